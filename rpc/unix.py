"""The Unix-socket transport, host side: listen on a path and serve each connection.

The socket is created inside a directory the caller made private (mode 0700) and is
itself set to mode 0600 before it listens, so only the run's own user can connect;
the token is the second lock.

Each connection is served with blocking reads in threads, leader/followers
(:class:`_ThreadedConnection`, a :class:`~rpc.threaded.LeaderFollowers`): one thread at
a time, the leader, reads; the thread that reads a whole request has it parsed and
authenticated once (:meth:`RPCServer.take`), runs a sync tool itself while keeping the
read turn, writes the reply and reads on, so a quick call costs its two syscalls and the
tool, with no event-loop pass, no thread hop and no thread woken. A tool that runs
past the hand-off watch's tick has the turn handed to a follower, which serves the
requests behind it. An async tool goes to the run's event loop, where it runs in the
connection's task group. The threads are bounded per connection and per run
(:attr:`RPCServer.thread_slots`): when none is left, a long call keeps the turn, and
the peer's further requests wait in the socket.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import anyio.to_thread

from hermes_sandbox import threads
from hermes_sandbox.rpc.errors import FrameError
from hermes_sandbox.rpc.framing import encode_frame, encode_frame_parts
from hermes_sandbox.rpc.server import LINGER_SECONDS, Reply, RequestReader, RPCServer
from hermes_sandbox.rpc.threaded import SOURCE_THREADS, LeaderFollowers

# sun_path is 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH = 107
BACKLOG = 64
# Threads serving one connection at most: one reading, the others running its calls.
CONNECTION_THREADS = SOURCE_THREADS
SERVING_THREAD = "hermes-rpc-unix"  # the name of every serving thread
_RECEIVE_CHUNK = 64 * 1024
# A reply body at least this long is written beside its header (sendmsg) rather than
# copied after it: the copy costs more than the second buffer.
_GATHER_FROM = 16 * 1024
# How long the end of a run waits for a connection's reading threads to see the
# socket shut (they wake at once; this only bounds a surprise).
_READERS_EXIT_SECONDS = 2.0


class _ThreadedConnection(LeaderFollowers):
    """One connection served by blocking reads in threads (rpc/threaded.py).

    A whole frame is written under ``_send_lock``; the socket is closed by the last of
    the connection's threads and calls to finish; :meth:`shut` shuts the socket, which
    wakes every thread blocked on it.
    """

    thread_name = SERVING_THREAD

    def __init__(self, server: RPCServer, sock: socket.socket, tasks: anyio.abc.TaskGroup) -> None:
        super().__init__(server, tasks)
        self._sock = sock
        self._reader = RequestReader(server)
        self._send_lock = threading.Lock()

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
            items = self._reader.feed(data)
        except FrameError as exc:
            self._send(self._server.framing_refusal(exc), None)
            self._linger()
            return False
        ready = self._ready
        for item in items:
            ready.append((item, None))
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

    def _send(self, reply: Reply, tag: object) -> None:
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

    def _wake_readers(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _release(self) -> None:
        self._sock.close()
        self._reader.close()
        self._server.release_connection()


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
