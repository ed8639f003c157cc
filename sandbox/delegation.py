"""Delegation: an agent hands sub-tasks to child agents, each in a sandbox of its own.

:class:`AsyncDelegationHost` (and :class:`DelegationHost`, its blocking twin) runs each
child's agent loop (sandbox/agent_loop.py) with its own task id, its own environment
and working directory, a narrowed tool list, a depth limit, a limit on how many run at
once, and a budget drawn from the parent's. :func:`register_delegate_task` offers it to
a model as the ``delegate_task`` tool. docs/delegation.md tells the whole story.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
from anyio.from_thread import BlockingPortal, start_blocking_portal

from hermes_sandbox.agent_loop import AgentLoop, ChildTask
from hermes_sandbox.environments import BackendError, Runtime
from hermes_sandbox.errors import AgentLoopError, RunError, ToolsetError
from hermes_sandbox.execute_code_tool import NAME as EXECUTE_CODE
from hermes_sandbox.execute_code_tool import build_schema, tool_definition
from hermes_sandbox.gate import Budget, ToolGate
from hermes_sandbox.rpc import CallRefused, Request
from hermes_sandbox.runner import (
    Plan,
    RunOptions,
    Stage,
    make_environment,
    open_stage,
    plan_run,
    remove_stage,
    resolve_tools,
    run_in_stage,
)
from hermes_sandbox.tools import (
    BLOCKED_TOOLS,
    ToolContext,
    ToolEntry,
    ToolRegistry,
    load_builtin_tools,
    tool_error,
    tools_for_run,
)
from hermes_sandbox.tools.registry import registry as default_registry

DELEGATE_TASK = "delegate_task"
DEFAULT_MAX_DEPTH = 2
DEFAULT_MAX_CONCURRENT = 3
DEFAULT_CHILD_TIMEOUT = 600.0  # seconds, when neither the call nor the parent says less
# Never given to a child: no user to ask, no shared memory to write, no messages to send;
# delegate_task only while the child's depth is under the limit.
CHILD_BLOCKED_TOOLS = frozenset({DELEGATE_TASK, "clarify", "memory", "send_message"})

ChildStatus = Literal["success", "error", "timeout", "interrupted", "refused"]


@dataclass(slots=True)
class DelegationResult:
    """One child's result. ``tool_calls_made`` counts its own calls, its scripts' and
    its children's (all charged to it); ``children`` are the results of the children it
    delegated to in turn. ``refused`` means it never started (depth, budget)."""

    status: ChildStatus
    summary: str
    tool_calls_made: int
    duration_seconds: float
    error: str | None = None
    task_id: str | None = None
    children: list[DelegationResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "success"

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "summary": self.summary,
            "tool_calls_made": self.tool_calls_made,
            "duration_seconds": self.duration_seconds,
            "error": self.error,
            "task_id": self.task_id,
            "children": [child.to_dict() for child in self.children],
        }

    def to_json(self, **kwargs: Any) -> str:
        kwargs.setdefault("ensure_ascii", False)
        return json.dumps(self.to_dict(), **kwargs)


@dataclass(frozen=True, slots=True)
class _ChildSpec:
    """One child as asked for, checked: its tools already narrowed."""

    goal: str
    context: str | None
    tools: tuple[str, ...]
    may_delegate: bool
    timeout: float | None
    max_tool_calls: int | None
    max_output_bytes: int | None


_SPEC_KEYS = frozenset(
    {"goal", "context", "tools", "toolsets", "timeout", "max_tool_calls", "max_output_bytes"}
)


def _names(value: Any, what: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(n, str) for n in value):
        raise RunError(f'{what} is a list of names, such as ["terminal", "file"]')
    return list(value)


class AsyncDelegationHost:
    """Runs delegated children for one parent agent; for anyio and asyncio callers.

    ``loop`` drives every child (see :class:`~hermes_sandbox.agent_loop.AgentLoop`).
    ``options`` are the parent's run options: each child's environment is built from
    their backend settings, and its scripts run under their limits. ``tools`` are the
    parent's tools (default: what ``options.tools`` allows). The parent's ``budget`` is
    what every child draws from (default: ``max_tool_calls`` calls, default
    ``options.max_tool_calls``; ``timeout`` seconds and ``max_output_bytes`` bytes,
    unbounded by default). ``depth`` is the parent's own depth (0 for a top agent).
    """

    def __init__(
        self,
        loop: AgentLoop,
        *,
        options: RunOptions | None = None,
        registry: ToolRegistry | None = None,
        tools: Sequence[str] | None = None,
        budget: Budget | None = None,
        max_tool_calls: int | None = None,
        timeout: float | None = None,
        max_output_bytes: int | None = None,
        depth: int = 0,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        task_id: str | None = None,
    ) -> None:
        if max_depth < 1:
            raise RunError(f"max_depth must be at least 1, got {max_depth}")
        if max_concurrent < 1:
            raise RunError(f"max_concurrent must be at least 1, got {max_concurrent}")
        if not 0 <= depth <= max_depth:
            raise RunError(f"depth must be between 0 and max_depth ({max_depth}), got {depth}")
        self.loop = loop
        self.options = (options or RunOptions()).validate()
        if registry is None:
            registry = default_registry
            load_builtin_tools()
        self.registry = registry
        self.tools = resolve_tools(registry, self.options.tools) if tools is None else list(tools)
        if budget is None:
            calls = self.options.max_tool_calls if max_tool_calls is None else max_tool_calls
            budget = Budget(calls, timeout=timeout, max_output_bytes=max_output_bytes)
        self.budget = budget
        self.depth = depth
        self.max_depth = max_depth
        self.max_concurrent = max_concurrent
        self.task_id = task_id or uuid.uuid4().hex[:12]
        self.children: list[DelegationResult] = []  # in the order they were asked for
        self._limiter = anyio.CapacityLimiter(max_concurrent)
        self._scopes: set[anyio.CancelScope] = set()
        self._cancelled = False
        self._count = 0

    # -- asking ---------------------------------------------------------------------------

    async def delegate(
        self,
        goal: str,
        *,
        context: str | None = None,
        tools: Sequence[str] | None = None,
        toolsets: Sequence[str] | None = None,
        timeout: float | None = None,
        max_tool_calls: int | None = None,
        max_output_bytes: int | None = None,
    ) -> DelegationResult:
        """Run one child on ``goal`` and return its result.

        Its tools are the parent's, narrowed to ``tools`` and ``toolsets`` when given,
        without the blocked ones. ``timeout``, ``max_tool_calls`` and
        ``max_output_bytes`` bound it further; it never gets more than the parent has
        left. A child past the depth limit, or asked for when the parent's budget is
        spent, is not started: its status is ``refused``. Raises :class:`RunError` for
        arguments that make no sense (an empty goal, an unknown toolset).
        """
        spec = self._spec(
            {
                "goal": goal,
                "context": context,
                "tools": tools,
                "toolsets": toolsets,
                "timeout": timeout,
                "max_tool_calls": max_tool_calls,
                "max_output_bytes": max_output_bytes,
            }
        )
        slot = self._reserve()
        self.children[slot] = await self._run(spec, slot)
        return self.children[slot]

    async def delegate_batch(self, tasks: Sequence[Mapping[str, Any]]) -> list[DelegationResult]:
        """Run several children at once (at most ``max_concurrent`` at a time, the rest
        waiting their turn) and return their results in the order of ``tasks``. Each
        task is a mapping of :meth:`delegate`'s arguments. Every task is checked before
        any starts; raises :class:`RunError` for one that makes no sense."""
        if isinstance(tasks, Mapping) or not isinstance(tasks, Sequence):
            raise RunError("tasks is a list of mappings, each with a goal")
        specs = [self._spec(task) for task in tasks]
        slots = [self._reserve() for _ in specs]

        async def run_one(spec: _ChildSpec, slot: int) -> None:
            self.children[slot] = await self._run(spec, slot)

        async with anyio.create_task_group() as group:
            for spec, slot in zip(specs, slots, strict=True):
                group.start_soon(run_one, spec, slot)
        return [self.children[slot] for slot in slots]

    def cancel(self) -> None:
        """Stop every child, running or waiting, and refuse new ones: their status is
        ``interrupted``. Each child's scripts and environment are gone when its
        ``delegate`` returns."""
        self._cancelled = True
        for scope in list(self._scopes):
            scope.cancel()

    @property
    def tool_calls_made(self) -> int:
        """Tool calls charged to the parent's budget so far, its children's included."""
        return self.budget.used

    # -- what a child gets ----------------------------------------------------------------

    def _spec(self, task: Mapping[str, Any]) -> _ChildSpec:
        if not isinstance(task, Mapping):
            raise RunError(f"a task is a mapping with a goal, got {type(task).__name__}")
        unknown = sorted(set(task) - _SPEC_KEYS)
        if unknown:
            raise RunError(
                f"unknown task key{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}; "
                f"a task takes {', '.join(sorted(_SPEC_KEYS))}"
            )
        goal = task.get("goal")
        if not isinstance(goal, str) or not goal.strip():
            raise RunError("a child needs a goal: a non-empty string saying what to do")
        context = task.get("context")
        if context is not None and not isinstance(context, str):
            raise RunError(f"context must be a string, got {type(context).__name__}")
        timeout = task.get("timeout")
        if timeout is not None and not (isinstance(timeout, int | float) and timeout > 0):
            raise RunError(f"timeout must be a positive number of seconds, got {timeout!r}")
        for key in ("max_tool_calls", "max_output_bytes"):
            value = task.get(key)
            if value is not None and not (isinstance(value, int) and value >= 0):
                raise RunError(f"{key} must be a whole number >= 0, got {value!r}")
        tools = _names(task.get("tools"), "tools")
        toolsets = _names(task.get("toolsets"), "toolsets")
        try:
            requested = tools_for_run(tools, toolsets, self.registry)
        except ToolsetError as exc:
            raise RunError(str(exc)) from None
        narrowed = self.tools if requested is None else [t for t in self.tools if t in requested]
        direct = tuple(
            t
            for t in narrowed
            if t not in CHILD_BLOCKED_TOOLS
            and t not in BLOCKED_TOOLS
            and t in self.registry
            and self.registry.is_available(t)
        )
        may_delegate = self.depth + 1 < self.max_depth and (
            requested is None or DELEGATE_TASK in requested
        )
        return _ChildSpec(
            goal=goal,
            context=context,
            tools=direct,
            may_delegate=may_delegate,
            timeout=task.get("timeout"),
            max_tool_calls=task.get("max_tool_calls"),
            max_output_bytes=task.get("max_output_bytes"),
        )

    def _reserve(self) -> int:
        """A place in ``children`` for the next child, so they list in asking order."""
        self.children.append(DelegationResult("interrupted", "", 0, 0.0))
        return len(self.children) - 1

    def _refusal(self) -> tuple[ChildStatus, str] | None:
        if self._cancelled:
            return "interrupted", "the parent cancelled its delegations"
        if self.depth + 1 > self.max_depth:
            return "refused", (
                f"delegation refused: the depth limit ({self.max_depth}) is reached; "
                "do the task yourself"
            )
        spent = self.budget.exhausted()
        if spent:
            return "refused", f"delegation refused: the parent's {spent} budget is spent"
        return None

    async def _run(self, spec: _ChildSpec, slot: int) -> DelegationResult:
        started = time.monotonic()
        task_id = f"{self.task_id}-{slot + 1}"
        refusal = self._refusal()
        if refusal is not None:
            return DelegationResult(refusal[0], "", 0, 0.0, error=refusal[1], task_id=task_id)
        scope = anyio.CancelScope()
        self._scopes.add(scope)
        budget: Budget | None = None
        toolbox: _Toolbox | None = None
        summary, error = "", None
        status: ChildStatus = "success"
        try:
            with scope:
                async with self._limiter:
                    refusal = self._refusal()  # the parent's time may have run out meanwhile
                    if refusal is not None:
                        status, error = refusal
                    else:
                        timeout = spec.timeout or DEFAULT_CHILD_TIMEOUT
                        budget = self.budget.child(
                            spec.max_tool_calls,
                            timeout=timeout,
                            max_output_bytes=spec.max_output_bytes,
                        )
                        toolbox = _Toolbox(self, spec, task_id, budget)
                        left = budget.remaining_time()
                        with anyio.move_on_after(left) as deadline:
                            try:
                                summary = await toolbox.live()
                            except (AgentLoopError, RunError, BackendError) as exc:
                                status, error = "error", str(exc)
                            except Exception as exc:  # a broken loop fails its child only
                                status, error = "error", f"{type(exc).__name__}: {exc}"
                        if deadline.cancelled_caught:
                            status = "timeout"
                            error = f"the child ran out of time ({left:.3g} s)"
            if scope.cancelled_caught:
                status, error = "interrupted", "the parent cancelled its delegations"
        finally:
            self._scopes.discard(scope)
        return DelegationResult(
            status,
            summary,
            budget.used if budget is not None else 0,
            round(time.monotonic() - started, 3),
            error=error,
            task_id=task_id,
            children=toolbox.children() if toolbox is not None else [],
        )


class _Toolbox:
    """One child's sandbox, tools and budget: what its loop acts through."""

    def __init__(self, host: AsyncDelegationHost, spec: _ChildSpec, task_id: str, budget: Budget):
        self._host = host
        self._spec = spec
        self.task_id = task_id
        self.budget = budget
        self._plan: Plan | None = None
        self._stage: Stage | None = None
        self._options: RunOptions | None = None
        self._gate: ToolGate | None = None
        self._nested: AsyncDelegationHost | None = None
        # One script at a time in the child's stage (each run writes its script there).
        self._scripts = anyio.Lock()
        self._closed = False

    def children(self) -> list[DelegationResult]:
        return list(self._nested.children) if self._nested is not None else []

    async def live(self) -> str:
        """Start the child's environment and stage, run its loop, take everything down."""
        host, spec = self._host, self._spec
        plan = plan_run(
            dataclasses.replace(
                host.options, tools=spec.tools, task_id=self.task_id, budget=self.budget
            ),
            host.registry,
        )
        self._plan = plan
        environment, base_env = make_environment(plan.options, plan.options.env)
        runtime: Runtime | None = None
        workdir: str | None = None
        try:
            runtime = await environment.start()
            self._stage = await open_stage(runtime, plan, base_env)
            if plan.options.cwd is None:
                workdir = await runtime.make_private_dir("hermes-delegate-")
            cwd = plan.options.cwd or workdir or runtime.default_cwd
            self._options = dataclasses.replace(plan.options, cwd=cwd)
            context = ToolContext(
                task_id=self.task_id,
                environment=runtime,
                cwd=cwd,
                approval=plan.options.approval,
                workspace_root=plan.options.workspace_root,
            )
            self._gate = ToolGate(host.registry, spec.tools, self.budget, context)
            if spec.may_delegate:
                self._nested = AsyncDelegationHost(
                    host.loop,
                    options=host.options,
                    registry=host.registry,
                    tools=[*spec.tools, DELEGATE_TASK],
                    budget=self.budget,
                    depth=host.depth + 1,
                    max_depth=host.max_depth,
                    max_concurrent=host.max_concurrent,
                    task_id=self.task_id,
                )
            task = ChildTask(
                goal=spec.goal,
                context=spec.context,
                tools=self.definitions(),
                task_id=self.task_id,
                depth=host.depth + 1,
            )
            summary = await host.loop.run(task, self)
            return self._fit_summary(summary)
        finally:
            self._closed = True
            with anyio.CancelScope(shield=True):
                if runtime is not None:
                    # (the environment goes next, and takes anything left along)
                    for path in (workdir, self._stage.path if self._stage else None):
                        if path is not None:
                            await remove_stage(runtime, path)
                await environment.aclose()

    def definitions(self) -> list[dict[str, Any]]:
        """The tools offered to the child's model, in OpenAI format."""
        host, spec = self._host, self._spec
        assert self._options is not None
        schema = build_schema(spec.tools, registry=host.registry, options=self._options)
        definitions = [tool_definition(schema)]
        definitions += [dict(d) for d in host.registry.get_definitions(spec.tools)]
        if self._nested is not None:
            definitions.append(tool_definition(delegate_task_schema(self._nested.max_concurrent)))
        return definitions

    def _fit_summary(self, summary: str) -> str:
        """The summary, cut to the output budget that is left, and charged to it."""
        data = summary.encode()
        left = self.budget.remaining_output()
        if left is not None and len(data) > left:
            data = data[:left]
            summary = data.decode(errors="ignore")
        self.budget.try_spend_output(len(summary.encode()))
        return summary

    def _deliver(self, result: str) -> str:
        size = len(result.encode())
        if self.budget.try_spend_output(size):
            return result
        return tool_error(
            f"the result ({size} bytes) does not fit in the output budget left "
            f"({self.budget.remaining_output()} bytes); finish with what you have"
        )

    async def call(self, name: str, arguments: Mapping[str, Any] | str | None = None) -> str:
        if self._closed:
            return tool_error("this child has ended; its tools can no longer be called")
        if isinstance(arguments, str):
            text = arguments
            try:
                arguments = json.loads(text) if text.strip() else {}
            except ValueError:
                return tool_error(
                    f"Invalid arguments for {name}: expected a JSON object, got text "
                    f"that is not JSON: {text[:60]!r}"
                )
        if arguments is not None and not isinstance(arguments, Mapping):
            return tool_error(
                f"Invalid arguments for {name}: expected an object of named arguments, "
                f"got {type(arguments).__name__}"
            )
        args = dict(arguments or {})
        if name == EXECUTE_CODE:
            code = args.get("code")
            if not isinstance(code, str) or not code.strip():
                return tool_error("execute_code needs `code`: the Python script to run")
            return await self.execute_code(code)
        if name == DELEGATE_TASK:
            if self._nested is None:
                return tool_error(
                    "delegate_task is not available to this child: the depth limit "
                    f"({self._host.max_depth}) is reached; do the task yourself"
                )
            return self._deliver(await run_delegate_task(self._nested, args))
        assert self._gate is not None
        try:
            result = await self._gate(Request(id=0, tool=name, args=args, token=""))
        except CallRefused as exc:
            return tool_error(exc.message, kind=exc.kind)
        return self._deliver(result)

    async def execute_code(self, code: str) -> str:
        if self._closed:
            return tool_error("this child has ended; its tools can no longer be called")
        assert self._plan is not None and self._stage is not None
        try:  # (the run ends by the child's deadline: its budget is the run's parent)
            async with self._scripts:
                result = await run_in_stage(self._stage, code, self._plan, options=self._options)
        except RunError as exc:
            return tool_error(str(exc))
        return self._deliver(result.to_json())


# -- the delegate_task tool ---------------------------------------------------------------


def delegate_task_schema(max_concurrent: int = DEFAULT_MAX_CONCURRENT) -> dict[str, Any]:
    """delegate_task's function schema, Hermes's shape: ``goal``, ``context`` and
    ``toolsets`` for one child, or ``tasks``, a list of them, for a batch."""
    toolsets = {
        "type": "array",
        "items": {"type": "string"},
        "description": "Toolsets the child may use (e.g. ['terminal', 'file']); default: "
        "yours. A child never gets clarify, memory or send_message.",
    }
    return {
        "name": DELEGATE_TASK,
        "description": (
            "Hand sub-tasks to child agents, each in its own sandbox with its own tools "
            "and a share of your budget; only each child's final summary comes back.\n"
            "One task: give 'goal' (and 'context', 'toolsets'). Several in parallel: give "
            f"'tasks', a list of them; at most {max_concurrent} run at once, the rest "
            "wait. Children know nothing of your conversation: put what they need in "
            "'context'.\n"
            'Returns JSON {"results": [...]}, one per task in order, each with status '
            "(success, error, timeout, interrupted, refused), summary, tool_calls_made, "
            "duration_seconds and error."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "goal": {
                    "type": "string",
                    "description": "What the child should accomplish, self-contained.",
                },
                "context": {
                    "type": "string",
                    "description": "What the child needs to know: paths, errors, constraints.",
                },
                "toolsets": toolsets,
                "tasks": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "goal": {"type": "string", "description": "Task goal"},
                            "context": {"type": "string", "description": "Task context"},
                            "toolsets": toolsets,
                        },
                        "required": ["goal"],
                    },
                    "description": "Batch mode: tasks run in parallel; when given, the "
                    "top-level goal, context and toolsets are ignored.",
                },
            },
            "required": [],
        },
    }


def _tasks_from_args(args: Mapping[str, Any]) -> list[dict[str, Any]]:
    """delegate_task's arguments as tasks for :meth:`AsyncDelegationHost.delegate_batch`."""
    tasks = args.get("tasks")
    if tasks:
        if not isinstance(tasks, list):
            raise RunError("tasks must be a list of objects, each with a goal")
        chosen = []
        for task in tasks:
            if not isinstance(task, Mapping):
                raise RunError("each of tasks must be an object with a goal")
            chosen.append({k: task.get(k) for k in ("goal", "context", "toolsets")})
        return chosen
    if not args.get("goal"):
        raise RunError("delegate_task needs 'goal' (one task) or 'tasks' (several)")
    return [{k: args.get(k) for k in ("goal", "context", "toolsets")}]


async def run_delegate_task(host: AsyncDelegationHost, args: Mapping[str, Any]) -> str:
    """Carry out one delegate_task call on ``host``; the result JSON for the model."""
    try:
        results = await host.delegate_batch(_tasks_from_args(args))
    except RunError as exc:
        return tool_error(str(exc))
    return json.dumps({"results": [r.to_dict() for r in results]}, ensure_ascii=False)


def register_delegate_task(
    registry: ToolRegistry | None, host: AsyncDelegationHost | DelegationHost
) -> ToolEntry:
    """Register ``delegate_task`` on ``registry`` (default: the global one), served by
    ``host``, for an agent host to offer its model; return its entry. Scripts can never
    call it (it is one of ``tools.BLOCKED_TOOLS``). An async host's tool must be
    dispatched on that host's event loop (``registry.adispatch``)."""
    registry = default_registry if registry is None else registry
    if isinstance(host, DelegationHost):
        blocking = host

        def handle_blocking(args: dict[str, Any]) -> str:
            return blocking.run_delegate_task(args)

        handler: Any = handle_blocking
        max_concurrent = host.max_concurrent
    else:
        serving = host

        async def handle(args: dict[str, Any]) -> str:
            return await run_delegate_task(serving, args)

        handler = handle
        max_concurrent = host.max_concurrent
    return registry.register(
        name=DELEGATE_TASK,
        toolset="delegation",
        schema=delegate_task_schema(max_concurrent),
        handler=handler,
        description="Hand sub-tasks to child agents in their own sandboxes.",
        emoji="🔀",
        override=True,
        validate_args=False,
    )


class DelegationHost:
    """:class:`AsyncDelegationHost` for synchronous callers: the same arguments, and
    the same methods, blocking. Its children run on an event loop in a helper thread;
    :meth:`cancel` may be called from any thread. Use it as a context manager, or call
    :meth:`close` when done."""

    def __init__(self, loop: AgentLoop, **kwargs: Any) -> None:
        self._portal_context: Any = start_blocking_portal()
        self._portal: BlockingPortal = self._portal_context.__enter__()
        try:
            self._host: AsyncDelegationHost = self._portal.call(self._make, loop, kwargs)
        except BaseException:
            self._portal_context.__exit__(None, None, None)
            raise

    @staticmethod
    async def _make(loop: AgentLoop, kwargs: dict[str, Any]) -> AsyncDelegationHost:
        return AsyncDelegationHost(loop, **kwargs)

    @property
    def host(self) -> AsyncDelegationHost:
        return self._host

    @property
    def max_concurrent(self) -> int:
        return self._host.max_concurrent

    @property
    def children(self) -> list[DelegationResult]:
        return list(self._host.children)

    @property
    def tool_calls_made(self) -> int:
        return self._host.tool_calls_made

    def delegate(self, goal: str, **kwargs: Any) -> DelegationResult:
        """See :meth:`AsyncDelegationHost.delegate`."""
        result: DelegationResult = self._portal.call(
            functools.partial(self._host.delegate, goal, **kwargs)
        )
        return result

    def delegate_batch(self, tasks: Sequence[Mapping[str, Any]]) -> list[DelegationResult]:
        """See :meth:`AsyncDelegationHost.delegate_batch`."""
        results: list[DelegationResult] = self._portal.call(self._host.delegate_batch, tasks)
        return results

    def run_delegate_task(self, args: Mapping[str, Any]) -> str:
        result: str = self._portal.call(run_delegate_task, self._host, args)
        return result

    def cancel(self) -> None:
        """See :meth:`AsyncDelegationHost.cancel`."""
        self._portal.call(self._host.cancel)

    def close(self) -> None:
        """Cancel what still runs and stop the helper thread. Idempotent."""
        if self._portal_context is None:
            return
        try:
            self._portal.call(self._host.cancel)
        finally:
            context, self._portal_context = self._portal_context, None
            context.__exit__(None, None, None)

    def __enter__(self) -> DelegationHost:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


__all__ = [
    "CHILD_BLOCKED_TOOLS",
    "DEFAULT_MAX_CONCURRENT",
    "DEFAULT_MAX_DEPTH",
    "DELEGATE_TASK",
    "AsyncDelegationHost",
    "DelegationHost",
    "DelegationResult",
    "delegate_task_schema",
    "register_delegate_task",
    "run_delegate_task",
]
