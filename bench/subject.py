"""Our side of every comparison: real scripts run through the public Python API.

Each measurement runs a script with :func:`sandbox.execute_code` (or its async twin)
against a private :class:`tools.registry.ToolRegistry` holding the benchmark's
``echo`` and ``blob`` tools, and ``pecho``, the echo registered the plain way (a sync
handler, not ``inline``). Round-trip scripts time their own calls with
:func:`bench.timing.time_calls` (its source is inlined at the top of the script) and
print the figures as JSON, which the host parses from the result's output.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import psutil

from bench.workload import BLOB_SCHEMA, ECHO_SCHEMA, blob_tool, call_spec, echo_tool
from hermes_sandbox import ExecutionResult, RunError, Session, execute_code, execute_code_async
from hermes_sandbox.environments import BackendError
from hermes_sandbox.sessions_wire import DIR_VARIABLE, SOCKET_NAME
from hermes_sandbox.tools.registry import ToolRegistry

BENCH_TOOLS = ("echo", "pecho", "blob")
MAX_CALLS = 10**9
RTT_STDOUT_CAP = 64 * 1024 * 1024


class NotAvailable(Exception):
    """This case cannot run here; the message says why."""


class ScriptKilled(RuntimeError):
    """A benchmark script died of a signal it did not send itself (on a shared machine,
    another session's cleanup can kill it); the round is worth retrying."""


def _killed(result: ExecutionResult) -> bool:
    return result.status == "error" and (result.exit_code or 0) > 128


# The echo registered as users register their tools: a plain sync handler, no
# ``inline=True``, so every call takes the host's ordinary path.
PLAIN_ECHO = "pecho"


@functools.cache
def bench_registry() -> ToolRegistry:
    """A private registry with only the benchmark's tools."""
    registry = ToolRegistry()
    registry.register("echo", "bench", ECHO_SCHEMA, echo_tool, inline=True)
    # The same echo registered as users register tools: a plain sync handler.
    registry.register(PLAIN_ECHO, "bench", {**ECHO_SCHEMA, "name": PLAIN_ECHO}, echo_tool)
    registry.register("blob", "bench", BLOB_SCHEMA, blob_tool)
    return registry


@functools.cache
def _timing_source() -> str:
    return (Path(__file__).parent / "timing.py").read_text(encoding="utf-8")


@functools.cache
def _spill_dir() -> str:
    return tempfile.mkdtemp(prefix="bench-spill-")


def cleanup() -> None:
    """Remove the spill directory the runs may have written to."""
    if _spill_dir.cache_info().currsize:
        shutil.rmtree(_spill_dir(), ignore_errors=True)
        _spill_dir.cache_clear()


def _execute(code: str, run_options: Mapping[str, Any], **extra: Any) -> ExecutionResult:
    """Run ``code``; turn "this backend or transport cannot be used" into NotAvailable."""
    options: dict[str, Any] = {
        "tools": BENCH_TOOLS,
        "registry": bench_registry(),
        "max_tool_calls": MAX_CALLS,
        "spill_dir": _spill_dir(),
        "timeout": 300,
        **run_options,
        **extra,
    }
    try:
        return execute_code(code, **options)
    except (RunError, BackendError) as exc:
        raise NotAvailable(str(exc)) from exc


def _first_json_line(result: ExecutionResult) -> dict[str, Any]:
    if _killed(result):
        raise ScriptKilled(f"benchmark script killed (exit code {result.exit_code})")
    if result.status != "success":
        raise RuntimeError(f"benchmark script failed ({result.status}): {result.output[-2000:]}")
    for line in result.output.splitlines():
        if line.startswith("{"):
            figures: dict[str, Any] = json.loads(line)
            return figures
    raise RuntimeError(f"benchmark script printed no figures: {result.output[-2000:]}")


def rtt_script(calls: int, callers: int, warmup: int, tool: str = "echo", size: int = 0) -> str:
    """A script that times ``calls`` calls of a benchmark tool and prints the figures."""
    args, expected = call_spec(tool, size)
    check = "len(reply['data']) != _EXPECTED" if tool == "blob" else "reply != _EXPECTED"
    return f"""{_timing_source()}

import json as _bench_json
from hermes_tools import {tool} as _tool

_ARGS = {args!r}
_EXPECTED = {expected!r}


def _call(_i):
    reply = _tool(**_ARGS)
    if {check}:
        raise AssertionError("wrong answer: %r" % (str(reply)[:200],))


print(_bench_json.dumps(time_calls(_call, {calls}, {callers}, {warmup})))
"""


def run_rtt(
    run_options: Mapping[str, Any],
    calls: int,
    callers: int = 1,
    warmup: int = 0,
    *,
    tool: str = "echo",
    size: int = 0,
) -> dict[str, Any]:
    """One round of a round-trip case: the script's own figures."""
    code = rtt_script(calls, callers, warmup, tool, size)
    result = _execute(code, run_options, max_stdout_bytes=RTT_STDOUT_CAP)
    return _first_json_line(result)


def _alternate(a: Callable[[], None], b: Callable[[], None], runs: int) -> None:
    """``a`` and ``b``, ``runs`` each, taking turns at going first."""
    for i in range(runs):
        first, second = (a, b) if i % 2 == 0 else (b, a)
        first()
        second()


def _interleave_with_bare(
    timed: Callable[[], None], runs: int, settle: Callable[[], None] | None = None
) -> dict[str, Any]:
    """``timed`` and a bare interpreter's ``print(1)``, interleaved, ``runs`` each;
    ``settle``, untimed, after each ``timed``."""
    bare_argv = [sys.executable, "-c", "print(1)"]
    times: list[float] = []
    bare_ms: list[float] = []

    def ours() -> None:
        t0 = time.perf_counter()
        timed()
        times.append((time.perf_counter() - t0) * 1000)
        if settle is not None:
            settle()

    def bare() -> None:
        t0 = time.perf_counter()
        done = subprocess.run(bare_argv, capture_output=True, check=True)
        bare_ms.append((time.perf_counter() - t0) * 1000)
        if done.stdout.strip() != b"1":
            raise RuntimeError(f"the bare interpreter printed {done.stdout!r}")

    _alternate(ours, bare, runs)
    return {"api_ms": times, "bare_ms": bare_ms, "bare_argv": bare_argv}


# A cold run as a script that uses a tool makes it: it imports hermes_tools (the client,
# the codec) and makes one call.
ONE_CALL = 'from hermes_tools import echo\nprint(echo(msg="1")["msg"])\n'


def run_cold(run_options: Mapping[str, Any], runs: int, *, call: bool = False) -> dict[str, Any]:
    """``print(1)`` (with ``call``, :data:`ONE_CALL`) through the API and a bare
    interpreter's ``print(1)``, interleaved, ``runs`` each.

    One untimed run first, so the host process is warm (imports, stub cache).
    """
    code, tools = (ONE_CALL, ("echo",)) if call else ("print(1)", ())
    warm = _execute(code, run_options, tools=tools)
    if warm.output.strip() != "1":
        raise RuntimeError(f"{code!r} printed {warm.output!r}")

    def api() -> None:
        result = _execute(code, run_options, tools=tools)
        if _killed(result):
            raise ScriptKilled(f"{code!r} was killed (exit code {result.exit_code})")
        if result.status != "success" or result.output.strip() != "1":
            raise RuntimeError(f"{code!r} through the API gave {result.to_dict()}")

    return _interleave_with_bare(api, runs, _standby_settle(run_options))


# How long the ssh cold row waits, untimed, for the relay the pool starts ahead of the
# next run (about as long as a run; an agent's runs are seconds apart).
STANDBY_WAIT_SECONDS = 2.0


def _standby_settle(run_options: Mapping[str, Any]) -> Callable[[], None] | None:
    """For ssh: wait until the pool's standby relay for the next run is ready, so its
    start neither counts in a timed run nor slows the bare interpreter beside it."""
    if run_options.get("backend") != "ssh":
        return None
    from hermes_sandbox.environments.ssh import SSHSettings, pool_stats

    config = SSHSettings.from_mapping(run_options["backend_options"])

    def settle() -> None:
        deadline = time.monotonic() + STANDBY_WAIT_SECONDS
        while not pool_stats(config).standby_relays and time.monotonic() < deadline:
            time.sleep(0.002)

    return settle


def cli_argv(script: str, *options: str) -> list[str]:
    """``hermes-sandbox run [OPTIONS] SCRIPT``: the installed console script when it sits
    beside this interpreter, else ``python -m hermes_sandbox``."""
    console = Path(sys.executable).with_name("hermes-sandbox")
    if console.is_file() and os.access(console, os.X_OK):
        return [str(console), "run", *options, script]
    return [sys.executable, "-m", "hermes_sandbox", "run", *options, script]


def run_cli_cold(runs: int) -> dict[str, Any]:
    """``hermes-sandbox run`` of a file holding ``print(1)`` (the local backend, a new
    process each time) and a bare interpreter, interleaved. The CLI gets its bytecode
    written (PYTHONDONTWRITEBYTECODE dropped), as an installed package has it."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return _run_cli_beside_bare(runs, env)


def run_cli_session(runs: int) -> dict[str, Any]:
    """``hermes-sandbox run --session`` of ``print(1)`` in a warm named session and a bare
    interpreter, interleaved, as :func:`run_cli_cold`. The sessions daemon is this
    function's own, in a directory of its own, and stopped at the end (its SIGTERM
    removes the session); the first, untimed run makes the session."""
    directory = tempfile.mkdtemp(prefix="hermes-bench-sessions-")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env[DIR_VARIABLE] = directory
    daemon = subprocess.Popen(
        [sys.executable, "-m", "hermes_sandbox.named_sessions", "serve", directory],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Ready before the first run, or that run would start a daemon of its own.
        deadline = time.monotonic() + 30
        while not os.path.exists(os.path.join(directory, SOCKET_NAME)):
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the sessions daemon did not start in {directory}")
            time.sleep(0.01)
        return _run_cli_beside_bare(runs, env, "--session", "bench")
    finally:
        daemon.terminate()
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        shutil.rmtree(directory, ignore_errors=True)


def _run_cli_beside_bare(runs: int, env: Mapping[str, str], *options: str) -> dict[str, Any]:
    script = Path(_spill_dir()) / "print1.py"
    script.write_text("print(1)\n", encoding="utf-8")
    argv = cli_argv(str(script), *options)

    def cli() -> None:
        done = subprocess.run(argv, capture_output=True, env=env, check=False)
        if done.returncode < 0:
            raise ScriptKilled(f"hermes-sandbox run was killed (signal {-done.returncode})")
        if done.returncode != 0 or done.stdout.strip() != b"1":
            raise RuntimeError(
                f"hermes-sandbox run printed {done.stdout!r}, exit {done.returncode}: "
                f"{done.stderr.decode(errors='replace')[-2000:]}"
            )

    cli()  # untimed: writes the bytecode once (and makes the session)
    figures = _interleave_with_bare(cli, runs)
    figures["cli_argv"] = argv
    return figures


def _started_session(run_options: Mapping[str, Any]) -> Session:
    """A started :class:`Session` with no tools (NotAvailable where it cannot start)."""
    options: dict[str, Any] = {"registry": bench_registry(), "tools": (), "timeout": 300}
    options.update(run_options)
    try:
        session = Session(**options)
        session.start()
    except (RunError, BackendError) as exc:
        raise NotAvailable(str(exc)) from exc
    return session


def run_warm(run_options: Mapping[str, Any], runs: int) -> dict[str, Any]:
    """``print(1)`` in a warm :class:`Session` and as a one-shot run beside it (the
    baseline), interleaved, ``runs`` each; one untimed run of each first."""
    session = _started_session(run_options)
    warm_ms: list[float] = []
    one_shot_ms: list[float] = []

    def check(result: ExecutionResult, what: str) -> None:
        if _killed(result):
            raise ScriptKilled(f"print(1) {what} was killed (exit code {result.exit_code})")
        if result.status != "success" or result.output.strip() != "1":
            raise RuntimeError(f"print(1) {what} gave {result.to_dict()}")

    def warm() -> None:
        t0 = time.perf_counter()
        result = session.run("print(1)")
        warm_ms.append((time.perf_counter() - t0) * 1000)
        check(result, "in a session")

    def one_shot() -> None:
        t0 = time.perf_counter()
        result = _execute("print(1)", run_options, tools=())
        one_shot_ms.append((time.perf_counter() - t0) * 1000)
        check(result, "one-shot")

    with session:
        check(session.run("print(1)"), "in a session")
        check(_execute("print(1)", run_options, tools=()), "one-shot")
        _alternate(warm, one_shot, runs)
    return {"warm_ms": warm_ms, "one_shot_ms": one_shot_ms}


def run_session(run_options: Mapping[str, Any], runs: int) -> dict[str, Any]:
    """``print(1)`` in a warm :class:`Session`, ``runs`` times, each timed from the call
    to its result; one untimed run first. Beside a floor row (``warm.floor.docker``)."""
    session = _started_session(run_options)
    times: list[float] = []
    with session:
        for i in range(runs + 1):
            t0 = time.perf_counter()
            result = session.run("print(1)")
            if i:
                times.append((time.perf_counter() - t0) * 1000)
            if _killed(result):
                raise ScriptKilled(f"print(1) was killed (exit code {result.exit_code})")
            if result.status != "success" or result.output.strip() != "1":
                raise RuntimeError(f"print(1) in a session gave {result.to_dict()}")
    return {"ms": times}


def run_cell(run_options: Mapping[str, Any], runs: int) -> dict[str, Any]:
    """``print(1)`` as one cell of a persistent interpreter and as a run in a warm
    (non-persistent) :class:`Session` beside it (the baseline), interleaved, ``runs``
    each, after one run of each; that first cell, which starts the interpreter in the
    already running environment, is timed apart (``start_ms``)."""
    options: dict[str, Any] = {"registry": bench_registry(), "tools": (), "timeout": 300}
    options.update(run_options)
    try:
        kernel = Session(persistent=True, **options)
        kernel.start()
        session = Session(**options)
        session.start()
    except (RunError, BackendError) as exc:
        raise NotAvailable(str(exc)) from exc
    timed: dict[str, list[float]] = {"cell_ms": [], "warm_ms": [], "start_ms": []}

    def once(which: Session, key: str | None) -> None:
        t0 = time.perf_counter()
        result = which.run("print(1)")
        if key is not None:
            timed[key].append((time.perf_counter() - t0) * 1000)
        if _killed(result):
            raise ScriptKilled(f"print(1) was killed (exit code {result.exit_code})")
        if result.status != "success" or result.output.strip() != "1":
            raise RuntimeError(f"print(1) gave {result.to_dict()}")

    with kernel, session:
        once(kernel, "start_ms")
        once(session, None)
        for i in range(runs):
            pair = [(kernel, "cell_ms"), (session, "warm_ms")]
            for which, key in pair if i % 2 == 0 else reversed(pair):
                once(which, key)
    return timed


class RSSSampler:
    """Samples this process's resident set size in a thread until stopped."""

    def __init__(self, interval: float = 0.005) -> None:
        self._process = psutil.Process()
        self._interval = interval
        self._stop = threading.Event()
        self.baseline = self._process.memory_info().rss
        self.peak = self.baseline
        self.samples = 0
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            rss = self._process.memory_info().rss
            self.samples += 1
            if rss > self.peak:
                self.peak = rss

    def __enter__(self) -> RSSSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)


def memory_script(total_bytes: int) -> str:
    return f"""import sys
line = b"x" * 1023 + b"\\n"
chunk = line * 1024
write = sys.stdout.buffer.write
for _ in range({total_bytes} // len(chunk)):
    write(chunk)
write(line * ({total_bytes} % len(chunk) // 1024))
"""


def run_memory(run_options: Mapping[str, Any], total_bytes: int) -> dict[str, Any]:
    """Host RSS growth while a script prints ``total_bytes`` to stdout, and the result size."""
    _execute(memory_script(1 << 20), run_options, tools=())  # warm, and spill once
    with RSSSampler() as rss:
        t0 = time.perf_counter()
        result = _execute(memory_script(total_bytes), run_options, tools=())
        seconds = time.perf_counter() - t0
    try:
        if _killed(result):
            raise ScriptKilled(f"the printing script was killed (exit code {result.exit_code})")
        if result.status != "success":
            raise RuntimeError(f"the printing script failed: {result.output[-2000:]}")
        if result.stdout_bytes_total != total_bytes:
            raise RuntimeError(
                f"captured {result.stdout_bytes_total} bytes of stdout, expected {total_bytes}"
            )
        return {
            "printed_bytes": total_bytes,
            "rss_before_mb": round(rss.baseline / 1e6, 1),
            "rss_peak_mb": round(rss.peak / 1e6, 1),
            "rss_growth_mb": round((rss.peak - rss.baseline) / 1e6, 1),
            "rss_samples": rss.samples,
            "result_json_bytes": len(result.to_json().encode()),
            "output_bytes": len(result.output.encode()),
            "seconds": round(seconds, 2),
            "mb_per_s": round(total_bytes / 1e6 / seconds),
        }
    finally:
        if result.stdout_spill_path:
            try:
                os.unlink(result.stdout_spill_path)
            except OSError:
                pass


def _describe(result: ExecutionResult | None) -> dict[str, Any] | None:
    return result.to_dict() if result is not None else None


def concurrent_script(run_index: int, calls: int) -> str:
    return f"""from hermes_tools import echo
for i in range({calls}):
    msg = "{run_index}-%d" % i
    reply = echo(msg=msg)
    if reply != {{"msg": msg}}:
        raise SystemExit("wrong answer to call %d: %r" % (i, reply))
print("ok {run_index}")
"""


def _run_at_once(
    scripts: list[str], options: Mapping[str, Any]
) -> tuple[float, list[ExecutionResult | None]]:
    """Every script at once through ``execute_code_async``: the wall time of them all,
    and each one's result."""
    results: list[ExecutionResult | None] = [None] * len(scripts)

    async def one(k: int) -> None:
        results[k] = await execute_code_async(scripts[k], **options)

    async def all_runs() -> float:
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tasks:
            for k in range(len(scripts)):
                tasks.start_soon(one, k)
        return time.perf_counter() - t0

    try:
        wall = anyio.run(all_runs)
    except* (RunError, BackendError) as group:  # the runs fail together in the task group
        raise NotAvailable(str(group.exceptions[0])) from None
    return wall, results


def _wrong_runs(results: list[ExecutionResult | None], calls: int) -> list[int]:
    """The runs that did not make ``calls`` calls and print ``ok <index>``."""
    wrong = []
    for k, result in enumerate(results):
        ok = (
            result is not None
            and result.status == "success"
            and result.tool_calls_made == calls
            and result.output.strip() == f"ok {k}"
        )
        if not ok:
            if result is not None and _killed(result):
                raise ScriptKilled(f"run {k} killed (exit code {result.exit_code})")
            wrong.append(k)
    return wrong


def run_concurrent(run_options: Mapping[str, Any], runs: int, calls: int) -> dict[str, Any]:
    """``runs`` scripts at once, each making ``calls`` echo calls; every result checked."""
    options: dict[str, Any] = {
        "tools": BENCH_TOOLS,
        "registry": bench_registry(),
        "max_tool_calls": calls,
        "spill_dir": _spill_dir(),
        "timeout": 300,
        **run_options,
    }
    wall, results = _run_at_once([concurrent_script(k, calls) for k in range(runs)], options)
    wrong = _wrong_runs(results, calls)
    durations = [r.duration_seconds for r in results if r is not None]
    return {
        "wall_s": wall,
        "run_s": durations,
        "correct": runs - len(wrong),
        "wrong": [_describe(results[k]) for k in wrong[:3]],
    }


# -- Many runs at once (issue #12, target 4) ---------------------------------------------
def many_script(run_index: int, threads: int, calls: int) -> str:
    """``threads`` threads, each making ``calls`` calls and checking every answer."""
    return f"""import threading
from hermes_tools import {PLAIN_ECHO} as echo

failures = []


def caller(t):
    for i in range({calls}):
        msg = "{run_index}-%d-%d" % (t, i)
        reply = echo(msg=msg)
        if reply != {{"msg": msg}}:
            failures.append("thread %d, call %d: %r" % (t, i, reply))
            return


workers = [threading.Thread(target=caller, args=(t,)) for t in range({threads})]
for w in workers:
    w.start()
for w in workers:
    w.join()
if failures:
    raise SystemExit("wrong answers: %r" % (failures[:3],))
print("ok {run_index}")
"""


def host_counts() -> dict[str, float]:
    """This process's resident set (MB), open file descriptors and threads, after a
    garbage collection (what a finished round still holds, not what it left to free)."""
    gc.collect()
    process = psutil.Process()
    return {
        "rss_mb": process.memory_info().rss / 1e6,
        "fds": process.num_fds(),
        "threads": process.num_threads(),
    }


def run_many(run_options: Mapping[str, Any], runs: int, threads: int, calls: int) -> dict[str, Any]:
    """One round: ``runs`` scripts at once, each with ``threads`` threads making
    ``calls`` plain echo calls apiece, every answer checked; then the host's counts."""
    total = threads * calls
    options: dict[str, Any] = {
        "tools": (PLAIN_ECHO,),
        "registry": bench_registry(),
        "max_tool_calls": total,
        "spill_dir": _spill_dir(),
        "timeout": 300,
        **run_options,
    }
    scripts = [many_script(k, threads, calls) for k in range(runs)]
    wall, results = _run_at_once(scripts, options)
    wrong = _wrong_runs(results, total)
    return {
        "wall_s": wall,
        "calls": runs * total,
        "correct": runs - len(wrong),
        "runs": runs,
        "wrong": [_describe(results[k]) for k in wrong[:3]],
        **host_counts(),
    }
