"""The host side of the protocol: read requests, answer each one exactly once.

:class:`RPCServer` holds what a run's requests are checked against (framing, shape,
the run's token) and the handler that does the work, and it alone decides what each
request gets (:meth:`RPCServer.take`): a frame body is parsed and authenticated once,
then answered at once when that cannot block (a refusal, an ``inline`` tool), else
handed back as the :class:`Request` for the transport to answer later, on a thread
that may block (:meth:`RPCServer.reply_blocking`, a sync tool) or on the event loop
(:meth:`RPCServer.reply_later`, an async tool). Every transport reads through a
:class:`RequestReader` and follows that one decision:

- the Unix socket (rpc/unix.py) serves each connection with blocking reads in
  threads, leader/followers: a sync tool runs on the thread that read its request;
- :meth:`RPCServer.serve` takes any anyio byte stream (the generic path: tests,
  in-memory streams), each slow request in a task of its own;
- the relay (rpc/relay.py) and the files transport (rpc/files.py) feed it the bytes
  they carry.

Requests on one connection are served concurrently, and each reply is written whole
as soon as it is ready. What a request *does* is the handler's business; a
:class:`~rpc.errors.CallRefused` from it becomes an error reply.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
import anyio.abc

from hermes_sandbox import threads
from hermes_sandbox.rpc import messages
from hermes_sandbox.rpc.errors import CallRefused, FrameError, FrameTooLarge
from hermes_sandbox.rpc.framing import (
    DEFAULT_MAX_FRAME_SIZE,
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
    :class:`~rpc.errors.CallRefused` to send an error reply. A handler may also have:

    - ``answer_now(request) -> str | None``, which the server tries first: it returns
      the result when it can be had without waiting (refusals, tools that never
      block), or None to have the request answered later;
    - ``answer_blocking(request) -> str | None``, called on a worker thread (never the
      event loop) by transports that serve in threads: it returns the result, blocking
      as long as the tool does, or None when the call needs the event loop (an async
      tool), which then gets ``handler(request)``.
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
        max_threads: int = 4 * threads.TOOL_THREADS,
    ) -> None:
        self._handler = handler
        self._answer_now: Callable[[Request], str | None] | None = getattr(
            handler, "answer_now", None
        )
        self._answer_blocking: Callable[[Request], str | None] | None = getattr(
            handler, "answer_blocking", None
        )
        self._token = token.encode()
        self._token_text = token
        self._token_suffix = messages.token_suffix(self._token)
        self.max_frame_size = max_frame_size
        self.max_connections = max_connections
        self.max_buffered_bytes = (
            max_buffered_bytes
            if max_buffered_bytes is not None
            else BUFFERED_FRAMES * max_frame_size
        )
        # Threads a threaded transport may start for this run beyond one per connection.
        self.thread_slots = threading.BoundedSemaphore(max_threads)
        # Guards the counts below: transports that serve in threads update them too.
        self._lock = threading.Lock()
        self.connections = 0
        self.buffered = 0  # bytes of unfinished frames held by all connections
        self._calls = 0  # requests whose handler is running (reply_blocking, reply_later)
        self._idle: anyio.Event | None = None  # set when they are done, or abandoned
        self._wake: Callable[[Callable[[], object]], bool] = _ignore
        self._abandoned = False

    # -- one request -------------------------------------------------------------------

    def receive(self, body: bytes) -> Request | Reply:
        """The request in one frame body, or the error reply refusing it.

        The token is checked before the arguments are decoded. Raises
        :class:`FrameError` for a body that is not a valid msgpack map: the caller
        answers with :meth:`framing_refusal` and closes the connection.
        """
        request = messages.quick_request(body, self._token_suffix, self._token_text)
        if request is not None:
            return request
        envelope = Envelope.parse(body)
        try:
            return envelope.request(self._token)
        except CallRefused as exc:
            return messages.error_reply(envelope.reply_id, exc.kind, exc.message)

    def take(self, body: bytes) -> Request | Reply:
        """What one frame body gets, parsed and authenticated once: the reply when it
        can be made now (a refusal, a tool that never blocks), else the
        :class:`Request`, token checked, for the transport to answer with
        :meth:`reply_blocking` on a thread or :meth:`reply_later` on the loop.

        Raises :class:`FrameError` like :meth:`receive`.
        """
        item = self.receive(body)
        if isinstance(item, Request):
            reply = self.reply_now(item)
            if reply is not None:
                return reply
        return item

    def reply_now(self, request: Request) -> Reply | None:
        """The reply to ``request`` if it can be made without waiting, else None."""
        if self._answer_now is None:
            return None
        return self._reply(self._answer_now, request)

    def reply_blocking(self, request: Request) -> Reply | None:
        """The reply to ``request``, made on this thread, which blocks as long as the
        tool does; None when the call needs the event loop (:meth:`reply_later`).
        Call it from a worker thread, never from the event loop."""
        answer = self._answer_blocking
        if answer is None:
            return None
        # _begin_call and _reply written out: this is every plain call's path.
        with self._lock:
            self._calls += 1
        try:
            result = answer(request)
        except CallRefused as exc:
            return messages.error_reply(request.id, exc.kind, exc.message)
        except Exception as exc:
            return _internal_error(request, exc)
        finally:
            self._end_call()
        return None if result is None else {"id": request.id, "result": result}

    async def reply_later(self, request: Request) -> Reply:
        """The reply to ``request``, waiting for its tool as long as it takes (the
        transport cancels it after :meth:`drain` when the run ends)."""
        self._begin_call()
        try:
            result = await self._handler(request)
        except CallRefused as exc:
            return messages.error_reply(request.id, exc.kind, exc.message)
        except Exception as exc:
            return _internal_error(request, exc)
        finally:
            self._end_call()
        return messages.result_reply(request.id, result)

    @staticmethod
    def _reply(answer: Callable[[Request], str | None], request: Request) -> Reply | None:
        try:
            result = answer(request)
        except CallRefused as exc:
            return messages.error_reply(request.id, exc.kind, exc.message)
        except Exception as exc:
            return _internal_error(request, exc)
        return None if result is None else messages.result_reply(request.id, result)

    def _begin_call(self) -> None:
        with self._lock:
            self._calls += 1

    def _end_call(self) -> None:
        with self._lock:
            self._calls -= 1
            idle = self._idle if not self._calls else None
        if idle is not None:
            self._wake(idle.set)

    async def drain(self) -> None:
        """Wait for the calls in flight to answer, at most
        :data:`~hermes_sandbox.threads.TOOL_CALL_DRAIN_SECONDS`, and not at all after
        :meth:`abandon`.

        Every transport calls it when the run ends, then cancels what is still running:
        an async tool is cancelled, a sync tool's thread abandoned (it cannot be
        stopped). So a tool that blocks holds a run past its end by this bound at most.
        """
        with self._lock:
            if self._abandoned or not self._calls:
                return
            idle = self._idle = anyio.Event()
            self._wake = loop_caller()
        with anyio.move_on_after(threads.TOOL_CALL_DRAIN_SECONDS):
            await idle.wait()

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
        with self._lock:
            if self.connections < self.max_connections:
                self.connections += 1
                return True
        log.warning("refusing RPC connection: %d already open", self.connections)
        return False

    def release_connection(self) -> None:
        with self._lock:
            self.connections -= 1

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
                self.release_connection()

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
                            tasks.start_soon(answer, item)
                        else:
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

    :meth:`feed` returns, in order, what :meth:`RPCServer.take` made of each whole
    frame: the reply to send now, or the :class:`Request` (token checked) to answer
    later; it raises :class:`FrameError` when the
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
        server = self._server
        try:
            bodies = self._splitter.feed(data)
        finally:
            held = self._splitter.pending
            grown = held > self._held
            if held != self._held:  # whole frames, the common case, change nothing
                with server._lock:
                    server.buffered += held - self._held
                    buffered = server.buffered
                self._held = held
        # The run's cap is checked by the connection whose unfinished frame grew.
        if grown and buffered > server.max_buffered_bytes:
            raise _RunBufferFull(buffered, server.max_buffered_bytes)
        return [server.take(body) for body in bodies]

    def close(self) -> None:
        with self._server._lock:
            self._server.buffered -= self._held
        self._held = 0


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


def _ignore(call: Callable[[], object]) -> bool:
    return False


def loop_caller() -> Callable[[Callable[[], object]], bool]:
    """A function that has the running event loop call ``f()`` soon, from any thread,
    without waiting for it; it returns False (and drops ``f``) once that loop is gone.
    Call this from the loop (asyncio or trio)."""
    try:
        schedule: Callable[[Callable[[], object]], object] = (
            asyncio.get_running_loop().call_soon_threadsafe
        )
    except RuntimeError:  # trio
        import trio

        schedule = trio.lowlevel.current_trio_token().run_sync_soon

    def call_soon(f: Callable[[], object]) -> bool:
        try:
            schedule(f)
        except RuntimeError:  # the loop is closed (trio: RunFinishedError)
            return False
        return True

    return call_soon
