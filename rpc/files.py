"""The files transport, host side: requests and replies as files in a shared directory.

For a sandbox that shares a directory with the host but where neither a Unix socket
nor an exec stream is wanted. The script writes each request as a file; the host
answers each with a file. Both are written under a temporary name and renamed into
place, so a reader never sees half a file::

    <dir>/<key>.req     one request frame (4-byte length + msgpack map), as on a socket
    <dir>/<key>.rep     its reply frame

``key`` is the caller's name for the call, unique within the run (the stub uses
``<pid>-<random>-<request id>``); 1 to 100 of ``[A-Za-z0-9_-]``. Names starting with
``.`` are temporary files and ignored. See docs/protocol.md, "Files".

Every request gets a reply, malformed and unauthorized ones included; files already
in the directory when serving starts are removed first, never run; a request that
arrives again under a key already seen never runs its tool twice. The host wakes on
inotify events (Linux), else polls with a short back-off. What a hostile script can
and cannot do to the host through this directory is in docs/security.md, "Transports".
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import re
import secrets
import stat
import struct
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread

from hermes_sandbox.rpc import messages
from hermes_sandbox.rpc.errors import FrameError
from hermes_sandbox.rpc.framing import HEADER, HEADER_SIZE, encode_frame
from hermes_sandbox.rpc.messages import Request
from hermes_sandbox.rpc.server import RPCServer

log = logging.getLogger(__name__)

REQUEST_SUFFIX = ".req"
REPLY_SUFFIX = ".rep"
KEY_RE = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
# Replies kept for answering a repeated request; older keys are still remembered (and
# never run again) but get an error instead of their reply.
KEPT_REPLIES = 256
# How long the host waits for an event before looking anyway (a lost event, or a
# filesystem that does not report them); the poll back-off where inotify is missing.
SAFETY_RESCAN = 0.5
POLL_MIN, POLL_MAX = 0.0005, 0.01
# Worker threads of one channel's file I/O: its own limiter, so a stuck filesystem
# never takes the threads that the rest of the run (the kill path) needs.
FILE_THREADS = 2

_IN_MOVED_TO = 0x00000080
_IN_Q_OVERFLOW = 0x00004000
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then the name
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC


class _Inotify:
    """The few inotify calls needed, through libc (Linux). ``fd`` is readable when
    something was renamed into the watched directory (a request, or a reply of ours)."""

    def __init__(self, directory: str) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self.fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        if libc.inotify_add_watch(self.fd, os.fsencode(directory), _IN_MOVED_TO) < 0:
            error = ctypes.get_errno()
            os.close(self.fd)
            raise OSError(error, f"inotify_add_watch {directory} failed")

    def names(self) -> set[str] | None:
        """The names renamed into the directory since the last call (never blocks);
        None if the kernel dropped events (the queue overflowed): look at everything."""
        found: set[str] | None = set()
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return found
            offset = 0
            while offset < len(data):
                _wd, mask, _cookie, size = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size
                if mask & _IN_Q_OVERFLOW:
                    found = None
                elif found is not None:
                    found.add(os.fsdecode(data[offset : offset + size].rstrip(b"\0")))
                offset += size

    def close(self) -> None:
        os.close(self.fd)


def _watcher(directory: str) -> _Inotify | None:
    try:
        return _Inotify(directory)
    except (OSError, AttributeError) as exc:  # no libc inotify here: poll instead
        log.debug("no inotify for %s (%s); polling", directory, exc)
        return None


class _Refusal(Exception):
    """A request file that is not served: the error reply to write instead."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.reply = messages.error_reply(None, kind, message)


class FileChannel:
    """Serves the request files of one run's directory with an :class:`RPCServer`.

    The directory is opened once (``O_DIRECTORY | O_NOFOLLOW``) and every operation is
    relative to that handle, so a script that renames the directory away and puts a
    symlink in its place moves nothing: the host goes on serving the directory it
    opened, wherever it now is, and never looks inside the symlink's target. Requests
    are opened ``O_NONBLOCK | O_NOFOLLOW`` and refused unread unless they are regular
    files with one link. File I/O runs in worker threads of the channel's own limiter,
    never on the event loop or in anyio's shared pool. Use :meth:`open` /
    :meth:`aclose` (or :func:`serve_files`).
    """

    def __init__(self, server: RPCServer, directory: str) -> None:
        self._server = server
        self._directory = directory
        self._fd = -1
        self._limiter = anyio.CapacityLimiter(FILE_THREADS)
        self._seen: set[str] = set()
        self._in_flight: set[str] = set()  # keys whose tool still runs
        # Entries refused and not removable (a non-empty directory): never looked at again.
        self._ignored: set[tuple[str, int]] = set()
        self._replies: OrderedDict[str, bytes] = OrderedDict()
        self._outbox: list[tuple[str, bytes]] = []  # replies waiting for the writer
        self._outbox_filled = anyio.Event()
        self.requests_served = 0

    def open(self) -> None:
        """Open the directory; raise OSError if it is not a directory (or a symlink)."""
        self._fd = os.open(
            self._directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        )

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    @property
    def watch_path(self) -> str:
        """A path naming the opened directory itself (for inotify), not its old name."""
        proc = f"/proc/self/fd/{self._fd}"
        return proc if os.path.isdir(proc) else self._directory

    async def _in_thread(self, function: Any, *args: Any) -> Any:
        # Never abandoned on cancel (unlike a tool's thread): each operation is bounded
        # (nothing here opens a file that can block), and the directory handle it uses
        # is closed only after every one of them has returned, never under it.
        return await anyio.to_thread.run_sync(function, *args, limiter=self._limiter)

    # -- files (called in worker threads) ----------------------------------------------

    def _remove(self, name: str) -> bool:
        """Remove an entry of the directory, whatever it is; False if it could not be."""
        try:
            os.unlink(name, dir_fd=self._fd)
            return True
        except FileNotFoundError:
            return True
        except IsADirectoryError:
            pass
        except PermissionError:  # EPERM: Linux's unlink of a directory
            pass
        except OSError:
            return False
        try:
            os.rmdir(name, dir_fd=self._fd)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            return False

    def remove_stale(self) -> list[str]:
        """Remove every entry already in the directory (an earlier run's); return names."""
        removed = []
        with os.scandir(self._fd) as entries:
            names = [entry.name for entry in entries]
        for name in names:
            if self._remove(name):
                removed.append(name)
        if removed:
            log.info("removed %d stale entries from %s", len(removed), self._directory)
        return removed

    def _write_reply(self, key: str, frame: bytes) -> None:
        # A fresh temporary name, created exclusively: nothing the script planted there
        # (a FIFO, a symlink) is opened.
        temporary = f".{key}{REPLY_SUFFIX}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(
                temporary,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=self._fd,
            )
            try:
                view = memoryview(frame)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.rename(temporary, key + REPLY_SUFFIX, src_dir_fd=self._fd, dst_dir_fd=self._fd)
        except OSError as exc:  # the directory is full or its reply name is taken
            log.warning("could not write the reply to %s: %s", key, exc)
            self._remove(temporary)

    def _write_replies(self, replies: list[tuple[str, bytes]]) -> None:
        for key, frame in replies:
            self._write_reply(key, frame)

    def _read_request(self, name: str) -> bytes:
        """Read and remove a request file; raise :class:`_Refusal` for anything but a
        regular file with one link and at most one frame's size (never echoing it)."""
        limit = HEADER_SIZE + self._server.max_frame_size
        try:
            fd = os.open(
                name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._fd
            )
        except FileNotFoundError:
            raise
        except OSError as exc:
            what = "a symlink" if exc.errno == errno.ELOOP else f"not readable ({exc.strerror})"
            raise _Refusal(messages.BAD_FRAME, f"request file is {what}; refused") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise _Refusal(
                    messages.BAD_FRAME,
                    "request is not a regular file; write it to a temporary name "
                    "and rename it to <key>.req",
                )
            if info.st_nlink != 1:
                raise _Refusal(
                    messages.BAD_FRAME,
                    "request file has other hard links; write a new file to a temporary "
                    "name and rename it to <key>.req",
                )
            if info.st_size > limit:
                raise _Refusal(
                    messages.FRAME_TOO_LARGE,
                    f"request file is over the {self._server.max_frame_size}-byte frame "
                    "limit; send less per call",
                )
            chunks = []
            size = 0
            while size <= limit and (chunk := os.read(fd, min(1 << 20, limit + 1 - size))):
                chunks.append(chunk)
                size += len(chunk)
            if size > limit:
                raise _Refusal(messages.FRAME_TOO_LARGE, "request file grew while read")
            return b"".join(chunks)
        finally:
            os.close(fd)
            self._remove(name)

    def _take(self, name: str) -> tuple[str, bytes | dict[str, Any]] | None:
        """What to do with one entry: (key, request bytes or refusal), or None to skip."""
        if not _may_be_request(name):
            return None  # a temporary file, or a reply not yet collected
        key = name[: -len(REQUEST_SUFFIX)] if name.endswith(REQUEST_SUFFIX) else ""
        try:
            inode = os.stat(name, dir_fd=self._fd, follow_symlinks=False).st_ino
        except FileNotFoundError:
            return None
        if (name, inode) in self._ignored:
            return None
        if not KEY_RE.match(key):
            log.warning("removing %r from the RPC directory: not a request file name", name)
            if not self._remove(name):
                self._ignored.add((name, inode))
            return None
        try:
            return key, self._read_request(name)
        except FileNotFoundError:
            return None  # taken already
        except _Refusal as refusal:
            if not self._remove(name):
                self._ignored.add((name, inode))  # answered once; never again
            return key, refusal.reply
        except OSError as exc:
            if not self._remove(name):
                self._ignored.add((name, inode))
            reason = exc.strerror or type(exc).__name__
            return key, messages.error_reply(None, messages.BAD_FRAME, f"unreadable: {reason}")

    def _take_all(
        self, names: set[str] | None
    ) -> tuple[int, bool, list[tuple[str, bytes | dict[str, Any]]]]:
        """Take the requests among ``names`` (None: every entry of the directory), up
        to the run's cap on buffered bytes: (entries seen, whether some were left for
        the next scan, what was taken)."""
        if names is None:
            with os.scandir(self._fd) as entries:
                names = {entry.name for entry in entries}
        taken: list[tuple[str, bytes | dict[str, Any]]] = []
        held = 0
        for name in sorted(names):
            if held >= self._server.max_buffered_bytes:
                return len(names), True, taken
            item = self._take(name)
            if item is not None:
                taken.append(item)
                if isinstance(item[1], bytes):
                    held += len(item[1])
        return len(names), False, taken

    # -- requests ----------------------------------------------------------------------

    def _body(self, data: bytes) -> bytes:
        """A request file's frame body: the file must be exactly one frame."""
        if len(data) < HEADER_SIZE:
            raise FrameError("request file is shorter than a frame header")
        (size,) = HEADER.unpack_from(data)
        if size == 0 or HEADER_SIZE + size != len(data):
            raise FrameError(
                "request file is not exactly one frame: its header does not match its length"
            )
        return data[HEADER_SIZE:]

    def _remember(self, key: str, frame: bytes) -> None:
        self._replies[key] = frame
        while len(self._replies) > KEPT_REPLIES:
            self._replies.popitem(last=False)

    def _answer(self, key: str, reply: dict[str, Any]) -> bytes:
        frame = encode_frame(reply)
        self._remember(key, frame)
        return frame

    async def _answer_later(self, key: str, request: Request) -> None:
        try:
            frame = self._answer(key, await self._server.reply_later(request))
        finally:
            self._in_flight.discard(key)
        self._send([(key, frame)])

    def _send(self, replies: list[tuple[str, bytes]]) -> None:
        self._outbox += replies
        self._outbox_filled.set()

    async def _write_outbox(self) -> None:
        """Write the replies as they come, until cancelled: those that come while a
        batch is written go in the next, so many calls answered at once cost one thread
        hop, not one each."""
        while True:
            await self._outbox_filled.wait()
            self._outbox_filled = anyio.Event()
            batch, self._outbox = self._outbox, []
            await self._in_thread(self._write_replies, batch)

    def _serve(
        self, key: str, taken: bytes | dict[str, Any], tasks: anyio.abc.TaskGroup
    ) -> bytes | None:
        """The reply frame to write now for a taken request, or None (answered later)."""
        self.requests_served += 1
        if key in self._seen:
            # A retry: never run the tool again. Answer as before, if still known; one
            # whose tool still runs gets the one answer when it finishes.
            if key in self._in_flight:
                return None
            frame = self._replies.get(key)
            if frame is not None:
                return frame
            reply = messages.error_reply(
                None,
                messages.BAD_REQUEST,
                f"request {key} was answered already and is not run twice",
            )
            return encode_frame(reply)
        self._seen.add(key)
        if isinstance(taken, dict):
            return self._answer(key, taken)
        try:
            item = self._server.take(self._body(taken))
        except FrameError as exc:
            return self._answer(key, self._server.framing_refusal(exc))
        if isinstance(item, Request):
            self._in_flight.add(key)
            tasks.start_soon(self._answer_later, key, item)
            return None
        return self._answer(key, item)

    async def scan(
        self, tasks: anyio.abc.TaskGroup, names: set[str] | None = None
    ) -> tuple[int, bool]:
        """Serve the request files among ``names`` (None: every entry): how many
        entries there were, and whether some were left for the next scan (the run's cap
        on buffered bytes)."""
        count, more, taken = await self._in_thread(self._take_all, names)
        replies = []
        for key, item in taken:
            frame = self._serve(key, item, tasks)
            if frame is not None:
                replies.append((key, frame))
        if replies:
            self._send(replies)
        return int(count), bool(more)

    async def run(self) -> None:
        """Serve until cancelled."""
        watcher = _watcher(self.watch_path)
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._write_outbox)
                delay = POLL_MIN
                names: set[str] | None = None  # the first scan looks at everything
                while True:
                    busy, more = await self.scan(tasks, names)
                    if more:
                        names = None
                        continue
                    if watcher is None:
                        delay = POLL_MIN if busy else min(delay * 2, POLL_MAX)
                        await anyio.sleep(delay)
                        continue
                    names = await _renamed(watcher)

        finally:
            if watcher is not None:
                watcher.close()


async def _renamed(watcher: _Inotify) -> set[str] | None:
    """The names that may be requests, once renames bring some; None (look at every
    entry) if the kernel dropped events or nothing came within SAFETY_RESCAN. The
    renames of the host's own replies are read and passed over without a scan."""
    with anyio.move_on_after(SAFETY_RESCAN):
        while True:
            await anyio.wait_readable(watcher.fd)
            names = watcher.names()
            if names is None:
                return None
            names = {n for n in names if _may_be_request(n)}
            if names:
                return names
    return None


def _may_be_request(name: str) -> bool:
    """Whether an entry needs the host's look: anything but a temporary name or a reply."""
    return not name.startswith(".") and not name.endswith(REPLY_SUFFIX)


@asynccontextmanager
async def serve_files(server: RPCServer, directory: str) -> AsyncIterator[FileChannel]:
    """Serve the request files of ``directory`` (which must exist, private to the run)
    while the context is open. Files already there are removed first."""
    channel = FileChannel(server, directory)
    channel.open()
    try:
        await anyio.to_thread.run_sync(channel.remove_stale, limiter=channel._limiter)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(channel.run)
            try:
                yield channel
            finally:
                try:
                    await server.drain()
                finally:
                    tasks.cancel_scope.cancel()
    finally:
        channel.close()


__all__ = ["REPLY_SUFFIX", "REQUEST_SUFFIX", "FileChannel", "serve_files"]
