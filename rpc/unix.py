"""The Unix-socket transport, host side: listen on a path and serve each connection.

The socket is created inside a directory the caller made private (mode 0700) and is
itself set to mode 0600 before it listens, so only the run's own user can connect;
the token is the second lock.

Each connection is served with blocking reads in threads, leader/followers
(:class:`_ThreadedConnection`): one thread at a time, the leader, reads; the thread that
reads a whole request has it parsed and authenticated once (:meth:`RPCServer.take`),
and for a sync tool hands the reading to a follower *before* it runs the tool on its own
thread, writes the reply and becomes a follower again. A call so costs its two
syscalls, a lock hand-off and the tool, with no event-loop pass and no thread hop. An
async tool goes to the run's event loop (:func:`rpc.server.loop_caller`), where it runs
in the connection's task group. The threads are bounded per connection and per run
(:attr:`RPCServer.thread_slots`): when none is left, the thread that read a request runs
it without handing off, and the peer's further requests wait in the socket.
"""

from __future__ import annotations

import functools
import os
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import anyio.to_thread

from hermes_sandbox import threads
from hermes_sandbox.rpc.errors import FrameError
from hermes_sandbox.rpc.framing import encode_frame, encode_frame_parts
from hermes_sandbox.rpc.messages import Request
from hermes_sandbox.rpc.server import (
    LINGER_SECONDS,
    Reply,
    RequestReader,
    RPCServer,
    loop_caller,
)

# sun_path is 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH = 107
BACKLOG = 64
# Threads serving one connection at most: one reading, the others running its calls.
CONNECTION_THREADS = threads.TOOL_THREADS + 1
SERVING_THREAD = "hermes-rpc-unix"  # the name of every serving thread
_RECEIVE_CHUNK = 64 * 1024
# A reply body at least this long is written beside its header (sendmsg) rather than
# copied after it: the copy costs more than the second buffer.
_GATHER_FROM = 16 * 1024
# How long the end of a run waits for a connection's reading threads to see the
# socket shut (they wake at once; this only bounds a surprise).
_READERS_EXIT_SECONDS = 2.0


class _ThreadedConnection:
    """One connection served by blocking reads in threads (leader/followers).

    Invariants: only the holder of ``_read_lock`` reads the socket, feeds the reader
    and takes from ``_ready``; a whole frame is written under ``_send_lock``; the socket
    is closed by the last of the connection's threads and calls to finish, so no thread
    ever uses a closed (possibly reused) descriptor. :meth:`shut` wakes every thread
    blocked on the socket.
    """

    def __init__(self, server: RPCServer, sock: socket.socket, tasks: anyio.abc.TaskGroup) -> None:
        self._server = server
        self._sock = sock
        self._tasks = tasks
        self._later_send, self._later = anyio.create_memory_object_stream[Request](float("inf"))
        self._call_soon = loop_caller()
        self._reader = RequestReader(server)
        self._ready: deque[Request | Reply] = deque()  # read, not yet taken
        self._read_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._state = threading.Lock()  # guards the counts and flags below
        self._threads = 0  # threads serving the connection
        self._readers = 0  # of them, reading or waiting to (the leader, the followers)
        self._calls = 0  # requests taken and not yet answered (in threads or on the loop)
        self._input_ended = False
        self._finished = False
        self.closed = False
        self.ended = anyio.Event()  # every thread and call is done, the socket closed
        self.readers_gone = anyio.Event()  # after shut(): no thread reads any more

    # -- threads ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the first thread (the caller admitted the connection)."""
        self._spawn(slot=False)

    def _spawn(self, *, slot: bool) -> None:
        with self._state:
            self._threads += 1
        thread = threading.Thread(
            target=self._serve, args=(slot,), name=SERVING_THREAD, daemon=True
        )
        try:
            thread.start()
        except RuntimeError:  # cannot start a thread: the others serve alone
            self._thread_exit(slot)

    def _serve(self, slot: bool) -> None:
        try:
            while (request := self._lead()) is not None:
                self._answer(request)
        finally:
            self._thread_exit(slot)

    def _thread_exit(self, slot: bool) -> None:
        if slot:
            self._server.thread_slots.release()
        with self._state:
            self._threads -= 1
        self._finish_if_done()

    def _lead(self) -> Request | None:
        """Wait to be the leader, then read until a request needs running; hand the
        reading on and return it. None when the connection is over for this thread."""
        with self._state:
            self._readers += 1
        try:
            with self._read_lock:
                while True:
                    while self._ready:
                        item = self._ready.popleft()
                        if isinstance(item, Request):
                            with self._state:
                                self._calls += 1
                            self._hand_off()
                            return item
                        self._send(item)
                    if self.closed or self._input_ended:
                        return None
                    if not self._read():
                        return None
        finally:
            with self._state:
                self._readers -= 1
                gone = self.closed and not self._readers
            if gone:
                self._call_soon(self.readers_gone.set)

    def _hand_off(self) -> None:
        """Before this thread runs a call: make sure another will read (a follower
        waits already, or one is started while the connection and the run have room)."""
        with self._state:
            needed = self._readers <= 1 and self._threads < CONNECTION_THREADS
        if needed and self._server.thread_slots.acquire(blocking=False):
            self._spawn(slot=True)

    def _read(self) -> bool:
        """Read once into ``_ready``; False when the connection ends for reading."""
        try:
            data = self._sock.recv(_RECEIVE_CHUNK)
        except OSError:
            data = b""
        if not data:
            with self._state:
                self._input_ended = True
                abandon = self._reader.inside_frame
            if abandon:  # cut off inside a frame: nothing more can be answered
                self.shut()
            # On a clean end the peer may have only shut its writing side: the calls
            # in flight still answer.
            return False
        try:
            self._ready.extend(self._reader.feed(data))
        except FrameError as exc:
            self._send(self._server.framing_refusal(exc))
            self._linger()
            return False
        return True

    def _linger(self) -> None:
        """Close after a refusal without losing it: closing a socket that still has
        unread input resets it, and the peer, still sending the refused frame, would get
        ECONNRESET instead of the reply. So end our side, then read and drop what the
        peer still sends (nothing is kept) until it ends or LINGER_SECONDS have passed in
        all, then shut."""
        self._reader.close()
        with self._state:
            self._input_ended = True
        deadline = time.monotonic() + LINGER_SECONDS
        try:
            self._sock.shutdown(socket.SHUT_WR)
            while not self.closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._sock.settimeout(left)
                if not self._sock.recv(_RECEIVE_CHUNK):
                    break
        except OSError:  # a timeout, a reset, or shut at the run's end
            pass
        self.shut()

    # -- calls --------------------------------------------------------------------------

    def _answer(self, request: Request) -> None:
        reply = None if self.closed else self._server.reply_blocking(request)
        # An async tool: to the run's event loop, into the connection's tasks.
        if (
            reply is None
            and not self.closed
            and self._call_soon(functools.partial(self._start_later, request))
        ):
            return
        if reply is not None:
            self._send(reply)
        self._call_done()

    def _start_later(self, request: Request) -> None:
        """On the loop: queue ``request`` for :meth:`run_later` (at most one per
        thread of the connection is ever queued)."""
        try:
            self._later_send.send_nowait(request)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):  # the run ended
            self._call_done()

    async def run_later(self) -> None:
        """On the loop, for the life of the connection: answer each request that needs
        the loop in a task of its own."""
        async with self._later:
            async for request in self._later:
                self._tasks.start_soon(self._answer_later, request)

    async def _answer_later(self, request: Request) -> None:
        try:
            reply = await self._server.reply_later(request)
            # The write may block (a peer slow to read): never on the loop. Not abandoned
            # when cancelled: the socket must outlive it, and shut() wakes it.
            await anyio.to_thread.run_sync(self._send, reply, limiter=threads.tool_limiter())
        finally:
            self._call_done()

    def _call_done(self) -> None:
        with self._state:
            self._calls -= 1
        self._finish_if_done()

    def _send(self, reply: Reply) -> None:
        header, body = encode_frame_parts(reply)
        with self._send_lock:
            if self.closed:
                return
            try:
                if len(body) < _GATHER_FROM:
                    self._sock.sendall(header + body)
                else:
                    _send_gathered(self._sock, header, body)
            except OSError:  # the peer has gone: there is no one left to tell
                self.shut()

    # -- the end ------------------------------------------------------------------------

    def shut(self) -> None:
        """End the connection now: every thread blocked on the socket wakes, replies
        still to come are dropped. Any thread or the loop may call it."""
        with self._state:  # never beside the close in _finish_if_done: fds are reused
            if self.closed or self._finished:
                return
            self.closed = True
            gone = not self._readers
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if gone:
            self._call_soon(self.readers_gone.set)

    def close_later(self) -> None:
        """On the loop: no more requests for :meth:`run_later`; those queued and not
        started are dropped (the connection is shut: no one would read their replies)."""
        self._later_send.close()
        while True:
            try:
                self._later.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return
            self._call_done()

    def _finish_if_done(self) -> None:
        with self._state:
            if self._finished or self._threads or self._calls:
                return
            self._finished = True
            self._sock.close()
        self._reader.close()
        self._server.release_connection()
        self._call_soon(self.ended.set)


def _send_gathered(sock: socket.socket, header: bytes, body: bytes) -> None:
    """Write ``header`` then ``body`` whole, as ``sendall`` would their concatenation."""
    sent = sock.sendmsg([header, body])
    if sent < len(header):
        sock.sendall(header[sent:])
        sent = len(header)
    if sent - len(header) < len(body):
        with memoryview(body) as rest:
            sock.sendall(rest[sent - len(header) :])


async def _serve_connection(server: RPCServer, conn: socket.socket) -> None:
    """Serve one accepted connection until it ends; cancelled, end it at once."""
    conn.setblocking(True)
    if not server.admit_connection():
        frame = encode_frame(server.TOO_MANY_CONNECTIONS)
        await anyio.to_thread.run_sync(_send_and_close, conn, frame, limiter=threads.tool_limiter())
        return
    async with anyio.create_task_group() as tasks:
        connection = _ThreadedConnection(server, conn, tasks)
        tasks.start_soon(connection.run_later)
        connection.start()
        try:
            await connection.ended.wait()
        finally:
            connection.shut()
            connection.close_later()
            tasks.cancel_scope.cancel()
            with anyio.CancelScope(shield=True), anyio.move_on_after(_READERS_EXIT_SECONDS):
                await connection.readers_gone.wait()


def _send_and_close(conn: socket.socket, frame: bytes) -> None:
    try:
        conn.settimeout(LINGER_SECONDS)
        conn.sendall(frame)
    except OSError:
        pass
    finally:
        conn.close()


@asynccontextmanager
async def serve_unix_socket(
    server: RPCServer, path: str, *, mode: int = 0o600
) -> AsyncIterator[str]:
    """Listen on ``path`` while the context is open; yield the path.

    Raises ValueError if the path is too long for a Unix socket. Leaving the context
    closes every connection and removes the socket file.
    """
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ValueError(
            f"Unix socket path is {len(os.fsencode(path))} bytes, over the "
            f"{MAX_SOCKET_PATH}-byte limit: set TMPDIR to a shorter directory"
        )
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        os.chmod(path, mode)
        listener.listen(BACKLOG)
        listener.setblocking(False)
        async with anyio.create_task_group() as tasks:

            async def accept_forever() -> None:
                while True:
                    await anyio.wait_readable(listener)
                    try:
                        conn, _ = listener.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    tasks.start_soon(_serve_connection, server, conn)

            tasks.start_soon(accept_forever)
            try:
                yield path
            finally:
                try:
                    await server.drain()
                finally:
                    tasks.cancel_scope.cancel()
    finally:
        listener.close()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
