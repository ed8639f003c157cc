"""Attacks on the host by a hostile script, through the real runtime and transports.

Each test is a script written to break the host rather than to do work (issue #11:
the files transport, the relay, and the work the host does before it checks the
token). It runs with :func:`hermes_sandbox.execute_code` on each backend x transport
pair where the attack applies: ``local`` and ``docker`` (scripts/podman-service), over
``unix``, ``relay`` and ``files``. The host is this test process, so its CPU time and
memory are measured here; a test that hangs fails on the short per-test timeout.
"""

from __future__ import annotations

import json
import logging
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import IMAGE, RUN_ID, TEST_LABEL, engine_problem, require

from hermes_sandbox import ExecutionResult, execute_code

TARGETS = [
    ("local", "unix"),
    ("local", "relay"),
    ("local", "files"),
    ("docker", "unix"),
    ("docker", "relay"),
    ("docker", "files"),
]
SOCKET_TARGETS = [t for t in TARGETS if t[1] != "files"]
FILES_TARGETS = [t for t in TARGETS if t[1] == "files"]
RELAY_TARGETS = [t for t in TARGETS if t[1] == "relay"]

# Script code: raw frames over whichever transport the script was given, with no help
# from hermes_tools (an attacker writes bytes, not calls).
RAW = """
import os, socket, struct, time
import _hermes_msgpack as codec

TOKEN = os.environ["HERMES_RPC_TOKEN"]
RPC_DIR = os.environ.get("HERMES_RPC_DIR")

def frame(body):
    return struct.pack(">I", len(body)) + body

def body_of(message):
    return codec.packb(message)

def read_replies(sock):
    '''Every reply until the host closes the connection.'''
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    replies = []
    while len(data) >= 4:
        size = struct.unpack(">I", data[:4])[0]
        replies.append(codec.unpackb(data[4:4 + size]))
        data = data[4 + size:]
    return replies

def ask_raw(data, key="raw"):
    '''Send raw bytes as one request; the decoded reply, or None if the host hung up.'''
    if RPC_DIR:
        tmp = os.path.join(RPC_DIR, "." + key)
        with open(tmp, "wb") as f:
            f.write(data)
        os.rename(tmp, os.path.join(RPC_DIR, key + ".req"))
        return wait_reply(key)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(os.environ["HERMES_RPC_SOCKET"])
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the host stopped reading: its reply says why
        replies = read_replies(s)
        return replies[0] if replies else None

def wait_reply(key, timeout=10.0):
    path = os.path.join(RPC_DIR, key + ".rep")
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return None
        time.sleep(0.005)
    with open(path, "rb") as f:
        data = f.read()
    os.unlink(path)
    return codec.unpackb(data[4:])

def kind(reply):
    return None if reply is None else (reply.get("error") or {}).get("kind", "result")
"""


@pytest.fixture(params=TARGETS, ids=[f"{b}-{t}" for b, t in TARGETS])
def target(request: pytest.FixtureRequest) -> tuple[str, str]:
    backend, transport = request.param
    if backend == "docker":
        require(engine_problem(), "the docker attacks need a container engine")
    return backend, transport


def runner(target: tuple[str, str], tmp_path: Path) -> Callable[..., ExecutionResult]:
    backend, transport = target

    def _run(code: str, **options: Any) -> ExecutionResult:
        options.setdefault("timeout", 20.0)
        options.setdefault("spill_dir", str(tmp_path / "spill"))
        if backend == "docker":
            options.setdefault("backend_options", {"image": IMAGE, "labels": {TEST_LABEL: RUN_ID}})
        return execute_code(
            RAW + textwrap.dedent(code), backend=backend, transport=transport, **options
        )

    return _run


def _lines(result: ExecutionResult) -> list[str]:
    return result.output.strip().splitlines()


class HostGauge:
    """This process's (the host's) peak RSS growth and CPU time while it is open."""

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._stop = threading.Event()
        self.base_rss = self._process.memory_info().rss
        self.peak_rss = self.base_rss
        self._cpu = self._process.cpu_times()
        self.cpu = 0.0

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak_rss = max(self.peak_rss, self._process.memory_info().rss)

    def __enter__(self) -> HostGauge:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        now = self._process.cpu_times()
        self.cpu = (now.user - self._cpu.user) + (now.system - self._cpu.system)

    @property
    def growth_mib(self) -> float:
        return (self.peak_rss - self.base_rss) / 2**20


@pytest.fixture
def gauge() -> Iterator[type[HostGauge]]:
    yield HostGauge


# -- 1. files transport ------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("target", FILES_TARGETS, indirect=True, ids=lambda t: "-".join(t))
def test_files_symlinked_request_directory_touches_nothing_outside(
    target: tuple[str, str], tmp_path: Path
) -> None:
    """The script swaps its request directory for a symlink to a host directory: the
    host must go on serving the directory it opened, and never list, remove or write
    in the symlink's target."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious\n")
    (victim / "bait.req").write_bytes(b"\0\0\0\1\x80")
    result = runner(target, tmp_path)(
        f"""
        away = RPC_DIR + ".away"
        os.rename(RPC_DIR, away)
        os.symlink({str(victim)!r}, RPC_DIR)
        time.sleep(1.5)   # the host rescans at least every 0.5 s
        # The host serves the directory it opened, wherever it has gone.
        RPC_DIR = away
        print(kind(ask_raw(frame(body_of({{"id": 1, "tool": "nope", "token": "x"}})))))
        """
    )
    assert result.status == "success", result.output
    assert _lines(result)[-1] == "unauthorized", result.output
    assert sorted(p.name for p in victim.iterdir()) == ["bait.req", "keep.txt"]
    assert (victim / "keep.txt").read_text() == "precious\n"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("target", FILES_TARGETS, indirect=True, ids=lambda t: "-".join(t))
def test_files_fifo_request_is_refused_and_the_timeout_still_fires(
    target: tuple[str, str], tmp_path: Path
) -> None:
    """A FIFO named k.req once blocked the host's event loop in open(): the run's
    timeout never fired. Now it is refused (bad_frame) and the host stays live."""
    started = time.monotonic()
    result = runner(target, tmp_path)(
        """
        os.mkfifo(os.path.join(RPC_DIR, "k.req"))
        print(kind(wait_reply("k")))
        print(kind(ask_raw(frame(body_of({"id": 1, "tool": "nope", "token": "x"})))))
        time.sleep(60)
        """,
        timeout=4.0,
    )
    assert result.status == "timeout", result.output
    assert time.monotonic() - started < 25
    assert _lines(result)[:2] == ["bad_frame", "unauthorized"], result.output


@pytest.mark.timeout(60)
@pytest.mark.parametrize("target", FILES_TARGETS, indirect=True, ids=lambda t: "-".join(t))
def test_files_directory_request_does_not_spin_the_host(
    target: tuple[str, str], tmp_path: Path, gauge: type[HostGauge]
) -> None:
    """A directory named k.req once kept the host at ~80% CPU for the rest of the run."""
    with gauge() as host:
        result = runner(target, tmp_path)(
            """
            os.mkdir(os.path.join(RPC_DIR, "k.req"))
            os.mkdir(os.path.join(RPC_DIR, "k.req", "inside"))   # cannot be removed
            print(kind(wait_reply("k")))
            time.sleep(3)
            print(kind(ask_raw(frame(body_of({"id": 1, "tool": "nope", "token": "x"})))))
            """
        )
    assert result.status == "success", result.output
    assert _lines(result) == ["bad_frame", "unauthorized"], result.output
    assert host.cpu < 1.5, f"the host used {host.cpu:.1f} s of CPU during a 3 s sleep"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("target", FILES_TARGETS, indirect=True, ids=lambda t: "-".join(t))
def test_files_hard_linked_request_is_refused_without_echoing_it(
    target: tuple[str, str], tmp_path: Path
) -> None:
    """A request hard-linked to another file is refused unread: the error says nothing
    of that file's size or bytes."""
    result = runner(target, tmp_path)(
        """
        secret = os.path.join(os.path.dirname(RPC_DIR), "secret")
        with open(secret, "wb") as f:
            f.write(b"\\x00\\x00\\x30\\x39" + b"TOPSECRET" * 1000)
        os.link(secret, os.path.join(RPC_DIR, "k.req"))
        reply = wait_reply("k")
        print(kind(reply))
        print(reply["error"]["message"])
        """
    )
    assert result.status == "success", result.output
    kind_line, message = _lines(result)[:2]
    assert kind_line == "bad_frame", result.output
    assert "link" in message
    for leak in ("9004", "9000", "12345", "TOPSECRET"):
        assert leak not in message, message


# -- 2. relay ----------------------------------------------------------------------------


@pytest.mark.timeout(90)
@pytest.mark.parametrize("target", SOCKET_TARGETS, indirect=True, ids=lambda t: "-".join(t))
def test_a_script_that_floods_requests_and_never_reads_is_still_killed_on_time(
    target: tuple[str, str], tmp_path: Path
) -> None:
    """Requests answered at once, sent without end and never read: the replies back
    up towards the script. The host must still enforce the run's timeout."""
    started = time.monotonic()
    result = runner(target, tmp_path)(
        """
        request = frame(body_of({"id": 1, "tool": "nope", "token": "wrong"})) * 2000
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(os.environ["HERMES_RPC_SOCKET"])
        print("flooding", flush=True)
        while True:
            s.sendall(request)
        """,
        timeout=3.0,
    )
    elapsed = time.monotonic() - started
    assert result.status in ("timeout", "error"), result.output
    assert "flooding" in result.output
    assert elapsed < 30, f"a 3 s timeout took {elapsed:.0f} s to enforce"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("target", SOCKET_TARGETS, indirect=True, ids=lambda t: "-".join(t))
def test_a_half_closed_connection_gets_its_replies(target: tuple[str, str], tmp_path: Path) -> None:
    result = runner(target, tmp_path)(
        """
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(os.environ["HERMES_RPC_SOCKET"])
            for i in range(3):
                s.sendall(frame(body_of({"id": i + 1, "tool": "nope", "token": TOKEN})))
            s.shutdown(socket.SHUT_WR)
            s.settimeout(10)
            print(sorted(kind(reply) for reply in read_replies(s)))
        """
    )
    assert result.status == "success", result.output
    assert _lines(result) == ["['unknown_tool', 'unknown_tool', 'unknown_tool']"], result.output


# -- 3. before authentication ------------------------------------------------------------


@pytest.mark.timeout(90)
def test_an_unauthenticated_array_bomb_costs_the_host_little(
    target: tuple[str, str], tmp_path: Path, gauge: type[HostGauge]
) -> None:
    """One frame of millions of empty arrays with no valid token: once ~75x its size
    in host memory, decoded on the event loop before the token was checked."""
    with gauge() as host:
        result = runner(target, tmp_path)(
            """
            n = 3 * 2**20
            body = (b"\\x84\\xa2id\\x01\\xa4tool\\xa4nope\\xa5token\\xa5wrong\\xa4args"
                    + b"\\xdd" + struct.pack(">I", n) + b"\\x90" * n)
            started = time.monotonic()
            print(kind(ask_raw(frame(body), key="bomb")))
            print("seconds", round(time.monotonic() - started, 1))
            """
        )
    assert result.status == "success", result.output
    assert _lines(result)[0] == "unauthorized", result.output
    assert host.growth_mib < 40, f"host RSS grew {host.growth_mib:.0f} MiB for a 3 MiB frame"


@pytest.mark.timeout(120)
def test_an_authenticated_args_bomb_is_refused_and_the_loop_keeps_serving(
    target: tuple[str, str], tmp_path: Path, gauge: type[HostGauge]
) -> None:
    """The same bomb behind the right token: the host checks the token, then decoded the
    arguments on its event loop, ~75x the frame in memory and a second or more of the
    loop per frame. Now the decoder stops at MAX_ARG_VALUES values, so the frame is
    refused (bad_request) at bounded cost, and a second connection's calls (the loop's
    heartbeat, as the script sees it) keep being answered meanwhile."""
    with gauge() as host:
        result = runner(target, tmp_path)(
            """
            import threading
            head = b"\\x84\\xa2id\\x01\\xa4tool\\xa4nope\\xa5token" + body_of(TOKEN)
            # args: {"x": [m arrays of 60000 empty arrays]}: no one container is long
            head += b"\\xa4args\\x81\\xa1x\\xdd"
            chunk = b"\\xdc" + struct.pack(">H", 60000) + b"\\x90" * 60000
            m = (4 * 2**20 - len(head) - 4) // len(chunk)
            body = head + struct.pack(">I", m) + chunk * m
            stop = threading.Event()
            worst = [0.0]
            beats = [0]

            def heartbeat():
                i = 0
                while not stop.is_set():
                    i += 1
                    ping = frame(body_of({"id": 1, "tool": "nope", "token": TOKEN}))
                    started = time.monotonic()
                    reply = ask_raw(ping, key="ping%d" % i)
                    worst[0] = max(worst[0], time.monotonic() - started)
                    if kind(reply) == "unknown_tool":
                        beats[0] += 1
                    time.sleep(0.02)

            beat = threading.Thread(target=heartbeat)
            beat.start()
            time.sleep(0.3)
            kinds = [kind(ask_raw(frame(body), key="bomb%d" % i)) for i in range(4)]
            time.sleep(0.3)
            stop.set()
            beat.join()
            print(sorted(set(kinds)))
            print("beats", beats[0] > 5)
            print("worst", round(worst[0], 2))
            """,
            timeout=90.0,
        )
    assert result.status == "success", result.output
    lines = _lines(result)
    assert lines[:2] == ["['bad_request']", "beats True"], result.output
    # Generous: the point is that no single frame holds the loop for seconds.
    assert float(lines[2].split()[1]) < 2.5, result.output
    assert host.growth_mib < 60, f"host RSS grew {host.growth_mib:.0f} MiB for 4 MiB frames"


@pytest.mark.timeout(60)
def test_a_frame_over_the_default_cap_is_refused_unread(
    target: tuple[str, str], tmp_path: Path, gauge: type[HostGauge]
) -> None:
    with gauge() as host:
        result = runner(target, tmp_path)(
            """
            body = b"\\x81\\xa4junk\\xc6" + struct.pack(">I", 16 * 2**20) + b"\\0" * (16 * 2**20)
            reply = ask_raw(frame(body), key="big")
            print(kind(reply))
            print(reply["error"]["message"])
            """
        )
    assert result.status == "success", result.output
    kind_line, message = _lines(result)[:2]
    assert kind_line == "frame_too_large", result.output
    assert "4194304" in message, message
    assert host.growth_mib < 40, f"host RSS grew {host.growth_mib:.0f} MiB"


@pytest.mark.timeout(60)
def test_ext_types_are_answered_bad_frame(target: tuple[str, str], tmp_path: Path) -> None:
    result = runner(target, tmp_path)(
        """
        body = body_of({"id": 7, "tool": "read_file", "token": TOKEN,
                        "args": {"path": "PLACEHOLDER"}})
        body = body.replace(b"\\xabPLACEHOLDER", b"\\xd6\\xff\\x00\\x00\\x00\\x01")  # timestamp
        print(kind(ask_raw(frame(body), key="ext")))
        """
    )
    assert result.status == "success", result.output
    assert _lines(result) == ["bad_frame"], result.output


@pytest.mark.timeout(90)
@pytest.mark.parametrize("target", SOCKET_TARGETS, indirect=True, ids=lambda t: "-".join(t))
def test_unfinished_frames_are_capped_across_the_runs_connections(
    target: tuple[str, str], tmp_path: Path, gauge: type[HostGauge]
) -> None:
    """Sixty connections each holding most of a frame: the host buffers at most the
    run's cap in all, and drops the connections past it."""
    with gauge() as host:
        result = runner(target, tmp_path)(
            """
            part = struct.pack(">I", 4 * 2**20 - 16) + b"\\x81" + b"\\0" * (4 * 2**20 - 64)
            socks, refused = [], set()
            for i in range(60):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(os.environ["HERMES_RPC_SOCKET"])
                s.settimeout(5)
                try:
                    s.sendall(part)
                except OSError:
                    refused.add(i)
                socks.append(s)
            deadline = time.monotonic() + 20  # what is still in transit is judged
            while len(refused) < 50 and time.monotonic() < deadline:
                time.sleep(0.2)
                for i, s in enumerate(socks):
                    if i in refused:
                        continue
                    s.setblocking(False)
                    try:
                        s.recv(65536)  # an error reply, or the end: the host dropped it
                        refused.add(i)
                    except BlockingIOError:
                        pass
                    except OSError:
                        refused.add(i)
            print("refused", len(refused) >= 50)
            """,
            timeout=40.0,
        )
    assert result.status == "success", result.output
    assert _lines(result)[-1] == "refused True", result.output
    assert host.growth_mib < 60, f"host RSS grew {host.growth_mib:.0f} MiB"


def test_attack_helpers_parse(tmp_path: Path) -> None:
    """The raw helper itself works: an ordinary unauthorized request gets its reply."""
    result = execute_code(
        RAW + 'print(kind(ask_raw(frame(body_of({"id": 1, "tool": "x", "token": "y"})))))',
        timeout=20,
        spill_dir=str(tmp_path / "spill"),
    )
    assert json.dumps(_lines(result)) == '["unauthorized"]', result.output


def test_the_default_frame_cap_is_a_few_mib() -> None:
    from hermes_sandbox.rpc import DEFAULT_MAX_FRAME_SIZE

    assert DEFAULT_MAX_FRAME_SIZE == 4 * 2**20


@pytest.mark.timeout(90)
@pytest.mark.parametrize("target", RELAY_TARGETS, indirect=True, ids=lambda t: "-".join(t))
def test_a_script_that_stops_its_relay_is_still_ended_on_time(
    target: tuple[str, str], tmp_path: Path
) -> None:
    """The relay is the script's parent: SIGSTOP it and it reads nothing more, the
    host's kill included. The host's deadline must end the run anyway."""
    started = time.monotonic()
    result = runner(target, tmp_path)(
        """
        import signal
        print("stopping the relay", flush=True)
        time.sleep(0.5)
        os.kill(os.getppid(), signal.SIGSTOP)
        time.sleep(120)
        """,
        timeout=3.0,
    )
    elapsed = time.monotonic() - started
    assert result.status in ("timeout", "error"), result.output
    assert elapsed < 40, f"a 3 s timeout took {elapsed:.0f} s to enforce"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("target", TARGETS[:3], indirect=True, ids=lambda t: "-".join(t))
def test_a_request_over_the_cap_gets_a_clear_error_from_the_stub(
    target: tuple[str, str], tmp_path: Path
) -> None:
    result = runner(target, tmp_path)(
        f"""
        from hermes_tools import write_file
        big = write_file(path={str(tmp_path / "big.txt")!r}, content="x" * (5 * 2**20))
        print(big["error_kind"])
        print(big["error"])
        small = write_file(path={str(tmp_path / "small.txt")!r}, content="fine")
        print("error" in small)
        """
    )
    assert result.status == "success", result.output
    kind_line, message, small_failed = _lines(result)[:3]
    assert kind_line == "frame_too_large", result.output
    assert "4194304" in message and "open()" in message, message
    assert small_failed == "False", result.output
    assert not (tmp_path / "big.txt").exists()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("target", FILES_TARGETS, indirect=True, ids=lambda t: "-".join(t))
def test_many_large_request_files_are_taken_a_capped_batch_at_a_time(
    target: tuple[str, str], tmp_path: Path, gauge: type[HostGauge]
) -> None:
    """Forty request files of nearly a frame each, dropped at once: the host takes them
    a batch of at most the run's buffer cap at a time, and answers every one."""
    with gauge() as host:
        result = runner(target, tmp_path)(
            """
            pad = b"\\0" * (4 * 2**20 - 200)
            body = body_of({"id": 1, "tool": "x", "token": "wrong", "pad": pad})
            for i in range(40):
                with open(os.path.join(RPC_DIR, ".big%d" % i), "wb") as f:
                    f.write(frame(body))
            for i in range(40):
                name = os.path.join(RPC_DIR, "big%d" % i)
                os.rename(os.path.join(RPC_DIR, ".big%d" % i), name + ".req")
            print(sorted(set(kind(wait_reply("big%d" % i, timeout=60)) for i in range(40))))
            """,
            timeout=80.0,
        )
    assert result.status == "success", result.output
    assert _lines(result) == ["['unauthorized']"], result.output
    assert host.growth_mib < 60, f"host RSS grew {host.growth_mib:.0f} MiB"


# -- 5. worker threads -------------------------------------------------------------------

LOCAL_TARGETS = [t for t in TARGETS if t[0] == "local"]

# Script code: 8 files, each swapped for a named pipe and back as fast as the script can,
# while 64 threads call a file tool on them. The tool checks that its path is a regular
# file and then opens it; a pipe swapped in between blocks a plain open() until its
# other end is opened, which here is never, so each such call kept a host worker thread.
FIFO_RACE = """
import threading
import hermes_tools

def swap_forever(path, tag):
    i = 0
    while True:
        i += 1
        spare = os.path.join(RACE, ".%s-%d" % (tag, i))
        with open(spare, "w") as f:
            f.write("text\\n")
        os.rename(spare, path)
        os.mkfifo(spare)
        os.rename(spare, path)

def call_forever(tool, path):
    while True:
        try:
            tool(path)
        except Exception:
            pass

paths = [os.path.join(RACE, "f%d.txt" % i) for i in range(8)]
for n, path in enumerate(paths):
    with open(path, "w") as f:
        f.write("text\\n")
    threading.Thread(target=swap_forever, args=(path, n), daemon=True).start()
for path in paths * 8:
    threading.Thread(target=call_forever, args=(TOOL, path), daemon=True).start()
time.sleep(60)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tool", ["read_file", "write_file"])
@pytest.mark.parametrize("target", LOCAL_TARGETS, indirect=True, ids=lambda t: "-".join(t))
def test_a_file_swapped_for_a_fifo_does_not_starve_the_kill(
    target: tuple[str, str], tool: str, tmp_path: Path
) -> None:
    """read_file or write_file racing a file swapped for a FIFO once wedged all 40 of
    anyio's default worker threads in open(); the kill needs that pool, so the run's
    4 s timeout was not enforced after 60 s. Now the open never blocks, and tool file
    I/O runs on its own threads."""
    race = tmp_path / "race"
    race.mkdir()
    call = (
        "hermes_tools.read_file"
        if tool == "read_file"
        else ("lambda p: hermes_tools.write_file(p, 'x')")
    )
    started = time.monotonic()
    result = runner(target, tmp_path)(
        f"RACE = {str(race)!r}\nTOOL = None\n"
        + FIFO_RACE.replace("(TOOL, path)", f"({call}, path)"),
        timeout=4.0,
        tools=["read_file", "write_file"],
    )
    elapsed = time.monotonic() - started
    assert result.status == "timeout", result.output
    assert elapsed < 15, f"a 4 s timeout took {elapsed:.1f} s to enforce"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("target", LOCAL_TARGETS[:1], indirect=True, ids=lambda t: "-".join(t))
def test_tools_that_block_do_not_hold_the_threads_the_kill_needs(
    target: tuple[str, str], tmp_path: Path
) -> None:
    """A sync tool that blocks (here: for 12 s) holds a worker thread. 60 of them at once
    once held all 40 of anyio's default threads, the ones the kill needs, so the script
    outlived its 3 s timeout until the tools let go. Now tools run on their own limiter
    (TOOL_THREADS), and the script is killed on time. (The run itself then waits for
    the calls in flight at most TOOL_CALL_DRAIN_SECONDS: see the tests below.)"""
    from hermes_sandbox.threads import TOOL_THREADS
    from hermes_sandbox.tools.registry import ToolRegistry

    release = threading.Event()
    registry = ToolRegistry()
    schema = {"name": "hold", "description": "Block.", "parameters": {"type": "object"}}

    def hold(args: dict[str, Any]) -> str:
        release.wait(30)
        return "{}"

    registry.register("hold", "test", schema, hold)
    pid_file = tmp_path / "pid"
    died: list[float] = []

    def watch() -> None:
        while not pid_file.exists() or not pid_file.read_text().endswith("\n"):
            time.sleep(0.01)
        script = psutil.Process(int(pid_file.read_text()))
        while script.is_running() and script.status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.01)
        died.append(time.monotonic())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    letting_go = threading.Timer(12.0, release.set)
    letting_go.start()
    started = time.monotonic()
    try:
        result = runner(target, tmp_path)(
            f"""
            import threading
            import hermes_tools
            with open({str(pid_file)!r}, "w") as f:
                f.write("%d\\n" % os.getpid())
            for _ in range(60):
                threading.Thread(target=hermes_tools.hold, daemon=True).start()
            time.sleep(60)
            """,
            timeout=3.0,
            tools=["hold"],
            registry=registry,
        )
    finally:
        release.set()
        letting_go.cancel()
    watcher.join(10)
    assert result.status == "timeout", result.output
    assert died, "the script never died"
    assert died[0] - started < 9, (
        f"the script outlived its 3 s timeout by {died[0] - started:.1f} s"
    )
    assert TOOL_THREADS < 40


# -- tool calls still running when the run ends ------------------------------------------


def _registry_with(name: str, handler: Callable[..., Any]) -> Any:
    from hermes_sandbox.tools.registry import ToolRegistry

    registry = ToolRegistry()
    schema = {"name": name, "description": "Block.", "parameters": {"type": "object"}}
    registry.register(name, "test", schema, handler)
    return registry


CALL_THEN_WAIT = """
import threading
import hermes_tools
threading.Thread(target=hermes_tools.hold, daemon=True).start()
print("calling", flush=True)
time.sleep(60)
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("target", LOCAL_TARGETS, indirect=True, ids=lambda t: "-".join(t))
def test_a_sync_tool_running_at_the_end_is_waited_for_a_bounded_time(
    target: tuple[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sync tool blocking 60 s once held a 1 s-timeout run until it returned. Now the
    run waits for calls in flight at most TOOL_CALL_DRAIN_SECONDS, then abandons them;
    the transport shuts down cleanly (the files channel closes its directory only after
    its own threads have returned: no EBADF, no error logged)."""
    import hermes_sandbox.threads as threads

    monkeypatch.setattr(threads, "TOOL_CALL_DRAIN_SECONDS", 1.0)
    release = threading.Event()
    entered = threading.Event()

    def hold(args: dict[str, Any]) -> str:
        entered.set()
        release.wait(60)
        return "{}"

    started = time.monotonic()
    try:
        result = runner(target, tmp_path)(
            CALL_THEN_WAIT, timeout=1.0, tools=["hold"], registry=_registry_with("hold", hold)
        )
    finally:
        elapsed = time.monotonic() - started
        release.set()
    assert entered.is_set(), result.output
    assert result.status == "timeout", result.output
    assert elapsed < 1.0 + 1.0 + 15, f"a 1 s run with a 1 s drain took {elapsed:.1f} s"
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


@pytest.mark.timeout(90)
@pytest.mark.parametrize("target", LOCAL_TARGETS, indirect=True, ids=lambda t: "-".join(t))
def test_an_async_tool_awaiting_at_the_end_is_cancelled(
    target: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import anyio

    import hermes_sandbox.threads as threads

    monkeypatch.setattr(threads, "TOOL_CALL_DRAIN_SECONDS", 1.0)
    events: list[str] = []

    async def hold(args: dict[str, Any]) -> str:
        events.append("entered")
        try:
            await anyio.sleep(60)
        except anyio.get_cancelled_exc_class():
            events.append("cancelled")
            raise
        return "{}"

    started = time.monotonic()
    result = runner(target, tmp_path)(
        CALL_THEN_WAIT, timeout=1.0, tools=["hold"], registry=_registry_with("hold", hold)
    )
    elapsed = time.monotonic() - started
    assert result.status == "timeout", result.output
    assert events == ["entered", "cancelled"], events
    assert elapsed < 1.0 + 1.0 + 15, f"a 1 s run with a 1 s drain took {elapsed:.1f} s"


def test_the_drain_at_the_end_of_a_run_is_bounded() -> None:
    from hermes_sandbox.threads import TOOL_CALL_DRAIN_SECONDS

    assert 0 < TOOL_CALL_DRAIN_SECONDS <= 10
