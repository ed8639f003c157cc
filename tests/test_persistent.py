"""Persistent interpreters: ``Session(persistent=True)`` runs each ``run`` as a cell of
one interpreter whose globals survive, on every backend the conformance suite reaches
(local over each transport, docker and ssh for real, the apptainer stand-in).

A check that something is gone looks only at this test's own processes (the pids its
cells print) and its own container.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from conftest import IMAGE, RUN_ID, TEST_LABEL
from test_conformance import (  # noqa: F401 - fixtures, found by name
    held_local,
    held_singularity,
    held_ssh,
    portal,
)
from test_sessions import SessionTarget, _container_exists

from hermes_sandbox import AsyncSession, RunError, Session, ToolRegistry, threads
from hermes_sandbox.execute_code_tool import close_task_session, register_execute_code
from hermes_sandbox.kernel import LIMITS, set_interpreter_limits
from hermes_sandbox.tools.registry import ToolContext

WAIT = 60.0  # generous: how long a test waits for something to end

TARGETS = [
    ("local", "unix"),
    ("local", "relay"),
    ("local", "files"),
    ("docker", "unix"),
    ("docker", "relay"),
    ("ssh", "relay"),
    ("singularity", "relay"),
]

PID = "import os; print(os.getpid())"


@pytest.fixture(autouse=True)
def default_limits() -> Iterator[None]:
    before = set_interpreter_limits()
    yield
    set_interpreter_limits(
        max_interpreters=before.max_interpreters, idle_seconds=before.idle_seconds
    )


@pytest.fixture(params=TARGETS, ids=[f"{b}-{t}" for b, t in TARGETS])
def target(request: pytest.FixtureRequest, portal: Any) -> SessionTarget:  # noqa: F811
    backend, transport = request.param
    if backend == "local":
        return SessionTarget(backend, transport, request.getfixturevalue("held_local"), portal)
    if backend == "docker":
        engine = request.getfixturevalue("engine")
        options = {"backend_options": {"image": IMAGE, "labels": {TEST_LABEL: RUN_ID}}}
        return SessionTarget(backend, transport, None, portal, options, engine)
    held, options = request.getfixturevalue(f"held_{backend}")
    options = {k: v for k, v in options.items() if k != "task_id"}  # an instance of its own
    return SessionTarget(backend, transport, held, portal, options)


def ok(result: Any) -> Any:
    assert result.status == "success", result.to_dict()
    return result


def gone(target: SessionTarget, session: Session, pids: list[int]) -> bool:
    """Whether none of ``pids`` runs any more where the session's cells run."""
    if target.held is not None:
        return target.alive(pids) == []
    check = f"import os; print([p for p in {pids!r} if os.path.exists('/proc/%d' % p)])"
    return ok(session.run(check)).output.strip() == "[]"  # docker: the same container's view


def test_globals_survive_and_an_exception_keeps_them(target: SessionTarget) -> None:
    with target.session(persistent=True, tools=["terminal"]) as s:
        first = ok(s.run("import os\nx = 41\nprint(os.getpid())"))
        assert first.interpreter_started is True and first.state_lost is False
        second = ok(s.run("x += 1\nprint(x, os.getpid())"))
        assert second.output.split() == ["42", first.output.strip()]
        assert second.interpreter_started is False and second.state_lost is False
        failed = s.run("y = 'set before the error'\nraise ValueError('boom')")
        assert failed.status == "error" and failed.exit_code == 1
        assert failed.error == "ValueError: boom" and "<cell 3>" in failed.output
        assert failed.state_lost is False
        kept = ok(s.run("print(x, y)"))
        assert kept.output == "42 set before the error\n"


def test_subprocess_output_and_tool_calls_belong_to_the_cell(target: SessionTarget) -> None:
    with target.session(persistent=True, tools=["terminal"]) as s:
        cell = (
            "import subprocess, sys\n"
            "print('from python')\n"
            "subprocess.run(['sh', '-c', 'echo from a child; echo child err >&2'])\n"
            "from hermes_tools import terminal\n"
            "print(terminal('echo from a tool')['output'].strip())\n"
            "sys.stdout.write('no newline')\n"
        )
        result = ok(s.run(cell))
        assert result.output.startswith("from python\nfrom a child\nfrom a tool\nno newline"), (
            result.output
        )
        assert "child err" in result.output and "\x1e" not in result.output
        assert result.tool_calls_made == 1
        again = ok(s.run("print('next')"))
        assert again.output == "next\n" and again.tool_calls_made == 0


def test_sys_exit_ends_the_interpreter_and_the_next_run_is_fresh(target: SessionTarget) -> None:
    with target.session(persistent=True) as s:
        ok(s.run("x = 1"))
        ended = s.run("print('bye'); import sys; sys.exit(3)")
        assert ended.status == "error" and ended.exit_code == 3
        assert ended.output.startswith("bye")
        assert ended.state_lost is True and "globals are gone" in (ended.warning or "")
        fresh = ok(s.run("print('x' in globals())"))
        assert fresh.output == "False\n" and fresh.interpreter_started is True


def test_a_timeout_kills_the_interpreter_and_says_its_state_is_lost(
    target: SessionTarget,
) -> None:
    with target.session(persistent=True) as s:
        pid = int(ok(s.run(PID + "\nx = 1")).output)
        late = s.run("print('started', flush=True)\nimport time\ntime.sleep(600)", timeout=5)
        assert late.status == "timeout" and late.exit_code == 124
        assert "started" in late.output
        assert late.state_lost is True and "timed out" in (late.warning or "")
        fresh = ok(s.run("print('x' in globals())"))
        assert fresh.output == "False\n" and fresh.interpreter_started is True
        assert gone(target, s, [pid])


def test_reset_discards_the_state(target: SessionTarget) -> None:
    with target.session(persistent=True) as s:
        pid = int(ok(s.run(PID + "\nx = 1")).output)
        container = getattr(s.environment, "container_id", None)
        s.reset()
        fresh = ok(s.run("print('x' in globals())"))
        assert fresh.output == "False\n" and fresh.interpreter_started is True
        if target.engine is not None:  # a new container: the old one, pids and all, is gone
            assert not _container_exists(target.engine, container)
        else:
            assert gone(target, s, [pid])


def test_close_leaves_nothing_behind(target: SessionTarget) -> None:
    cell = (
        "import os, subprocess\n"
        "child = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        "print(os.getpid(), child.pid)"
    )
    with target.session(persistent=True) as s:
        pids = [int(p) for p in ok(s.run(cell)).output.split()]
        container = getattr(s.environment, "container_id", None)
        workspace = s.workspace
    assert s.closed
    if target.engine is not None:
        assert not _container_exists(target.engine, container)
    else:
        assert target.alive(pids) == [], "a process of the session's interpreter is left"
        assert workspace is not None and not target.exists(workspace)


def _local(**options: Any) -> Session:
    return Session("local", persistent=True, timeout=WAIT, **options)


def test_the_least_recently_used_interpreter_is_shut_down_beyond_the_limit(
    held_local: Any,  # noqa: F811
    portal: Any,  # noqa: F811
) -> None:
    assert LIMITS.max_interpreters == 4  # the default
    target = SessionTarget("local", "unix", held_local, portal)
    sessions = [_local() for _ in range(5)]
    try:
        pids = []
        for s in sessions[:4]:
            pids.append(int(ok(s.run(PID + "\nx = 1")).output))
        ok(sessions[0].run("x += 1"))  # the first is now the most recently used
        assert sorted(target.alive(pids)) == sorted(pids)
        ok(sessions[4].run(PID))  # a fifth: the least recently used (the second) ends
        assert target.alive([pids[1]]) == [], "the least recently used interpreter is left"
        assert sorted(target.alive([pids[0], pids[2], pids[3]])) == sorted(
            [pids[0], pids[2], pids[3]]
        )
        ok(sessions[0].run("print(x)"))  # kept
        evicted = ok(sessions[1].run("print('x' in globals())"))
        assert evicted.output == "False\n" and evicted.interpreter_started is True
        assert "least recently used" in (evicted.warning or ""), evicted.warning
    finally:
        for s in sessions:
            s.close()


def test_an_idle_interpreter_is_shut_down(held_local: Any, portal: Any) -> None:  # noqa: F811
    set_interpreter_limits(idle_seconds=1)
    target = SessionTarget("local", "unix", held_local, portal)
    with _local() as s:
        pid = int(ok(s.run(PID + "\nx = 1")).output)
        deadline = time.monotonic() + WAIT
        while target.alive([pid]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert target.alive([pid]) == [], "the idle interpreter was not shut down"
        fresh = ok(s.run("print('x' in globals())"))
        assert fresh.output == "False\n" and fresh.interpreter_started is True
        assert "idle" in (fresh.warning or ""), fresh.warning


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError):
        set_interpreter_limits(max_interpreters=0)
    with pytest.raises(ValueError):
        set_interpreter_limits(idle_seconds=0)


def test_a_persistent_async_session_needs_async_with() -> None:
    async def main() -> None:
        s = AsyncSession(persistent=True)
        try:
            with pytest.raises(RunError, match="async with"):
                await s.run("print(1)")
        finally:
            await s.aclose()
        async with AsyncSession(persistent=True, timeout=WAIT) as s:
            ok(await s.run("x = 5"))
            assert ok(await s.run("print(x)")).output == "5\n"

    anyio.run(main)


def test_interrupt_ends_the_interpreter(held_local: Any, portal: Any) -> None:  # noqa: F811
    async def main() -> None:
        async with AsyncSession(persistent=True, timeout=WAIT) as s:
            ok(await s.run("x = 5"))
            stop = anyio.Event()
            lines: list[str] = []

            async def seen(line: str) -> None:
                lines.append(line)
                stop.set()

            result = await s.run(
                "print('waiting', flush=True)\nimport time\ntime.sleep(600)",
                on_stdout=seen,
                interrupt=stop,
            )
            assert result.status == "interrupted" and result.state_lost is True
            assert lines == ["waiting\n"]
            fresh = ok(await s.run("print('x' in globals())"))
            assert fresh.output == "False\n"

    anyio.run(main)


def test_execute_code_keeps_the_interpreter_of_each_task(
    held_local: Any,  # noqa: F811
    portal: Any,  # noqa: F811
) -> None:
    registry = ToolRegistry()
    register_execute_code(registry, enabled_tools=[], persistent=True)
    target = SessionTarget("local", "unix", held_local, portal)

    def call(task: str, code: str, **args: Any) -> dict[str, Any]:
        context = ToolContext(task_id=task, environment=None, cwd=os.getcwd())
        result = json.loads(registry.dispatch("execute_code", {"code": code, **args}, context))
        assert result["status"] == "success", result
        return dict(result)

    task_a, task_b = f"pa-{RUN_ID}", f"pb-{RUN_ID}"
    try:
        pid = int(call(task_a, PID + "\nx = 'a'")["output"])
        assert call(task_a, "print(x)")["output"] == "a\n"
        assert call(task_b, "print('x' in globals())")["output"] == "False\n"
        fresh = call(task_a, "print('x' in globals())", reset=True)
        assert fresh["output"] == "False\n" and fresh["interpreter_started"] is True
        assert target.alive([pid]) == []
        pid = int(call(task_a, PID)["output"])
        assert close_task_session(task_a)
        assert target.alive([pid]) == []
    finally:
        close_task_session(task_a)
        close_task_session(task_b)


def test_an_unused_persistent_task_session_is_closed_with_its_interpreter(
    held_local: Any,  # noqa: F811
    portal: Any,  # noqa: F811
) -> None:
    """A persistent task session unused for ``idle_seconds`` is closed by itself, its
    interpreter with it; the task's next script starts a new one, and its result says
    the globals are gone."""
    registry = ToolRegistry()
    register_execute_code(registry, enabled_tools=[], persistent=True, idle_seconds=0.5)
    target = SessionTarget("local", "unix", held_local, portal)
    context = ToolContext(task_id=f"pidle-{RUN_ID}", environment=None, cwd=os.getcwd())

    def call(code: str) -> dict[str, Any]:
        result = json.loads(registry.dispatch("execute_code", {"code": code}, context))
        assert result["status"] == "success", result
        return dict(result)

    try:
        pid = int(call(PID + "\nx = 'a'")["output"])
        deadline = time.monotonic() + 30
        while target.alive([pid]):  # the reaper's work shows only in what it ends
            assert time.monotonic() < deadline, "the idle interpreter still runs"
            time.sleep(0.05)
        fresh = call("print('x' in globals())")
        assert fresh["output"] == "False\n" and fresh["interpreter_started"] is True
        assert "globals" in fresh.get("warning", ""), fresh
    finally:
        close_task_session(str(context.task_id))


HOST = """
import sys, time
from hermes_sandbox import Session
s = Session(persistent=True, transport=sys.argv[1], timeout=60)
s.start()
result = s.run("import hermes_tools, os; print(os.path.dirname(hermes_tools.__file__))")
print(result.output.strip(), flush=True)
time.sleep(600)
"""


def _running_in(stage: str) -> list[int]:
    """This machine's processes whose command line names ``stage`` (this test's own)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    if stage.encode() in handle.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.mark.parametrize("transport", ["unix", "relay"])
def test_the_interpreter_ends_when_its_host_dies(transport: str) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", HOST, transport], stdout=subprocess.PIPE, text=True
    ) as host:
        try:
            assert host.stdout is not None
            stage = host.stdout.readline().strip()
            assert stage.startswith("/") and _running_in(stage), stage
        finally:
            host.kill()
            host.wait(WAIT)
    deadline = time.monotonic() + WAIT
    while _running_in(stage) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _running_in(stage) == [], "the interpreter outlived its host"


def test_a_backend_that_cannot_start_raises_its_own_error(tmp_path: Any) -> None:
    """Not an ExceptionGroup from the interpreters' task group: the error says what to do."""
    from hermes_sandbox import DockerSettings
    from hermes_sandbox.errors import BackendNotAvailable

    engine = DockerSettings(docker_host=f"unix://{tmp_path}/no-engine.sock")
    s = Session(persistent=True, backend=engine)
    with pytest.raises(BackendNotAvailable, match="no container engine answers"):
        s.start()
    s.close()


def test_close_does_not_wait_for_the_interpreters_own_request(
    held_local: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Between cells the interpreter waits on a request for its next cell. Closing must
    # answer it, not leave the transport's drain to wait for it: with the drain made
    # an hour long, a close that waited for it would still be closing after WAIT.
    monkeypatch.setattr(threads, "TOOL_CALL_DRAIN_SECONDS", 3600.0)
    for transport in ("unix", "relay", "files"):
        s = _local(transport=transport)
        ok(s.run("x = 1"))
        closing = threading.Thread(target=s.close, daemon=True)
        closing.start()
        closing.join(WAIT)
        assert not closing.is_alive(), f"close() over {transport} waits for the drain"
        assert s.closed
