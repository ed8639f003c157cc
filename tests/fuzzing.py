"""A fuzzer of the host's request decoding and of a live RPC server, for tests and
scripts/fuzz.

Inputs are byte streams a peer without the run's token might send: mutations of
request frames (bit flips, splices, truncations, bad headers, nesting and ext types)
and random bytes. Every input goes through :class:`RequestReader` (the sans-I/O path
every transport shares) or over a real Unix socket to an :class:`RPCServer`; a
:class:`RecordingHandler` records every tool call that reached it, and none may: no
input carries the token.
"""

from __future__ import annotations

import os
import random
import socket
import struct
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import anyio.from_thread
import msgpack

from hermes_sandbox.rpc import messages
from hermes_sandbox.rpc.errors import FrameError
from hermes_sandbox.rpc.messages import Request
from hermes_sandbox.rpc.server import RequestReader, RPCServer
from hermes_sandbox.rpc.unix import serve_unix_socket

TOKEN = "fuzz-token-" + "k" * 32
MAX_FRAME = 64 * 1024


class RecordingHandler:
    """A tool host that records every call that reaches it (none should)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def answer_now(self, request: Request) -> str | None:
        self.calls.append((request.tool, request.args))
        return '{"ok": true}'

    async def __call__(self, request: Request) -> str:
        self.calls.append((request.tool, request.args))
        return '{"ok": true}'


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def _seeds() -> list[bytes]:
    pack = msgpack.packb
    bodies = [
        pack({"id": 1, "tool": "read_file", "args": {"path": "a.txt"}, "token": "wrong"}),
        pack({"id": 2, "tool": "terminal", "args": {"command": "rm -rf /"}}),
        pack({"id": 3, "tool": "x" * 2000, "token": TOKEN[:-1] + "j"}),
        pack({"id": -1, "tool": "", "args": [], "token": None}),
        pack({"token": "wrong", "args": {"a": [[]] * 50, "b": {"c": b"\0" * 40}}}),
        pack({b"id": 1, 1: 2, "tool": ["x"], "args": {1: 2}, "token": b"bytes"}),
        pack([1, 2, 3]),
        pack("just a string"),
        b"\x84\xa2id\x01\xa4tool\xa1x\xa5token\xa1y\xa4args\x81\xa1k\xd6\xff\0\0\0\1",
        b"\x81\xa4args" + b"\x91" * 3000 + b"\xc0",
        b"\x84\xa2id\x01\xa4tool\xa1x\xa5token\xa1y\xa4args\xdd\0\0\x10\0" + b"\x90" * 4096,
        b"\x81\xa4args\xc1",
        b"\x82\xa2id\x01\xa2id",
        b"\xc0",
    ]
    return bodies


SEEDS = _seeds()


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One to four random edits of ``data``."""
    buffer = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice = rng.random()
        if not buffer or choice < 0.15:
            buffer += rng.randbytes(rng.randint(1, 16))
        elif choice < 0.4:
            position = rng.randrange(len(buffer))
            buffer[position] ^= 1 << rng.randrange(8)
        elif choice < 0.55:
            position = rng.randrange(len(buffer))
            buffer[position] = rng.choice((0xC0, 0xC1, 0xD4, 0xD6, 0xDC, 0xDD, 0xDE, 0xDF, 0xFF))
        elif choice < 0.7:
            del buffer[rng.randrange(len(buffer)) :]
        elif choice < 0.85:
            other = rng.choice(SEEDS)
            cut = rng.randrange(len(other) + 1)
            position = rng.randrange(len(buffer) + 1)
            buffer[position:position] = other[cut:]
        else:
            position = rng.randrange(len(buffer))
            buffer[position : position + 4] = rng.randbytes(4)
    return bytes(buffer)


def stream(rng: random.Random) -> bytes:
    """A byte stream of one to three frames (sometimes with a lying header), or noise."""
    if rng.random() < 0.05:
        return rng.randbytes(rng.randint(0, 64))
    out = b""
    for _ in range(rng.randint(1, 3)):
        body = mutate(rng, rng.choice(SEEDS)) if rng.random() < 0.9 else rng.choice(SEEDS)
        if rng.random() < 0.1:
            out += struct.pack(">I", rng.choice((0, len(body) + 1, MAX_FRAME + 1, 2**32 - 1)))
            out += body
        else:
            out += frame(body)
    return out


def new_server(handler: RecordingHandler | None = None) -> RPCServer:
    return RPCServer(handler or RecordingHandler(), token=TOKEN, max_frame_size=MAX_FRAME)


def check_reader(server: RPCServer, data: bytes, rng: random.Random) -> None:
    """Feed ``data`` in random pieces; only error replies or a FrameError may come out,
    and the server's count of buffered bytes must return to zero."""
    reader = RequestReader(server)
    try:
        position = 0
        while position < len(data):
            step = rng.randint(1, max(1, len(data) - position))
            for item in reader.feed(data[position : position + step]):
                assert not isinstance(item, Request), f"accepted without the token: {data!r}"
                assert item["error"]["kind"] in messages.ERROR_KINDS
            position += step
    except FrameError:
        pass
    finally:
        reader.close()
    assert server.buffered == 0


@contextmanager
def live_server(handler: RecordingHandler) -> Iterator[str]:
    """An RPCServer listening on a Unix socket in a private directory, in a thread."""
    directory = tempfile.mkdtemp(prefix="hs-fuzz-")
    path = os.path.join(directory, "rpc.sock")
    server = new_server(handler)
    ready = anyio.Event()
    stop = anyio.Event()

    async def serve() -> None:
        async with serve_unix_socket(server, path):
            ready.set()
            await stop.wait()

    with anyio.from_thread.start_blocking_portal() as portal:
        future = portal.start_task_soon(serve)
        portal.call(ready.wait)
        try:
            yield path
        finally:
            portal.call(stop.set)
            future.result(10)
    os.rmdir(directory)


def ask_live(path: str, data: bytes, timeout: float = 5.0) -> list[dict[str, Any]]:
    """Send ``data`` on a fresh connection, shut the writing side, and read every reply
    until the server closes; fail if it does not within ``timeout`` (a hang)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server closed first (a framing error): read its reply
        received = bytearray()
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
    replies = []
    while len(received) >= 4:
        (size,) = struct.unpack_from(">I", received)
        replies.append(msgpack.unpackb(bytes(received[4 : 4 + size])))
        del received[: 4 + size]
    assert not received, "a reply frame was cut short"
    return replies


def valid_request(request_id: int = 1) -> bytes:
    return frame(msgpack.packb({"id": request_id, "tool": "probe", "args": {}, "token": TOKEN}))


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run(inputs: int, *, seed: int, live_every: int = 50, report: Any = None) -> dict[str, Any]:
    """Fuzz ``inputs`` streams; every ``live_every``-th also goes to a live server.

    Returns counts and measurements; raises AssertionError on a finding.
    """
    rng = random.Random(seed)
    handler = RecordingHandler()
    server = new_server(handler)
    started = time.monotonic()
    slowest = 0.0
    rss_start = rss_after_warmup = rss()
    with live_server(handler) as path:
        for n in range(inputs):
            data = stream(rng)
            t0 = time.monotonic()
            check_reader(server, data, rng)
            if live_every and n % live_every == 0:
                ask_live(path, data)
            slowest = max(slowest, time.monotonic() - t0)
            if n == min(inputs - 1, 10_000):
                rss_after_warmup = rss()
            if report is not None and n and n % 100_000 == 0:
                elapsed = time.monotonic() - started
                report(f"{n} inputs, {n / elapsed:,.0f}/s, rss {rss() / 2**20:.0f} MiB")
        replies = ask_live(path, valid_request(7))
        assert replies and replies[0].get("id") == 7 and "result" in replies[0], replies
    assert handler.calls == [("probe", {})], f"tools ran without the token: {handler.calls[:5]}"
    elapsed = time.monotonic() - started
    return {
        "inputs": inputs,
        "seconds": elapsed,
        "per_second": inputs / elapsed if elapsed else 0.0,
        "slowest_input": slowest,
        "rss_start": rss_start,
        "rss_after_warmup": rss_after_warmup,
        "rss_end": rss(),
    }
