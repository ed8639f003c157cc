"""Sessions: one warm environment for many runs, files in and out, reset, close, and
output streamed to callbacks as the script prints it.

The scenarios run through :class:`hermes_sandbox.Session` on each backend the
conformance suite reaches (local, docker and ssh for real; the apptainer stand-in and
the modal and daytona fakes), with its fixtures. A check that something is gone looks
only at what this test's session made: its paths, its container, its instance.
"""

from __future__ import annotations

import json
import os
import pty
import shlex
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import IMAGE, RUN_ID, TEST_LABEL, is_gone
from test_conformance import (  # noqa: F401 - fixtures, found by name
    ALIVE,
    held_daytona,
    held_local,
    held_modal,
    held_singularity,
    held_ssh,
    portal,
)

from hermes_sandbox import AsyncSession, RunError, Session, ToolRegistry
from hermes_sandbox.environments import Environment
from hermes_sandbox.execute_code_tool import (
    close_task_session,
    register_execute_code,
)
from hermes_sandbox.output import CappedOutput
from hermes_sandbox.streaming import StreamedOutput, streaming_notice
from hermes_sandbox.tools.registry import ToolContext

TIMEOUT = 60.0
WAIT = 60.0  # how long a tool waits for the test to see a streamed line

TARGETS = [
    ("local", "unix"),
    ("local", "relay"),
    ("docker", "unix"),
    ("docker", "relay"),
    ("ssh", "relay"),
    ("singularity", "relay"),
    ("modal", "relay"),
    ("daytona", "relay"),
]


@dataclass
class SessionTarget:
    """Where a session runs, and an environment held open there for checking (None
    for docker: the session's container is its own, checked through the engine)."""

    backend: str
    transport: str
    held: Environment | None
    portal: Any
    options: dict[str, Any] = field(default_factory=dict)
    engine: Any = None

    def session(self, **options: Any) -> Session:
        options.setdefault("timeout", TIMEOUT)
        return Session(self.backend, transport=self.transport, **{**self.options, **options})

    def alive(self, pids: list[int]) -> list[int]:
        """Those of ``pids`` still running where the session's scripts run."""
        assert self.held is not None
        command = "python3 -c " + shlex.quote(ALIVE) + " " + " ".join(map(str, pids))
        result = self.portal.call(self.held.execute, command)
        assert result.exit_code == 0, result.output
        return [int(line) for line in result.output.split()]

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists where the session's scripts run."""
        assert self.held is not None
        result = self.portal.call(self.held.execute, f"test -e {shlex.quote(path)}")
        return result.exit_code == 0


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


WHERE = "import os; print(os.path.dirname(os.path.abspath(__file__))); print(os.getcwd())"


def test_runs_share_one_warm_environment_and_stage(target: SessionTarget) -> None:
    with target.session() as s:
        environment = s.environment
        first = s.run(WHERE + "\nopen('note.txt', 'w').write('kept')")
        assert first.status == "success", first.output
        container = getattr(environment, "container_id", None)
        second = s.run(WHERE + "\nprint(open('note.txt').read())")
        assert second.status == "success", second.output
        assert s.environment is environment
        assert getattr(s.environment, "container_id", None) == container
        stage, cwd = first.output.split()[:2]
        assert second.output.split() == [stage, cwd, "kept"]  # same stage, same workspace
        assert cwd == s.workspace


def test_upload_and_download_round_trip(target: SessionTarget, tmp_path: Path) -> None:
    payload = bytes(range(256)) * 64 + "é✓\n".encode()
    source = tmp_path / "in.bin"
    source.write_bytes(payload)
    with target.session() as s:
        remote = s.upload(source, "data/in.bin")
        assert remote == f"{s.workspace}/data/in.bin"
        result = s.run(
            "import hashlib\n"
            "data = open('data/in.bin', 'rb').read()\n"
            "open('out.bin', 'wb').write(data[::-1])\n"
            "print(hashlib.sha256(data).hexdigest())"
        )
        assert result.status == "success", result.output
        import hashlib

        assert result.output.strip() == hashlib.sha256(payload).hexdigest()
        s.download("out.bin", tmp_path / "out.bin")
        assert (tmp_path / "out.bin").read_bytes() == payload[::-1]
        with pytest.raises(FileNotFoundError):
            s.download("missing.bin", tmp_path / "missing.bin")


def test_reset_gives_a_fresh_environment(target: SessionTarget) -> None:
    with target.session() as s:
        before = s.workspace
        assert s.run("open('left.txt', 'w').write('x')").status == "success"
        container = getattr(s.environment, "container_id", None)
        s.reset()
        assert s.workspace != before
        result = s.run("import os; print(sorted(os.listdir('.')))")
        assert result.status == "success", result.output
        assert result.output.strip() == "[]"
        if target.engine is not None:
            assert s.environment.container_id != container  # type: ignore[union-attr]
            assert not _container_exists(target.engine, container)
        else:
            assert not target.exists(before)


def test_close_leaves_nothing_behind(target: SessionTarget) -> None:
    daemon = (
        "\nimport subprocess\n"
        "child = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        "print(child.pid)"
    )
    with target.session() as s:
        result = s.run(WHERE + daemon)
        assert result.status == "success", result.output
        stage, workspace, pid = result.output.split()
        environment = s.environment
        assert environment is not None
        container = getattr(environment, "container_id", None)
        shared = environment.shared_directory if target.backend == "docker" else None
        instance = getattr(environment, "instance_name", None)
    assert s.closed and s.environment is None
    assert not environment.alive
    if target.engine is not None:
        assert not _container_exists(target.engine, container)
        if shared is not None:
            assert not os.path.exists(shared), "the container's shared directory is left"
    else:
        assert not target.exists(stage), "the stage is left"
        assert not target.exists(workspace), "the workspace is left"
        assert target.alive([int(pid)]) == [], "a process the session started is left"
    if instance is not None:
        running = target.portal.call(target.held._list_instances, instance)  # type: ignore[union-attr]
        assert instance not in running, "the session's apptainer instance is left"
    with pytest.raises(RunError, match="closed"):
        s.run("print(1)")


def _container_exists(engine: Any, container_id: str | None) -> bool:
    import docker

    try:
        engine.containers.get(container_id)
    except docker.errors.NotFound:
        return False
    return True


def _waiting_registry(seen: threading.Event) -> ToolRegistry:
    """A registry with one tool, ``wait_seen``, that returns "seen" once ``seen`` is
    set (by the test, when its callback got the script's line), "not seen" after WAIT."""
    registry = ToolRegistry()

    def wait_seen(args: dict[str, Any], ctx: Any) -> str:
        return json.dumps({"answer": "seen" if seen.wait(WAIT) else "not seen"})

    registry.register(
        name="wait_seen",
        toolset="test",
        schema={
            "name": "wait_seen",
            "description": "Wait until the test saw the line.",
            "parameters": {"type": "object", "properties": {}},
        },
        handler=wait_seen,
    )
    return registry


def test_callbacks_get_lines_before_the_run_ends(target: SessionTarget) -> None:
    seen = threading.Event()
    lines: list[str] = []
    errors: list[str] = []

    def on_stdout(line: str) -> None:
        lines.append(line)
        if line == "ready\n":
            seen.set()

    code = """
        import sys
        from hermes_tools import wait_seen
        print("ready", flush=True)
        print("to stderr", file=sys.stderr, flush=True)
        print(wait_seen()["answer"])
        print("no newline at the end", end="")
    """
    registry = _waiting_registry(seen)
    with target.session(registry=registry, tools=["wait_seen"]) as s:
        result = s.run(textwrap.dedent(code), on_stdout=on_stdout, on_stderr=errors.append)
    assert result.status == "success", result.output
    assert lines == ["ready\n", "seen\n", "no newline at the end"]
    assert errors == ["to stderr\n"]
    assert result.output.startswith("ready\nseen\nno newline at the end")


def test_caps_still_apply_to_the_result_while_streaming(target: SessionTarget) -> None:
    lines: list[str] = []
    with target.session(max_stdout_bytes=1000) as s:
        result = s.run("for i in range(500): print('line %03d' % i)", on_stdout=lines.append)
    assert result.status == "success", result.output
    assert lines == [f"line {i:03d}\n" for i in range(500)]  # 4,500 bytes, under the bound
    assert result.stdout_truncated
    assert result.stdout_bytes_total == 4500
    assert result.stdout_bytes_captured <= 1000


# -- local only: the session's own rules ---------------------------------------------------


def test_a_second_run_while_one_runs_is_refused(tmp_path: Path) -> None:
    gate = tmp_path / "go"
    code = (
        f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)\nprint('done')"
    )

    async def main() -> None:
        async with AsyncSession(timeout=TIMEOUT) as s:
            outcome: dict[str, Any] = {}

            async def first() -> None:
                outcome["result"] = await s.run(code)

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(first)
                await anyio.sleep(0.2)
                with pytest.raises(RunError, match="sequential"):
                    await s.run("print(2)")
                with pytest.raises(RunError, match="sequential"):
                    await s.upload(__file__, "x.py")
                gate.write_text("")
            assert outcome["result"].output.strip() == "done"
            assert (await s.run("print(3)")).output.strip() == "3"  # free again

    anyio.run(main)


def test_sync_session_refuses_a_run_or_close_from_another_thread_meanwhile(
    tmp_path: Path,
) -> None:
    gate = tmp_path / "go"
    code = (
        "import os, time\n"
        f"print('started', flush=True)\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
        "print('done')"
    )
    started = threading.Event()
    outcome: dict[str, Any] = {}
    with Session(timeout=TIMEOUT) as s:

        def first() -> None:
            outcome["result"] = s.run(code, on_stdout=lambda line: started.set())

        worker = threading.Thread(target=first)
        worker.start()
        try:
            assert started.wait(TIMEOUT)
            with pytest.raises(RunError, match="sequential"):
                s.run("print(2)")
            with pytest.raises(RunError, match="in progress"):
                s.close()
            assert not s.closed
        finally:
            gate.write_text("")
            worker.join(TIMEOUT)
        assert outcome["result"].output.split() == ["started", "done"]
        assert s.run("print(3)").output.strip() == "3"  # still usable
        workspace = s.workspace
    assert s.closed and workspace is not None and not os.path.exists(workspace)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_async_session_on_asyncio_and_trio(backend: str, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("hello")

    async def main() -> tuple[str, str, str | None]:
        got: list[str] = []

        async def on_stdout(line: str) -> None:  # a coroutine callback is awaited
            got.append(line)

        async with AsyncSession(timeout=TIMEOUT) as s:
            await s.upload(source, "in.txt")
            first = await s.run("print(open('in.txt').read().upper())", on_stdout=on_stdout)
            await s.reset()
            second = await s.run("import os; print(os.listdir('.'))")
            workspace = s.workspace
        assert got == ["HELLO\n"]
        return first.output.strip(), second.output.strip(), workspace

    first, second, workspace = anyio.run(main, backend=backend)
    assert (first, second) == ("HELLO", "[]")
    assert workspace is not None and not os.path.exists(workspace)


def test_cancelling_a_run_kills_the_script_and_keeps_the_session(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(300)"

    async def main() -> str:
        async with AsyncSession(timeout=TIMEOUT, kill_grace=0.5) as s:
            with anyio.move_on_after(30) as scope:
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(s.run, code)
                    while not pid_file.exists() or not pid_file.read_text():  # noqa: ASYNC110
                        await anyio.sleep(0.05)  # the script's file, not an event of ours
                    tasks.cancel_scope.cancel()
            assert not scope.cancelled_caught
            return (await s.run("print('after')")).output.strip()

    assert anyio.run(main) == "after"
    assert is_gone(int(pid_file.read_text()))


# -- the execute_code tool: one session per task id -------------------------------------------


def test_execute_code_keeps_one_session_per_task() -> None:
    registry = ToolRegistry()
    entry = register_execute_code(registry, enabled_tools=[])
    stage = "import os; print(os.path.dirname(os.path.abspath(__file__)))"

    def call(task: str, **args: Any) -> dict[str, Any]:
        context = ToolContext(task_id=task, environment=None, cwd=os.getcwd())
        result = json.loads(registry.dispatch("execute_code", {"code": stage, **args}, context))
        assert result["status"] == "success", result
        assert set(result) >= {"status", "output", "exit_code", "tool_calls_made"}
        return result

    task_a, task_b = f"a-{RUN_ID}", f"b-{RUN_ID}"
    try:
        first = call(task_a)["output"].strip()
        assert call(task_a)["output"].strip() == first  # the same warm stage
        other = call(task_b)["output"].strip()
        assert other != first
        fresh = call(task_a, reset=True)["output"].strip()
        assert fresh != first and not os.path.exists(first)
        assert close_task_session(task_a)
        assert not os.path.exists(fresh)
        assert not close_task_session(task_a)  # nothing left to close
        assert os.path.exists(other)
    finally:
        close_task_session(task_a)
        close_task_session(task_b)
    assert not os.path.exists(other)
    assert entry.name == "execute_code"


def stage_of(registry: ToolRegistry, task: str, code: str = "") -> tuple[str, dict[str, Any]]:
    """Run execute_code for ``task`` (``code`` first); return the run's stage directory
    (where the script lies) and the result."""
    stage = "import os; print(os.path.dirname(os.path.abspath(__file__)))"
    context = ToolContext(task_id=task, environment=None, cwd=os.getcwd())
    result = json.loads(registry.dispatch("execute_code", {"code": code + stage}, context))
    assert result["status"] == "success", result
    return result["output"].strip().splitlines()[-1], result


def wait_gone(path: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while os.path.exists(path):  # the reaper's work shows only in what it removes
        assert time.monotonic() < deadline, f"{path} still there after {seconds} s"
        time.sleep(0.05)


def test_an_unused_task_session_is_closed_and_its_next_run_says_so() -> None:
    """No script of the task runs for ``idle_seconds``: its session is closed (its stage
    removed) by itself, and the task's next script starts in a new one, whose result's
    warning says what was lost; the run after that is warm again, with no warning."""
    registry = ToolRegistry()
    register_execute_code(registry, enabled_tools=[], idle_seconds=0.5)
    task = f"idle-{RUN_ID}"
    try:
        first, result = stage_of(registry, task)
        assert "warning" not in result, result
        wait_gone(first)
        second, result = stage_of(registry, task)
        assert second != first
        assert "closed after 0.5 s unused" in result.get("warning", ""), result
        again, result = stage_of(registry, task)
        assert again == second and "warning" not in result, result
    finally:
        close_task_session(task)


def test_a_task_session_in_use_is_not_closed() -> None:
    """A run longer than ``idle_seconds`` is not cut, and runs that follow each other
    keep their session: idleness counts from the end of the last run."""
    registry = ToolRegistry()
    register_execute_code(registry, enabled_tools=[], idle_seconds=1.0)
    task = f"busy-{RUN_ID}"
    try:
        first, result = stage_of(registry, task, "import time; time.sleep(2.5)\n")
        assert os.path.exists(first)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            stage, result = stage_of(registry, task)
            assert stage == first and "warning" not in result, result
        wait_gone(first)  # then, unused, it goes
    finally:
        close_task_session(task)


@pytest.mark.parametrize("idle_seconds", [0, -1.0, float("nan"), True])
def test_an_idle_time_that_is_not_positive_is_refused(idle_seconds: Any) -> None:
    with pytest.raises(ValueError, match="idle_seconds must be positive"):
        register_execute_code(ToolRegistry(), enabled_tools=[], idle_seconds=idle_seconds)


# -- the streaming mechanism over in-memory chunks ----------------------------------------------


def _stream(chunks: list[bytes], **options: Any) -> tuple[list[str], CappedOutput]:
    got: list[str] = []
    sink = CappedOutput(100)

    async def main() -> None:
        streamed = StreamedOutput(sink, got.append, **options)
        for chunk in chunks:
            await streamed.feed(chunk)
        await streamed.flush()

    anyio.run(main)
    return got, sink


def test_lines_are_joined_across_chunks_and_characters_are_not_split() -> None:
    check = "✓".encode()
    got, sink = _stream([b"ab", b"c\nde", check[:1], check[1:] + b"\n", b"tail"])
    assert got == ["abc\n", "de✓\n", "tail"]
    assert sink.buffer.total == 3 + 1 + 2 + 3 + 1 + 4


def test_a_long_line_comes_in_pieces_and_the_stream_is_bounded() -> None:
    got, _ = _stream([b"x" * 25 + b"\n"], piece_chars=10)
    assert got == ["x" * 10, "x" * 10, "x" * 5 + "\n"]
    got, sink = _stream([b"12345\n"] * 10, limit=15)
    assert got == ["12345\n", "12345\n", "123" + streaming_notice(15)]
    assert sink.buffer.total == 60  # the capture is not bounded by the streaming limit


def test_a_callback_that_raises_is_dropped_not_fatal() -> None:
    calls: list[str] = []

    def bad(line: str) -> None:
        calls.append(line)
        raise ValueError("boom")

    sink = CappedOutput(100)

    async def main() -> None:
        streamed = StreamedOutput(sink, bad)
        await streamed.feed(b"one\ntwo\n")
        await streamed.flush()

    anyio.run(main)
    assert calls == ["one\n"]
    assert sink.text() == "one\ntwo\n"


# -- the command line: live output at a terminal --------------------------------------------


def _run_at_terminal(args: list[str], code: str, gate: Path) -> tuple[bytes, bytes, int]:
    """Run ``hermes-sandbox`` with its stdout and stderr on a pseudo-terminal; return
    what the terminal showed before ``gate`` was made (the script waits for it), all of
    it, and the exit code. The gate is made once "first" has been shown."""
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "hermes_sandbox", "run", *args, "-"],
        stdin=subprocess.PIPE,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    assert process.stdin is not None
    process.stdin.write(code.encode())
    process.stdin.close()
    shown = b""
    before = b""
    timer = threading.Timer(WAIT, lambda: gate.write_text(""))  # never hang the test
    timer.start()
    try:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not data:
                break
            shown += data
            if b"first" in shown and not gate.exists():
                before = shown
                gate.write_text("")
    finally:
        timer.cancel()
        os.close(master)
        code_ = process.wait(timeout=WAIT)
    return before, shown, code_


def test_run_shows_output_live_at_a_terminal(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    code = (
        "import os, time\n"
        "print('first', flush=True)\n"
        f"while not os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
        "print('second')\n"
    )
    before, shown, exit_code = _run_at_terminal([], code, gate)
    assert exit_code == 0
    assert b"first" in before and b"second" not in before  # shown while the script ran
    assert shown.replace(b"\r\n", b"\n").count(b"first\n") == 1  # not shown again at the end
    assert b"second" in shown


def test_run_json_at_a_terminal_is_one_json_object(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.write_text("")  # no waiting: the JSON comes only at the end
    _, shown, exit_code = _run_at_terminal(["--json"], "print('first')\n", gate)
    assert exit_code == 0
    result = json.loads(shown.decode())
    assert result["output"] == "first\n" and result["status"] == "success"
