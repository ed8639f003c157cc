"""The host side of the protocol: read requests from a byte stream, answer each one.

:class:`RPCServer` is transport-agnostic: it serves any anyio byte stream, whether it
came from a Unix-socket listener (:mod:`rpc.unix`) or, later, a relay channel. Every
request is answered exactly once; requests on one connection are served concurrently,
each in its own task, and their replies are written whole, one at a time, as they finish.
What a request *does* is the handler's business: the server checks framing, shape and
the run's token, and turns a :class:`~rpc.errors.CallRefused` from the handler into an
error reply.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc

from rpc import messages
from rpc.errors import CallRefused, ConnectionClosed, FrameError, FrameTooLarge
from rpc.framing import DEFAULT_MAX_FRAME_SIZE, encode_frame, iter_messages
from rpc.messages import Request

log = logging.getLogger(__name__)

RequestHandler = Callable[[Request], Awaitable[str]]
"""Serves one authorized request: returns the tool's result as JSON text, or raises
:class:`~rpc.errors.CallRefused` to send an error reply."""

DEFAULT_MAX_CONNECTIONS = 64


class RPCServer:
    """Answers the requests of one run.

    ``token`` is the run's secret; a request whose token differs (compared in constant
    time) gets an ``unauthorized`` error. An empty server token refuses everything.
    """

    def __init__(
        self,
        handler: RequestHandler,
        *,
        token: str,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        self._handler = handler
        self._token = token.encode()
        self.max_frame_size = max_frame_size
        self.max_connections = max_connections
        self._connections = 0

    def _authorized(self, token: str) -> bool:
        if not self._token:
            return False
        return hmac.compare_digest(token.encode("utf-8", "surrogatepass"), self._token)

    async def serve(self, stream: anyio.abc.ByteStream) -> None:
        """Serve one connection until the peer closes it or breaks the framing.

        Never raises for anything the peer does; closes ``stream`` when done.
        """
        async with stream:
            if self._connections >= self.max_connections:
                log.warning("refusing RPC connection: %d already open", self._connections)
                await _send_quietly(
                    stream,
                    messages.error_reply(
                        None, messages.INTERNAL, "too many connections to the host"
                    ),
                )
                return
            self._connections += 1
            try:
                await self._serve(stream)
            finally:
                self._connections -= 1

    async def _serve(self, stream: anyio.abc.ByteStream) -> None:
        send_lock = anyio.Lock()

        async def reply(message: dict[str, Any]) -> None:
            frame = encode_frame(message)
            async with send_lock:
                await _send_quietly(stream, frame)

        refusal: dict[str, Any] | None = None
        async with anyio.create_task_group() as tasks:
            try:
                async for message in iter_messages(stream, self.max_frame_size):
                    tasks.start_soon(self._answer, message, reply)
            except FrameTooLarge as exc:
                refusal = messages.error_reply(None, messages.FRAME_TOO_LARGE, str(exc))
                tasks.cancel_scope.cancel()
            except FrameError as exc:
                refusal = messages.error_reply(None, messages.BAD_FRAME, str(exc))
                tasks.cancel_scope.cancel()
            except ConnectionClosed:
                tasks.cancel_scope.cancel()
            # On a clean end of stream the peer may have only shut its writing side:
            # let the calls in flight finish and answer.
        if refusal is not None:
            # Sent outside the cancelled group, or the cancellation would swallow it.
            with anyio.move_on_after(5):
                await reply(refusal)

    async def _answer(
        self, message: dict[str, Any], reply: Callable[[dict[str, Any]], Awaitable[None]]
    ) -> None:
        request_id = messages.request_id_of(message)
        try:
            request = Request.from_message(message)
            if not self._authorized(request.token):
                raise CallRefused(messages.UNAUTHORIZED, "Unauthorized RPC request: bad token")
            result = await self._handler(request)
        except CallRefused as exc:
            await reply(messages.error_reply(request_id, exc.kind, exc.message))
        except Exception as exc:
            log.exception("RPC handler failed on %r", message.get("tool"))
            await reply(
                messages.error_reply(
                    request_id, messages.INTERNAL, f"host error: {type(exc).__name__}: {exc}"
                )
            )
        else:
            await reply(messages.result_reply(request.id, result))


async def _send_quietly(stream: anyio.abc.ByteSendStream, data: Any) -> None:
    """Send, ignoring a peer that has gone: there is no one left to tell."""
    if isinstance(data, dict):
        data = encode_frame(data)
    try:
        await stream.send(data)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass
