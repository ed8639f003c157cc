"""How the local backend contains its scripts: under bubblewrap (bwrap), or not at all.

The mode is ``auto`` (bwrap when it runs here, else none), ``bwrap`` or ``none``: the
local settings' ``isolation`` (``--isolation``, ``-o isolation=``, the config file's
``backends.local.isolation``, ``LocalSettings(isolation=...)``), else
``$HERMES_SANDBOX_ISOLATION``, else ``auto``. :func:`choose_isolation` makes the choice
(probing bwrap once per process, and a positive answer once per machine state:
environments/bwrap_cache.py); :meth:`Isolation.prefix` is the command line that a
launched script goes behind. Only what starts a script is contained (``spawn`` and
``open_exec_stream``); the tools' own commands (``execute``) act on the host, as the
tools do. docs/security.md says what the sandbox keeps from a script and what it does not.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from hermes_sandbox.environments import bwrap_cache
from hermes_sandbox.environments.local_settings import ISOLATION_MODES
from hermes_sandbox.errors import BackendNotAvailable, SettingError

if TYPE_CHECKING:
    from hermes_sandbox.environments.local_settings import LocalSettings

ISOLATION_VARIABLE = "HERMES_SANDBOX_ISOLATION"
BWRAP = "bwrap"
_PROBE_TIMEOUT = 30.0

# Directories the script gets empty and private (a tmpfs of its own), and home
# directories it does not see at all (an empty tmpfs over them).
_PRIVATE_DIRS = ("/tmp", "/var/tmp", "/run")
_HIDDEN_DIRS = ("/root", "/home")

# What a path in the sandbox is, by precedence: where two mounts claim one path, the
# higher rank wins (a working directory inside /tmp is the host's, not the tmpfs).
_READ_ONLY, _TMPFS, _INTERPRETER, _WRITABLE, _KERNEL = range(5)


@dataclass(frozen=True, slots=True)
class BwrapProbe:
    """What was found of bwrap here: its ``path`` (None: not found), ``version``, and
    ``problem``, why it cannot be used (None: it ran a command in a sandbox); ``cached``
    when the answer came from an earlier process's probe (environments/bwrap_cache.py)."""

    path: str | None
    version: str | None
    problem: str | None
    cached: bool = False

    @property
    def works(self) -> bool:
        return self.problem is None


def probe_bwrap() -> BwrapProbe:
    """Whether bwrap, found on PATH, runs a command here in the sandbox the runs get
    (a container without user namespaces, for one, refuses it). Each executable is
    tried once per process, and a working one is remembered across processes while
    nothing its answer depends on changes (environments/bwrap_cache.py)."""
    path = shutil.which(BWRAP)
    if path is None:
        return BwrapProbe(None, None, f"{BWRAP} not found on PATH")
    return _probe(os.path.realpath(path))


def forget_bwrap_probe(probe: BwrapProbe | None = None) -> bool:
    """Drop what is known of bwrap (``probe``'s executable; default: the one on PATH),
    in this process and in the cache across processes, after a run failed in bwrap:
    the next choice probes again. Returns whether a cached entry was dropped."""
    path = probe.path if probe is not None else shutil.which(BWRAP)
    _probe.cache_clear()
    if path is None:
        return False
    return bwrap_cache.forget(bwrap_cache.key(os.path.realpath(path)))


@functools.cache
def _probe(path: str) -> BwrapProbe:
    entry_key = bwrap_cache.key(path)
    known = bwrap_cache.lookup(entry_key)
    if known is not None:
        return BwrapProbe(path, known or None, None, cached=True)
    found = _run_probe(path)
    if found.works:
        bwrap_cache.store(entry_key, found.version)  # never a negative answer
    return found


def _run_probe(path: str) -> BwrapProbe:
    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT,
        )

    try:
        version_run = run([path, "--version"])
        words = version_run.stdout.split()
        version = words[-1] if version_run.returncode == 0 and words else None
        trial = run(  # a change here raises bwrap_cache.PROBE_VERSION
            [
                *_bwrap_argv(path, cwd=None, writable=(), python=sys.executable, network=False),
                # -E -S: the question is whether bwrap starts the interpreter here,
                # not the site-packages set-up, which costs most of a bare start
                # (about 80 ms of 100 inside the sandbox on the development machine).
                sys.executable,
                "-E",
                "-S",
                "-c",
                "",
            ]
        )
    except subprocess.TimeoutExpired:
        return BwrapProbe(path, None, f"{path} did not finish within {_PROBE_TIMEOUT:g} s")
    except OSError as exc:
        return BwrapProbe(path, None, f"{path} cannot be run: {exc.strerror or exc}")
    if trial.returncode != 0:
        said = " ".join(trial.stderr.split())[-300:] or f"exit code {trial.returncode}"
        return BwrapProbe(path, version, f"{path} does not work here: {said}")
    return BwrapProbe(path, version, None)


@dataclass(frozen=True, slots=True)
class Isolation:
    """The isolation a run gets: ``mode`` "bwrap" or "none", ``requested`` what was
    asked for ("auto", "bwrap" or "none"), and the ``probe`` of bwrap (None when none
    was asked for, so bwrap was not looked at)."""

    mode: Literal["bwrap", "none"]
    requested: Literal["auto", "bwrap", "none"]
    probe: BwrapProbe | None = None

    def describe(self) -> str:
        """One phrase for people: ``bwrap 0.8.0 (auto)``, ``none (bwrap not found on
        PATH)``, ``none (as asked)``."""
        if self.mode == "bwrap":
            assert self.probe is not None
            name = f"bwrap {self.probe.version or '(version unknown)'}"
            return f"{name} (auto)" if self.requested == "auto" else name
        if self.probe is not None and self.probe.problem:
            return f"none ({self.probe.problem})"
        return "none (as asked)"

    def prefix(
        self,
        *,
        cwd: str,
        writable: Sequence[str],
        python: str,
        network: bool,
    ) -> list[str]:
        """The command line a launched command goes behind ([] for none): a sandbox
        whose working directory ``cwd`` and ``writable`` directories (the run's stage)
        are the host's and writable, and whose interpreter ``python`` can run; the
        network is the host's only with ``network``."""
        if self.mode == "none":
            return []
        assert self.probe is not None and self.probe.path is not None
        return _bwrap_argv(
            self.probe.path, cwd=cwd, writable=writable, python=python, network=network
        )


def requested_isolation(
    settings: LocalSettings, environ: Mapping[str, str] | None = None
) -> Literal["auto", "bwrap", "none"]:
    """The mode asked for: the settings', else ``$HERMES_SANDBOX_ISOLATION``, else
    auto. Raises SettingError for a variable holding something else."""
    if settings.isolation is not None:
        return settings.isolation  # type: ignore[return-value]  # checked by LocalSettings
    text = (os.environ if environ is None else environ).get(ISOLATION_VARIABLE, "").strip()
    if not text:
        return "auto"
    if text not in ISOLATION_MODES:
        raise SettingError(
            f"must be one of {', '.join(ISOLATION_MODES)}, got {text!r}",
            field="isolation",
            place=f"${ISOLATION_VARIABLE}",
        )
    return text  # type: ignore[return-value]


def choose_isolation(
    settings: LocalSettings, environ: Mapping[str, str] | None = None
) -> Isolation:
    """The isolation runs with ``settings`` get here (blocking: it may probe bwrap).

    Raises SettingError for an unknown mode in the environment variable, and
    BackendNotAvailable when bwrap is asked for and does not work here.
    """
    requested = requested_isolation(settings, environ)
    if requested == "none":
        return Isolation("none", "none")
    probe = probe_bwrap()
    if probe.works:
        return Isolation("bwrap", requested, probe)
    if requested == "bwrap":
        raise BackendNotAvailable(
            f"isolation bwrap was asked for, but {probe.problem}; install bubblewrap "
            "(apt-get install bubblewrap) where user namespaces are allowed, or choose "
            "--isolation auto (bwrap where it works) or --isolation none"
        )
    return Isolation("none", "auto", probe)


def describe_isolation(settings: LocalSettings) -> str:
    """:meth:`Isolation.describe` for ``settings``, or what is wrong with them."""
    try:
        return choose_isolation(settings).describe()
    except BackendNotAvailable:
        return f"bwrap, which does not work here ({probe_bwrap().problem})"
    except SettingError as exc:
        return f"unknown ({exc})"


# -- the sandbox -----------------------------------------------------------------------


def _bwrap_argv(
    path: str, *, cwd: str | None, writable: Sequence[str], python: str, network: bool
) -> list[str]:
    argv = [
        path,
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        # No --unshare-user: bwrap makes a user namespace itself when it needs one
        # (run unprivileged, not setuid), and as root it is not needed.
        "--die-with-parent",
        "--new-session",  # setsid: no way back to a controlling terminal (TIOCSTI)
        "--cap-drop",
        "ALL",
    ]
    if not network:
        argv.append("--unshare-net")  # a network namespace of its own: loopback only
    # A stage removed meanwhile is left out: bwrap refuses a bind of nothing.
    mine = [os.path.realpath(p) for p in ([] if cwd is None else [cwd])]
    mine += [os.path.realpath(p) for p in writable if os.path.isdir(p)]
    argv += _mounts(mine, python, network)
    argv += ["--chdir", mine[0] if cwd is not None else "/", "--"]
    return argv


def _mounts(mine: Sequence[str], python: str, network: bool) -> list[str]:
    """The mount options: the whole system read-only, private temporary directories,
    hidden homes, the interpreter's installation where a home hides it, the writable
    directories, and a fresh /dev and /proc; applied parents first, so a deeper mount
    lies over the one it is in."""
    plan: dict[str, tuple[int, list[str]]] = {}

    def claim(where: str, rank: int, options: list[str]) -> None:
        if where not in plan or plan[where][0] < rank:
            plan[where] = (rank, options)

    claim("/", _READ_ONLY, ["--ro-bind", "/", "/"])
    for where in (*_PRIVATE_DIRS, *_HIDDEN_DIRS):
        if os.path.isdir(where) and not os.path.islink(where):
            claim(where, _TMPFS, ["--tmpfs", where])
    for where in mine:
        claim(where, _WRITABLE, ["--bind", where, where])
    needed = _interpreter_paths(python)
    if network and os.path.exists("/etc/resolv.conf"):
        needed.add(os.path.realpath("/etc/resolv.conf"))  # often a link into /run
    for where in sorted(needed, key=_depth):  # an installation before its executable
        # Seen through the deepest mount that holds it: bound back if that is a tmpfs
        # (not a whole home: an interpreter in ~/bin leaves the rest of the home hidden).
        holder = max((p for p in plan if _inside(where, p)), key=_depth)
        if plan[holder][0] == _TMPFS and where != holder:
            claim(where, _INTERPRETER, ["--ro-bind", where, where])
    claim("/dev", _KERNEL, ["--dev", "/dev"])
    claim("/proc", _KERNEL, ["--proc", "/proc"])
    options: list[str] = []
    for where in sorted(plan, key=lambda p: (_depth(p), p)):
        options += plan[where][1]
    return options


def _interpreter_paths(python: str) -> set[str]:
    """What ``python`` needs to start: the executable, and its installation (the
    directory above its bin/, through symlinks and not; this process's prefixes when it
    is this process's interpreter, a virtual environment's base among them)."""
    found = os.path.abspath(shutil.which(python) or python)
    paths = {found}
    for executable in (found, os.path.realpath(found)):
        paths.add(os.path.dirname(os.path.dirname(executable)))
    if os.path.realpath(found) == os.path.realpath(sys.executable):
        paths.update(os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix))
    return paths


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _depth(path: str) -> int:
    return 0 if path == "/" else path.count("/")


__all__ = [
    "ISOLATION_MODES",
    "ISOLATION_VARIABLE",
    "BwrapProbe",
    "Isolation",
    "choose_isolation",
    "describe_isolation",
    "forget_bwrap_probe",
    "probe_bwrap",
    "requested_isolation",
]
