"""Where the file tools may read and write, decided on real paths inside the environment.

Every path is first resolved the way the kernel would open it, by the run's environment
(:func:`resolve_path`): ``..`` and symlinks are followed by ``ctx.environment.stat``, and
for a path that does not exist yet the nearest existing ancestor is resolved and the rest
appended, following a dangling symlink on the way (writing through ``ws/new -> /etc/x``
would create ``/etc/x``). The checks then look at the real path:

- with a workspace root (``ctx.workspace_root``), reads and writes must stay inside it;
- writes are always refused under the protected paths of :data:`PROTECTED_SYSTEM_DIRS`
  and :data:`PROTECTED_HOME_ENTRIES` (:mod:`~hermes_sandbox.tools.protected_paths`, the
  list the terminal's approval check flags writes to as well), to a container engine's
  socket, and to anything that is not a regular file (a FIFO would block the write
  forever, a device would take it).

The tools should then act on :attr:`ResolvedPath.path`, the path that was checked, not
on the name they were given: checking one path and opening another is how symlink
escapes happen. Another process in the environment can still swap a symlink between the
check and the use; the script itself can open any file its user may. This guards the
tools against mistakes and confused-deputy calls; isolation is the backend's job.

Tool authors: ``await resolve_for_read(ctx, path)`` / ``await resolve_for_write(ctx,
path)`` return the :class:`ResolvedPath` or raise :class:`PathRefused` with a message fit
for the script; :func:`check_read` and :func:`check_write` return that message or None.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass

from hermes_sandbox.environments.base import FileStat, Runtime
from hermes_sandbox.errors import PathRefused
from hermes_sandbox.tools.protected_paths import (
    ENGINE_SOCKET_SUFFIXES,
    ENGINE_SOCKETS,
    HOME_DIRS,
    PROTECTED_HOME_ENTRIES,
    PROTECTED_SYSTEM_DIRS,
)
from hermes_sandbox.tools.registry import ToolContext

MAX_SYMLINK_HOPS = 40  # as Linux: a longer chain of dangling symlinks resolves no further

_NOT_REGULAR = {
    "char_device": "a character device",
    "block_device": "a block device",
    "fifo": "a named pipe",
    "socket": "a socket",
    "other": "not a regular file",
}


@dataclass(frozen=True, slots=True)
class ResolvedPath:
    """A path as the tool was given it and as the environment resolves it.

    ``stat`` describes the file if it exists; otherwise it is None and ``error`` holds
    what stat raised for the full path (FileNotFoundError, PermissionError...).
    """

    requested: str
    path: str
    stat: FileStat | None
    error: OSError | None = None

    @property
    def exists(self) -> bool:
        return self.stat is not None


def _absolute(ctx: ToolContext, path: str) -> str:
    """``path`` joined to the working directory, ``..`` kept for the environment to
    resolve (``link/..`` is the link target's parent, not the link's directory)."""
    return posixpath.join(ctx.cwd, ctx.expand_user(path))


def _is_within(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


async def resolve_path(
    ctx: ToolContext, path: str, *, resolve_missing: bool = True
) -> ResolvedPath:
    """Resolve ``path`` (relative to ``ctx.cwd``) through ``ctx.environment``.

    An existing path resolves to what ``stat`` reports. A missing one resolves to its
    nearest existing ancestor's real path plus the rest, normalised, following a dangling
    symlink on the way (``new.txt -> /etc/x`` resolves to ``/etc/x``: opening it for
    writing would create that file). With ``resolve_missing=False`` a missing path
    resolves to itself, normalised, for one stat call. Never raises for a missing or
    unreadable path; raises OSError only if even ``/`` cannot be stat'ed.
    """
    env = ctx.environment
    absolute = _absolute(ctx, path)
    try:
        info = await env.stat(absolute)
    except OSError as exc:
        error: OSError = exc
    else:
        return ResolvedPath(path, info.path, info)
    if not resolve_missing:
        return ResolvedPath(path, _clean(absolute), None, error)
    return ResolvedPath(path, await _resolve_missing(env, absolute, error), None, error)


async def _resolve_missing(env: Runtime, absolute: str, error: OSError, hops: int = 0) -> str:
    # The local backend's stat names the path it got to, symlinks followed, in the
    # error; a backend that does not is asked whether the first missing component is
    # a dangling symlink.
    hint = getattr(error, "filename", None)
    probe = True
    if isinstance(hint, str) and hint.startswith("/"):
        absolute, probe = hint, False
    parent_real, rest = await _nearest_existing(env, absolute)
    if probe and rest and hops < MAX_SYMLINK_HOPS:
        first, _, remainder = rest.partition("/")
        target = await _dangling_symlink_target(env, posixpath.join(parent_real, first))
        if target is not None:
            followed = posixpath.join(parent_real, target, remainder)
            try:
                return (await env.stat(followed)).path
            except OSError as exc:
                return await _resolve_missing(env, followed.rstrip("/"), exc, hops + 1)
    return _clean(posixpath.join(parent_real, rest))


async def _nearest_existing(env: Runtime, absolute: str) -> tuple[str, str]:
    """(real path of the nearest existing ancestor, the rest of ``absolute`` below it).

    ``absolute`` itself is missing. An ancestor exists if a longer one does (the kernel
    walks every prefix of a path to reach the next), so the nearest is found by galloping
    up from the end (1, 2, 4... components) and then bisecting: O(log n) stat calls for n
    components, where one call per component made resolution quadratic.
    """
    parts = [part for part in absolute.split("/") if part]

    def prefix(count: int) -> str:
        return "/" + "/".join(parts[:count])

    missing, found, real, step = len(parts), 0, None, 1
    while missing - step > 0:
        try:
            real = (await env.stat(prefix(missing - step))).path
        except OSError:
            missing -= step
            step *= 2
            continue
        found = missing - step
        break
    if real is None:
        real = (await env.stat("/")).path
    while missing - found > 1:
        middle = (found + missing) // 2
        try:
            real = (await env.stat(prefix(middle))).path
        except OSError:
            missing = middle
        else:
            found = middle
    return real, "/".join(parts[found:])


async def _dangling_symlink_target(env: Runtime, path: str) -> str | None:
    """The target of ``path`` if it is a symlink, else None (also if readlink is missing)."""
    quoted = shlex.quote(path)
    done = await env.execute(f"[ -h {quoted} ] && readlink -- {quoted}", timeout=30)
    target = done.output.rstrip("\n")
    return target if done.exit_code == 0 and target else None


def _clean(path: str) -> str:
    path = posixpath.normpath(path)
    return "/" + path.lstrip("/") if path.startswith("//") else path


async def _workspace(ctx: ToolContext) -> str | None:
    root = ctx.workspace_root
    if root is None:
        return None
    resolved = await resolve_path(ctx, root)
    if resolved.stat is None or resolved.stat.kind != "directory":
        raise PathRefused(
            f"Refused: the workspace root {root} does not exist or is not a directory, so "
            "the file tools cannot use any path; the host must fix its workspace setting"
        )
    return resolved.path


def _via(resolved: ResolvedPath, ctx: ToolContext) -> str:
    """Say where the path really goes when that differs from how it reads."""
    if _clean(_absolute(ctx, resolved.requested)) == resolved.path:
        return ""
    return f" (it resolves to {resolved.path} through symlinks or '..')"


def _outside(verb: str, resolved: ResolvedPath, root: str, ctx: ToolContext) -> PathRefused:
    return PathRefused(
        f"Refused to {verb} {resolved.requested}: it is outside the workspace {root}"
        f"{_via(resolved, ctx)}. The file tools only {verb} files inside the workspace."
    )


def _home_dirs(home: str | None) -> list[str]:
    homes = list(HOME_DIRS)
    if home and home.startswith("/") and home != "/":
        homes.append(_clean(home))
    return homes


def _home_entry(path: str, home: str | None) -> str | None:
    """The protected home entry ``path`` is or is under, if any."""
    parts = path.strip("/").split("/")
    for home_dir in _home_dirs(home):
        pattern = home_dir.strip("/").split("/")
        if len(parts) <= len(pattern):
            continue
        if not all(p in ("*", part) for p, part in zip(pattern, parts, strict=False)):
            continue
        below = parts[len(pattern) :]
        for entry in PROTECTED_HOME_ENTRIES:
            entry_parts = entry.split("/")
            if below[: len(entry_parts)] == entry_parts:
                return "/" + "/".join([*parts[: len(pattern)], entry])
    return None


def protected_reason(path: str, home: str | None = None) -> str | None:
    """Why writing the absolute, normalised ``path`` is never allowed, or None.

    ``home`` is the home directory of the environment's user (protected like the
    usual ones, wherever it is)."""
    name = posixpath.basename(path)
    if path in ENGINE_SOCKETS or name.endswith(ENGINE_SOCKET_SUFFIXES):
        return "it is a container engine's socket (writing to it controls the host)"
    for directory in PROTECTED_SYSTEM_DIRS:
        if _is_within(path, directory):
            return f"it is under {directory}, a protected system directory"
    entry = _home_entry(path, home)
    if entry is not None:
        return f"it is under {entry}, which holds credentials or start-up files"
    return None


async def resolve_for_read(ctx: ToolContext, path: str) -> ResolvedPath:
    """Resolve ``path`` for reading; raise PathRefused if it is outside the workspace.

    Outside the workspace, a missing file is refused like an existing one, so the
    answer does not tell whether it exists.
    """
    root = await _workspace(ctx)
    resolved = await resolve_path(ctx, path, resolve_missing=root is not None)
    if root is not None and not _is_within(resolved.path, root):
        raise _outside("read", resolved, root, ctx)
    return resolved


async def resolve_for_write(ctx: ToolContext, path: str) -> ResolvedPath:
    """Resolve ``path`` for writing; raise PathRefused if it is protected (as written or
    as resolved), outside the workspace, or an existing file that is not regular."""
    resolved = await resolve_path(ctx, path)
    as_written = _clean(_absolute(ctx, path))
    for candidate in dict.fromkeys((resolved.path, as_written)):
        reason = protected_reason(candidate, ctx.environment.home)
        if reason is None:
            continue
        where = _via(resolved, ctx) if candidate == resolved.path else ""
        raise PathRefused(
            f"Refused to write {path}{where}: {reason}. The file tools never write there; "
            "if the change is really needed, ask the user to make it."
        )
    root = await _workspace(ctx)
    if root is not None and not _is_within(resolved.path, root):
        raise _outside("write", resolved, root, ctx)
    if resolved.stat is not None and resolved.stat.kind in _NOT_REGULAR:
        raise PathRefused(
            f"Refused to write {path}: it is {_NOT_REGULAR[resolved.stat.kind]}; the file "
            "tools write regular files only"
        )
    return resolved


async def check_read(ctx: ToolContext, path: str) -> str | None:
    """The refusal message for reading ``path``, or None when it may be read."""
    try:
        await resolve_for_read(ctx, path)
    except PathRefused as exc:
        return str(exc)
    return None


async def check_write(ctx: ToolContext, path: str) -> str | None:
    """The refusal message for writing ``path``, or None when it may be written."""
    try:
        await resolve_for_write(ctx, path)
    except PathRefused as exc:
        return str(exc)
    return None
