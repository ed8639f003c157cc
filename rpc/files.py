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

The directory is served by blocking threads, leader/followers (rpc/threaded.py), like a
Unix socket connection: the leader waits on inotify (or polls), reads the request
files (keeping each open, under its name, to carry its reply: no new file per call;
or removing it), has each parsed and authenticated once (:meth:`RPCServer.take`), and for a sync
tool hands the watching to a follower before it runs the tool on its own thread and
writes the reply file. No event-loop pass and no thread hop per call; an async tool
goes to the run's event loop.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import math
import os
import re
import secrets
import select
import stat
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread

from hermes_sandbox import threads
from hermes_sandbox.rpc import messages
from hermes_sandbox.rpc.errors import FrameError
from hermes_sandbox.rpc.framing import HEADER, HEADER_SIZE, encode_frame
from hermes_sandbox.rpc.server import Reply, RPCServer
from hermes_sandbox.rpc.threaded import Item, LeaderFollowers

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
SERVING_THREAD = "hermes-rpc-files"  # the name of every serving thread
# How long the end of a run waits for the serving threads to stop reading and end (they
# wake at once; this only bounds a surprise).
_EXIT_SECONDS = 2.0
# Request files kept open, each to carry its own call's reply, so that a call makes no
# new inode on the host's side: at most this many per directory at once (one
# descriptor each); past it a request file is removed after reading, as before.
# On an ext4 without a journal, creating a file scans past every inode freed in the
# last minute or more, so a new file per reply slowed calls down as they went on
# (docs/benchmarks.md, "Many runs over files: the benchmark's rounds against single
# rounds").
RECYCLED_FILES = 16
# A reply that finds its filesystem full (ENOSPC, EDQUOT: a small tmpfs, say) is
# replaced by an error reply of at most this size, which may still fit.
_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})
_NO_ROOM_REPLY_SIZE = 512

_IN_MOVED_TO = 0x00000080
_IN_Q_OVERFLOW = 0x00004000
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then the name
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC


@functools.cache
def _libc() -> ctypes.CDLL:
    """libc, loaded once: ``find_library`` runs ``ldconfig -p`` in a subprocess, which
    cost each run's start a fork and exec on the event loop. The interpreter's own
    symbols hold libc's on Linux (as in the script's client)."""
    return ctypes.CDLL(None, use_errno=True)


class _Inotify:
    """The few inotify calls needed, through libc (Linux). ``fd`` is readable when
    something was renamed into the watched directory (a request, or a reply of ours)."""

    def __init__(self, directory: str) -> None:
        libc = _libc()
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
            if len(data) < 65536 - 4096:  # all there was: no read to fail saying so
                return found

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


class FileChannel(LeaderFollowers):
    """Serves the request files of one run's directory with an :class:`RPCServer`.

    The directory is opened once (``O_DIRECTORY | O_NOFOLLOW``) and every operation is
    relative to that handle, so a script that renames the directory away and puts a
    symlink in its place moves nothing: the host goes on serving the directory it
    opened, wherever it now is, and never looks inside the symlink's target. Requests
    are opened ``O_NONBLOCK | O_NOFOLLOW`` and refused unread unless they are regular
    files with one link. File I/O runs in the channel's own serving threads
    (leader/followers, :class:`~rpc.threaded.LeaderFollowers`), never on the event loop
    or in anyio's shared pool; the last of them closes the directory. Use
    :func:`serve_files`.
    """

    thread_name = SERVING_THREAD

    def __init__(self, server: RPCServer, directory: str, tasks: anyio.abc.TaskGroup) -> None:
        super().__init__(server, tasks)
        self._directory = directory
        self._fd = -1
        self._watcher: _Inotify | None = None
        self._closing_watcher: _Inotify | None = None  # closed after the end (_release)
        self._wake = (-1, -1)  # a pipe: shut() writes to it to wake the leader
        self._poller = select.poll()
        self._rescan = True  # look at every entry, not only the renames reported
        self._delay = POLL_MIN  # the poll back-off where there is no inotify
        self._keys = threading.Lock()  # guards the four below (senders are any thread)
        self._seen: set[str] = set()
        self._in_flight: set[str] = set()  # keys whose tool still runs
        self._replies: OrderedDict[str, bytes] = OrderedDict()
        # key -> (an open descriptor of its request file, still named <key>.req, and its
        # inode): where its reply is written, before that name becomes <key>.rep
        # (_write_reply).
        self._recycled: dict[str, tuple[int, int]] = {}
        self.requests_served = 0
        # Entries refused and not removable (a non-empty directory): never looked at
        # again. The leader's alone.
        self._ignored: set[tuple[str, int]] = set()

    def open(self) -> None:
        """Open the directory and what wakes the leader; raise OSError if it is not a
        directory (or a symlink)."""
        self._fd = os.open(
            self._directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        )
        try:
            self._wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._poller.register(self._wake[0], select.POLLIN)
            self._watcher = _watcher(self.watch_path)
            if self._watcher is not None:
                self._poller.register(self._watcher.fd, select.POLLIN)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the directory, the watcher and the wake pipe (once no thread uses them);
        remove the request files kept for replies never sent."""
        with self._keys:
            kept, self._recycled = list(self._recycled.items()), {}
        for key, (fd, _inode) in kept:
            os.close(fd)
            if self._fd >= 0:
                self._remove(key + REQUEST_SUFFIX)
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        for fd in (*self._wake, self._fd):
            if fd >= 0:
                os.close(fd)
        self._wake, self._fd = (-1, -1), -1

    @property
    def watch_path(self) -> str:
        """A path naming the opened directory itself (for inotify), not its old name."""
        proc = f"/proc/self/fd/{self._fd}"
        return proc if os.path.isdir(proc) else self._directory

    # -- files (called in the serving threads) ----------------------------------------------

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
        with self._keys:
            recycled = self._recycled.get(key)
        if recycled is not None:
            written = self._write_recycled(key, frame, recycled[0])
            with self._keys:  # only now: until its rename, <key>.req is passed over
                self._recycled.pop(key, None)
            if written:
                return
        error = self._write_fresh(key, frame)
        if error is not None and error.errno in _NO_ROOM and len(frame) > _NO_ROOM_REPLY_SIZE:
            # A filesystem full (a small tmpfs, say): the caller learns why, not nothing.
            log.warning("no room for the %d-byte reply to %s: %s", len(frame), key, error)
            refusal = messages.error_reply(
                None,
                messages.INTERNAL,
                f"the reply ({len(frame)} bytes) did not fit in the call directory: its "
                f"filesystem is full ({error.strerror}); return less per call",
            )
            error = self._write_fresh(key, encode_frame(refusal))
        if error is not None:
            log.warning("could not write the reply to %s: %s", key, error)

    def _write_fresh(self, key: str, frame: bytes) -> OSError | None:
        """Write the reply into a new file and rename it to <key>.rep; the error if not
        (the directory is full, or the reply's name is taken), leaving nothing behind."""
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
                _write_all(fd, frame)
            finally:
                os.close(fd)
            os.rename(temporary, key + REPLY_SUFFIX, src_dir_fd=self._fd, dst_dir_fd=self._fd)
            return None
        except OSError as exc:
            self._remove(temporary)
            return exc

    def _write_recycled(self, key: str, frame: bytes, fd: int) -> bool:
        """Write the reply into its request's own file, kept open since it was read
        (still a regular file with no other link), and rename its name, <key>.req, to
        <key>.rep; False to write a fresh file instead."""
        name = key + REQUEST_SUFFIX
        try:
            try:
                if os.fstat(fd).st_nlink != 1:
                    raise OSError(errno.EMLINK, "the request file has other links now")
                # Written over from the start, then cut to its length: never truncated to
                # 0 first, which on ext4 has the close start writing the file to disk.
                _write_all(fd, frame, at=0)
                os.ftruncate(fd, len(frame))
            finally:
                os.close(fd)
            os.rename(name, key + REPLY_SUFFIX, src_dir_fd=self._fd, dst_dir_fd=self._fd)
            return True
        except OSError:
            self._remove(name)
            return False

    def _read_request(self, name: str) -> bytes:
        """Read and remove a request file; raise :class:`_Refusal` for anything but a
        regular file with one link and at most one frame's size (never echoing it).
        While there is room, the file is kept open, under its name, to carry the reply
        (:meth:`_keep_for_reply`), rather than removed."""
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
        kept = False
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
            # One read for the whole file, as a rule (a regular file's short read is its end).
            first = os.read(fd, min(info.st_size + 1, limit + 1))
            chunks = [first]
            size = len(first)
            while (
                size > info.st_size
                and size <= limit
                and (chunk := os.read(fd, min(1 << 20, limit + 1 - size)))
            ):
                chunks.append(chunk)
                size += len(chunk)
            if size > limit:
                raise _Refusal(messages.FRAME_TOO_LARGE, "request file grew while read")
            kept = self._keep_for_reply(name, fd, info.st_ino)
            return b"".join(chunks)
        finally:
            if not kept:
                os.close(fd)
                self._remove(name)

    def _keep_for_reply(self, name: str, fd: int, inode: int) -> bool:
        """Keep the request file ``name``, read through ``fd`` and found a regular file
        with one link, to carry its reply, if there is room: reopened for writing
        through ``fd`` itself (so only that inode, never whatever the name holds by now).
        The name stays until the reply is in the file, then becomes the reply's (one
        rename a call: each rename here wakes both sides' watches); until then a look at
        the directory passes it over (:meth:`_take`). True if kept; ``fd`` is closed
        then, else left to the caller."""
        key = name[: -len(REQUEST_SUFFIX)]
        with self._keys:
            if key in self._recycled or len(self._recycled) >= RECYCLED_FILES:
                return False
        try:
            # Not the name: only a file already known to be regular is opened to write
            # (a FIFO or a device the script planted is never opened for writing).
            writer = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_CLOEXEC)
        except OSError:  # not the host's to write (another owner), or no /proc
            return False
        with self._keys:
            if key in self._recycled or len(self._recycled) >= RECYCLED_FILES:
                os.close(writer)
                return False
            self._recycled[key] = (writer, inode)  # no reply to it can come before
        os.close(fd)
        return True

    def _remove_or_ignore(self, name: str) -> None:
        """Remove a refused entry, or else never look at it again (the leader's)."""
        if self._remove(name):
            return
        try:
            inode = os.stat(name, dir_fd=self._fd, follow_symlinks=False).st_ino
        except OSError:
            return  # gone after all
        self._ignored.add((name, inode))

    def _take(self, name: str) -> tuple[str, bytes | dict[str, Any]] | None:
        """What to do with one entry: (key, request bytes or refusal), or None to skip."""
        if not _may_be_request(name):
            return None  # a temporary file, or a reply not yet collected
        key = name[: -len(REQUEST_SUFFIX)] if name.endswith(REQUEST_SUFFIX) else ""
        kept = self._recycled.get(key)
        if self._ignored or kept is not None:  # else no inode to compare: no stat
            try:
                inode = os.stat(name, dir_fd=self._fd, follow_symlinks=False).st_ino
            except FileNotFoundError:
                return None
            if (name, inode) in self._ignored:
                return None
            if kept is not None and kept[1] == inode:
                return None  # read already: the file waits for its reply (_keep_for_reply)
        if not KEY_RE.match(key):
            log.warning("removing %r from the RPC directory: not a request file name", name)
            self._remove_or_ignore(name)
            return None
        try:
            return key, self._read_request(name)
        except FileNotFoundError:
            return None  # taken already
        except _Refusal as refusal:
            self._remove_or_ignore(name)  # answered once; never again
            return key, refusal.reply
        except OSError as exc:
            self._remove_or_ignore(name)
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

    # -- requests (LeaderFollowers) ----------------------------------------------------

    def _read(self) -> bool:
        """Wait for request files, take them, and put what each gets in ``_ready``;
        False once the channel is shut."""
        names = self._wait()
        if self.closed:
            return False
        count, self._rescan, taken = self._take_all(names)
        if self._watcher is None:
            self._delay = POLL_MIN if count else min(self._delay * 2, POLL_MAX)
        for key, item in taken:
            ready = self._admit(key, item)
            if ready is not None:
                self._ready.append(ready)
        return True

    def _wait(self) -> set[str] | None:
        """The names that may be requests, once renames bring some; None (look at
        every entry) to rescan, if the kernel dropped events, without inotify, or if
        nothing came within SAFETY_RESCAN. The renames of the host's own replies are
        read and passed over. Returns early, with nothing, once shut."""
        if self._rescan:
            self._rescan = False
            return None
        if self._watcher is None:  # the poller holds only the wake pipe: a sleep
            self._poller.poll(math.ceil(self._delay * 1000))
            return None
        deadline = time.monotonic() + SAFETY_RESCAN
        while not self.closed:
            left = deadline - time.monotonic()
            if left <= 0 or not self._poller.poll(math.ceil(left * 1000)):
                return None
            names = self._watcher.names()
            if names is None:
                return None
            names = {n for n in names if _may_be_request(n)}
            if names:
                return names
        return set()

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

    def _admit(self, key: str, taken: bytes | Reply) -> Item | None:
        """What a taken request gets: (a Request to run, or the reply to write now, a
        dict or an encoded frame; its key), or None when it is answered later."""
        with self._keys:
            self.requests_served += 1
            if key in self._seen:
                # A retry: never run the tool again. Answer as before, if still known;
                # one whose tool still runs gets the one answer when it finishes.
                if key in self._in_flight:
                    return None
                frame = self._replies.get(key)
                if frame is None:
                    reply = messages.error_reply(
                        None,
                        messages.BAD_REQUEST,
                        f"request {key} was answered already and is not run twice",
                    )
                    frame = encode_frame(reply)
                return frame, key
            self._seen.add(key)
            self._in_flight.add(key)  # until _send has its reply
        if isinstance(taken, dict):
            return taken, key
        try:
            return self._server.take(self._body(taken)), key
        except FrameError as exc:
            return self._server.framing_refusal(exc), key

    def _send(self, reply: Reply | bytes, key: str) -> None:
        """Write the reply file of ``key`` (any thread); a new reply is remembered for
        a retry of its request."""
        if isinstance(reply, bytes):
            frame = reply  # a retry's: remembered already, or not to be
        else:
            frame = encode_frame(reply)
            with self._keys:
                self._replies[key] = frame
                while len(self._replies) > KEPT_REPLIES:
                    self._replies.popitem(last=False)
                self._in_flight.discard(key)
        if not self.closed:
            self._write_reply(key, frame)

    def _wake_readers(self) -> None:
        try:
            os.write(self._wake[1], b"x")
        except OSError:  # full: the leader is being woken already
            pass

    def _release(self) -> None:
        # The watch is closed after the end is signalled (_release_after_end): closing
        # an inotify descriptor waits for the kernel to finish tearing down watches
        # just removed, such as the script's own on this directory as its process
        # exited: about 7 ms, which every files run's end used to wait out
        # (docs/benchmarks.md, "Many runs over files (session 13)").
        self._watcher, self._closing_watcher = None, self._watcher
        self.close()

    def _release_after_end(self) -> None:
        watcher, self._closing_watcher = self._closing_watcher, None
        if watcher is not None:
            watcher.close()


def _write_all(fd: int, data: bytes, at: int | None = None) -> None:
    """Write all of ``data`` at the file's offset, or from offset ``at``."""
    view = memoryview(data)
    while view:
        if at is None:
            view = view[os.write(fd, view) :]
        else:
            written = os.pwrite(fd, view, at)
            view, at = view[written:], at + written


def _may_be_request(name: str) -> bool:
    """Whether an entry needs the host's look: anything but a temporary name or a reply."""
    return not name.startswith(".") and not name.endswith(REPLY_SUFFIX)


@asynccontextmanager
async def serve_files(server: RPCServer, directory: str) -> AsyncIterator[FileChannel]:
    """Serve the request files of ``directory`` (which must exist, private to the run)
    while the context is open. Files already there are removed first. Leaving the
    context (cancelled too) waits for the calls in flight (:meth:`RPCServer.drain`),
    then stops the serving threads; the last of them closes the directory."""
    async with anyio.create_task_group() as tasks:
        channel = FileChannel(server, directory, tasks)
        channel.open()
        started = False
        try:
            await anyio.to_thread.run_sync(channel.remove_stale, limiter=threads.tool_limiter())
            tasks.start_soon(channel.run_later)
            channel.start()
            started = True
            try:
                yield channel
            finally:
                try:
                    await server.drain()
                finally:
                    channel.shut()
                    channel.close_later()
                    tasks.cancel_scope.cancel()
                    with anyio.CancelScope(shield=True), anyio.move_on_after(_EXIT_SECONDS):
                        await channel.readers_gone.wait()
                        # No tool left running (an abandoned one keeps its thread, which
                        # closes the directory when it returns): the threads end now.
                        if not channel.calls_in_flight:
                            await channel.ended.wait()
        finally:
            if not started:
                channel.close()


__all__ = ["REPLY_SUFFIX", "REQUEST_SUFFIX", "FileChannel", "serve_files"]
