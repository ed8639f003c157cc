"""The relay channel's per-call path, piece by piece: the relay's own encoding of the
``rpc`` and ``out`` messages (stubs/_relay.py, without the generic codec), and the
host's writer (rpc/relay.py), which writes a frame in the call that made it when the
stream takes it at once and queues the rest, in order, under the same caps."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import types
from typing import Any

import anyio
import msgpack
import pytest
from conftest import read_relay_slowly

from hermes_sandbox.rpc import relay as host_relay
from hermes_sandbox.rpc.framing import FrameDecoder
from hermes_sandbox.stubs import _msgpack, _proctree

RELAY_SOURCE = host_relay.__file__.replace("rpc/relay.py", "stubs/_relay.py")


def _load_relay() -> types.ModuleType:
    """stubs/_relay.py as the sandbox runs it, with the pure-Python codec."""
    saved = {name: sys.modules.get(name) for name in ("_hermes_msgpack", "_proctree", "msgpack")}
    sys.modules["_hermes_msgpack"] = _msgpack
    sys.modules["_proctree"] = _proctree
    sys.modules["msgpack"] = None  # type: ignore[assignment]  # as in a bare image
    try:
        spec = importlib.util.spec_from_file_location("_relay_under_test", RELAY_SOURCE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    assert module._pack is _msgpack.packb  # the fallback was taken
    return module


relay = _load_relay()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


CONNS = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1]
SIZES = [0, 1, 255, 256, 65535, 65536, 300_000]


@pytest.mark.parametrize("conn", CONNS)
@pytest.mark.parametrize("size", SIZES)
def test_relay_rpc_frames_are_what_msgpack_writes(conn: int, size: int) -> None:
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    frame = relay.data_frame(relay.rpc_head(conn), data)
    expected = msgpack.packb({"op": "rpc", "conn": conn, "data": data}, use_bin_type=True)
    assert frame == len(expected).to_bytes(4, "big") + expected
    assert relay.read_rpc(frame[4:]) == (conn, data)
    # The host's own encoding of the same message reads the same.
    by_host = host_relay.encode_frame({"op": "rpc", "conn": conn, "data": data})
    assert relay.read_rpc(by_host[4:]) == (conn, data)


@pytest.mark.parametrize("fd", [1, 2])
def test_relay_out_frames_are_what_msgpack_writes(fd: int) -> None:
    frame = relay.data_frame(relay._OUT_HEADS[fd], b"hello")
    assert [m for m in FrameDecoder().feed(frame)] == [{"op": "out", "fd": fd, "data": b"hello"}]


@pytest.mark.parametrize(
    "body",
    [
        msgpack.packb({"conn": 1, "op": "rpc", "data": b"ab"}),  # other key order
        msgpack.packb({"op": "rpc", "conn": 1, "data": b"ab", "x": 1}),  # more keys
        msgpack.packb({"op": "rpc", "conn": -1, "data": b"ab"}),  # a negative conn
        msgpack.packb({"op": "rpc", "conn": 1, "data": "ab"}),  # str, not bin
        msgpack.packb({"op": "close", "conn": 1}),
        msgpack.packb({"op": "rpc", "conn": 1, "data": b"abc"})[:-1],  # truncated
        msgpack.packb({"op": "rpc", "conn": 1, "data": b"abc"}) + b"\0",  # trailing
        msgpack.packb({"op": "rpc", "conn": 1, "data": b"abc"})[:12],  # cut in the head
        b"",
    ],
)
def test_relay_fast_read_leaves_anything_else_to_the_codec(body: bytes) -> None:
    assert relay.read_rpc(body) is None


class _Stream(anyio.abc.ByteSendStream):
    """Takes ``accept`` bytes now per send_nowait call (None: this stream cannot), and
    the rest through send, which waits while ``gate`` is closed."""

    def __init__(self, accept: int | None) -> None:
        self.accept = accept
        self.wire = bytearray()
        self.gate = anyio.Event()
        self.sends = 0
        self.three_sent = anyio.Event()
        if accept is None:
            self.send_nowait = None  # type: ignore[assignment]

    def send_nowait(self, data: bytes) -> int:  # type: ignore[no-redef]
        assert self.accept is not None
        taken = data[: self.accept]
        self.wire += taken
        return len(taken)

    async def send(self, item: bytes) -> None:
        await self.gate.wait()
        self.sends += 1
        self.wire += item
        if self.sends == 3:
            self.three_sent.set()

    async def send_eof(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


def _messages(wire: bytes) -> list[dict[str, Any]]:
    decoder = FrameDecoder(1 << 30)
    messages = decoder.feed(wire)
    assert not decoder.inside_frame
    return messages


@pytest.mark.anyio
async def test_writer_writes_a_frame_in_the_call_when_the_stream_takes_it() -> None:
    stream = _Stream(accept=1 << 20)
    writer = host_relay._ChannelWriter(stream)
    assert writer.put({"op": "rpc", "conn": 1, "data": b"reply"}, conn=1)
    assert _messages(stream.wire) == [{"op": "rpc", "conn": 1, "data": b"reply"}]
    assert stream.sends == 0  # no task was needed


@pytest.mark.anyio
async def test_writer_queues_the_rest_of_a_partly_written_frame_before_a_kill() -> None:
    stream = _Stream(accept=7)  # part of the first frame only
    writer = host_relay._ChannelWriter(stream)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(writer.run)
        assert writer.put({"op": "rpc", "conn": 1, "data": b"a" * 100}, conn=1)
        assert writer.put({"op": "rpc", "conn": 1, "data": b"b" * 100}, conn=1)
        written = writer.put_first({"op": "kill", "grace": 0.0})
        stream.gate.set()
        with anyio.fail_after(10):
            await written.wait()
            await stream.three_sent.wait()
        tasks.cancel_scope.cancel()
    assert _messages(stream.wire) == [
        {"op": "rpc", "conn": 1, "data": b"a" * 100},  # its rest went first, whole
        {"op": "kill", "grace": 0.0},
        {"op": "rpc", "conn": 1, "data": b"b" * 100},
    ]


@pytest.mark.parametrize("accept", [0, None, 5])
@pytest.mark.anyio
async def test_writer_caps_a_connection_whose_replies_back_up(accept: int | None) -> None:
    """A stream that takes nothing more (the relay stopped reading): replies for one
    connection queue up to the limit, then are refused, whatever send_nowait does."""
    stream = _Stream(accept=accept)
    writer = host_relay._ChannelWriter(stream)
    reply = b"r" * (1 << 20)
    accepted = 0
    while writer.put({"op": "rpc", "conn": 3, "data": reply}, conn=3):
        accepted += 1
        assert accepted * len(reply) <= host_relay.CONNECTION_QUEUE_LIMIT + 2 * len(reply)
    assert accepted >= 1
    # Another connection still gets its reply queued, and the channel's cap holds too.
    assert writer.put({"op": "rpc", "conn": 4, "data": b"x"}, conn=4)
    total = 0
    conn = 10
    while writer.put({"op": "rpc", "conn": conn, "data": reply}, conn=conn):
        conn += 1
        total += len(reply)
        assert total <= host_relay.CHANNEL_QUEUE_LIMIT + len(reply)


def _read_message(stream: Any) -> dict[str, Any]:
    header = stream.read(4)
    assert len(header) == 4, "the relay closed its channel"
    return msgpack.unpackb(stream.read(int.from_bytes(header, "big")), raw=False)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("last", ["reply", "request"])
def test_relay_polls_only_briefly_after_a_call_step(tmp_path: Any, last: str) -> None:
    """The relay polls for a call's next step for a moment after passing one on
    (_SPIN_SECONDS: after a request, for the host's reply; after a reply, for the
    script's next request) and then sleeps in select: a script that makes many calls
    and then stops, or whose last request the host leaves unanswered, leaves the relay
    idle, not spinning."""
    socket_path = str(tmp_path / "rpc.sock")
    script = (
        "import socket, sys, time\n"
        "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
        "for _ in range(200):\n"
        "    s.sendall(b'ping'); assert s.recv(16) == b'pong'\n"
        + ("s.sendall(b'last'); s.recv(16)\n" if last == "request" else "")
        + "time.sleep(30)\n"
    )
    wanted = 201 if last == "request" else 200
    stubs = os.path.dirname(RELAY_SOURCE)
    relay_process = subprocess.Popen(
        [sys.executable, RELAY_SOURCE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": stubs},
    )
    assert relay_process.stdin is not None and relay_process.stdout is not None
    try:
        run = {"op": "run", "argv": [sys.executable, "-c", script, socket_path]}
        run["socket"] = socket_path
        body = msgpack.packb(run, use_bin_type=True)
        relay_process.stdin.write(len(body).to_bytes(4, "big") + body)
        relay_process.stdin.flush()
        relay_pid, calls = None, 0
        while calls < wanted:
            message = _read_message(relay_process.stdout)
            if message["op"] == "started":
                relay_pid = message["relay_pid"]
            elif message["op"] == "rpc":
                calls += 1
                if calls <= 200:  # the 201st request is left unanswered
                    reply = relay.data_frame(relay.rpc_head(message["conn"]), b"pong")
                    relay_process.stdin.write(reply)
                    relay_process.stdin.flush()
        assert relay_pid is not None
        time.sleep(0.2)  # the last call step is the relay's last event
        before = _cpu_seconds(relay_pid)
        time.sleep(1.0)
        assert _cpu_seconds(relay_pid) - before < 0.2  # spinning would be about 1 s
    finally:
        relay_process.stdin.close()  # the host is gone: the relay kills the script
        relay_process.wait(timeout=10)
        relay_process.stdout.close()


class _WiredRelay:
    """A relay driven in this process: its channel is two pipes whose other ends are the
    host's (``host_reads``, ``host_writes``), and its connection 1 a socketpair whose
    other end is the script's (``script``)."""

    def __init__(self) -> None:
        import socket

        self.channel_in, self.host_writes = os.pipe()
        self.host_reads, self.channel_out = os.pipe()
        self.script, self.relay_end = socket.socketpair()
        self.relay_end.setblocking(False)
        self.relay = relay.Relay(self.channel_in, self.channel_out)
        conn = self.relay.conns[1] = relay._Conn(self.relay_end, 1)
        conn.events = relay.EVENT_READ
        self.relay.sel.register(self.relay_end, conn.events, ("conn", 1))
        os.set_blocking(self.channel_in, False)

    def close(self) -> None:
        for fd in (
            self.channel_in,
            self.host_writes,
            self.host_reads,
            self.channel_out,
            self.relay.sigchld_r,
            self.relay.sigchld_w,
        ):
            os.close(fd)
        self.script.close()
        self.relay_end.close()


def test_relay_reads_into_its_kept_buffer() -> None:
    """A message read from the script or from the host is read into the relay's kept
    buffer, not into a new bytes object of the read's full size for every read (above
    malloc's mmap threshold that is an mmap, an mremap and a munmap each time): what a
    small call allocates is near its own size. The bytes passed on are unchanged."""
    import tracemalloc

    wired = _WiredRelay()
    instance, script = wired.relay, wired.script
    host_reads, host_writes = wired.host_reads, wired.host_writes
    request, reply = b"\0\0\0\x05hello", b"\0\0\0\x03bye"
    tracemalloc.start()
    try:
        script.sendall(request)
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        instance.read_conn(1)
        from_script = tracemalloc.get_traced_memory()[1] - before
        os.write(host_writes, relay.data_frame(relay.rpc_head(1), reply))
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        instance.read_channel()
        from_host = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    try:
        assert os.read(host_reads, 65536) == relay.data_frame(relay.rpc_head(1), request)
        assert script.recv(65536) == reply
    finally:
        wired.close()
    assert from_script < 16384, from_script  # a read of 256 KiB allocated 262,177 bytes
    assert from_host < 16384, from_host


def test_relay_passes_messages_larger_than_its_buffer_whole() -> None:
    """A request and a reply larger than the relay's kept read buffer arrive over
    several reads; each reaches the other side byte for byte (the host's reply held
    across reads, the script's request sent on as pieces of at most one read)."""
    import threading

    wired = _WiredRelay()
    instance, script = wired.relay, wired.script
    host_reads, host_writes = wired.host_reads, wired.host_writes
    os.set_blocking(wired.channel_out, False)
    instance.sel.register(wired.channel_in, relay.EVENT_READ, ("channel", None))
    size = 3 * relay._READ_SIZE + 12345
    request = bytes(range(256)) * (size // 256)
    reply = request[::-1]
    got: dict[str, bytes] = {}

    def script_side() -> None:
        script.sendall(request)
        received = bytearray()
        while len(received) < len(reply):
            received += script.recv(1 << 20)
        got["reply"] = bytes(received)

    def host_side() -> None:
        pieces = bytearray()
        decoder = FrameDecoder(1 << 30)
        while len(pieces) < len(request):
            for message in decoder.feed(os.read(host_reads, 1 << 20)):
                assert message["op"] == "rpc" and message["conn"] == 1
                assert len(message["data"]) <= relay._READ_SIZE
                pieces += message["data"]
        got["request"] = bytes(pieces)
        frame = relay.data_frame(relay.rpc_head(1), reply)
        os.set_blocking(host_writes, True)
        os.write(host_writes, frame[:100])  # a frame split across reads, from its start
        os.write(host_writes, frame[100:])

    threads = [threading.Thread(target=script_side), threading.Thread(target=host_side)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 30
        while "reply" not in got and time.monotonic() < deadline:
            for key, events in instance.sel.select(timeout=0.1):
                if key.data[0] == "conn":
                    instance.conn_ready(1, events)
                elif key.data[0] == "channel":
                    instance.read_channel()
                elif key.data[0] == "channel_out":
                    instance.flush_channel()
    finally:
        for thread in threads:
            thread.join(30)
        wired.close()
    assert got["request"] == request
    assert got["reply"] == reply


# -- the host reading the channel from the loop's reader callback -----------------------------


class _Answers:
    """A handler answering at once, noting whether it ran inside a task."""

    def __init__(self) -> None:
        self.in_task: list[bool] = []

    def answer_now(self, request: Any) -> str:
        import asyncio

        self.in_task.append(asyncio.current_task() is not None)
        return str(request.args["n"])

    async def __call__(self, request: Any) -> str:
        raise AssertionError("answered at once")


def _frame(message: dict[str, Any]) -> bytes:
    return host_relay.encode_frame(message)


@pytest.mark.anyio
async def test_host_answers_a_relayed_call_in_the_loops_reader_callback() -> None:
    """Over a socket read from the loop (docker's exec socket), a request that can be
    answered at once is answered in the reader callback, with no task woken; output
    beyond what the host holds pauses the channel, and everything keeps its order."""
    import socket
    import threading

    from hermes_sandbox.environments.docker.stream import NonBlockingSocketStream
    from hermes_sandbox.rpc.server import RPCServer

    token = "t" * 43
    answers = _Answers()
    server = RPCServer(answers, token=token)
    host, peer = socket.socketpair()
    outputs = 3 * host_relay._HELD_MESSAGES
    replies: list[dict[str, Any]] = []

    def relay_side() -> None:
        decoder = FrameDecoder()
        peer.sendall(_frame({"op": "started", "pid": 42, "relay_pid": 41}))
        peer.sendall(_frame({"op": "open", "conn": 1}))
        wire = b"".join(_frame({"op": "out", "fd": 1, "data": b"%d\n" % i}) for i in range(outputs))
        for n in range(5):  # calls after a burst of output, then one at a time
            request = {"id": n, "tool": "echo", "args": {"n": n}, "token": token}
            body = msgpack.packb(request, use_bin_type=True)
            wire += _frame({"op": "rpc", "conn": 1, "data": len(body).to_bytes(4, "big") + body})
            peer.sendall(wire)
            wire = b""
            while len(replies) <= n:
                for message in decoder.feed(peer.recv(65536)):
                    (inner,) = FrameDecoder().feed(message["data"])
                    replies.append(inner)
        peer.sendall(_frame({"op": "exit", "code": 0}))
        peer.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=relay_side)
    thread.start()
    try:
        async with host_relay.RelaySession(NonBlockingSocketStream(host), server) as session:
            got, status = await read_relay_slowly(session)
            assert status == 0
    finally:
        thread.join(30)
        peer.close()
    assert got == b"".join(b"%d\n" % i for i in range(outputs))
    assert [r["result"] for r in replies] == ["0", "1", "2", "3", "4"]
    # The first call waited behind the output, so the task answered it; the ones sent
    # alone were answered from the reader callback.
    assert answers.in_task[0] is True
    assert answers.in_task[1:] == [False] * 4
