"""Attacks on the Unix socket's threaded serving (rpc/unix.py, leader/followers).

Each connection is served by blocking reads in threads, and a sync tool runs on the
thread that read its request. These tests try to make that cost the host without
bound: a peer that never reads its replies, many connections each holding half a
frame, a run that ends while sync tools block. Threads are counted by identity against
the ones alive before the test, so other tests' leftovers never count.
"""

from __future__ import annotations

import json
import os
import queue
import struct
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread
import pytest
from test_rpc_server import RawClient, raw_client, request

from hermes_sandbox import threads as host_threads
from hermes_sandbox.rpc import threaded
from hermes_sandbox.rpc.messages import Request
from hermes_sandbox.rpc.server import RPCServer
from hermes_sandbox.rpc.unix import CONNECTION_THREADS, SERVING_THREAD, serve_unix_socket

pytestmark = pytest.mark.anyio

TOKEN = "s3cret-token"
# Generous bounds: the machine may be loaded; a hang still fails the test.
SETTLE_SECONDS = 10.0
MiB = 1 << 20


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def socket_dir(short_dir: Path) -> str:
    return str(short_dir)  # a socket's path in it stays under the 107-byte limit


class BlockingHandler:
    """Sync tools answered on the serving thread (``answer_blocking``): ``echo``;
    ``big`` (a 1 MiB result); ``block`` (waits for :attr:`release`). ``async`` needs
    the loop and gets ``__call__``."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)
        self.loop_calls = 0

    def answer_blocking(self, request: Request) -> str | None:
        if request.tool == "async":
            return None
        if request.tool == "block":
            self.entered.release()
            self.release.wait(60)
            return json.dumps({"released": True})
        if request.tool == "big":
            return "x" * MiB
        return json.dumps(request.args)

    async def __call__(self, request: Request) -> str:
        self.loop_calls += 1
        await anyio.lowlevel.checkpoint()
        return json.dumps({"on_the_loop": request.args})


def new_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    """The connections' serving threads started since ``before`` and still alive (anyio's
    idle worker threads, which the test's client uses too, are not the server's)."""
    return [
        t
        for t in threading.enumerate()
        if t not in before and t.is_alive() and t.name == SERVING_THREAD
    ]


async def wait_until(predicate: Any, what: str, seconds: float = SETTLE_SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():  # threads end outside the loop: nothing to wait on but time
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        await anyio.sleep(0.02)


def result(reply: dict[str, Any], request_id: int) -> Any:
    assert set(reply) == {"id", "result"}, reply
    assert reply["id"] == request_id
    return json.loads(reply["result"])


async def test_sync_and_async_tools_answer_on_one_connection(socket_dir: str) -> None:
    handler = BlockingHandler()
    server = RPCServer(handler, token=TOKEN)
    async with (
        serve_unix_socket(server, os.path.join(socket_dir, "s")) as path,
        raw_client(path) as client,
    ):
        calls = [request(i, "async" if i % 2 else "echo", {"n": i}) for i in range(40)]
        await client.send(b"".join(calls))
        replies = {r["id"]: r for r in await client.replies(40)}
    for i in range(40):
        got = result(replies[i], i)
        assert got == ({"on_the_loop": {"n": i}} if i % 2 else {"n": i})
    assert handler.loop_calls == 20


async def test_sequential_calls_reuse_the_connection_threads(socket_dir: str) -> None:
    """A call must not cost a thread: one caller is served by the same few threads."""
    before = set(threading.enumerate())
    server = RPCServer(BlockingHandler(), token=TOKEN)
    async with (
        serve_unix_socket(server, os.path.join(socket_dir, "s")) as path,
        raw_client(path) as client,
    ):
        for i in range(200):
            result(await client.call(request(i, "echo", {"i": i})), i)
        assert len(new_threads(before)) <= 3
    await wait_until(lambda: not new_threads(before), "the connection's threads ended")


async def test_a_blocked_sync_tool_never_stalls_the_calls_behind_it(socket_dir: str) -> None:
    """A sync tool runs on the thread that read it, which keeps the read turn; when the
    tool blocks, the hand-off watch gives the turn to another thread, so the requests
    read with it and those sent after it on the same connection are answered while it
    still blocks."""
    before = set(threading.enumerate())
    handler = BlockingHandler()
    server = RPCServer(handler, token=TOKEN)
    try:
        async with (
            serve_unix_socket(server, os.path.join(socket_dir, "s")) as path,
            raw_client(path) as client,
        ):
            # In one write: the thread that reads "block" has read the echo too.
            await client.send(request(1, "block") + request(2, "echo", {"behind": 1}))
            assert await anyio.to_thread.run_sync(handler.entered.acquire, True, 10)
            assert result(await client.reply(), 2) == {"behind": 1}
            for i in range(3, 6):  # sent after it, on the same connection
                assert result(await client.call(request(i, "echo", {"i": i})), i) == {"i": i}
            handler.release.set()
            assert result(await client.reply(), 1) == {"released": True}
    finally:
        handler.release.set()
    await wait_until(lambda: not new_threads(before), "the connection's threads ended")


async def test_blocked_calls_hold_no_more_threads_than_the_run_allows(socket_dir: str) -> None:
    """Every blocked call has the turn handed on, but a thread is started for it only
    while the run has a slot: past that, the thread that holds the turn keeps it and
    the requests wait; another connection is still served by its own first thread."""
    before = set(threading.enumerate())
    handler = BlockingHandler()
    server = RPCServer(handler, token=TOKEN, max_threads=2)
    try:
        async with (
            serve_unix_socket(server, os.path.join(socket_dir, "s")) as path,
            raw_client(path) as greedy,
        ):
            await greedy.send(b"".join(request(i, "block") for i in range(8)))
            for _ in range(3):  # the connection's own thread and the run's two slots
                assert await anyio.to_thread.run_sync(handler.entered.acquire, True, 10)
            # Many hand-off ticks later, no fourth call has started.
            assert not await anyio.to_thread.run_sync(handler.entered.acquire, True, 0.3)
            assert len(new_threads(before)) <= 3
            async with raw_client(path) as other:
                assert result(await other.call(request(9, "echo", {"ok": 1})), 9) == {"ok": 1}
            handler.release.set()
            replies = await greedy.replies(8)
            assert sorted(r["id"] for r in replies) == list(range(8))
    finally:
        handler.release.set()
    await wait_until(lambda: not new_threads(before), "every serving thread ended")


async def test_the_hand_off_watch_sleeps_once_calls_stop(socket_dir: str) -> None:
    """The watch ticks only while calls run: a tick with no call takes the connection
    off it, and with none left it waits without a timeout (no wake-ups while idle)."""
    server = RPCServer(BlockingHandler(), token=TOKEN)
    async with (
        serve_unix_socket(server, os.path.join(socket_dir, "s")) as path,
        raw_client(path) as client,
    ):
        for i in range(20):
            result(await client.call(request(i, "echo", {"i": i})), i)
        await wait_until(lambda: threaded._WATCH.idle, "the watch has nothing to look at")
        # A call after the quiet spell puts the connection back on the watch.
        result(await client.call(request(99, "echo", {"again": 1})), 99)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork() with threads, 3.12+
def test_a_forked_child_starts_a_watch_of_its_own() -> None:
    """The parent's watch thread does not exist in a forked child: the child's first
    call must start one, or a blocked tool there would hold its connection."""

    class Quiet:  # a source with no call: the watch drops it at its second tick
        _state = threading.Lock()
        _lent = None
        _lent_calls = 0
        _watched = True

    assert threaded._WATCH.watch(Quiet())  # type: ignore[arg-type]  # starts the thread
    assert threaded._WATCH._thread is not None
    pid = os.fork()
    if pid == 0:  # the child: report by exit code only
        fresh = threaded._WATCH._thread is None and threaded._WATCH.idle
        os._exit(0 if fresh else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


async def test_a_peer_that_never_reads_its_replies_holds_bounded_threads(
    socket_dir: str,
) -> None:
    before = set(threading.enumerate())
    server = RPCServer(BlockingHandler(), token=TOKEN)
    async with serve_unix_socket(server, os.path.join(socket_dir, "s")) as path:
        greedy = await RawClient.open(path, timeout=2.0)
        try:
            # Far more 1 MiB replies than the socket buffers: the serving threads block
            # writing, the reading stops at the thread cap, the rest wait in the socket.
            flood = b"".join(request(i, "big") for i in range(500))

            def send_flood() -> None:
                try:
                    greedy.sock.sendall(flood)
                except OSError:  # the host stopped reading: what it should do
                    pass

            await anyio.to_thread.run_sync(send_flood)
            await anyio.sleep(0.5)
            assert len(new_threads(before)) <= CONNECTION_THREADS  # + anyio workers
            # The host is not hung: another connection is served meanwhile.
            async with raw_client(path) as other:
                assert result(await other.call(request(7, "echo", {"ok": 1})), 7) == {"ok": 1}
            await wait_until(
                lambda: len(new_threads(before)) <= CONNECTION_THREADS,
                "the other connection's threads ended, the greedy one's stayed bounded",
            )
        finally:
            greedy.close()
    await wait_until(lambda: not new_threads(before), "every serving thread ended")
    assert server.connections == 0


async def test_many_connections_each_holding_half_a_frame(socket_dir: str) -> None:
    before = set(threading.enumerate())
    cap = 64 * 1024
    server = RPCServer(BlockingHandler(), token=TOKEN, max_frame_size=cap)
    async with serve_unix_socket(server, os.path.join(socket_dir, "s")) as path:
        clients = [await RawClient.open(path) for _ in range(12)]
        try:
            half = struct.pack(">I", cap - 100) + b"\x81" + b"a" * (cap // 2)
            for client in clients:
                await client.send(half)
            await anyio.sleep(0.5)
            # One reading thread per connection; the run's cap on unfinished frames.
            assert len(new_threads(before)) <= len(clients)
            assert server.buffered <= server.max_buffered_bytes
            async with raw_client(path) as fresh:
                assert result(await fresh.call(request(3, "echo", {"x": 1})), 3) == {"x": 1}

            def outcome(client: RawClient) -> str:
                try:
                    reply = client.read_reply()
                except TimeoutError:
                    return "held"
                assert reply["error"]["kind"] == "frame_too_large", reply
                return "refused"

            for client in clients:
                client.sock.settimeout(0.5)
            outcomes = [await anyio.to_thread.run_sync(outcome, c) for c in clients]
            assert "refused" in outcomes  # 12 half frames of 32 KiB pass the 256 KiB cap
        finally:
            for client in clients:
                client.close()
    await wait_until(lambda: not new_threads(before), "every serving thread ended")
    assert server.buffered == 0
    assert server.connections == 0


async def test_run_end_while_sync_tools_block_leaves_no_reader(
    socket_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_threads, "TOOL_CALL_DRAIN_SECONDS", 0.5)
    before = set(threading.enumerate())
    handler = BlockingHandler()
    server = RPCServer(handler, token=TOKEN)
    clients: list[RawClient] = []
    try:
        async with serve_unix_socket(server, os.path.join(socket_dir, "s")) as path:
            for n in (4, 1):
                client = await RawClient.open(path)
                clients.append(client)
                await client.send(b"".join(request(i, "block") for i in range(n)))
            for _ in range(5):
                entered = await anyio.to_thread.run_sync(handler.entered.acquire, True, 10)
                assert entered, "a blocking tool never started"
            started = time.monotonic()
        # The drain waited its bound, not the tools; every reading thread has gone: it
        # stopped reading before the run ended, and ends its thread just after.
        assert time.monotonic() - started < 0.5 + SETTLE_SECONDS
        await wait_until(lambda: len(new_threads(before)) <= 5, "only the tools' threads stay")
        for client in clients:
            client.sock.settimeout(SETTLE_SECONDS)
            assert await anyio.to_thread.run_sync(client.sock.recv, 1) == b""
    finally:
        handler.release.set()
        for client in clients:
            client.close()
    await wait_until(lambda: not new_threads(before), "the tools' threads ended")
    assert server.connections == 0


async def test_abandon_ends_the_run_without_the_drain(socket_dir: str) -> None:
    before = set(threading.enumerate())
    handler = BlockingHandler()
    server = RPCServer(handler, token=TOKEN)
    try:
        async with (
            serve_unix_socket(server, os.path.join(socket_dir, "s")) as path,
            raw_client(path) as client,
        ):
            await client.send(request(1, "block"))
            assert await anyio.to_thread.run_sync(handler.entered.acquire, True, 10)
            started = time.monotonic()
            server.abandon()
        assert time.monotonic() - started < host_threads.TOOL_CALL_DRAIN_SECONDS - 2
    finally:
        handler.release.set()
    await wait_until(lambda: not new_threads(before), "the tool's thread ended")


async def test_frames_are_written_whole_under_concurrent_replies(socket_dir: str) -> None:
    """Many threads answering at once on one connection never interleave frames."""
    server = RPCServer(BlockingHandler(), token=TOKEN)
    count = 300
    async with (
        serve_unix_socket(server, os.path.join(socket_dir, "s")) as path,
        raw_client(path) as client,
    ):
        await client.send(
            b"".join(request(i, "big" if i % 10 == 0 else "echo", {"i": i}) for i in range(count))
        )
        replies = await client.replies(count)
    assert sorted(r["id"] for r in replies) == list(range(count))
    for r in replies:
        if r["id"] % 10 == 0:
            assert r["result"] == "x" * MiB
        else:
            assert json.loads(r["result"]) == {"i": r["id"]}


async def test_a_run_that_ends_amid_calls_to_the_loop_releases_every_connection(
    socket_dir: str,
) -> None:
    """A run cut off while a connection's requests stream to the loop (async tools):
    a request handed to the loop but not yet started there was once lost when the
    connection's queue was cancelled, so the connection was never released: its socket
    was left to the garbage collector and the connection counted open. Tried many
    times, cut at a later point in the stream each time."""
    before = set(threading.enumerate())
    for attempt in range(40):
        await _end_amid_calls_to_the_loop(os.path.join(socket_dir, "s"), attempt)
    await wait_until(lambda: not new_threads(before), "the serving threads ended")


async def _end_amid_calls_to_the_loop(path: str, calls: int) -> None:
    """Stream async calls, end the run once ``calls`` have reached the loop, and wait
    for the connection to be released."""
    handler = BlockingHandler()
    server = RPCServer(handler, token=TOKEN)
    async with serve_unix_socket(server, path):
        client = await RawClient.open(path)
        try:
            await client.send(b"".join(request(i, "async") for i in range(400)))
            await wait_until(lambda: handler.loop_calls > calls, "calls reach the loop")
            server.abandon()
        finally:
            client.close()
    await wait_until(lambda: server.connections == 0, f"released, cut after {calls} calls")


class QueueSource(threaded.LeaderFollowers):
    """A source of requests put in a queue, its replies kept in a list: the smallest
    transport of rpc/threaded.py, for driving the read turn by hand. It never joins the
    hand-off watch (``_watched`` from the start): the test takes the turn from a call
    itself, as the watch's tick would (``_hand_on``)."""

    def __init__(self, server: RPCServer, tasks: anyio.abc.TaskGroup) -> None:
        super().__init__(server, tasks)
        self._watched = True
        self.queue: queue.Queue[Request | None] = queue.Queue()
        self.replies: queue.Queue[dict[str, Any]] = queue.Queue()

    def _read(self) -> bool:
        item = self.queue.get()
        if item is None:
            return False
        self._ready.append((item, None))
        return True

    def _send(self, reply: Any, tag: Any) -> None:
        if not self.closed:
            self.replies.put(reply)

    def _wake_readers(self) -> None:
        self.queue.put(None)


class TwoLatches:
    """Sync tools ``block1`` and ``block2``, each waiting for its own latch; ``echo``."""

    def __init__(self) -> None:
        self.release = {"block1": threading.Event(), "block2": threading.Event()}
        self.entered = {"block1": threading.Event(), "block2": threading.Event()}

    def answer_blocking(self, request: Request) -> str | None:
        if request.tool in self.release:
            self.entered[request.tool].set()
            self.release[request.tool].wait(60)
        return json.dumps({"tool": request.tool})

    async def __call__(self, request: Request) -> str:
        raise AssertionError("no tool of these runs on the loop")


async def test_a_call_that_lost_the_turn_never_ends_the_next_holders_loan() -> None:
    """The turn is taken from a blocked call and a follower runs the next call with it
    lent; when the first call returns, its thread must wait for the turn, not read
    beside the follower's call (which holds the turn until it is done or taken)."""
    before = set(threading.enumerate())
    handler = TwoLatches()
    server = RPCServer(handler, token=TOKEN)

    def take(timeout: float = SETTLE_SECONDS) -> str:
        return str(json.loads(source.replies.get(timeout=timeout)["result"])["tool"])

    async with anyio.create_task_group() as tasks:
        source = QueueSource(server, tasks)
        tasks.start_soon(source.run_later)
        source.start()
        try:
            source.queue.put(Request(1, "block1", {}, TOKEN))
            assert await anyio.to_thread.run_sync(handler.entered["block1"].wait, 10)
            source._hand_on()  # as the watch does with a call that runs a whole tick
            source.queue.put(Request(2, "block2", {}, TOKEN))  # the follower's call
            assert await anyio.to_thread.run_sync(handler.entered["block2"].wait, 10)
            handler.release["block1"].set()
            assert await anyio.to_thread.run_sync(take) == "block1"
            source.queue.put(Request(3, "echo", {}, TOKEN))
            # block2 still holds the turn: nothing reads the echo until it is done.
            with pytest.raises(queue.Empty):
                await anyio.to_thread.run_sync(take, 0.3)
            assert source.calls_in_flight == 1
            handler.release["block2"].set()
            assert {await anyio.to_thread.run_sync(take) for _ in range(2)} == {"block2", "echo"}
        finally:
            for latch in handler.release.values():
                latch.set()
            source.shut()
            source.close_later()
        with anyio.fail_after(SETTLE_SECONDS):
            await source.ended.wait()
        tasks.cancel_scope.cancel()
    await wait_until(lambda: not [t for t in new_threads_named(before, "hermes-rpc")], "ended")
    assert source.calls_in_flight == 0


def new_threads_named(before: set[threading.Thread], name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t not in before and t.is_alive() and t.name == name]
