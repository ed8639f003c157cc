"""The stream relay, host side: one exec stream carries a whole run.

The relay program (stubs/_relay.py) runs inside the sandbox with its stdin and
stdout attached to a byte stream the backend gives us (``open_exec_stream``). Over it
travel, as frames of the usual kind (docs/protocol.md, "Stream relay"):

- the script's stdout and stderr, which :class:`RelaySession` exposes as byte streams;
- its exit status (:meth:`RelaySession.wait`), and our request to kill it;
- the bytes of every RPC connection the script opens to the relay's socket inside the
  sandbox, each served by the same :class:`RPCServer` as a socket on the host would be,
  quick answers straight from the demultiplexer.

So any backend that can attach to a process's stdin and stdout gets full-speed RPC,
the output caps and the timeout, with one round trip per call.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol, cast

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream

from hermes_sandbox.errors import RelayError
from hermes_sandbox.rpc.errors import ConnectionClosed, FrameError
from hermes_sandbox.rpc.framing import FrameDecoder, encode_frame, iter_messages
from hermes_sandbox.rpc.messages import Request
from hermes_sandbox.rpc.server import RequestReader, RPCServer, loop_caller

log = logging.getLogger(__name__)

_OUTPUT_BUFFER = 64  # chunks of script output held before the relay is made to wait
# Bytes of replies queued for one of the script's connections, and for all, before the
# connection that would pass them is dropped (its script does not read its replies).
# A reply alone in the queue always fits, however large.
CONNECTION_QUEUE_LIMIT = 8 * 1024 * 1024
CHANNEL_QUEUE_LIMIT = 32 * 1024 * 1024
# How long a kill may wait to be written to the channel before the host gives up on
# the relay and closes the channel (which ends the relay, then the process or
# container behind it).
KILL_DEADLINE = 3.0
# Frames from the relay are small: script output comes in 64 KiB pieces and RPC bytes
# in 256 KiB pieces (docs/protocol.md, 7.2).
CHANNEL_FRAME_LIMIT = 1024 * 1024
# Messages from the relay read in the loop's callback and not yet acted on (script
# output waiting for its sink) before the channel is paused.
_HELD_MESSAGES = 64
# How long the end of a run waits, after the relay's exit report, for the relay itself
# to end (its channel's end): it leaves at once, so this only bounds a surprise.
RELAY_END_SECONDS = 2.0


class _LoopReadChannel(Protocol):
    """A channel that can be read from the event loop's reader callback (docker's exec
    stream: ``DockerExecStream.read_in_loop``), or from the thread that received its
    bytes (ssh's: ``SSHExecStream.read_in_loop`` on paramiko's transport thread):
    ``on_data`` is called from either, one call at a time and in order, and may call
    ``pause_reading`` and ``stop_reading``; ``on_end`` from the loop's thread."""

    def read_in_loop(
        self, on_data: Callable[[bytes], None], on_end: Callable[[Exception | None], None]
    ) -> bool: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def stop_reading(self) -> None: ...


class _OnLoop:
    """Runs ``f()`` on the event loop's thread: at once when called there, else soon
    (from the channel's receiving thread, for what only the loop may do: set an anyio
    event, start a task). Make it on the loop."""

    def __init__(self) -> None:
        self._thread = threading.get_ident()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # trio: called on its thread only (no reader callbacks)
            self._later: Callable[[Callable[[], object]], object] = loop_caller()
            return
        # In the loop's context (anyio finds its backend there), not the caller's.
        context = contextvars.copy_context()

        def later(f: Callable[[], object]) -> None:
            try:
                loop.call_soon_threadsafe(f, context=context.copy())
            except RuntimeError:  # the loop is closed
                pass

        self._later = later

    def __call__(self, f: Callable[[], object]) -> None:
        if threading.get_ident() == self._thread:
            f()
        else:
            self._later(f)


def _at_once(f: Callable[[], object]) -> None:
    f()


class _ChannelWriter:
    """Frames to the relay, written whole and in order.

    Queuing never waits, so the task that reads the channel never stops reading it:
    :meth:`put` queues a frame (refusing a connection's reply past the queue limits),
    :meth:`put_first` queues one ahead of all others (the kill). When nothing is queued
    or being written, :meth:`put` first offers the frame to the stream's
    ``send_nowait`` (an :class:`~environments.base.ExecStream` that can write without
    waiting): a reply then goes out in the call that made it, with no task switch.
    What the stream does not take at once is queued, ahead of all else, for the
    writing task (:meth:`run`).

    :meth:`put` may be called from any thread: the queue is kept under ``lock`` (the
    session's), and ``on_loop`` sets the writing task's event from the loop's thread.
    """

    def __init__(
        self, stream: anyio.abc.ByteSendStream, lock: threading.RLock | None = None
    ) -> None:
        self._stream = stream
        self._lock = lock if lock is not None else threading.RLock()
        self.on_loop: Callable[[Callable[[], object]], None] = _at_once
        self._send_nowait: Callable[[bytes], int] | None = getattr(stream, "send_nowait", None)
        self._queue: deque[tuple[bytes, int | None, anyio.Event | None]] = deque()
        self._queued = 0
        self._per_connection: dict[int, int] = {}
        self._ready = anyio.Event()
        self._sending = False  # run() is inside a send
        self._head_started = False  # the first queued frame is partly written
        self.broken = False

    def put(self, message: dict[str, Any], *, conn: int | None = None) -> bool:
        """Queue ``message``; False if it is a reply for ``conn`` over the limits."""
        frame = encode_frame(message)
        with self._lock:
            return self._put(frame, conn)

    def _put(self, frame: bytes, conn: int | None) -> bool:
        if self.broken:
            return False
        if not self._queue and not self._sending and self._send_nowait is not None:
            written = self._send_nowait(frame)
            if written == len(frame):
                return True
            if written:
                frame = frame[written:]
                self._head_started = True  # the rest must go before anything else
        elif conn is not None:
            held = self._per_connection.get(conn, 0)
            if held and held + len(frame) > CONNECTION_QUEUE_LIMIT:
                return False
            if self._queued and self._queued + len(frame) > CHANNEL_QUEUE_LIMIT:
                return False
        if conn is not None:
            self._per_connection[conn] = self._per_connection.get(conn, 0) + len(frame)
        self._queue.append((frame, conn, None))
        self._queued += len(frame)
        self.on_loop(self._ready.set)
        return True

    def put_first(self, message: dict[str, Any]) -> anyio.Event:
        """Queue ``message`` before everything else (after the rest of a frame already
        partly written); the event is set once written."""
        frame = encode_frame(message)
        written = anyio.Event()
        with self._lock:
            if self.broken:
                raise anyio.BrokenResourceError
            self._queue.insert(1 if self._head_started else 0, (frame, None, written))
            self._queued += len(frame)
            self._ready.set()
        return written

    async def run(self) -> None:
        """Write queued frames until cancelled or the channel breaks."""
        try:
            while True:
                with self._lock:
                    if not self._queue:
                        self._ready = ready = anyio.Event()
                        item = None
                    else:
                        item = self._queue.popleft()
                        frame, conn, written = item
                        self._head_started = False
                        self._queued -= len(frame)
                        if conn is not None:
                            left = self._per_connection.pop(conn) - len(frame)
                            if left:
                                self._per_connection[conn] = left
                        self._sending = True
                if item is None:
                    await ready.wait()
                    continue
                try:
                    await self._stream.send(frame)
                finally:
                    with self._lock:
                        self._sending = False
                if written is not None:
                    written.set()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            with self._lock:
                self.broken = True
                self._queue.clear()


class _RelayedConnection:
    """One RPC connection of the script, served as its bytes arrive on the channel.

    Frames are decoded as they come; a request that can be answered at once is
    answered from the demultiplexer, the others each in a task (as
    the Unix socket does on the host). After the script
    shuts its side (``eof``), the calls in flight still answer, then the host closes.
    A connection whose replies back up past the writer's limits is dropped.
    Its state is the session's: used under the session's ``lock``, from the loop's
    thread or the channel's receiving thread (``on_loop`` starts the tasks).
    """

    def __init__(
        self,
        conn_id: int,
        server: RPCServer,
        writer: _ChannelWriter,
        tasks: anyio.abc.TaskGroup,
        lock: threading.RLock,
        on_loop: Callable[[Callable[[], object]], None],
    ) -> None:
        self.conn_id = conn_id
        self._server = server
        self._writer = writer
        self._tasks = tasks
        self._lock = lock
        self._on_loop = on_loop
        self._reader = RequestReader(server)
        self._in_flight = 0
        self._input_ended = False
        self.closed = False

    def _send(self, reply: dict[str, Any]) -> None:
        if self.closed:
            return
        message = {"op": "rpc", "conn": self.conn_id, "data": encode_frame(reply)}
        if not self._writer.put(message, conn=self.conn_id):
            if not self._writer.broken:
                log.warning("dropping relayed connection %d: replies not read", self.conn_id)
            self.close()

    async def _answer_later(self, request: Request) -> None:
        try:
            reply = await self._server.reply_later(request)
            with self._lock:
                self._send(reply)
        finally:
            with self._lock:
                self._in_flight -= 1
                if self._input_ended and not self._in_flight:
                    self.close()

    def _start_answer(self, request: Request) -> None:
        """On the loop's thread: answer ``request`` in a task."""
        try:
            self._tasks.start_soon(self._answer_later, request)
        except RuntimeError:  # the run's task group has ended: no one to answer
            with self._lock:
                self._in_flight -= 1

    def feed(self, data: bytes) -> None:
        if self.closed or self._input_ended:
            return
        try:
            for item in self._reader.feed(data):
                if isinstance(item, Request):
                    self._in_flight += 1
                    self._on_loop(functools.partial(self._start_answer, item))
                    continue
                self._send(item)
                if self.closed:
                    return
        except FrameError as exc:
            self._send(self._server.framing_refusal(exc))
            self.close()

    def end_of_input(self) -> None:
        """The script shut its writing side: answer what is in flight, then close."""
        self._input_ended = True
        if self._reader.inside_frame or not self._in_flight:
            self.close()  # nothing more can be answered

    def forget(self) -> None:
        """The connection is over (closed by the script, or the run ended)."""
        if not self.closed:
            self.closed = True
            self._reader.close()
            self._server.connections -= 1

    def close(self) -> None:
        """Close from the host's side, and tell the relay."""
        if self.closed:
            return
        self.forget()
        self._writer.put({"op": "close", "conn": self.conn_id})


class _OutputStream(anyio.abc.ByteReceiveStream):
    def __init__(self, receive: MemoryObjectReceiveStream[bytes]) -> None:
        self._receive = receive

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return await self._receive.receive()

    async def aclose(self) -> None:
        self._receive.close()


# The exit code of a script whose relay was lost, as ssh reports a lost connection.
LOST_EXIT_CODE = 255


class RelaySession:
    """A script run through a relay: the SandboxProcess contract, over one channel.

    Use as::

        async with RelaySession(channel, server) as session:   # serves the channel
            await session.start(argv, env=..., cwd=..., socket_path=...)
            ... read session.stdout / session.stderr, await session.wait() ...

    Leaving the context kills whatever still runs and closes the channel.
    ``kill_relay_tree`` is called with the relay's pid when the relay does not answer a
    kill (a script stopped it): it must kill the relay and everything below it.
    ``relay_reaped``, once the channel has ended, waits until the relay is gone
    (:meth:`environments.base.ExecStream.wait_reaped`).
    """

    def __init__(
        self,
        channel: anyio.abc.ByteStream,
        server: RPCServer,
        *,
        max_frame_size: int = CHANNEL_FRAME_LIMIT,
        kill_relay_tree: Callable[[int], Awaitable[None]] | None = None,
        relay_reaped: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._channel = channel
        self._kill_relay_tree = kill_relay_tree
        self._relay_reaped = relay_reaped
        self.relay_pid: int | None = None
        self._server = server
        self._max_frame_size = max_frame_size  # of the channel's frames from the relay
        # Held for every use of the connections and the writer's queue: the channel's
        # data may be acted on by the thread that received it (_serve_in_loop).
        self._lock = threading.RLock()
        self._on_loop: Callable[[Callable[[], object]], None] = _at_once
        self._writer = _ChannelWriter(channel, self._lock)
        out_send, out_receive = anyio.create_memory_object_stream[bytes](_OUTPUT_BUFFER)
        err_send, err_receive = anyio.create_memory_object_stream[bytes](_OUTPUT_BUFFER)
        self._sinks = {1: out_send, 2: err_send}
        self.stdout = _OutputStream(out_receive)
        self.stderr = _OutputStream(err_receive)
        self._connections: dict[int, _RelayedConnection] = {}
        self._exited = anyio.Event()
        self._channel_ended = anyio.Event()
        self._started = anyio.Event()
        self.exit_code: int | None = None
        self.pid: int | None = None
        self.error: str | None = None
        # Why the channel ended before the relay reported the script's exit (the
        # sandbox or the connection to it went away), or None.
        self.lost: str | None = None
        # Whether the relay reported it removed the run's stage (``--remove-after``).
        self.stage_removed = False
        self._tasks: anyio.abc.TaskGroup | None = None
        self._context: AbstractAsyncContextManager[RelaySession]

    async def __aenter__(self) -> RelaySession:
        self._context = self._serve()
        return await self._context.__aenter__()

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        return await self._context.__aexit__(*exc_info)

    @asynccontextmanager
    async def _serve(self) -> AsyncIterator[RelaySession]:
        try:
            async with anyio.create_task_group() as tasks:
                self._tasks = tasks
                self._on_loop = self._writer.on_loop = _OnLoop()
                tasks.start_soon(self._writer.run)
                tasks.start_soon(self._demultiplex)
                try:
                    yield self
                finally:
                    try:
                        with anyio.CancelScope(shield=True):
                            if not self._exited.is_set():
                                await self.kill(0)
                        await self._server.drain()
                        if self._exited.is_set() and self.lost is None:
                            # The relay leaves right after its exit report: the run
                            # ends when it has (nothing of it running), not before.
                            with anyio.CancelScope(shield=True):
                                with anyio.move_on_after(RELAY_END_SECONDS):
                                    await self._channel_ended.wait()
                                    if self._relay_reaped is not None:
                                        await self._relay_reaped()
                    finally:
                        tasks.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._channel.aclose()
                for sink in self._sinks.values():
                    sink.close()
                await self.stdout.aclose()
                await self.stderr.aclose()

    async def start(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None,
        socket_path: str | None,
        stdin_path: str | None = None,
    ) -> None:
        """Ask the relay to start the script, its stdin read from ``stdin_path`` (a
        file in the sandbox) or closed; raise RelayError if it cannot."""
        self._writer.put(
            {
                "op": "run",
                "argv": list(argv),
                "env": dict(env),
                "cwd": cwd,
                "socket": socket_path,
                "stdin": stdin_path,
            }
        )
        with anyio.fail_after(30):
            await self._started.wait()
        if self.pid is None:
            raise RelayError(self.error or "the relay did not start the script")

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.exit_code is not None
        return self.exit_code

    async def kill(self, grace: float = 2.0) -> None:
        """Have the relay kill the script's whole tree; wait until it reports the exit.

        The kill is written before anything else queued. If it cannot be written within
        :data:`KILL_DEADLINE` (the relay stopped reading), or the relay does not report
        the exit within ``grace`` + :data:`KILL_DEADLINE`, the relay is killed with its
        tree (``kill_relay_tree``) and the channel is closed: a relay that still runs
        kills everything when its input ends, and the backend closes what is left.
        """
        if self._exited.is_set():
            return
        try:
            written = self._writer.put_first({"op": "kill", "grace": grace})
        except anyio.BrokenResourceError:
            self._mark_exit(-9, "the relay channel broke")
            return
        with anyio.move_on_after(KILL_DEADLINE):
            await written.wait()
        if written.is_set():
            with anyio.move_on_after(grace + KILL_DEADLINE):
                await self._exited.wait()
        if not self._exited.is_set():
            self._mark_exit(-9, "the relay did not report the script's exit after a kill")
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                if self._kill_relay_tree is not None and self.relay_pid is not None:
                    await self._kill_relay_tree(self.relay_pid)
                await self._channel.aclose()

    async def aclose(self) -> None:
        await self.kill(0)

    def _mark_exit(self, code: int, error: str | None = None) -> None:
        with self._lock:
            self._mark_exit_locked(code, error)

    def _mark_exit_locked(self, code: int, error: str | None) -> None:
        if self._exited.is_set():
            return
        if error and not self.error:
            self.error = error
        self.exit_code = code
        self._started.set()
        self._exited.set()
        for sink in self._sinks.values():
            sink.close()
        for connection in self._connections.values():
            connection.forget()
        self._connections.clear()

    async def _demultiplex(self) -> None:
        assert self._tasks is not None
        try:
            if not await self._serve_in_loop():
                async for message in iter_messages(self._channel, self._max_frame_size):
                    if message.get("op") == "rpc":
                        with self._lock:
                            self._feed_rpc(message)
                    else:
                        await self._dispatch(message)
        except (FrameError, ConnectionClosed) as exc:
            self._mark_lost(f"the relay channel broke: {exc}")
        finally:
            self._channel_ended.set()
            self._mark_lost("the relay went away before the script's exit")

    async def _serve_in_loop(self) -> bool:
        """Read the channel where it calls back with its bytes (``read_in_loop``:
        docker's exec socket from the event loop's reader callback, ssh's channel from
        paramiko's transport thread): a script's request is then answered, when it can
        be at once, in the callback that read it, with no task woken. Every other
        message, and what follows one, is queued in order for this task; past
        :data:`_HELD_MESSAGES` the channel is paused until the queue drains (the
        output's backpressure). A held message leaves the queue once acted on, so a
        call behind an ``open`` finds its connection. False if the channel cannot."""
        if not hasattr(self._channel, "read_in_loop"):
            return False
        channel = cast(_LoopReadChannel, self._channel)
        decoder = FrameDecoder(self._max_frame_size)
        held: deque[dict[str, Any]] = deque()
        ended: list[BaseException | None] = []
        wake = [anyio.Event()]
        paused = False
        lock, on_loop = self._lock, self._on_loop

        def on_data(data: bytes) -> None:
            nonlocal paused
            with lock:
                if ended:
                    return
                try:
                    for message in decoder.feed(data):
                        if not held and message.get("op") == "rpc":
                            self._feed_rpc(message)
                        else:
                            held.append(message)
                except BaseException as exc:  # raised in this task, not lost in a callback
                    ended.append(exc)
                    channel.stop_reading()
                    on_loop(wake[0].set)
                    return
                if held:
                    if len(held) >= _HELD_MESSAGES and not paused:
                        paused = True
                        channel.pause_reading()
                    on_loop(wake[0].set)

        def on_end(exc: Exception | None) -> None:
            with lock:
                ended.append(None)
                wake[0].set()

        if not channel.read_in_loop(on_data, on_end):
            return False
        try:
            while True:
                with lock:
                    message = held[0] if held else None
                    if message is not None and message.get("op") == "rpc":
                        self._feed_rpc(message)
                        held.popleft()
                        continue
                    if message is None:
                        if ended:
                            if ended[0] is not None:
                                raise ended[0]
                            if decoder.inside_frame:
                                raise ConnectionClosed("stream ended inside a frame")
                            return True
                        if paused:
                            paused = False
                            channel.resume_reading()
                        wake[0] = woken = anyio.Event()
                if message is None:
                    await woken.wait()
                    continue
                await self._dispatch(message)
                with lock:
                    held.popleft()
        finally:
            channel.stop_reading()

    def _feed_rpc(self, message: dict[str, Any]) -> None:
        connection = self._connections.get(message.get("conn", -1))
        if connection is not None:
            connection.feed(message.get("data") or b"")
            if connection.closed:
                self._connections.pop(connection.conn_id, None)

    async def _dispatch(self, message: dict[str, Any]) -> None:
        """Act on one message from the relay other than ``rpc``."""
        if message.get("op") == "out":
            sink = self._sinks.get(message.get("fd", 1))
            if sink is not None:
                try:
                    await sink.send(message.get("data") or b"")
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    pass
        else:
            with self._lock:
                self._act(message)

    def _act(self, message: dict[str, Any]) -> None:
        """Act on one message from the relay other than ``rpc`` and ``out`` (under the
        lock, on the loop's thread)."""
        op = message.get("op")
        if op == "open":
            self._open(int(message["conn"]))
        elif op == "eof":
            connection = self._connections.get(message.get("conn", -1))
            if connection is not None:
                connection.end_of_input()
                if connection.closed:
                    self._connections.pop(connection.conn_id, None)
        elif op == "close":
            connection = self._connections.pop(message.get("conn", -1), None)
            if connection is not None:
                connection.forget()
        elif op == "started":
            self.pid = int(message.get("pid", 0)) or None
            self.relay_pid = int(message.get("relay_pid", 0)) or None
            self._started.set()
        elif op == "exit":
            self.stage_removed = message.get("removed") is True
            self._mark_exit(int(message.get("code", 1)))
        elif op == "error":
            self.error = str(message.get("message"))

    def _mark_lost(self, error: str) -> None:
        if self._exited.is_set():
            return
        tail = getattr(self._channel, "stderr_tail", b"").decode("utf-8", "replace").strip()
        self.lost = error + (f": {tail[-500:]}" if tail else "")
        self._mark_exit(LOST_EXIT_CODE, self.lost)

    def _open(self, conn_id: int) -> None:
        assert self._tasks is not None
        if not self._server.admit_connection():
            refusal = encode_frame(self._server.TOO_MANY_CONNECTIONS)
            self._writer.put({"op": "rpc", "conn": conn_id, "data": refusal})
            self._writer.put({"op": "close", "conn": conn_id})
            return
        self._connections[conn_id] = _RelayedConnection(
            conn_id, self._server, self._writer, self._tasks, self._lock, self._on_loop
        )
