"""End-to-end tests of the run limits: timeout, leftovers, budget, output caps, exit
codes, cancellation, interruption and many runs at once. Every script is a real process;
what it started is checked by pid afterwards."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import psutil
import pytest

from hermes_sandbox import execute_code, execute_code_async
from hermes_sandbox.output import MAX_SPILL_BYTES, MAX_STDERR_BYTES, MAX_STDOUT_BYTES

HEAD_BYTES = int(MAX_STDOUT_BYTES * 0.4)
TAIL_BYTES = MAX_STDOUT_BYTES - HEAD_BYTES
MARKER = re.compile(r"\n\.\.\. \[([\d,]+) bytes omitted\] \.\.\.\n")

# Defined in scripts that report pids: write them atomically, so a reader never sees half.
WRITE_PIDS = """
def write_pids(path, *pids):
    with open(path + ".tmp", "w") as f:
        f.write(" ".join(map(str, pids)))
    os.replace(path + ".tmp", path)
"""


def script(body: str, **values: object) -> str:
    """A script: WRITE_PIDS, then ``body`` dedented with ``{name}`` placeholders filled."""
    return "import os\n" + WRITE_PIDS + textwrap.dedent(body).format(**values)


async def read_pids(path: Path, count: int, timeout: float = 10.0) -> list[int]:
    """The pids a script wrote to ``path``, once there; for async tests (never blocks)."""
    pidfile = anyio.Path(path)
    with anyio.fail_after(timeout):
        while True:
            if await pidfile.exists():
                pids = [int(p) for p in (await pidfile.read_text()).split()]
                if len(pids) >= count:
                    return pids
            await anyio.sleep(0.02)


# -- timeout ---------------------------------------------------------------------------


def test_timeout_kills_script_grandchild_and_setsid_child(run, assert_gone):
    result = run(
        """
        import os, subprocess, sys, time
        middle = subprocess.Popen(
            [sys.executable, "-c",
             "import subprocess; p = subprocess.Popen(['sleep', '300']); "
             "print(p.pid, flush=True); p.wait()"],
            stdout=subprocess.PIPE, text=True,
        )
        grandchild = int(middle.stdout.readline())
        detached = subprocess.Popen(["sleep", "300"], start_new_session=True)
        print("pids", os.getpid(), middle.pid, grandchild, detached.pid, flush=True)
        time.sleep(300)
        """,
        timeout=2,
    )
    assert result.status == "timeout"
    assert result.exit_code == 124
    assert result.output.startswith("pids ")
    assert result.output.endswith("⏰ Script timed out after 2s and was killed.")
    assert "timed out" in result.error
    pids = [int(p) for p in result.output.splitlines()[0].split()[1:]]
    assert len(pids) == 4
    # The script, its middle child, that one's sleep (the grandchild), the setsid'd sleep.
    assert_gone(pids, "the timeout")


def test_timeout_kills_script_that_ignores_sigterm(run, assert_gone):
    result = run(
        """
        import os, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("pid", os.getpid(), flush=True)
        time.sleep(300)
        """,
        timeout=1,
        kill_grace=0.5,
    )
    assert result.status == "timeout"
    assert result.exit_code == 124
    assert_gone([int(result.output.split()[1])], "SIGTERM")


# -- leftovers of a script that exits normally ------------------------------------------


def test_escaped_daemon_is_killed_after_a_normal_exit(run, assert_gone):
    result = run(
        """
        import os, sys, time
        import psutil
        r, w = os.pipe()
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                fd = os.open(os.devnull, os.O_RDWR)
                for n in (0, 1, 2):
                    os.dup2(fd, n)
                os.write(w, str(os.getpid()).encode())
                os.close(w)
                time.sleep(300)
                os._exit(0)
            os._exit(0)
        os.close(w)
        daemon = int(os.read(r, 64))
        os.wait()  # the middle process: the daemon is now nobody's child of ours
        me = psutil.Process()
        escaped = (
            daemon not in [c.pid for c in me.children(recursive=True)]
            and os.getsid(daemon) != os.getsid(0)
            and psutil.Process(daemon).is_running()
        )
        print("daemon", daemon, "escaped" if escaped else "NOT-ESCAPED")
        """
    )
    assert result.status == "success", result.output
    words = result.output.split()
    assert words[2] == "escaped"
    assert_gone([int(words[1])], "the end of the run")


def test_background_child_of_a_finished_script_is_killed(run, assert_gone):
    result = run(
        """
        import subprocess
        child = subprocess.Popen(["sleep", "300"])
        print("child", child.pid)
        """
    )
    assert result.status == "success"
    assert result.exit_code == 0
    assert_gone([int(result.output.split()[1])], "the end of the run")


# -- tool-call budget --------------------------------------------------------------------


def test_budget_refuses_calls_past_the_limit_and_the_script_goes_on(run, tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("hello\n")
    result = run(
        f"""
        import json
        from hermes_tools import read_file
        for i in range(6):
            print(json.dumps(read_file({str(data)!r})))
        print("after the calls")
        """,
        max_tool_calls=3,
    )
    assert result.status == "success", result.output
    assert result.tool_calls_made == 3
    lines = result.output.splitlines()
    assert lines[-1] == "after the calls"
    replies = [json.loads(line) for line in lines[:6]]
    for reply in replies[:3]:
        assert reply["content"] == "hello\n"
    for reply in replies[3:]:
        assert set(reply) == {"error", "error_kind"}
        assert reply["error_kind"] == "budget_exhausted"
        assert "limit" in reply["error"]


# -- stdout and stderr caps --------------------------------------------------------------

LINE_SCRIPT = """
import sys
pad = "x" * ({width} - 10)
write = sys.stdout.write
for i in range({count}):
    write(f"{{i:08d}} {{pad}}\\n")
"""


def numbered_lines(count: int, width: int = 1024) -> bytes:
    pad = "x" * (width - 10)
    return "".join(f"{i:08d} {pad}\n" for i in range(count)).encode()


def test_stdout_cap_keeps_head_and_tail_and_spills(run, tmp_path):
    count, width = 20_000, 1024
    expected = numbered_lines(count, width)
    assert len(expected) == count * width
    spill_dir = tmp_path / "spill"
    result = run(LINE_SCRIPT.format(count=count, width=width), spill_dir=str(spill_dir))

    assert result.status == "success"
    assert result.stdout_truncated is True
    assert result.stdout_bytes_total == len(expected)
    assert result.stdout_bytes_captured == MAX_STDOUT_BYTES
    assert result.stdout_bytes_omitted == len(expected) - MAX_STDOUT_BYTES

    match = MARKER.search(result.output)
    assert match, result.output[:300]
    assert int(match[1].replace(",", "")) == result.stdout_bytes_omitted
    head = result.output[: match.start()].encode()
    tail = result.output[match.end() :].encode()
    assert head == expected[:HEAD_BYTES]  # ASCII: exactly 40% of the cap
    assert tail == expected[-TAIL_BYTES:]  # and exactly 60%
    assert head.startswith(b"00000000 x")
    assert tail.endswith(f"{count - 1:08d} ".encode() + b"x" * (width - 10) + b"\n")

    spill = Path(result.stdout_spill_path)
    assert spill.parent == spill_dir
    data = spill.read_bytes()
    assert len(data) <= MAX_SPILL_BYTES + 200  # the cap plus a one-line note
    assert data[:MAX_SPILL_BYTES] == expected[:MAX_SPILL_BYTES]
    assert str(spill) in result.warning


# Bytes a cap of n lets through after decoding: n of text (its JSON included), plus the
# omission marker and, in the JSON result, the other fields (status, counts, warning).
JSON_SLACK = 2_000


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "payload",
    [b"\xff" * 10**6, b"\x00" * 10**6, b"\xff" * 40_000, "\u20ac".encode() * 300_000],
    ids=["1MB-invalid", "1MB-nul", "40kB-invalid", "900kB-euro"],
)
def test_the_output_cap_holds_after_decoding(run, tmp_path, payload):
    """An invalid byte decodes to U+FFFD (3 bytes) and a control byte to a 6-byte JSON
    escape: a cap counted in raw bytes once let 1 MB of them through as 150 kB of text
    and 300 kB of JSON. The cap now holds for the text and its JSON, and the counts say
    how many bytes the text really shows."""
    source = tmp_path / "payload.bin"
    source.write_bytes(payload)
    result = run(
        f"""
        import sys
        with open({str(source)!r}, "rb") as f:
            sys.stdout.buffer.write(f.read())
        """,
        spill_dir=str(tmp_path / "spill"),
    )
    assert result.status == "success", result.output[:300]
    assert len(result.output.encode()) <= MAX_STDOUT_BYTES + JSON_SLACK
    assert len(result.to_json().encode()) <= MAX_STDOUT_BYTES + JSON_SLACK
    assert result.stdout_truncated is True
    assert result.stdout_bytes_total == len(payload)
    assert 0 < result.stdout_bytes_captured <= min(len(payload), MAX_STDOUT_BYTES)
    assert result.stdout_bytes_omitted == len(payload) - result.stdout_bytes_captured
    match = MARKER.search(result.output)
    assert match, result.output[:300]
    assert int(match[1].replace(",", "")) == result.stdout_bytes_omitted
    shown = result.output[: match.start()] + result.output[match.end() :]
    if payload[:1] == b"\xff":
        assert shown == "\ufffd" * result.stdout_bytes_captured
    elif payload[:1] == b"\x00":
        assert shown == "\x00" * result.stdout_bytes_captured
    else:
        assert shown == "\u20ac" * (result.stdout_bytes_captured // 3)
    # The spill file keeps the raw bytes, as the script wrote them.
    assert result.stdout_spill_path is not None, result.warning
    assert Path(result.stdout_spill_path).read_bytes()[: len(payload)] == payload[:MAX_SPILL_BYTES]


def test_host_memory_stays_bounded_while_a_script_prints_200_mb(run):
    run("print('warm up')")  # imports and first-run allocations happen here, not below
    host = psutil.Process()
    before = host.memory_info().rss
    peak = before
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.02):
            peak = max(peak, host.memory_info().rss)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = run(
            """
            import sys
            block = (b"y" * 1023 + b"\\n") * 1024
            for _ in range(200):
                sys.stdout.buffer.write(block)
            """
        )
    finally:
        done.set()
        sampler.join()
    peak = max(peak, host.memory_info().rss)
    assert result.status == "success"
    assert result.stdout_bytes_total == 200 * 1024 * 1024
    assert peak - before < 64 * 1024 * 1024, f"host RSS grew by {(peak - before) >> 20} MiB"


def test_stderr_cap_and_marker_after_stdout(run):
    result = run(
        """
        import sys
        print("to stdout")
        for i in range(1000):
            sys.stderr.write(f"E{i:04d} " + "e" * 23 + "\\n")  # 30 bytes a line
        """
    )
    assert result.status == "success"
    assert not result.stdout_truncated
    stdout_part, sep, stderr_part = result.output.partition("\n--- stderr ---\n")
    assert sep
    assert stdout_part.rstrip("\n") == "to stdout"
    match = MARKER.search(stderr_part)
    assert match, stderr_part[:300]
    assert int(match[1].replace(",", "")) == 30_000 - MAX_STDERR_BYTES
    kept = stderr_part[: match.start()] + stderr_part[match.end() :]
    assert len(kept.encode()) == MAX_STDERR_BYTES
    assert stderr_part.startswith("E0000 ")
    assert stderr_part.endswith("E0999 " + "e" * 23 + "\n")


def test_invalid_utf8_output_becomes_replacement_characters(run):
    result = run(
        r"""
        import sys
        sys.stdout.buffer.write(b"\xff\xfe bad \xc3")
        """
    )
    assert result.status == "success"
    assert result.output == "\ufffd\ufffd bad \ufffd"


def test_multibyte_character_cut_at_the_head_and_tail_boundaries(run):
    # 3-byte characters: the head ends 2 bytes into one and the tail starts 1 byte
    # after the beginning of another.
    count = 20_000
    result = run(f"import sys\nsys.stdout.write('€' * {count} + 'b')")
    assert result.stdout_truncated
    assert HEAD_BYTES % 3 and (count * 3 + 1 - TAIL_BYTES) % 3
    match = MARKER.search(result.output)
    assert match
    head, tail = result.output[: match.start()], result.output[match.end() :]
    head_body = head.removesuffix("\ufffd")
    tail_body = tail.removeprefix("\ufffd")
    assert set(head_body) == {"€"}
    assert set(tail_body[:-1]) == {"€"} and tail_body[-1] == "b"
    # Only the cut characters may be lost, each at most replaced by one U+FFFD.
    assert len(head_body) == HEAD_BYTES // 3
    assert len(tail_body) - 1 == (TAIL_BYTES - 1) // 3


# -- exit codes --------------------------------------------------------------------------


def test_uncaught_exception(run):
    result = run(
        """
        print("before the error")
        raise ValueError("boom")
        """
    )
    assert result.status == "error"
    assert result.exit_code == 1
    assert result.error == "Script exited with code 1: ValueError: boom"
    stdout_part, sep, stderr_part = result.output.partition("--- stderr ---")
    assert sep
    assert "before the error" in stdout_part
    assert "Traceback (most recent call last)" in stderr_part
    assert stderr_part.rstrip().endswith("ValueError: boom")


def test_sys_exit_code(run):
    result = run("import sys\nprint('bye')\nsys.exit(3)")
    assert result.status == "error"
    assert result.exit_code == 3
    assert result.output == "bye\n"


def test_script_killed_by_sigkill_reports_137(run):
    result = run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert result.status == "error"
    assert result.exit_code == 137


# -- cancellation and interruption -------------------------------------------------------

SLEEPER = """
import subprocess, time
child = subprocess.Popen(["sleep", "300"])
write_pids({pidfile!r}, os.getpid(), child.pid)
time.sleep(300)
"""

ESCAPING_SLEEPER = """
import time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        fd = os.open(os.devnull, os.O_RDWR)
        for n in (0, 1, 2):
            os.dup2(fd, n)
        os.write(w, str(os.getpid()).encode())
        time.sleep(300)
        os._exit(0)
    os._exit(0)
os.close(w)
daemon = int(os.read(r, 64))
os.wait()
write_pids({pidfile!r}, os.getpid(), daemon)
time.sleep(300)
"""


@pytest.mark.parametrize("body", [SLEEPER, ESCAPING_SLEEPER], ids=["child", "escaped-daemon"])
def test_cancelling_the_run_kills_the_script(tmp_path, assert_gone, body):
    pidfile = tmp_path / "pids"
    code = script(body, pidfile=str(pidfile))
    outcome: dict[str, object] = {}

    async def main() -> None:
        async def call() -> None:
            outcome["result"] = await execute_code_async(code, timeout=30)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(call)
            outcome["pids"] = await read_pids(pidfile, 2)
            await anyio.sleep(0.5)
            tasks.cancel_scope.cancel()

    anyio.run(main)
    assert "result" not in outcome  # it was cancelled, not finished
    assert_gone(outcome["pids"], "the cancellation")


def test_interrupt_event_stops_the_script(tmp_path, assert_gone):
    pidfile = tmp_path / "pids"
    code = script(SLEEPER, pidfile=str(pidfile))

    async def main():
        interrupt = anyio.Event()
        async with anyio.create_task_group() as tasks:

            async def set_later() -> None:
                await read_pids(pidfile, 2)
                await anyio.sleep(0.5)
                interrupt.set()

            tasks.start_soon(set_later)
            return await execute_code_async(code, timeout=30, interrupt=interrupt)

    result = anyio.run(main)
    assert result.status == "interrupted"
    assert result.exit_code == 130
    assert result.output.endswith("[execution interrupted]")
    assert_gone([int(pid) for pid in pidfile.read_text().split()], "the interrupt")


# -- many runs at once -------------------------------------------------------------------

PARALLEL_SCRIPT = """
import time
from hermes_tools import read_file
for _ in range(5):
    assert read_file({path!r})["content"] == "shared\\n"
time.sleep(1)
print("value", {value!r})
"""
PARALLEL_RUNS = 8


def test_concurrent_async_runs(tmp_path):
    data = tmp_path / "shared.txt"
    data.write_text("shared\n")
    results = {}

    async def one(i: int) -> None:
        code = PARALLEL_SCRIPT.format(path=str(data), value=f"run-{i}")
        results[i] = await execute_code_async(code, timeout=30)

    async def main() -> None:
        async with anyio.create_task_group() as tasks:
            for i in range(PARALLEL_RUNS):
                tasks.start_soon(one, i)

    started = time.monotonic()
    anyio.run(main)
    elapsed = time.monotonic() - started
    for i in range(PARALLEL_RUNS):
        assert results[i].status == "success", results[i]
        assert results[i].output == f"value run-{i}\n"
        assert results[i].tool_calls_made == 5
    # Each script sleeps 1 s: one after another would take at least 8 s.
    assert elapsed < PARALLEL_RUNS * 0.75, f"runs did not overlap ({elapsed:.1f}s)"


def test_concurrent_sync_runs_from_threads(tmp_path):
    data = tmp_path / "shared.txt"
    data.write_text("shared\n")

    def one(i: int):
        code = PARALLEL_SCRIPT.format(path=str(data), value=f"thread-{i}")
        return execute_code(code, timeout=30)

    started = time.monotonic()
    with ThreadPoolExecutor(PARALLEL_RUNS) as pool:
        results = list(pool.map(one, range(PARALLEL_RUNS)))
    elapsed = time.monotonic() - started
    for i, result in enumerate(results):
        assert result.status == "success", result
        assert result.output == f"value thread-{i}\n"
        assert result.tool_calls_made == 5
    assert elapsed < PARALLEL_RUNS * 0.75, f"runs did not overlap ({elapsed:.1f}s)"


# -- the leftover check itself ----------------------------------------------------------


def test_leftover_check_finds_a_marked_process(sandbox_processes, gone):
    """The automatic leftover check must see a process that carries the marker and this
    test's tag, or it proves nothing."""
    env = {**os.environ, "HERMES_SANDBOX_ENV": "leftover-check"}
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    with subprocess.Popen(sleeper, env=env) as process:
        try:
            deadline = time.monotonic() + 5
            while process.pid not in sandbox_processes() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert process.pid in sandbox_processes()
        finally:
            process.kill()
    assert gone(process.pid)


def test_scripts_carry_the_leftover_check_tag(run):
    """The tag reaches sandboxed scripts, so the leftover check covers them."""
    result = run("import os\nprint(os.environ.get('LC_HERMES_TEST_TAG'))")
    assert result.output.strip() == os.environ["LC_HERMES_TEST_TAG"]
