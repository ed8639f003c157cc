"""The host side of the protocol: read requests, answer each one exactly once.

:class:`RPCServer` holds what a run's requests are checked against (framing, shape,
the run's token) and the handler that does the work. It serves connections two ways:

- :meth:`RPCServer.serve` takes any anyio byte stream: a Unix socket on any anyio
  backend, a relay channel, an in-memory stream in tests.
- :class:`RPCProtocol` is the same server as an ``asyncio.Protocol``, for sockets on
  the asyncio backend: frames are decoded as the bytes arrive, and a request that can
  be answered at once is answered from that callback, without waking a task. This is
  the fast path that makes a trivial call cost little more than its two syscalls
  (docs/benchmarks.md).

Either way, requests on one connection are served concurrently, each slow one in its
own task, and each reply is written whole as soon as it is ready. What a request
*does* is the handler's business; a :class:`~rpc.errors.CallRefused` from it becomes
an error reply.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from hermes_sandbox import threads
from hermes_sandbox.rpc import messages
from hermes_sandbox.rpc.errors import CallRefused, FrameError, FrameTooLarge
from hermes_sandbox.rpc.framing import (
    DEFAULT_MAX_FRAME_SIZE,
    HEADER_SIZE,
    FrameSplitter,
    encode_frame,
)
from hermes_sandbox.rpc.messages import Envelope, Request

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 64
# Unfinished frames a run's connections may hold at once, in frames of the cap.
BUFFERED_FRAMES = 4
_RECEIVE_CHUNK = 256 * 1024
# How long a connection refused for its framing is kept half-open to deliver the refusal.
LINGER_SECONDS = 2.0
Reply = dict[str, Any]


class RequestHandler(Protocol):
    """Serves authorized requests.

    ``handler(request)`` returns the tool's result as JSON text, or raises
    :class:`~rpc.errors.CallRefused` to send an error reply. A handler may also have a
    synchronous ``answer_now(request) -> str | None``, which the server tries first: it
    returns the result when it can be had without waiting (refusals, tools that never
    block), or None to have ``handler(request)`` called in a task.
    """

    def __call__(self, request: Request) -> Awaitable[str]: ...


class RPCServer:
    """Answers the requests of one run.

    ``token`` is the run's secret; a request whose token differs (compared in constant
    time) gets an ``unauthorized`` error, and its arguments are never decoded. An empty
    server token refuses everything. ``max_buffered_bytes`` caps the bytes of
    unfinished frames held across all the run's connections at once.
    """

    def __init__(
        self,
        handler: RequestHandler,
        *,
        token: str,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_buffered_bytes: int | None = None,
    ) -> None:
        self._handler = handler
        self._answer_now: Callable[[Request], str | None] | None = getattr(
            handler, "answer_now", None
        )
        self._token = token.encode()
        self.max_frame_size = max_frame_size
        self.max_connections = max_connections
        self.max_buffered_bytes = (
            max_buffered_bytes
            if max_buffered_bytes is not None
            else BUFFERED_FRAMES * max_frame_size
        )
        self.connections = 0
        self.buffered = 0  # bytes of unfinished frames held by all connections
        self._calls = 0  # requests whose handler is running (reply_later)
        self._idle: anyio.Event | None = None  # set when they are done, or abandoned
        self._abandoned = False

    # -- one request -------------------------------------------------------------------

    def receive(self, body: bytes) -> Request | Reply:
        """The request in one frame body, or the error reply refusing it.

        The token is checked before the arguments are decoded. Raises
        :class:`FrameError` for a body that is not a valid msgpack map: the caller
        answers with :meth:`framing_refusal` and closes the connection.
        """
        envelope = Envelope.parse(body)
        try:
            return envelope.request(self._token)
        except CallRefused as exc:
            return messages.error_reply(envelope.reply_id, exc.kind, exc.message)

    def reply_now(self, request: Request) -> Reply | None:
        """The reply to ``request`` if it can be made without waiting, else None."""
        if self._answer_now is None:
            return None
        try:
            result = self._answer_now(request)
        except CallRefused as exc:
            return messages.error_reply(request.id, exc.kind, exc.message)
        except Exception as exc:
            return _internal_error(request, exc)
        return None if result is None else messages.result_reply(request.id, result)

    async def reply_later(self, request: Request) -> Reply:
        """The reply to ``request``, waiting for its tool as long as it takes (the
        transport cancels it after :meth:`drain` when the run ends)."""
        self._calls += 1
        try:
            result = await self._handler(request)
        except CallRefused as exc:
            return messages.error_reply(request.id, exc.kind, exc.message)
        except Exception as exc:
            return _internal_error(request, exc)
        finally:
            self._calls -= 1
            if not self._calls and self._idle is not None:
                self._idle.set()
        return messages.result_reply(request.id, result)

    async def drain(self) -> None:
        """Wait for the calls in flight to answer, at most
        :data:`~hermes_sandbox.threads.TOOL_CALL_DRAIN_SECONDS`, and not at all after
        :meth:`abandon`.

        Every transport calls it when the run ends, then cancels what is still running:
        an async tool is cancelled, a sync tool's thread abandoned (it cannot be
        stopped). So a tool that blocks holds a run past its end by this bound at most.
        """
        if self._abandoned or not self._calls:
            return
        self._idle = anyio.Event()
        with anyio.move_on_after(threads.TOOL_CALL_DRAIN_SECONDS):
            await self._idle.wait()

    def abandon(self) -> None:
        """Make :meth:`drain` wait no more (the run was interrupted: end it now)."""
        self._abandoned = True
        if self._idle is not None:
            self._idle.set()

    @staticmethod
    def framing_refusal(exc: FrameError) -> Reply:
        kind = messages.FRAME_TOO_LARGE if isinstance(exc, FrameTooLarge) else messages.BAD_FRAME
        return messages.error_reply(None, kind, str(exc))

    TOO_MANY_CONNECTIONS = messages.error_reply(
        None, messages.INTERNAL, "too many connections to the host"
    )

    def admit_connection(self) -> bool:
        if self.connections >= self.max_connections:
            log.warning("refusing RPC connection: %d already open", self.connections)
            return False
        self.connections += 1
        return True

    # -- a connection as an anyio byte stream -------------------------------------------

    async def serve(self, stream: anyio.abc.ByteStream) -> None:
        """Serve one connection until the peer closes it or breaks the framing.

        Never raises for anything the peer does; closes ``stream`` when done.
        """
        async with stream:
            if not self.admit_connection():
                await _send_quietly(stream, encode_frame(self.TOO_MANY_CONNECTIONS))
                return
            reader = RequestReader(self)
            try:
                await self._serve(stream, reader)
            finally:
                reader.close()
                self.connections -= 1

    async def _serve(self, stream: anyio.abc.ByteStream, reader: RequestReader) -> None:
        send_lock = anyio.Lock(fast_acquire=True)

        async def send(reply: Reply) -> None:
            frame = encode_frame(reply)
            async with send_lock:
                await _send_quietly(stream, frame)

        async def answer(request: Request) -> None:
            await send(await self.reply_later(request))

        refusal: Reply | None = None
        async with anyio.create_task_group() as tasks:
            try:
                while True:
                    try:
                        data = await stream.receive(_RECEIVE_CHUNK)
                    except (
                        anyio.EndOfStream,
                        anyio.BrokenResourceError,
                        anyio.ClosedResourceError,
                    ):
                        if reader.inside_frame:
                            tasks.cancel_scope.cancel()
                        # On a clean end the peer may have only shut its writing side:
                        # let the calls in flight finish and answer.
                        break
                    for item in reader.feed(data):
                        if isinstance(item, Request):
                            quick = self.reply_now(item)
                            if quick is None:
                                tasks.start_soon(answer, item)
                                continue
                            item = quick
                        await send(item)
            except FrameError as exc:
                refusal = self.framing_refusal(exc)
                tasks.cancel_scope.cancel()
        if refusal is not None:
            # Sent outside the cancelled group, or the cancellation would swallow it.
            with anyio.move_on_after(5):
                await send(refusal)


class _RunBufferFull(FrameTooLarge):
    """The run's connections together hold more unfinished frames than its cap."""

    def __init__(self, held: int, limit: int) -> None:
        FrameError.__init__(
            self,
            f"the run's connections hold {held} bytes of unfinished frames, over the run's "
            f"{limit}-byte cap; send large requests one at a time",
        )
        self.size = held
        self.limit = limit


class RequestReader:
    """The requests arriving on one connection, from its bytes (sans-I/O).

    :meth:`feed` returns, in order, each whole request (:class:`Request`, token
    checked) or the error reply refusing it; it raises :class:`FrameError` when the
    stream breaks its framing, or when the bytes of unfinished frames held by all the
    run's connections pass the server's ``max_buffered_bytes``. Call :meth:`close`
    when the connection ends, to release what it held.
    """

    __slots__ = ("_held", "_server", "_splitter")

    def __init__(self, server: RPCServer) -> None:
        self._server = server
        self._splitter = FrameSplitter(server.max_frame_size)
        self._held = 0

    @property
    def inside_frame(self) -> bool:
        return self._splitter.inside_frame

    def feed(self, data: bytes) -> list[Request | Reply]:
        try:
            bodies = self._splitter.feed(data)
        finally:
            held = self._splitter.pending
            server = self._server
            server.buffered += held - self._held
            self._held = held
        if held and server.buffered > server.max_buffered_bytes:
            raise _RunBufferFull(server.buffered, server.max_buffered_bytes)
        return [server.receive(body) for body in bodies]

    def close(self) -> None:
        self._server.buffered -= self._held
        self._held = 0


class RPCProtocol(asyncio.Protocol):
    """One connection of an :class:`RPCServer`, driven by asyncio's callbacks.

    Requests that can be answered at once are answered in :meth:`data_received`;
    the others go to :meth:`run`, a task the transport's owner runs for the life of
    the connection, which serves each in a task of its own.
    """

    def __init__(self, server: RPCServer) -> None:
        self._server = server
        self._reader = RequestReader(server)
        self._transport: asyncio.Transport | None = None
        self._pending_send: MemoryObjectSendStream[Request]
        self._pending: MemoryObjectReceiveStream[Request]
        self._pending_send, self._pending = anyio.create_memory_object_stream(float("inf"))
        self._lost = anyio.Event()
        self._admitted = False
        # After a framing refusal: how many more bytes are read and dropped before the
        # connection is closed, or None while it is served.
        self._discard: int | None = None

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        if self._server.admit_connection():
            self._admitted = True
        else:
            self._write(self._server.TOO_MANY_CONNECTIONS)
            self._finish()

    def data_received(self, data: bytes) -> None:
        if self._lost.is_set():
            return
        if self._discard is not None:
            self._discard -= len(data)
            if self._discard <= 0:
                self._finish()
            return
        try:
            for item in self._reader.feed(data):
                if isinstance(item, Request):
                    reply = self._server.reply_now(item)
                    if reply is None:
                        self._pending_send.send_nowait(item)
                        continue
                    item = reply
                self._write(item)
        except FrameError as exc:
            self._write(self._server.framing_refusal(exc))
            self._linger()

    def _linger(self) -> None:
        """Close after a refusal without losing it: closing a socket that still has
        unread input resets it, and the peer, still sending the refused frame, would get
        ECONNRESET instead of the reply. So end our side, read and drop a bounded amount
        (what the refused frame may still send) for at most LINGER_SECONDS, then close."""
        assert self._transport is not None
        self._reader.close()
        self._discard = self._server.max_frame_size + HEADER_SIZE
        if self._transport.can_write_eof():
            self._transport.write_eof()
        asyncio.get_running_loop().call_later(LINGER_SECONDS, self._finish)

    def eof_received(self) -> bool:
        if self._discard is not None:
            self._finish()
            return False
        # The peer may have shut only its writing side: answer what is in flight.
        self._pending_send.close()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish()

    def pause_writing(self) -> None:
        assert self._transport is not None
        self._transport.pause_reading()  # a peer that does not read gets no more served

    def resume_writing(self) -> None:
        assert self._transport is not None
        if not self._transport.is_closing():
            self._transport.resume_reading()

    # helpers
    def _write(self, reply: Reply) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(encode_frame(reply))

    def _finish(self) -> None:
        self._pending_send.close()
        self._reader.close()
        self._lost.set()

    async def run(self) -> None:
        """Serve the requests that need waiting, until the connection ends.

        After the peer's end of input the calls in flight still finish and answer; a
        lost connection or broken framing abandons them.
        """
        assert self._transport is not None
        try:
            async with anyio.create_task_group() as connection:

                async def abandon_when_lost() -> None:
                    await self._lost.wait()
                    connection.cancel_scope.cancel()

                async def answer(request: Request) -> None:
                    self._write(await self._server.reply_later(request))

                connection.start_soon(abandon_when_lost)
                async with anyio.create_task_group() as calls:
                    async for request in self._pending:
                        calls.start_soon(answer, request)
                connection.cancel_scope.cancel()
        finally:
            self._pending.close()
            self._reader.close()
            if self._admitted:
                self._server.connections -= 1
            self._transport.close()


def _internal_error(request: Request, exc: Exception) -> Reply:
    log.exception("RPC handler failed on %r", request.tool)
    return messages.error_reply(
        request.id,
        messages.INTERNAL,
        f"host error: {type(exc).__name__}: {exc}",
    )


async def _send_quietly(stream: anyio.abc.ByteSendStream, data: bytes) -> None:
    """Send, ignoring a peer that has gone: there is no one left to tell."""
    try:
        await stream.send(data)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass
