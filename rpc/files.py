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

What this fixes of the reference's file RPC: every request gets a reply, malformed and
unauthorized ones included (the reference deleted them and its caller waited out 300
s); files already in the directory when serving starts are removed first, never run;
a request that arrives again under a key already seen never runs its tool twice (the
first reply is written again, or an error once that reply is forgotten); and the host
wakes on inotify events rather than polling every 50-250 ms, so a call costs
milliseconds. Where inotify is not available (not Linux), it polls with a short
back-off instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import re
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc

from hermes_sandbox.rpc import messages
from hermes_sandbox.rpc.errors import FrameError
from hermes_sandbox.rpc.framing import HEADER, HEADER_SIZE, decode_body, encode_frame
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

_IN_MOVED_TO = 0x00000080
_IN_CLOSE_WRITE = 0x00000008
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC


class _Inotify:
    """The few inotify calls needed, through libc (Linux). ``fd`` is readable when
    something was renamed or written into the watched directory."""

    def __init__(self, directory: str) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self.fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        mask = _IN_MOVED_TO | _IN_CLOSE_WRITE
        if libc.inotify_add_watch(self.fd, os.fsencode(directory), mask) < 0:
            error = ctypes.get_errno()
            os.close(self.fd)
            raise OSError(error, f"inotify_add_watch {directory} failed")

    def drain(self) -> None:
        try:
            while os.read(self.fd, 65536):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        os.close(self.fd)


def _watcher(directory: str) -> _Inotify | None:
    try:
        return _Inotify(directory)
    except (OSError, AttributeError) as exc:  # no libc inotify here: poll instead
        log.debug("no inotify for %s (%s); polling", directory, exc)
        return None


class FileChannel:
    """Serves the request files of one run's directory with an :class:`RPCServer`."""

    def __init__(self, server: RPCServer, directory: str) -> None:
        self._server = server
        self._directory = directory
        self._seen: set[str] = set()
        self._replies: OrderedDict[str, bytes] = OrderedDict()
        self.requests_served = 0

    # -- files -------------------------------------------------------------------------

    def _path(self, name: str) -> str:
        return os.path.join(self._directory, name)

    def remove_stale(self) -> list[str]:
        """Remove every file already in the directory (an earlier run's); return names."""
        removed = []
        for entry in os.scandir(self._directory):
            if entry.is_file(follow_symlinks=False) or entry.is_symlink():
                try:
                    os.unlink(entry.path)
                    removed.append(entry.name)
                except FileNotFoundError:
                    pass
        if removed:
            log.info("removed %d stale files from %s", len(removed), self._directory)
        return removed

    def _write_reply(self, key: str, frame: bytes) -> None:
        temporary = self._path(f".{key}{REPLY_SUFFIX}.tmp")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                view = memoryview(frame)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.replace(temporary, self._path(key + REPLY_SUFFIX))
        except OSError as exc:  # the directory went away: the run is ending
            log.warning("could not write the reply to %s: %s", key, exc)

    def _take_request(self, name: str) -> bytes | dict[str, Any]:
        """Read and remove a request file: its bytes, or the refusal to send instead."""
        path = self._path(name)
        limit = self._server.max_frame_size
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                os.unlink(path)
                return messages.error_reply(None, messages.BAD_FRAME, "request is a symlink")
            raise
        try:
            size = os.fstat(fd).st_size
            if size > HEADER_SIZE + limit:
                return messages.error_reply(
                    None,
                    messages.FRAME_TOO_LARGE,
                    f"request file is {size} bytes, over the {limit}-byte frame limit",
                )
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)
            os.unlink(path)

    # -- requests ----------------------------------------------------------------------

    def _message(self, data: bytes) -> dict[str, Any]:
        """Decode a request file's contents: exactly one frame; raise FrameError."""
        if len(data) < HEADER_SIZE:
            raise FrameError(f"request file is {len(data)} bytes, shorter than a frame header")
        (size,) = HEADER.unpack_from(data)
        if size == 0 or HEADER_SIZE + size != len(data):
            raise FrameError(
                f"request file holds {len(data) - HEADER_SIZE} body bytes, its header says {size}"
            )
        return decode_body(memoryview(data)[HEADER_SIZE:])

    def _remember(self, key: str, frame: bytes) -> None:
        self._replies[key] = frame
        while len(self._replies) > KEPT_REPLIES:
            self._replies.popitem(last=False)

    def _answer(self, key: str, reply: dict[str, Any]) -> None:
        frame = encode_frame(reply)
        self._remember(key, frame)
        self._write_reply(key, frame)

    async def _answer_later(self, key: str, message: dict[str, Any]) -> None:
        self._answer(key, await self._server.reply_later(message))

    def handle(self, name: str, tasks: anyio.abc.TaskGroup) -> None:
        """Serve one file that appeared in the directory."""
        if name.startswith(".") or name.endswith(REPLY_SUFFIX):
            return  # a temporary file, or a reply not yet collected
        key = name[: -len(REQUEST_SUFFIX)] if name.endswith(REQUEST_SUFFIX) else ""
        if not KEY_RE.match(key):
            log.warning("removing %r from the RPC directory: not a request file name", name)
            try:
                os.unlink(self._path(name))
            except OSError:
                pass
            return
        try:
            taken = self._take_request(name)
        except FileNotFoundError:
            return  # taken already
        except OSError as exc:
            self._answer(key, messages.error_reply(None, messages.BAD_FRAME, str(exc)))
            return
        self.requests_served += 1
        if key in self._seen:
            # A retry: never run the tool again. Answer as before, if still known.
            frame = self._replies.get(key)
            if frame is not None:
                self._write_reply(key, frame)
            else:
                reply = messages.error_reply(
                    None,
                    messages.BAD_REQUEST,
                    f"request {key} was answered already and is not run twice",
                )
                self._write_reply(key, encode_frame(reply))
            return
        self._seen.add(key)
        if isinstance(taken, dict):
            self._answer(key, taken)
            return
        try:
            message = self._message(taken)
        except FrameError as exc:
            self._answer(key, self._server.framing_refusal(exc))
            return
        reply = self._server.reply_now(message)
        if reply is not None:
            self._answer(key, reply)
        else:
            # Remembered only once answered: a retry meanwhile is a no-op (the answer
            # comes when the tool finishes), because _seen already holds the key.
            tasks.start_soon(self._answer_later, key, message)

    def scan(self, tasks: anyio.abc.TaskGroup) -> int:
        """Serve every request file present; return how many files there were."""
        try:
            names = sorted(os.listdir(self._directory))
        except FileNotFoundError:
            return 0
        for name in names:
            self.handle(name, tasks)
        return len(names)

    async def run(self) -> None:
        """Serve until cancelled."""
        watcher = _watcher(self._directory)
        try:
            async with anyio.create_task_group() as tasks:
                delay = POLL_MIN
                while True:
                    if watcher is not None:
                        watcher.drain()  # before scanning: what comes after wakes us
                    busy = self.scan(tasks)
                    if watcher is not None:
                        with anyio.move_on_after(SAFETY_RESCAN):
                            await anyio.wait_readable(watcher.fd)
                    else:
                        delay = POLL_MIN if busy else min(delay * 2, POLL_MAX)
                        await anyio.sleep(delay)
        finally:
            if watcher is not None:
                watcher.close()


@asynccontextmanager
async def serve_files(server: RPCServer, directory: str) -> AsyncIterator[FileChannel]:
    """Serve the request files of ``directory`` (which must exist, private to the run)
    while the context is open. Files already there are removed first."""
    channel = FileChannel(server, directory)
    channel.remove_stale()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(channel.run)
        try:
            yield channel
        finally:
            tasks.cancel_scope.cancel()


__all__ = ["REPLY_SUFFIX", "REQUEST_SUFFIX", "FileChannel", "serve_files"]
