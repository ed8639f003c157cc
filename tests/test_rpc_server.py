"""Tests for rpc/server.py and rpc/unix.py: a real RPCServer on a real Unix socket.

The client is a plain blocking socket speaking the wire format by hand (struct and
msgpack, no code from rpc/), driven from a worker thread so the server keeps running in
the test's event loop. Every reply is checked whole: its keys, its id, its error kind.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import stat
import struct
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import msgpack
import pytest

from hermes_sandbox.gate import ToolCallBudget, ToolGate
from hermes_sandbox.rpc import unix as rpc_unix
from hermes_sandbox.rpc.errors import CallRefused
from hermes_sandbox.rpc.messages import Request
from hermes_sandbox.rpc.server import DEFAULT_MAX_CONNECTIONS, RPCServer
from hermes_sandbox.rpc.unix import serve_unix_socket
from hermes_sandbox.tools.registry import ToolContext, ToolRegistry

TOKEN = "s3cret-token"
GiB = 2**30
# Long enough for a slow CI machine, short enough that a hang fails the test quickly.
REPLY_TIMEOUT = 5.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def socket_dir(short_dir: Path) -> str:
    return str(short_dir)  # a socket's path in it stays under the 107-byte limit


# -- the wire, by hand --------------------------------------------------------------


def frame(message: Any) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def request(request_id: Any, tool: str = "echo", args: Any = None, token: Any = TOKEN) -> bytes:
    message: dict[str, Any] = {"id": request_id, "tool": tool, "args": args or {}}
    if token is not None:
        message["token"] = token
    return frame(message)


class RawClient:
    """A blocking Unix-socket client; the tests call it through ``anyio.to_thread``."""

    def __init__(self, path: str, timeout: float = REPLY_TIMEOUT) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(path)
        except OSError:
            self.sock.close()
            raise
        self._buffer = b""

    def _read_exactly(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError(f"the host closed the connection ({len(self._buffer)}/{n} bytes)")
            self._buffer += chunk
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def read_reply(self) -> dict[str, Any]:
        (size,) = struct.unpack(">I", self._read_exactly(4))
        reply = msgpack.unpackb(self._read_exactly(size), raw=False, strict_map_key=False)
        assert isinstance(reply, dict), reply
        return reply

    def read_closed(self) -> bytes:
        """What the socket gives once the host has closed it: b"" for a clean close."""
        assert not self._buffer, f"unread bytes before the close: {self._buffer!r}"
        return self.sock.recv(65536)

    def close(self) -> None:
        self.sock.close()

    # async faces, so a test never blocks the event loop the server runs in

    @classmethod
    async def open(cls, path: str, timeout: float = REPLY_TIMEOUT) -> RawClient:
        return await anyio.to_thread.run_sync(cls, path, timeout)

    async def send(self, data: bytes) -> None:
        await anyio.to_thread.run_sync(self.sock.sendall, data)

    async def reply(self) -> dict[str, Any]:
        return await anyio.to_thread.run_sync(self.read_reply)

    async def replies(self, count: int) -> list[dict[str, Any]]:
        return await anyio.to_thread.run_sync(lambda: [self.read_reply() for _ in range(count)])

    async def call(self, data: bytes) -> dict[str, Any]:
        await self.send(data)
        return await self.reply()

    async def closed(self) -> bytes:
        return await anyio.to_thread.run_sync(self.read_closed)


@asynccontextmanager
async def raw_client(path: str, timeout: float = REPLY_TIMEOUT) -> AsyncIterator[RawClient]:
    client = await RawClient.open(path, timeout)
    try:
        yield client
    finally:
        client.close()


# -- handlers -----------------------------------------------------------------------


class TestHandler:
    """A small real handler: echo, slow (sleeps ``seconds``), boom (fails), else unknown."""

    __test__ = False  # not a test class, despite the name

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.started = anyio.Event()
        self.finished = anyio.Event()

    async def __call__(self, request: Request) -> str:
        self.requests.append(request)
        if request.tool == "echo":
            return json.dumps(request.args)
        if request.tool == "slow":
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.started.set()
            try:
                await anyio.sleep(float(request.args.get("seconds", 0.5)))
            finally:
                self.in_flight -= 1
                self.finished.set()
            return json.dumps(request.args)
        if request.tool == "boom":
            raise RuntimeError("the tool blew up")
        raise CallRefused("unknown_tool", f"Unknown tool: {request.tool}")


@pytest.fixture(autouse=True, params=["protocol", "stream"])
def connection_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run every test over both ways the server reads a connection: the asyncio
    protocol (what serve_unix_socket uses on asyncio) and RPCServer.serve over an anyio
    byte stream (what other backends and the relay use)."""
    if request.param == "stream":

        async def over_anyio_stream(server: RPCServer, conn: socket.socket) -> None:
            await server.serve(await anyio.abc.SocketStream.from_socket(conn))

        monkeypatch.setattr(rpc_unix, "_serve_connection", over_anyio_stream)
    return str(request.param)


@asynccontextmanager
async def serving(
    socket_dir: str, handler: Any, *, token: str = TOKEN, **options: Any
) -> AsyncIterator[str]:
    server = RPCServer(handler, token=token, **options)
    async with serve_unix_socket(server, os.path.join(socket_dir, "rpc.sock")) as path:
        yield path


def assert_result(reply: dict[str, Any], request_id: int) -> Any:
    assert set(reply) == {"id", "result"}, reply
    assert reply["id"] == request_id
    assert isinstance(reply["result"], str)
    return json.loads(reply["result"])


def assert_error(reply: dict[str, Any], request_id: int | None, kind: str) -> str:
    assert set(reply) == {"id", "error"}, reply
    assert reply["id"] == request_id, reply
    assert set(reply["error"]) == {"kind", "message"}, reply
    assert reply["error"]["kind"] == kind, reply
    assert isinstance(reply["error"]["message"], str) and reply["error"]["message"]
    return reply["error"]["message"]


# -- the socket itself --------------------------------------------------------------


@pytest.mark.anyio
async def test_socket_is_private_and_removed_on_exit(socket_dir: str) -> None:
    async with serving(socket_dir, TestHandler()) as path:
        mode = os.stat(path).st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o600
    assert not await anyio.Path(path).exists()


@pytest.mark.anyio
async def test_socket_path_too_long_is_refused(socket_dir: str) -> None:
    server = RPCServer(TestHandler(), token=TOKEN)
    path = os.path.join(socket_dir, "x" * 120)
    with pytest.raises(ValueError, match="107-byte"):
        async with serve_unix_socket(server, path):
            pass
    assert not await anyio.Path(path).exists()


# -- a good request -----------------------------------------------------------------


@pytest.mark.anyio
async def test_good_request_gets_id_and_result(socket_dir: str) -> None:
    handler = TestHandler()
    async with serving(socket_dir, handler) as path, raw_client(path) as client:
        reply = await client.call(request(7, "echo", {"text": "héllo", "n": [1, 2]}))
        assert assert_result(reply, 7) == {"text": "héllo", "n": [1, 2]}
        # Ids are the client's: any non-negative int, up to 2**63 - 1, comes back as sent.
        for request_id in (0, 2**32, 2**63 - 1):
            assert assert_result(await client.call(request(request_id)), request_id) == {}
    (first, *_) = handler.requests
    assert (first.id, first.tool, first.args, first.token) == (
        7,
        "echo",
        {"text": "héllo", "n": [1, 2]},
        TOKEN,
    )


@pytest.mark.anyio
async def test_request_without_args_gets_empty_args(socket_dir: str) -> None:
    handler = TestHandler()
    async with serving(socket_dir, handler) as path, raw_client(path) as client:
        reply = await client.call(frame({"id": 1, "tool": "echo", "token": TOKEN}))
        assert assert_result(reply, 1) == {}


@pytest.mark.anyio
async def test_handler_failure_is_an_internal_error_and_the_connection_lives(
    socket_dir: str,
) -> None:
    async with serving(socket_dir, TestHandler()) as path, raw_client(path) as client:
        message = assert_error(await client.call(request(3, "boom")), 3, "internal")
        assert "RuntimeError" in message and "blew up" in message
        assert assert_result(await client.call(request(4, "echo", {"a": 1})), 4) == {"a": 1}


# -- the token ----------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    "token",
    [
        pytest.param("wrong", id="wrong"),
        pytest.param("", id="empty"),
        pytest.param(None, id="missing"),
        pytest.param(TOKEN + "x", id="longer"),
        pytest.param(TOKEN[:-1], id="prefix"),
        pytest.param(12345, id="not-a-string"),
    ],
)
async def test_bad_token_is_unauthorized(socket_dir: str, token: Any) -> None:
    handler = TestHandler()
    async with serving(socket_dir, handler) as path, raw_client(path) as client:
        assert_error(await client.call(request(11, "echo", token=token)), 11, "unauthorized")
        # The connection survives a refusal, and the handler never saw the bad request.
        assert assert_result(await client.call(request(12, "echo")), 12) == {}
    assert [r.id for r in handler.requests] == [12]


@pytest.mark.anyio
@pytest.mark.parametrize("token", ["", "anything"])
async def test_server_with_empty_token_refuses_everything(socket_dir: str, token: str) -> None:
    handler = TestHandler()
    async with serving(socket_dir, handler, token="") as path, raw_client(path) as client:
        assert_error(await client.call(request(1, "echo", token=token)), 1, "unauthorized")
    assert handler.requests == []


@pytest.mark.anyio
async def test_non_ascii_token_is_compared_not_crashed(socket_dir: str) -> None:
    # hmac.compare_digest refuses non-ASCII str: the server must compare bytes.
    async with serving(socket_dir, TestHandler()) as path, raw_client(path) as client:
        assert_error(await client.call(request(1, token="s3cret-tökén")), 1, "unauthorized")


# -- the gate: unknown, not allowed, budget -----------------------------------------


def gate_with(limit: int) -> ToolGate:
    registry = ToolRegistry()

    async def echo(args: dict[str, Any]) -> str:
        return json.dumps(args)

    def secret(args: dict[str, Any]) -> str:
        raise AssertionError("a tool outside the allowed set must never run")

    registry.register("echo", "test", {"name": "echo", "parameters": {}}, echo)
    registry.register("add", "test", {"name": "add", "parameters": {}}, echo)
    registry.register("secret", "test", {"name": "secret", "parameters": {}}, secret)
    context = ToolContext(task_id="test", environment=None, cwd="/")  # type: ignore[arg-type]
    return ToolGate(registry, ["echo", "add"], ToolCallBudget(limit), context)


@pytest.mark.anyio
async def test_unknown_tool(socket_dir: str) -> None:
    async with serving(socket_dir, TestHandler()) as path, raw_client(path) as client:
        assert_error(await client.call(request(5, "nope")), 5, "unknown_tool")


@pytest.mark.anyio
async def test_gate_unknown_and_not_allowed(socket_dir: str) -> None:
    gate = gate_with(10)
    async with serving(socket_dir, gate) as path, raw_client(path) as client:
        message = assert_error(await client.call(request(1, "nope")), 1, "unknown_tool")
        assert "nope" in message
        message = assert_error(await client.call(request(2, "secret")), 2, "not_allowed")
        assert "secret" in message
        assert "add, echo" in message  # the allowed tools are listed
        assert assert_result(await client.call(request(3, "echo", {"x": 1})), 3) == {"x": 1}
    assert gate.calls_made == 1


@pytest.mark.anyio
async def test_gate_budget(socket_dir: str) -> None:
    gate = gate_with(3)
    async with serving(socket_dir, gate) as path, raw_client(path) as client:
        # Refusals spend nothing: they come first and the budget is still whole after.
        assert_error(await client.call(request(100, "nope")), 100, "unknown_tool")
        assert_error(await client.call(request(101, "secret")), 101, "not_allowed")
        assert_error(await client.call(request(102, "echo", token="bad")), 102, "unauthorized")
        for n in (1, 2, 3):
            assert assert_result(await client.call(request(n, "echo", {"n": n})), n) == {"n": n}
        for n in (4, 5):
            message = assert_error(await client.call(request(n)), n, "budget_exhausted")
            assert "3" in message
        assert_error(await client.call(request(6, "secret")), 6, "not_allowed")
    assert gate.calls_made == 3
    assert gate.budget.used == 3


@pytest.mark.anyio
async def test_gate_budget_under_concurrent_calls(socket_dir: str) -> None:
    gate = gate_with(3)
    async with serving(socket_dir, gate) as path, raw_client(path) as client:
        await client.send(b"".join(request(n, "echo", {"n": n}) for n in range(1, 9)))
        replies = await client.replies(8)
    assert sorted(r["id"] for r in replies) == list(range(1, 9))
    results = [r for r in replies if "result" in r]
    refused = [r for r in replies if "error" in r]
    assert len(results) == 3
    for reply in refused:
        assert_error(reply, reply["id"], "budget_exhausted")
    assert gate.calls_made == 3


# -- malformed requests -------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    "message",
    [
        pytest.param({"tool": "echo", "args": {}, "token": TOKEN}, id="missing-id"),
        pytest.param({"id": -1, "tool": "echo", "args": {}, "token": TOKEN}, id="negative-id"),
        pytest.param({"id": "7", "tool": "echo", "args": {}, "token": TOKEN}, id="string-id"),
        pytest.param({"id": None, "tool": "echo", "args": {}, "token": TOKEN}, id="nil-id"),
        pytest.param({"id": 1.0, "tool": "echo", "args": {}, "token": TOKEN}, id="float-id"),
        pytest.param({"id": True, "tool": "echo", "args": {}, "token": TOKEN}, id="bool-id"),
        pytest.param({"id": 2**63, "tool": "echo", "args": {}, "token": TOKEN}, id="id-over-i64"),
    ],
)
async def test_unusable_id_is_bad_request_with_nil_id(
    socket_dir: str, message: dict[str, Any]
) -> None:
    handler = TestHandler()
    async with serving(socket_dir, handler) as path, raw_client(path) as client:
        assert_error(await client.call(frame(message)), None, "bad_request")
        # A well-formed frame with a bad map does not cost the connection.
        assert assert_result(await client.call(request(2)), 2) == {}
    assert [r.id for r in handler.requests] == [2]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"args": [1, 2]}, id="args-list"),
        pytest.param({"args": "text"}, id="args-str"),
        pytest.param({"args": {1: "int key"}}, id="args-int-key"),
        pytest.param({"tool": ""}, id="tool-empty"),
        pytest.param({"tool": 5}, id="tool-int"),
        pytest.param({"tool": None}, id="tool-nil"),
    ],
)
async def test_bad_fields_are_bad_request_with_the_request_id(
    socket_dir: str, fields: dict[str, Any]
) -> None:
    handler = TestHandler()
    message = {"id": 9, "tool": "echo", "args": {}, "token": TOKEN, **fields}
    async with serving(socket_dir, handler) as path, raw_client(path) as client:
        assert_error(await client.call(frame(message)), 9, "bad_request")
        assert assert_result(await client.call(request(10)), 10) == {}
    assert [r.id for r in handler.requests] == [10]


# -- bad frames ---------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    "data",
    [
        pytest.param(struct.pack(">I", 4) + b"\xc1\xc1\xc1\xc1", id="not-msgpack"),
        pytest.param(struct.pack(">I", 0), id="zero-length"),
        pytest.param(frame([1, 2, 3]), id="list-not-map"),
        pytest.param(frame(42), id="int-not-map"),
    ],
)
async def test_bad_frame_gets_one_reply_then_close(socket_dir: str, data: bytes) -> None:
    handler = TestHandler()
    async with serving(socket_dir, handler) as path, raw_client(path) as client:
        await client.send(data)
        assert_error(await client.reply(), None, "bad_frame")
        assert await client.closed() == b""
    assert handler.requests == []


@pytest.mark.anyio
async def test_bad_frame_after_good_requests(socket_dir: str) -> None:
    async with serving(socket_dir, TestHandler()) as path, raw_client(path) as client:
        assert assert_result(await client.call(request(1)), 1) == {}
        await client.send(struct.pack(">I", 2) + b"\xc1\xc1")
        assert_error(await client.reply(), None, "bad_frame")
        assert await client.closed() == b""
        # The server itself is fine: a new connection is served.
        async with raw_client(path) as other:
            assert assert_result(await other.call(request(2)), 2) == {}


@pytest.mark.anyio
async def test_header_over_default_cap_is_refused_without_reading_the_body(
    socket_dir: str,
) -> None:
    # Only the header is sent. A host that waited for the 1 GiB body would never
    # answer, and read_reply would time out after 2 s.
    async with serving(socket_dir, TestHandler()) as path, raw_client(path, 2.0) as client:
        started = time.monotonic()
        await client.send(struct.pack(">I", GiB))
        message = assert_error(await client.reply(), None, "frame_too_large")
        assert str(GiB) in message and str(4 * 1024 * 1024) in message
        assert await client.closed() == b""
        assert time.monotonic() - started < 10  # no wait for the body (read_reply's 2 s)


@pytest.mark.anyio
async def test_small_cap_refuses_a_body_that_was_sent(socket_dir: str) -> None:
    def body_with(pad: int) -> bytes:
        args = {"pad": "x" * pad}
        return msgpack.packb({"id": 1, "tool": "echo", "args": args, "token": TOKEN})

    body = body_with(2000 - (len(body_with(1900)) - 1900))
    assert len(body) == 2000
    handler = TestHandler()
    async with (
        serving(socket_dir, handler, max_frame_size=1024) as path,
        raw_client(path, 2.0) as client,
    ):
        await client.send(struct.pack(">I", len(body)) + body)
        message = assert_error(await client.reply(), None, "frame_too_large")
        assert "2000" in message and "1024" in message
        # The host closes. If it left the refused body unread in its socket, Linux
        # reports the close to us as a reset rather than EOF; either is a close.
        try:
            assert await client.closed() == b""
        except ConnectionResetError:
            pass
    assert handler.requests == []


@pytest.mark.anyio
async def test_frame_at_the_cap_is_served(socket_dir: str) -> None:
    data = request(1, "echo", {"pad": "y" * 500})
    async with (
        serving(socket_dir, TestHandler(), max_frame_size=len(data) - 4) as path,
        raw_client(path) as client,
    ):
        assert assert_result(await client.call(data), 1) == {"pad": "y" * 500}


# -- many requests on one connection ------------------------------------------------


@pytest.mark.anyio
async def test_pipelined_requests_each_get_exactly_one_reply(socket_dir: str) -> None:
    count = 50
    async with serving(socket_dir, TestHandler()) as path, raw_client(path) as client:
        await client.send(b"".join(request(n, "echo", {"n": n}) for n in range(count)))
        replies = await client.replies(count)
        assert sorted(r["id"] for r in replies) == list(range(count))
        for reply in replies:
            assert assert_result(reply, reply["id"]) == {"n": reply["id"]}
        # No stray extra reply is queued: the next one read answers the next request.
        assert assert_result(await client.call(request(999, "echo", {"n": 999})), 999) == {"n": 999}


@pytest.mark.anyio
async def test_pipelined_requests_split_across_writes(socket_dir: str) -> None:
    data = b"".join(request(n, "echo", {"n": n}) for n in range(10))
    async with serving(socket_dir, TestHandler()) as path, raw_client(path) as client:
        for offset in range(0, len(data), 13):  # frames cut mid-header and mid-body
            await client.send(data[offset : offset + 13])
        replies = await client.replies(10)
    assert sorted(r["id"] for r in replies) == list(range(10))


@pytest.mark.anyio
async def test_slow_calls_on_one_connection_overlap(socket_dir: str) -> None:
    handler = TestHandler()
    async with serving(socket_dir, handler) as path, raw_client(path) as client:
        await client.send(b"".join(request(n, "slow", {"seconds": 0.5, "n": n}) for n in range(10)))
        replies = await client.replies(10)
    # Structural, not timed: served one after another, at most one would be in flight.
    assert handler.max_in_flight == 10
    assert sorted(r["id"] for r in replies) == list(range(10))
    for reply in replies:
        assert assert_result(reply, reply["id"])["n"] == reply["id"]


@pytest.mark.anyio
async def test_replies_come_back_in_the_order_calls_finish(socket_dir: str) -> None:
    async with serving(socket_dir, TestHandler()) as path, raw_client(path) as client:
        await client.send(request(1, "slow", {"seconds": 0.5}) + request(2, "echo", {"x": 2}))
        first, second = await client.replies(2)
    assert assert_result(first, 2) == {"x": 2}
    assert assert_result(second, 1) == {"seconds": 0.5}


@pytest.mark.anyio
async def test_half_closed_client_still_gets_its_replies(socket_dir: str) -> None:
    async with serving(socket_dir, TestHandler()) as path, raw_client(path) as client:
        await client.send(request(1, "slow", {"seconds": 0.2}) + request(2))
        client.sock.shutdown(socket.SHUT_WR)  # "no more requests", but still listening
        replies = await client.replies(2)
        assert sorted(r["id"] for r in replies) == [1, 2]
        assert await client.closed() == b""


# -- peers that misbehave -----------------------------------------------------------


@pytest.mark.anyio
async def test_client_disconnecting_mid_call_does_not_crash_the_server(socket_dir: str) -> None:
    handler = TestHandler()
    async with serving(socket_dir, handler, max_connections=1) as path:
        client = await RawClient.open(path)
        try:
            await client.send(request(1, "slow", {"seconds": 0.3}))
            with anyio.fail_after(REPLY_TIMEOUT):
                await handler.started.wait()
        finally:
            client.close()
        with anyio.fail_after(REPLY_TIMEOUT):
            await handler.finished.wait()  # the reply to a gone peer is dropped quietly
        # With max_connections=1 this also proves the dead connection gave its slot back.
        async with raw_client(path) as later:
            reply = await connected_call(later, path, request(2, "echo", {"after": True}))
            assert assert_result(reply, 2) == {"after": True}


@pytest.mark.anyio
async def test_client_disconnecting_mid_frame_does_not_crash_the_server(socket_dir: str) -> None:
    handler = TestHandler()
    async with serving(socket_dir, handler) as path:
        async with raw_client(path) as client:
            await client.send(request(1)[:7])  # header and part of the body, then gone
        async with raw_client(path) as later:
            assert assert_result(await later.call(request(2)), 2) == {}
    assert [r.id for r in handler.requests] == [2]


async def connected_call(client: RawClient, path: str, data: bytes) -> dict[str, Any]:
    """Make a call on ``client``; if the server refused it for a slot not yet given
    back (it learns of a peer's close asynchronously), retry on a new connection for
    up to a second. Anything other than that refusal is returned as it is. The refusal
    may come, and the server close the connection, before the call is sent: the send
    then breaks, and the refusal is read from what the server sent."""
    with anyio.fail_after(REPLY_TIMEOUT):
        while True:
            try:
                reply = await client.call(data)
            except (BrokenPipeError, ConnectionResetError):
                reply = await client.reply()
            error = reply.get("error") or {}
            if reply.get("id") is not None or "too many connections" not in error.get(
                "message", ""
            ):
                return reply
            client.close()
            await anyio.sleep(0.02)
            client.sock = (await RawClient.open(path)).sock
            client._buffer = b""


@pytest.mark.anyio
async def test_connections_over_the_limit_are_refused(socket_dir: str) -> None:
    assert DEFAULT_MAX_CONNECTIONS >= 1
    async with (
        serving(socket_dir, TestHandler(), max_connections=2) as path,
        raw_client(path) as first,
        raw_client(path) as second,
    ):
        # A round trip on each makes sure the server has taken both connections.
        assert assert_result(await first.call(request(1)), 1) == {}
        assert assert_result(await second.call(request(2)), 2) == {}
        async with raw_client(path) as extra:
            message = assert_error(await extra.reply(), None, "internal")
            assert "too many connections" in message
            assert await extra.closed() == b""
        # The ones already in keep working.
        assert assert_result(await first.call(request(3)), 3) == {}
        assert assert_result(await second.call(request(4)), 4) == {}
        # A closed connection frees its slot.
        second.close()
        async with raw_client(path) as replacement:
            reply = await connected_call(replacement, path, request(5))
            assert assert_result(reply, 5) == {}


@pytest.mark.anyio
async def test_leaving_waits_for_no_reader_of_a_connection_that_ended_by_itself(
    socket_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection its client closed has no reading thread left, so leaving the
    socket's context does not wait out the bound on the readers' exit (it once did: 2 s
    more at the end of every run that made a call over the unix transport)."""
    bound = 4 * REPLY_TIMEOUT
    monkeypatch.setattr(rpc_unix, "_READERS_EXIT_SECONDS", bound)
    server = RPCServer(TestHandler(), token=TOKEN)
    with anyio.fail_after(bound / 2):  # waiting out the bound fails here, not a hang
        async with serve_unix_socket(server, os.path.join(socket_dir, "rpc.sock")) as path:
            async with raw_client(path) as client:
                assert assert_result(await client.call(request(1)), 1) == {}
            # The server's threads see the client's end outside the loop: nothing to
            # wait on but time.
            while server.connections:  # noqa: ASYNC110
                await anyio.sleep(0.01)


# -- decoding the arguments at bounded cost (issue #11) --------------------------------


@pytest.mark.parametrize("padding", [0, 1000], ids=["small", "large"])
def test_decode_args_builds_what_msgpack_builds(padding: int) -> None:
    from hermes_sandbox.rpc.messages import decode_args

    value = {"a": [1, "x", b"\x00", None, True, 1.5, {"n": [[], {}]}], "b": {"c": -3}}
    value["pad"] = "p" * padding  # small arguments take msgpack's own path
    assert decode_args(msgpack.packb(value, use_bin_type=True)) == value


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param([[]] * 70_000, "more than 65536 values", id="one-long-array"),
        pytest.param([[None] * 40_000] * 2, "more than 65536 values", id="values-in-all"),
        pytest.param({str(i): i for i in range(40_000)}, "more than 65536", id="map-entries"),
        pytest.param(
            functools.reduce(lambda v, _: [v], range(300), []),
            "deeper than 256",
            id="nesting",
        ),
    ],
)
def test_decode_args_refuses_past_its_limits(value: Any, message: str) -> None:
    from hermes_sandbox.rpc.messages import decode_args

    with pytest.raises(CallRefused) as caught:
        decode_args(msgpack.packb(value))
    assert caught.value.kind == "bad_request"
    assert message in caught.value.message


def test_decode_args_refuses_unhashable_keys_as_bad_frame() -> None:
    from hermes_sandbox.rpc.errors import FrameError
    from hermes_sandbox.rpc.messages import decode_args

    with pytest.raises(FrameError):
        decode_args(b"\x81\x90\x01")  # {[]: 1}


# -- the quick parse of a well-formed request (session 7) ------------------------------


def _careful(server: RPCServer, body: bytes) -> Any:
    """What the careful walk alone makes of ``body``: the request, or the refusal."""
    from hermes_sandbox.rpc.messages import Envelope

    envelope = Envelope.parse(body)
    try:
        return envelope.request(TOKEN.encode())
    except CallRefused as exc:
        return {"id": envelope.reply_id, "error": {"kind": exc.kind, "message": exc.message}}


_SUFFIX_BYTES = msgpack.packb("token") + msgpack.packb(TOKEN)


@pytest.mark.parametrize(
    "message",
    [
        pytest.param({"id": 1, "tool": "echo", "args": {"a": 1}, "token": TOKEN}, id="good"),
        pytest.param({"id": 1, "tool": "echo", "token": TOKEN}, id="no-args"),
        pytest.param({"id": 1, "tool": "echo", "args": {}, "token": "x" * 12}, id="bad-token"),
        pytest.param({"id": -1, "tool": "echo", "args": {}, "token": TOKEN}, id="bad-id"),
        pytest.param({"id": 1, "tool": "", "args": {}, "token": TOKEN}, id="empty-tool"),
        pytest.param({"id": 1, "tool": "echo", "args": [1], "token": TOKEN}, id="args-list"),
        pytest.param({"id": 1, "tool": "echo", "args": {1: 2}, "token": TOKEN}, id="int-key"),
        pytest.param(
            {"id": 1, "tool": "echo", "args": {}, "x": 0, "token": TOKEN}, id="extra-field"
        ),
        pytest.param(
            # The token entry's bytes end an argument; the request's own token is wrong.
            {"id": 1, "tool": "echo", "token": "wrong", "args": {"t": _SUFFIX_BYTES}},
            id="token-bytes-inside-args",
        ),
        pytest.param(
            {"id": 1, "tool": "echo", "args": {"p": "x" * 300}, "token": TOKEN}, id="large"
        ),
    ],
)
def test_quick_parse_agrees_with_the_careful_walk(message: dict[str, Any]) -> None:
    server = RPCServer(TestHandler(), token=TOKEN)
    body = msgpack.packb(message, use_bin_type=True)
    assert server.receive(body) == _careful(server, body)


def test_quick_parse_never_accepts_a_wrong_token() -> None:
    from hermes_sandbox.rpc.messages import quick_request, token_suffix

    suffix = token_suffix(TOKEN.encode())
    good = {"id": 1, "tool": "echo", "args": {}, "token": TOKEN}
    assert quick_request(msgpack.packb(good), suffix, TOKEN) == Request(1, "echo", {}, TOKEN)
    wrong = {"id": 1, "tool": "echo", "token": "wrong", "args": {"t": _SUFFIX_BYTES}}
    assert quick_request(msgpack.packb(wrong), suffix, TOKEN) is None
    assert token_suffix(b"") is None
