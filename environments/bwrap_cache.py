"""The bwrap probe's cache across processes: only ever "bwrap works here".

A probe (environments/isolation.py) starts an interpreter inside bwrap, which every
``hermes-sandbox run`` would otherwise pay. Its positive answer is kept in a file under
``$XDG_CACHE_HOME/hermes-sandbox/bwrap`` (else ``~/.cache/hermes-sandbox/bwrap``), one
file per key;
a negative one never is, so a stale entry can never make an ``auto`` run unsandboxed:
at worst a run fails loudly in bwrap, and that run drops the entry (:func:`forget`) so
the next one probes again.

The key is everything that can change the answer and is cheap to read: bwrap's
resolved path and its stat (device, inode, size, mtime, mode: a setuid bit counts),
the interpreter the probe starts and its stat, the uid, the kernel's boot id, the user
namespace sysctls that exist, and :data:`PROBE_VERSION` (the probe's own command line).
The file is 0600 in a 0700 directory, written atomically (a temporary file renamed
over it); a file that is not a regular file, not this uid's, group- or world-writable,
or not the JSON written here is ignored. ``HERMES_SANDBOX_PROBE_CACHE=0`` (or ``off``,
``no``, ``false``) turns the cache off.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import tempfile

CACHE_VARIABLE = "HERMES_SANDBOX_PROBE_CACHE"
# Raised whenever the probe's trial (its bwrap options, its interpreter flags) changes.
PROBE_VERSION = 1
_OFF = ("0", "off", "no", "false")
_MAX_BYTES = 4096
_BOOT_ID = "/proc/sys/kernel/random/boot_id"
_SYSCTLS = (
    "/proc/sys/kernel/unprivileged_userns_clone",
    "/proc/sys/user/max_user_namespaces",
    "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
)


def enabled() -> bool:
    return os.environ.get(CACHE_VARIABLE, "").strip().lower() not in _OFF


def cache_dir() -> str:
    """``$XDG_CACHE_HOME/hermes-sandbox/bwrap`` (else under ``~/.cache``): a directory of
    its own, made 0700, as ``hermes-sandbox`` itself may be another part's, and wider."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hermes-sandbox", "bwrap")


def key(bwrap: str, python: str = sys.executable) -> dict[str, object] | None:
    """What the answer for ``bwrap`` (a resolved path) depends on; None when part of it
    cannot be read (then nothing is cached)."""
    try:
        found = {
            "probe": PROBE_VERSION,
            "bwrap": [bwrap, *_stat(bwrap)],
            "python": [python, os.path.realpath(python), *_stat(python)],
            "uid": os.getuid(),
            "boot": _read(_BOOT_ID),
        }
    except OSError:
        return None
    for path in _SYSCTLS:
        try:
            found[os.path.basename(path)] = _read(path)
        except OSError:
            pass  # not on this kernel
    return found


def _stat(path: str) -> list[int]:
    st = os.stat(path)
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode]


def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read(256).strip()


def _path(entry_key: dict[str, object]) -> str:
    digest = hashlib.sha256(json.dumps(entry_key, sort_keys=True).encode()).hexdigest()
    return os.path.join(cache_dir(), f"bwrap-{digest[:32]}.json")


def lookup(entry_key: dict[str, object] | None) -> str | None:
    """The bwrap version recorded as working for ``entry_key`` ("" for unknown), or
    None: no entry, or one to ignore."""
    if entry_key is None or not enabled():
        return None
    try:
        fd = os.open(_path(entry_key), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_uid != os.getuid()
            or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            or not _private_dir(os.path.dirname(_path(entry_key)))
        ):
            return None
        data = json.loads(os.read(fd, _MAX_BYTES))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if not isinstance(data, dict) or data.get("key") != entry_key or data.get("works") is not True:
        return None
    version = data.get("version")
    return version if isinstance(version, str) else ""


def _private_dir(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode)
        and st.st_uid == os.getuid()
        and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def store(entry_key: dict[str, object] | None, version: str | None) -> None:
    """Record that bwrap works for ``entry_key``; quietly nothing if it cannot be."""
    if entry_key is None or not enabled():
        return
    target = _path(entry_key)
    folder = os.path.dirname(target)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)  # 0700; its parents by the umask
        if not _private_dir(folder):
            return
        fd, temporary = tempfile.mkstemp(prefix=".bwrap-", dir=folder)  # 0600
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"key": entry_key, "works": True, "version": version}, f)
            os.replace(temporary, target)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError:
        pass  # a read-only home, a full disk: the next run probes again


def forget(entry_key: dict[str, object] | None) -> bool:
    """Drop the entry for ``entry_key``; whether there was one."""
    if entry_key is None:
        return False
    try:
        os.unlink(_path(entry_key))
    except OSError:
        return False
    return True
