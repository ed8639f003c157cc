"""The delegation host with real children on local and docker: each child's loop is a
plain function (FunctionLoop) that runs real scripts in the child's own sandbox.

Tool calls from the scripts reach ``probe``, an async tool of a private registry that
records what it is sent and counts how many children are inside it at once. Nothing
left behind is checked on what each test made: the pids its scripts reported (local,
and the autouse check of conftest), the containers carrying its own label (docker).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import anyio
import psutil
import pytest
from conftest import IMAGE, RUN_ID, TEST_LABEL

from hermes_sandbox import (
    AsyncDelegationHost,
    Budget,
    ChildTask,
    DelegationHost,
    FunctionLoop,
    RunError,
    RunOptions,
    ToolRegistry,
    register_delegate_task,
    run_code,
)
from hermes_sandbox.delegation import CHILD_BLOCKED_TOOLS, DELEGATE_TASK
from hermes_sandbox.environments.docker import DockerSettings

# Each docker child starts and removes a container of its own: slow on a loaded machine.
pytestmark = pytest.mark.timeout(300)

CHILD_LABEL = "hermes-delegation-test"
GRACE = 10.0  # generous: a loaded 2-core machine


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Target:
    name: str
    options: RunOptions
    label: str | None = None  # docker: this test's containers carry CHILD_LABEL=label

    def containers(self, engine: Any) -> list[Any]:
        assert self.label is not None
        return engine.api.containers(all=True, filters={"label": f"{CHILD_LABEL}={self.label}"})


@pytest.fixture(params=["local", "docker"])
def target(request: pytest.FixtureRequest) -> Target:
    if request.param == "docker":
        request.getfixturevalue("engine")
        label = uuid.uuid4().hex
        settings = DockerSettings(image=IMAGE, labels={TEST_LABEL: RUN_ID, CHILD_LABEL: label})
        return Target("docker", RunOptions(backend=settings, timeout=60), label)
    return Target("local", RunOptions(timeout=60))


class Probe:
    """An async tool: records each call's arguments and how many are inside at once;
    ``hold`` keeps a call inside until ``want`` are (at most ``wait`` seconds), then
    ``hold`` seconds more."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.inside = 0
        self.most_inside = 0
        self._changed: anyio.Event | None = None

    async def __call__(self, args: dict[str, Any]) -> str:
        self.calls.append(args)
        self.inside += 1
        self.most_inside = max(self.most_inside, self.inside)
        self._notify()
        try:
            hold = float(args.get("hold") or 0)
            if hold:
                with anyio.move_on_after(float(args.get("wait") or 3)):
                    while self.inside < int(args.get("want") or 1):
                        self._changed = self._changed or anyio.Event()
                        await self._changed.wait()
                await anyio.sleep(hold)
        finally:
            self.inside -= 1
            self._notify()
        return json.dumps({"ok": True, "n": len(self.calls)})

    async def wait_for_calls(self, count: int) -> None:
        while len(self.calls) < count:
            self._changed = self._changed or anyio.Event()
            await self._changed.wait()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None


def make_registry(probe: Probe) -> ToolRegistry:
    """probe, plus stand-ins of the tools a child must never get."""
    registry = ToolRegistry()
    schema = {
        "name": "probe",
        "description": "Record a call.",
        "parameters": {
            "type": "object",
            "properties": {
                "tag": {"type": "string"},
                "hold": {"type": "number"},
                "want": {"type": "integer"},
                "wait": {"type": "number"},
            },
        },
    }
    registry.register("probe", "test", schema, probe.__call__, is_async=True)
    for name in sorted(CHILD_BLOCKED_TOOLS - {DELEGATE_TASK}):
        blocked = {"name": name, "description": f"{name}.", "parameters": {"type": "object"}}
        registry.register(name, "agent", blocked, lambda args: "{}")
    return registry


Loop = Callable[[ChildTask, Any], Awaitable[str]]


def host_for(
    target: Target, loop: Loop, probe: Probe | None = None, **kwargs: Any
) -> AsyncDelegationHost:
    registry = make_registry(probe or Probe())
    kwargs.setdefault("tools", ["probe", *sorted(CHILD_BLOCKED_TOOLS - {DELEGATE_TASK})])
    return AsyncDelegationHost(
        FunctionLoop(loop), options=target.options, registry=registry, **kwargs
    )


async def script(toolbox: Any, code: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(await toolbox.execute_code(code))
    return result


# -- what each child gets -------------------------------------------------------------------


@pytest.mark.anyio
async def test_each_child_has_its_own_task_id_sandbox_and_working_directory(
    target: Target,
) -> None:
    async def loop(task: ChildTask, toolbox: Any) -> str:
        result = await script(
            toolbox,
            "import os, socket\n"
            "open('mine.txt', 'w').write('x')\n"
            "print(os.getcwd(), socket.gethostname(), sorted(os.listdir('.')))",
        )
        assert result["status"] == "success", result
        return result["output"].strip()

    host = host_for(target, loop)
    first, second = await host.delegate_batch([{"goal": "one"}, {"goal": "two"}])
    assert first.ok and second.ok, (first, second)
    assert first.task_id != second.task_id
    cwd1, host1, files1 = first.summary.split(" ", 2)
    cwd2, host2, files2 = second.summary.split(" ", 2)
    assert cwd1 != cwd2
    # Each sees only its own file: the other's working directory is not shared.
    assert files1 == files2 == "['mine.txt']"
    if target.name == "docker":
        assert host1 != host2  # two containers


@pytest.mark.anyio
async def test_blocked_tools_are_absent_from_the_childs_stub_and_schema(target: Target) -> None:
    seen: dict[str, Any] = {}

    async def loop(task: ChildTask, toolbox: Any) -> str:
        seen["tools"] = task.tool_names
        seen["schema"] = json.dumps(task.tools)
        result = await script(
            toolbox, "import hermes_tools\nprint(open(hermes_tools.__file__).read())"
        )
        seen["stub"] = result["output"]
        seen["refused"] = {n: json.loads(await toolbox.call(n, {})) for n in CHILD_BLOCKED_TOOLS}
        raw = "import hermes_tools\nprint(hermes_tools._call('memory', {}))"
        seen["raw"] = (await script(toolbox, raw))["output"]
        return "done"

    # The parent has every blocked tool; max_depth=1 takes delegate_task away too.
    host = host_for(target, loop, max_depth=1)
    result = await host.delegate("look at your tools")
    assert result.ok, result
    assert seen["tools"] == ["execute_code", "probe"]
    assert "def probe(" in seen["stub"]
    for name in CHILD_BLOCKED_TOOLS:
        assert f"def {name}(" not in seen["stub"]
        assert f'"name": "{name}"' not in seen["schema"]
        assert "error" in seen["refused"][name]
    assert "not_allowed" in seen["raw"] or "unknown_tool" in seen["raw"]


@pytest.mark.anyio
async def test_tools_are_the_parents_narrowed_to_the_request() -> None:
    seen: list[list[str]] = []

    async def loop(task: ChildTask, toolbox: Any) -> str:
        seen.append(task.tool_names)
        return "ok"

    host = host_for(Target("local", RunOptions()), loop, tools=["probe", "memory"])
    await host.delegate("a", tools=["probe", "clarify"])  # clarify: not the parent's
    await host.delegate("b", toolsets=["agent"])  # memory only: blocked
    assert seen[0][:2] == ["execute_code", "probe"] and "clarify" not in seen[0]
    assert seen[1] == ["execute_code"]
    with pytest.raises(RunError, match="unknown toolset"):
        await host.delegate("c", toolsets=["nope"])


# -- budgets ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_child_cannot_spend_more_calls_than_the_parent_has_left(target: Target) -> None:
    probe = Probe()

    async def loop(task: ChildTask, toolbox: Any) -> str:
        result = await script(
            toolbox,
            "from hermes_tools import probe\n"
            "for i in range(6):\n"
            "    r = probe(tag=str(i))\n"
            "    print(i, 'error_kind' in r and r['error_kind'])\n",
        )
        return result["output"]

    host = host_for(target, loop, probe, max_tool_calls=3)
    result = await host.delegate("spend", max_tool_calls=10)  # asks for more than there is
    assert result.ok, result
    lines = result.summary.splitlines()
    assert lines[:3] == ["0 False", "1 False", "2 False"]
    assert lines[3:] == ["3 budget_exhausted", "4 budget_exhausted", "5 budget_exhausted"]
    assert len(probe.calls) == 3
    assert result.tool_calls_made == 3 and host.tool_calls_made == 3
    # Nothing is left: the next child is not even started.
    again = await host.delegate("spend more")
    assert again.status == "refused" and "tool calls" in (again.error or "")
    assert len(probe.calls) == 3


@pytest.mark.anyio
async def test_a_child_gets_no_more_time_than_the_parent_has_left(target: Target) -> None:
    reported: list[int] = []

    async def loop(task: ChildTask, toolbox: Any) -> str:
        await script(
            toolbox,
            "import subprocess, time\n"
            "from hermes_tools import probe\n"
            "p = subprocess.Popen(['sleep', '300'])\n"
            "probe(tag=str(p.pid))\n"
            "time.sleep(300)\n",
        )
        return "never"

    probe = Probe()
    started = time.monotonic()
    host = host_for(target, loop, probe, timeout=6)  # the parent's whole time
    result = await host.delegate("sleep", timeout=120)
    assert result.status == "timeout", result
    assert time.monotonic() - started < 6 + GRACE
    reported.extend(int(c["tag"]) for c in probe.calls)
    if target.name == "local":  # (the autouse check of conftest looks for the rest)
        assert all(not psutil.pid_exists(p) or _zombie(p) for p in reported)
    # The parent's time is spent: the next child is refused.
    assert (await host.delegate("more")).status == "refused"


@pytest.mark.anyio
async def test_a_childs_output_is_charged_to_the_parent_and_capped_by_it() -> None:
    async def loop(task: ChildTask, toolbox: Any) -> str:
        big = json.loads(await toolbox.execute_code("print('x' * 5000)"))
        small = json.loads(await toolbox.execute_code("print('hi')"))
        return json.dumps({"big": big.get("error", "")[:40], "small": small.get("output")})

    host = host_for(Target("local", RunOptions()), loop, max_output_bytes=2000)
    result = await host.delegate("print")
    assert result.ok, result
    summary = json.loads(result.summary)
    assert summary["big"].startswith("the result (")
    assert summary["small"] == "hi\n"
    assert host.budget.output_used <= 2000


def test_a_budget_charges_its_whole_chain_and_never_overspends() -> None:
    parent = Budget(5, max_output_bytes=100, timeout=60)
    child = parent.child(10, timeout=600)
    assert child.remaining_calls() == 5
    assert child.remaining_time() is not None and child.remaining_time() <= 60  # type: ignore[operator]
    spent = sum(child.try_spend() for _ in range(8))
    assert spent == 5 and parent.used == 5 and child.try_spend() is False
    assert child.try_spend_output(101) is False and parent.output_used == 0
    assert child.try_spend_output(60) and parent.output_used == 60
    assert parent.exhausted() == "tool calls"


def test_a_budget_of_its_own_never_overspends_from_many_threads() -> None:
    """A run's own budget (no parent) is charged under its one lock: threads racing
    for the last calls and bytes never get more than the limits."""
    budget = Budget(1000, max_output_bytes=3000)
    granted: list[int] = []
    written: list[int] = []
    start = threading.Barrier(8)

    def spend() -> None:
        start.wait()
        granted.append(sum(budget.try_spend() for _ in range(300)))
        written.append(sum(7 for _ in range(300) if budget.try_spend_output(7)))

    workers = [threading.Thread(target=spend) for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert sum(granted) == budget.used == 1000
    assert sum(written) == budget.output_used == 2996  # 428 writes of 7 bytes fit in 3000
    assert budget.try_spend() is False and budget.try_spend_output(5) is False
    assert budget.try_spend_output(4) is True and budget.exhausted() == "tool calls"


# -- depth ------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_delegation_past_the_depth_limit_is_refused(target: Target) -> None:
    async def loop(task: ChildTask, toolbox: Any) -> str:
        answer = json.loads(await toolbox.call(DELEGATE_TASK, {"goal": f"below {task.depth}"}))
        return json.dumps({"depth": task.depth, "tools": task.tool_names, "answer": answer})

    host = host_for(target, loop)  # max_depth 2: a child may delegate, a grandchild not
    result = await host.delegate("top")
    assert result.ok, result
    top = json.loads(result.summary)
    assert top["depth"] == 1 and DELEGATE_TASK in top["tools"]
    (grandchild,) = result.children
    assert grandchild.ok and top["answer"]["results"][0]["status"] == "success"
    below = json.loads(grandchild.summary)
    assert below["depth"] == 2 and DELEGATE_TASK not in below["tools"]
    assert "depth limit" in below["answer"]["error"]
    # A host already at the limit refuses before starting anything.
    at_limit = host_for(target, loop, depth=2)
    refused = await at_limit.delegate("deeper")
    assert refused.status == "refused" and "depth limit" in (refused.error or "")


# -- how many at once, and in what order -------------------------------------------------------


@pytest.mark.anyio
async def test_no_more_than_max_concurrent_children_run_at_once(target: Target) -> None:
    probe = Probe()

    async def loop(task: ChildTask, toolbox: Any) -> str:
        # Each waits inside for a third (up to 5 s): with two at a time it never comes, so
        # the two running children are seen together; a third running would be seen too.
        code = "from hermes_tools import probe\nprint(probe(hold=0.1, want=3, wait=5))"
        result = await script(toolbox, code)
        return result["status"]

    host = host_for(target, loop, probe, max_concurrent=2)
    results = await host.delegate_batch([{"goal": f"task {i}"} for i in range(3)])
    assert [r.summary for r in results] == ["success"] * 3
    assert probe.most_inside == 2  # observed: two at once, never three


@pytest.mark.anyio
async def test_batch_results_come_back_in_order(target: Target) -> None:
    async def loop(task: ChildTask, toolbox: Any) -> str:
        delay = {"slow": 2.0, "medium": 1.0}.get(task.goal, 0.0)
        result = await script(toolbox, f"import time\ntime.sleep({delay})\nprint({task.goal!r})")
        return result["output"].strip()

    host = host_for(target, loop)
    goals = ["slow", "medium", "fast"]
    results = await host.delegate_batch([{"goal": g} for g in goals])
    assert [r.summary for r in results] == goals
    assert [r.summary for r in host.children] == goals
    assert len({r.task_id for r in results}) == 3


# -- cancelling -------------------------------------------------------------------------------


async def _cancel_scenario(target: Target, how: str, engine: Any | None) -> None:
    probe = Probe()

    async def loop(task: ChildTask, toolbox: Any) -> str:
        await script(
            toolbox,
            "import subprocess, time\n"
            "from hermes_tools import probe\n"
            "p = subprocess.Popen(['sleep', '300'])\n"
            "probe(tag=str(p.pid))\n"
            "time.sleep(300)\n",
        )
        return "never"

    host = host_for(target, loop, probe, max_concurrent=2)
    results: list[Any] = []
    with anyio.fail_after(120):
        async with anyio.create_task_group() as group:

            async def parent() -> None:
                results.extend(await host.delegate_batch([{"goal": str(i)} for i in range(3)]))

            group.start_soon(parent)
            await probe.wait_for_calls(2)  # both running children have started a process
            if how == "host":
                host.cancel()
            else:
                group.cancel_scope.cancel()  # the parent itself is cancelled
    if how == "host":
        assert [r.status for r in results] == ["interrupted"] * 3
    pids = [int(c["tag"]) for c in probe.calls]
    assert len(pids) == 2  # the queued child never started
    if target.name == "local":
        assert all(not psutil.pid_exists(p) or _zombie(p) for p in pids)
    else:
        assert target.containers(engine) == []


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["host", "parent"])
async def test_cancelling_the_parent_leaves_nothing_behind(
    target: Target, how: str, request: pytest.FixtureRequest
) -> None:
    engine = request.getfixturevalue("engine") if target.name == "docker" else None
    await _cancel_scenario(target, how, engine)


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_blocking_host_delegates_and_cancels_from_another_thread() -> None:
    probe = Probe()
    started = threading.Event()

    async def loop(task: ChildTask, toolbox: Any) -> str:
        if task.goal == "wait":
            started.set()
            await toolbox.execute_code("import time\ntime.sleep(300)")
        return task.goal

    registry = make_registry(probe)
    with DelegationHost(FunctionLoop(loop), registry=registry, tools=["probe"]) as host:
        assert host.delegate("hello").summary == "hello"
        threading.Thread(target=lambda: (started.wait(60), host.cancel()), daemon=True).start()
        began = time.monotonic()
        result = host.delegate("wait")
        assert result.status == "interrupted"
        assert time.monotonic() - began < 60
        assert [c.summary for c in host.children] == ["hello", ""]


# -- the delegate_task tool ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_delegate_task_has_hermes_schema_and_runs_a_batch() -> None:
    async def loop(task: ChildTask, toolbox: Any) -> str:
        return f"did {task.goal} with {task.context}"

    host = host_for(Target("local", RunOptions()), loop)
    registry = host.registry
    entry = register_delegate_task(registry, host)
    parameters = entry.schema["function"]["parameters"]
    assert set(parameters["properties"]) == {"goal", "context", "toolsets", "tasks"}
    assert parameters["properties"]["tasks"]["items"]["required"] == ["goal"]
    one = json.loads(await registry.adispatch(DELEGATE_TASK, {"goal": "a", "context": "c"}))
    assert [r["summary"] for r in one["results"]] == ["did a with c"]
    batch = json.loads(
        await registry.adispatch(DELEGATE_TASK, {"tasks": [{"goal": "x"}, {"goal": "y"}]})
    )
    assert [r["summary"] for r in batch["results"]] == ["did x with None", "did y with None"]
    assert "error" in json.loads(await registry.adispatch(DELEGATE_TASK, {}))


@pytest.mark.anyio
async def test_delegate_task_can_never_be_called_from_a_script() -> None:
    async def loop(task: ChildTask, toolbox: Any) -> str:
        return "should not run"

    host = host_for(Target("local", RunOptions()), loop)
    register_delegate_task(host.registry, host)
    with pytest.raises(RunError, match="delegate_task can never be called"):
        await run_code("print(1)", RunOptions(tools=[DELEGATE_TASK]), registry=host.registry)
    code = (
        "import hermes_tools\n"
        "print('def delegate_task' in open(hermes_tools.__file__).read())\n"
        "print(hermes_tools._call('delegate_task', {'goal': 'x'}))"
    )
    result = await run_code(code, RunOptions(tools=["probe"]), registry=host.registry)
    first, second = result.output.splitlines()
    assert first == "False"
    assert "not_allowed" in second
    assert host.children == []


def test_a_child_that_fails_fails_alone() -> None:
    async def broken(task: ChildTask, toolbox: Any) -> str:
        if task.goal == "bad":
            raise ValueError("boom")
        return "fine"

    async def main() -> list[Any]:
        host = host_for(Target("local", RunOptions()), broken)
        return await host.delegate_batch([{"goal": "bad"}, {"goal": "good"}])

    bad, good = anyio.run(main)
    assert bad.status == "error" and "ValueError: boom" in (bad.error or "")
    assert good.ok


def test_bad_requests_are_refused_before_any_child_starts() -> None:
    started: list[str] = []

    async def loop(task: ChildTask, toolbox: Any) -> str:
        started.append(task.goal)
        return "x"

    async def main() -> None:
        host = host_for(Target("local", RunOptions()), loop)
        for tasks in ([{"goal": "ok"}, {"goal": ""}], [{"goal": "ok", "colour": "red"}]):
            with pytest.raises(RunError):
                await host.delegate_batch(tasks)
        with pytest.raises(RunError):
            await host.delegate("x", timeout=-1)

    anyio.run(main)
    assert started == []


def test_options_carry_the_parents_backend_to_each_child() -> None:
    # A settings object that cannot start: the child fails with the backend's error,
    # and the parent goes on.
    async def loop(task: ChildTask, toolbox: Any) -> str:
        return "x"

    options = replace(
        RunOptions(),
        backend=DockerSettings(image=IMAGE, docker_host="unix:///nonexistent/docker.sock"),
    )

    async def main() -> Any:
        host = host_for(Target("docker", options), loop)
        return await host.delegate("x")

    result = anyio.run(main)
    assert result.status == "error" and result.error


def test_a_run_ends_by_its_budgets_deadline() -> None:
    budget = Budget(10, timeout=2)
    started = time.monotonic()
    result = anyio.run(
        lambda: run_code("import time\ntime.sleep(120)", RunOptions(timeout=120, budget=budget))
    )
    assert result.status == "timeout"
    assert time.monotonic() - started < 2 + GRACE


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_plain_function_loop_gets_a_blocking_toolbox(backend: str) -> None:
    def loop(task: ChildTask, toolbox: Any) -> str:  # runs in a worker thread
        printed = json.loads(toolbox.execute_code("print(6 * 7)"))["output"].strip()
        echoed = json.loads(toolbox.call("probe", '{"tag": "sync"}'))
        return f"{printed} {echoed['ok']}"

    async def main() -> Any:
        registry = make_registry(Probe())
        host = AsyncDelegationHost(FunctionLoop(loop), registry=registry, tools=["probe"])
        return await host.delegate("compute")

    result = anyio.run(main, backend=backend)
    assert result.ok, result
    assert result.summary == "42 True" and result.tool_calls_made == 1
