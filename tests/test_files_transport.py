"""Tests for rpc/files.py: the files transport's host side, on a real directory.

The client writes request files by hand (struct and msgpack, no code from rpc/), as a
script would, from a worker thread while the server runs in the test's event loop.
Each guarantee the reference lacked is tried: every request gets a reply (malformed,
oversized, unauthorized ones too), stale files are removed and never run, a request
sent again under the same key never runs its tool twice.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import struct
import subprocess
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import msgpack
import psutil
import pytest
from conftest import bwrap_problem, require

from hermes_sandbox import execute_code_async
from hermes_sandbox import threads as host_threads
from hermes_sandbox.environments.local import MEMORY_PARENT
from hermes_sandbox.environments.local_settings import LocalSettings
from hermes_sandbox.rpc import files as files_transport
from hermes_sandbox.rpc import messages
from hermes_sandbox.rpc.errors import CallRefused
from hermes_sandbox.rpc.files import (
    SAFETY_RESCAN,
    SERVING_THREAD,
    FileChannel,
    _Inotify,
    serve_files,
)
from hermes_sandbox.rpc.messages import Request
from hermes_sandbox.rpc.server import RPCServer
from hermes_sandbox.tools.registry import ToolRegistry
from hermes_sandbox.transports import FILES_DIR_PREFIX, FILES_MEMORY_PREFIX, FILES_MEMORY_ROOM

TOKEN = "files-token"
REPLY_TIMEOUT = 5.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class CountingHandler:
    """Counts how often each tool ran; ``slow`` waits until released."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.release = anyio.Event()
        self.called = anyio.Event()

    async def __call__(self, request: Request) -> str:
        self.calls.append((request.tool, request.args))
        self.called.set()
        if request.tool == "slow":
            await self.release.wait()
        if request.tool == "refuse":
            raise CallRefused(messages.NOT_ALLOWED, "not this one")
        if request.tool == "big":
            return "x" * int(request.args["size"])
        return json.dumps({"echo": request.args})


def frame(message: Any) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def put(directory: Path, key: str, data: bytes) -> None:
    temporary = directory / f".{key}.tmp"
    temporary.write_bytes(data)
    os.rename(temporary, directory / f"{key}.req")


def request(tool: str = "echo", token: str = TOKEN, request_id: int = 1, **args: Any) -> bytes:
    return frame({"id": request_id, "tool": tool, "args": args, "token": token})


def wait_reply(directory: Path, key: str) -> dict[str, Any]:
    path = directory / f"{key}.rep"
    deadline = time.monotonic() + REPLY_TIMEOUT
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"no reply to {key} within {REPLY_TIMEOUT}s")
        time.sleep(0.001)
    data = path.read_bytes()
    path.unlink()
    (size,) = struct.unpack(">I", data[:4])
    assert len(data) == 4 + size, "a reply file holds exactly one frame"
    reply = msgpack.unpackb(data[4:], raw=False)
    assert isinstance(reply, dict)
    return reply


async def ask(directory: Path, key: str, data: bytes) -> dict[str, Any]:
    def go() -> dict[str, Any]:
        put(directory, key, data)
        return wait_reply(directory, key)

    return await anyio.to_thread.run_sync(go)


@asynccontextmanager
async def serving(
    directory: Path, handler: CountingHandler, **options: Any
) -> AsyncIterator[FileChannel]:
    server = RPCServer(handler, token=TOKEN, **options)
    async with serve_files(server, str(directory)) as channel:
        yield channel


@pytest.mark.anyio
async def test_a_call_and_its_reply(tmp_path: Path) -> None:
    handler = CountingHandler()
    async with serving(tmp_path, handler):
        reply = await ask(tmp_path, "1-a-1", request(x=1))
    assert reply == {"id": 1, "result": json.dumps({"echo": {"x": 1}})}
    assert handler.calls == [("echo", {"x": 1})]
    assert os.listdir(tmp_path) == []  # the request was taken, the reply collected


@pytest.mark.anyio
async def test_the_reply_is_written_into_its_request_file(tmp_path: Path) -> None:
    """No new file per reply: the host writes it into the request's own file (held
    open here, so the same inode is the same file, not a freed one given out again)."""
    handler = CountingHandler()
    async with serving(tmp_path, handler):

        def go() -> tuple[int, int, dict[str, Any]]:
            temporary = tmp_path / ".r-1.tmp"
            temporary.write_bytes(request(x=1))
            fd = os.open(temporary, os.O_RDONLY)
            try:
                os.rename(temporary, tmp_path / "r-1.req")
                inode = os.fstat(fd).st_ino
                deadline = time.monotonic() + REPLY_TIMEOUT
                while not (tmp_path / "r-1.rep").exists() and time.monotonic() < deadline:
                    time.sleep(0.001)
                return inode, (tmp_path / "r-1.rep").stat().st_ino, wait_reply(tmp_path, "r-1")
            finally:
                os.close(fd)

        request_inode, reply_inode, reply = await anyio.to_thread.run_sync(go)
    assert reply == {"id": 1, "result": json.dumps({"echo": {"x": 1}})}
    assert reply_inode == request_inode
    assert os.listdir(tmp_path) == []


@pytest.mark.anyio
async def test_a_call_renames_nothing_but_its_reply_into_the_directory(tmp_path: Path) -> None:
    """Every rename into the directory wakes both sides' watches: the host keeps a
    request's file under its name while the tool runs and renames it once, to the
    reply's name (no temporary name in between)."""
    handler = CountingHandler()
    watch = _Inotify(str(tmp_path))  # the host's own inotify wrapper, on its own fd
    try:
        async with serving(tmp_path, handler):
            replies = [await ask(tmp_path, f"r-{k}", request(x=k)) for k in range(3)]
        renamed = watch.names()
    finally:
        watch.close()
    assert [reply["result"] for reply in replies] == [
        json.dumps({"echo": {"x": k}}) for k in range(3)
    ]
    # The test's own renames (its requests) and the host's: the replies, nothing else.
    assert renamed == {f"r-{k}.{suffix}" for k in range(3) for suffix in ("req", "rep")}


@pytest.mark.anyio
async def test_a_request_waiting_for_its_reply_is_passed_over_by_a_full_look(
    tmp_path: Path,
) -> None:
    """The request's file keeps its name while the tool runs: a look at every entry
    (after SAFETY_RESCAN with nothing renamed in) must not take it as a new request."""
    handler = CountingHandler()
    async with serving(tmp_path, handler) as channel:
        await anyio.to_thread.run_sync(put, tmp_path, "slow-1", request(tool="slow"))
        await handler.called.wait()
        await anyio.sleep(SAFETY_RESCAN * 2.5)  # two full looks, at least
        assert (tmp_path / "slow-1.req").exists()
        assert channel.requests_served == 1
        handler.release.set()
        reply = await anyio.to_thread.run_sync(wait_reply, tmp_path, "slow-1")
    assert "result" in reply
    assert len(handler.calls) == 1
    assert os.listdir(tmp_path) == []


@pytest.mark.anyio
async def test_stale_files_are_removed_first_and_never_run(tmp_path: Path) -> None:
    put(tmp_path, "old-1", request(tool="stale"))
    (tmp_path / "old-2.rep").write_bytes(b"an earlier run's reply")
    (tmp_path / ".half-written").write_bytes(b"\x00")
    handler = CountingHandler()
    async with serving(tmp_path, handler) as channel:
        reply = await ask(tmp_path, "new-1", request())
    assert "result" in reply
    assert [tool for tool, _ in handler.calls] == ["echo"]
    assert channel.requests_served == 1
    assert os.listdir(tmp_path) == []


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b"", messages.BAD_FRAME),
        (b"\x00\x00", messages.BAD_FRAME),
        (b"\x00\x00\x00\x05abc", messages.BAD_FRAME),  # header says more than there is
        (b"\x00\x00\x00\x01\xc1", messages.BAD_FRAME),  # 0xc1 is never valid msgpack
        (frame([1, 2, 3]), messages.BAD_FRAME),  # not a map
        (frame({"id": 3, "tool": "echo", "args": {}}), messages.UNAUTHORIZED),
        (request(token="wrong"), messages.UNAUTHORIZED),
        (frame({"id": "x", "tool": "echo", "token": TOKEN}), messages.BAD_REQUEST),
        (request(tool="refuse"), messages.NOT_ALLOWED),
    ],
)
async def test_every_bad_request_gets_a_reply(tmp_path: Path, data: bytes, kind: str) -> None:
    handler = CountingHandler()
    async with serving(tmp_path, handler):
        reply = await ask(tmp_path, "bad-1", data)
        # ... and the channel goes on serving after it
        good = await ask(tmp_path, "good-1", request(request_id=9))
    assert reply["error"]["kind"] == kind, reply
    assert good["id"] == 9 and "result" in good
    assert all(tool in ("echo", "refuse") for tool, _ in handler.calls)
    assert ("echo", {}) not in handler.calls[:-1]  # the unauthorized ones never ran


@pytest.mark.anyio
async def test_an_oversized_request_is_refused_unread(tmp_path: Path) -> None:
    handler = CountingHandler()
    async with serving(tmp_path, handler, max_frame_size=1024):
        reply = await ask(tmp_path, "big-1", request(blob="x" * 5000))
    assert reply["error"]["kind"] == messages.FRAME_TOO_LARGE
    assert handler.calls == []


@pytest.mark.anyio
async def test_a_repeated_request_never_runs_twice(tmp_path: Path) -> None:
    handler = CountingHandler()
    async with serving(tmp_path, handler):
        first = await ask(tmp_path, "7-r-1", request(request_id=1, n=1))
        again = await ask(tmp_path, "7-r-1", request(request_id=1, n=1))
    assert first == again
    assert handler.calls == [("echo", {"n": 1})]


@pytest.mark.anyio
async def test_a_retry_while_the_tool_runs_gets_the_one_answer(tmp_path: Path) -> None:
    handler = CountingHandler()
    async with serving(tmp_path, handler):
        await anyio.to_thread.run_sync(put, tmp_path, "slow-1", request(tool="slow"))
        await handler.called.wait()
        await anyio.to_thread.run_sync(put, tmp_path, "slow-1", request(tool="slow"))
        await anyio.sleep(0.05)  # the retry is taken, and not run
        assert not (tmp_path / "slow-1.req").exists()
        handler.release.set()
        reply = await anyio.to_thread.run_sync(wait_reply, tmp_path, "slow-1")
    assert "result" in reply
    assert len(handler.calls) == 1


@pytest.mark.anyio
async def test_calls_overlap_and_each_is_answered(tmp_path: Path) -> None:
    handler = CountingHandler()
    async with serving(tmp_path, handler):
        await anyio.to_thread.run_sync(put, tmp_path, "slow-1", request(tool="slow"))
        quick = await ask(tmp_path, "quick-1", request(request_id=2))
        assert "result" in quick  # not held up behind the slow one
        handler.release.set()
        slow = await anyio.to_thread.run_sync(wait_reply, tmp_path, "slow-1")
    assert "result" in slow


@pytest.mark.anyio
async def test_files_with_other_names_are_removed(tmp_path: Path) -> None:
    handler = CountingHandler()
    async with serving(tmp_path, handler):
        # Renamed in, as a script would, so inotify reports it at once (a file created
        # in place is found by the next SAFETY_RESCAN instead).
        (tmp_path / ".other").write_bytes(request())
        os.rename(tmp_path / ".other", tmp_path / "not a request")
        put(tmp_path, "x" * 101, request())  # key too long
        reply = await ask(tmp_path, "ok-1", request())
        assert "result" in reply
        await anyio.sleep(0.05)
    assert sorted(os.listdir(tmp_path)) == []
    assert len(handler.calls) == 1


@pytest.mark.anyio
async def test_a_planted_fifo_request_is_never_opened_for_writing(tmp_path: Path) -> None:
    """The host may write a reply into its request's file, but only once that file is
    known to be a regular one: a FIFO planted as a request is opened to be read (and
    refused), never for writing. A script's blocking open of the FIFO for reading
    returns only when some process opens it for writing: here, only the test does."""
    handler = CountingHandler()
    calls = tmp_path / "calls"
    calls.mkdir()
    fifo = tmp_path / "fifo"  # its first name, outside the directory the host serves
    os.mkfifo(fifo)
    opened = threading.Event()

    def reader() -> None:
        fd = os.open(fifo, os.O_RDONLY)  # until a writer opens it
        opened.set()
        os.close(fd)

    watcher = threading.Thread(target=reader, daemon=True)
    watcher.start()
    try:
        async with serving(calls, handler):
            os.link(fifo, calls / "f-1.req")  # the same FIFO, planted as a request
            reply = await anyio.to_thread.run_sync(wait_reply, calls, "f-1")
            assert reply["error"]["kind"] == messages.BAD_FRAME
            assert not opened.wait(0.2), "the host opened a planted FIFO for writing"
    finally:
        while watcher.is_alive():  # free the reader
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # it has not opened yet
                pass
            watcher.join(0.05)
    assert handler.calls == []


@pytest.mark.anyio
async def test_a_symlinked_request_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path.parent / f"{tmp_path.name}-secret"
    secret.write_bytes(request(tool="from-a-link"))
    calls = tmp_path / "calls"
    calls.mkdir()
    handler = CountingHandler()
    async with serving(calls, handler):
        os.symlink(secret, calls / "link-1.req")
        reply = await anyio.to_thread.run_sync(wait_reply, calls, "link-1")
    assert reply["error"]["kind"] == messages.BAD_FRAME
    assert handler.calls == []
    assert secret.exists()  # the link was removed, not its target
    secret.unlink()


ROUNDS_SCRIPT = """
import threading
from hermes_tools import echo

def work(t):
    for i in range(5):
        assert echo(text="%d-%d" % (t, i)) == {"text": "%d-%d" % (t, i)}

threads = [threading.Thread(target=work, args=(t,)) for t in range(3)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("ok")
"""


def memory_problem() -> str | None:
    """Why this machine has no room for a call directory in memory, or None."""
    try:
        free = os.statvfs(MEMORY_PARENT)
    except OSError:
        return f"no {MEMORY_PARENT} here"
    if free.f_bavail * free.f_frsize < FILES_MEMORY_ROOM:
        return f"{MEMORY_PARENT} has under {FILES_MEMORY_ROOM} bytes free"
    return None


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Any:
    """A 64 KB tmpfs of its own (mounting needs root): a call directory that fills up."""
    where = tmp_path / "small"
    where.mkdir()
    mount = shutil.which("mount")
    if mount is None or os.geteuid() != 0:
        require("mounting one needs root and mount(8)", "a small tmpfs")
    assert mount is not None
    done = subprocess.run(
        [mount, "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        require(f"mount failed: {done.stderr.strip()}", "a small tmpfs")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


@pytest.mark.anyio
async def test_a_reply_with_no_room_in_its_filesystem_gets_an_error_reply(
    small_tmpfs: Path,
) -> None:
    """A call directory in a small tmpfs: a 200 KB reply does not fit, and the caller
    gets an error saying so (not silence until the run's timeout); the next small call
    is answered as usual."""
    handler = CountingHandler()
    async with serving(small_tmpfs, handler):
        reply = await ask(small_tmpfs, "big", request("big", size=200_000))
        assert reply["error"]["kind"] == messages.INTERNAL, reply
        assert "filesystem is full" in reply["error"]["message"]
        after = await ask(small_tmpfs, "small", request("big", size=10, request_id=2))
    assert after["result"] == "x" * 10


def echo_registry() -> ToolRegistry:
    """A registry of one plain tool, ``echo``, which returns its arguments."""
    registry = ToolRegistry()
    registry.register(
        "echo",
        "test",
        {
            "name": "echo",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
        },
        lambda args: json.dumps(args),
    )
    return registry


ECHO_DIR_SCRIPT = """import os
from hermes_tools import echo
assert echo(text="hi") == {"text": "hi"}
print(os.environ["HERMES_RPC_DIR"])
"""


@pytest.mark.anyio
@pytest.mark.parametrize("isolation", ["none", "bwrap"])
async def test_a_local_files_run_keeps_its_call_directory_in_memory(isolation: str) -> None:
    """On the local backend the call directory is made in /dev/shm where it has room
    (fewer, cheaper filesystem operations a call than on a disk), and removed with its
    run; under bwrap the script reaches it through its private /dev."""
    if isolation == "bwrap":
        require(bwrap_problem(), "a run under bwrap needs a bubblewrap that works here")
    require(memory_problem(), "a call directory in memory")
    registry = echo_registry()
    result = await execute_code_async(
        ECHO_DIR_SCRIPT,
        transport="files",
        tools=["echo"],
        registry=registry,
        backend=LocalSettings(isolation=isolation),
    )
    assert result.status == "success", result.to_dict()
    directory = Path(result.output.strip())
    assert str(directory.parent.parent) == MEMORY_PARENT
    assert directory.parent.name.startswith(FILES_MEMORY_PREFIX)
    assert directory.name.startswith(FILES_DIR_PREFIX)
    assert not await anyio.Path(directory.parent).exists()


LITTERING_SCRIPT = """import os
from hermes_tools import echo
assert echo(text="hi") == {"text": "hi"}
directory = os.environ["HERMES_RPC_DIR"]
parent = os.path.dirname(directory)
os.rename(directory, directory + ".away")
os.symlink(parent, directory)
with open(os.path.join(parent, "left-behind"), "w") as f:
    f.write("x")
print(directory)
"""


@pytest.mark.anyio
async def test_what_a_script_leaves_beside_its_call_directory_goes_with_the_run() -> None:
    """A call directory in memory has a private parent of its own, removed as a whole:
    a script that renames its directory away, puts a symlink in its place and writes
    beside it (as it may with no isolation) leaves nothing in the shared /dev/shm."""
    require(memory_problem(), "a call directory in memory")
    registry = echo_registry()
    result = await execute_code_async(
        LITTERING_SCRIPT, transport="files", tools=["echo"], registry=registry
    )
    assert result.status == "success", result.to_dict()
    directory = Path(result.output.strip())
    for left in (directory, Path(f"{directory}.away"), directory.parent / "left-behind"):
        assert not await anyio.to_thread.run_sync(os.path.lexists, left), left


@pytest.mark.anyio
async def test_rounds_of_runs_leave_no_descriptors_or_threads_behind() -> None:
    """Four rounds of four runs at once over files, in one event loop (a long-lived
    host): the host's open descriptors after each round stay those after the first
    (each run's inotify watch and directory handle are closed), and so do its threads
    other than anyio's pooled workers."""
    registry = echo_registry()
    process = psutil.Process()
    # Threads of earlier tests (trio's cached workers) may end during this one.
    earlier = {t.ident for t in threading.enumerate()}
    counts = []
    for _ in range(4):
        results: list[Any] = []

        async def one(results: list[Any] = results) -> None:
            result = await execute_code_async(
                ROUNDS_SCRIPT, transport="files", tools=["echo"], registry=registry
            )
            results.append(result)

        async with anyio.create_task_group() as tasks:
            for _ in range(4):
                tasks.start_soon(one)
        assert [(r.status, r.output.strip(), r.tool_calls_made) for r in results] == [
            ("success", "ok", 15)
        ] * 4, [r.to_dict() for r in results]
        gc.collect()
        # The last serving thread signals the run's end just before it returns: it may
        # still be alive for a moment after the run (a thread kept would stay).
        await wait_until(
            lambda: all(t.ident in earlier for t in serving_threads()),
            "the round's serving threads ended",
        )
        # anyio's pooled workers stay for a while, as many as the busiest moment needed.
        own = [
            t.name
            for t in threading.enumerate()
            if t.name != "AnyIO worker thread" and t.ident not in earlier
        ]
        counts.append((process.num_fds(), sorted(own)))
    fds = [c[0] for c in counts]
    threads = [c[1] for c in counts]
    assert fds[1:] == [fds[0]] * 3, f"open descriptors after each round: {fds}"
    assert threads[1:] == [threads[0]] * 3, f"threads after each round: {threads}"


class SlowToClose(_Inotify):
    """A real inotify watch whose close waits until the test releases it, as the
    kernel's close does for some milliseconds when a watch on the same directory has
    just gone (the script's, as its process exits)."""

    def __init__(self, directory: str) -> None:
        super().__init__(directory)
        self.release = threading.Event()
        self.closed = threading.Event()

    def close(self) -> None:
        self.release.wait(10)
        super().close()
        self.closed.set()


@pytest.mark.anyio
async def test_the_end_of_a_run_does_not_wait_for_its_watch_to_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's end is signalled before the watch is closed, so a slow close (about
    7 ms of every files run, docs/benchmarks.md) is not on its path; the watch is
    still closed, by the last serving thread, after it."""
    watchers: list[SlowToClose] = []

    def watcher(directory: str) -> SlowToClose:
        watchers.append(SlowToClose(directory))
        return watchers[-1]

    monkeypatch.setattr(files_transport, "_watcher", watcher)
    process = psutil.Process()
    fds = process.num_fds()
    handler = CountingHandler()
    try:
        async with serving(tmp_path, handler) as channel:
            reply = await ask(tmp_path, "1-a-1", request(x=1))
        assert reply == {"id": 1, "result": json.dumps({"echo": {"x": 1}})}
        assert channel.ended.is_set(), "the end of the run waited for the watch's close"
        assert not watchers[0].closed.is_set()
    finally:
        watchers[0].release.set()
    await wait_until(watchers[0].closed.is_set, "the watch closed")
    await wait_until(lambda: not serving_threads(), "every serving thread ended")
    assert process.num_fds() == fds


class BlockingHandler:
    """Sync tools, as users register them: ``block`` blocks its thread until released.
    Records the name of each thread a tool ran on."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)
        self.thread_names: list[str] = []

    def answer_blocking(self, request: Request) -> str:
        self.thread_names.append(threading.current_thread().name)
        if request.tool == "block":
            self.entered.release()
            self.release.wait(60)
        return json.dumps({"echo": request.args})

    async def __call__(self, request: Request) -> str:
        raise AssertionError("a sync tool never goes to the event loop")


def serving_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == SERVING_THREAD and t.is_alive()]


async def wait_until(predicate: Any, what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():  # threads end outside the loop: nothing to wait on but time
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        await anyio.sleep(0.02)


@pytest.mark.anyio
async def test_a_blocked_sync_tool_never_stalls_the_other_calls(tmp_path: Path) -> None:
    handler = BlockingHandler()
    server = RPCServer(handler, token=TOKEN)
    async with serve_files(server, str(tmp_path)):
        await anyio.to_thread.run_sync(put, tmp_path, "b-1", request(tool="block"))
        entered = await anyio.to_thread.run_sync(handler.entered.acquire, True, 10)
        assert entered, "the blocking tool never started"
        for k in range(3):  # answered while "block" still holds its thread
            reply = await ask(tmp_path, f"e-{k}", request(x=k))
            assert reply == {"id": 1, "result": json.dumps({"echo": {"x": k}})}
        handler.release.set()
        reply = await anyio.to_thread.run_sync(wait_reply, tmp_path, "b-1")
        assert "result" in reply
    # Each ran on the channel's own serving threads: no hop to a pool or the loop.
    assert set(handler.thread_names) == {SERVING_THREAD}
    await wait_until(lambda: not serving_threads(), "every serving thread ended")
    assert os.listdir(tmp_path) == []


@pytest.mark.anyio
@pytest.mark.parametrize("end", ["drained", "cancelled"])
async def test_run_end_while_a_sync_tool_blocks_leaves_nothing_behind(
    tmp_path: Path, end: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run ends (after the drain's bound, or cancelled as by Ctrl-C) while a sync
    tool blocks: every serving thread but the tool's is gone at once, and when the tool
    returns its thread writes nothing and closes the directory and the watch."""
    monkeypatch.setattr(host_threads, "TOOL_CALL_DRAIN_SECONDS", 0.5)
    process = psutil.Process()
    fds = process.num_fds()
    handler = BlockingHandler()
    server = RPCServer(handler, token=TOKEN)
    try:
        with anyio.CancelScope() as scope:
            async with serve_files(server, str(tmp_path)):
                for k in range(3):
                    await anyio.to_thread.run_sync(put, tmp_path, f"b-{k}", request(tool="block"))
                for _ in range(3):
                    entered = await anyio.to_thread.run_sync(handler.entered.acquire, True, 10)
                    assert entered, "a blocking tool never started"
                if end == "cancelled":
                    scope.cancel()
                    await anyio.sleep_forever()
        # Only the threads inside the tools stay (the others are ending).
        await wait_until(lambda: len(serving_threads()) == 3, "the readers ended")
        assert process.num_fds() > fds  # the directory stays open under them
    finally:
        handler.release.set()
    await wait_until(lambda: not serving_threads(), "the tools' threads ended")
    assert process.num_fds() == fds
    assert os.listdir(tmp_path) == []  # no reply written after the end
