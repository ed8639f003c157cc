"""The seam between a delegated child and the model that drives it.

A child's loop gets a :class:`ChildTask` (its goal, context and the definitions of the
tools it may use) and a :class:`ChildToolbox` (run code with execute_code in the child's
own sandbox, call its tools), and returns a summary. :class:`FunctionLoop` makes a
plain Python callable a loop; sandbox/openai_loop.py drives an OpenAI-compatible
chat-completions endpoint.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import anyio
import anyio.from_thread
import anyio.to_thread

from hermes_sandbox.errors import AgentLoopError


@dataclass(frozen=True, slots=True)
class ChildTask:
    """What a child is asked to do. ``tools`` are OpenAI-format tool definitions
    (``{"type": "function", "function": {...}}``): execute_code, the tools the child
    may call directly, and delegate_task when its depth allows."""

    goal: str
    context: str | None
    tools: Sequence[Mapping[str, Any]]
    task_id: str
    depth: int

    def prompt(self) -> str:
        """The goal and context as one message for a model."""
        if not self.context:
            return self.goal
        return f"{self.goal}\n\nContext:\n{self.context}"

    @property
    def tool_names(self) -> list[str]:
        return [definition["function"]["name"] for definition in self.tools]


@runtime_checkable
class ChildToolbox(Protocol):
    """How a child's loop acts: every method returns the result JSON a model is shown
    (``{"error": ...}`` for a refused or failed call) and never raises for a tool's
    failure. Calls may run concurrently."""

    async def call(self, name: str, arguments: Mapping[str, Any] | str | None) -> str:
        """Call tool ``name`` (execute_code and delegate_task included) with its
        arguments as a mapping or as the JSON text a model wrote."""
        ...

    async def execute_code(self, code: str) -> str:
        """Run ``code`` as a script in the child's sandbox; its result JSON."""
        ...


class AgentLoop(Protocol):
    """A child's agent loop: work on ``task`` with ``toolbox`` and return a summary.

    Raise :class:`AgentLoopError` when it cannot finish (the child's status is then
    ``error``). It must be cancellable: cancelling the child cancels ``run``.
    """

    async def run(self, task: ChildTask, toolbox: ChildToolbox) -> str: ...


class BlockingToolbox:
    """A toolbox for a loop that runs in a worker thread: the same calls, blocking."""

    def __init__(self, toolbox: ChildToolbox) -> None:
        self._toolbox = toolbox

    def call(self, name: str, arguments: Mapping[str, Any] | str | None = None) -> str:
        result: str = anyio.from_thread.run(self._toolbox.call, name, arguments)
        return result

    def execute_code(self, code: str) -> str:
        result: str = anyio.from_thread.run(self._toolbox.execute_code, code)
        return result


LoopFunction = Callable[[ChildTask, Any], "str | Awaitable[str]"]


class FunctionLoop:
    """A plain callable as a child's loop: ``function(task, toolbox) -> summary``.

    An async function gets the :class:`ChildToolbox` and runs on the host's event loop;
    a sync one runs in a worker thread and gets a :class:`BlockingToolbox`. A sync
    function cannot be stopped from outside: when its child is cancelled, its further
    tool calls fail and its result is ignored.
    """

    def __init__(self, function: LoopFunction) -> None:
        if not callable(function):
            raise TypeError(f"FunctionLoop needs a callable, got {type(function).__name__}")
        self._function = function

    async def run(self, task: ChildTask, toolbox: ChildToolbox) -> str:
        if inspect.iscoroutinefunction(self._function):
            summary = await self._function(task, toolbox)
        else:
            summary = await anyio.to_thread.run_sync(
                self._function, task, BlockingToolbox(toolbox), abandon_on_cancel=True
            )
            if inspect.isawaitable(summary):
                summary = await summary
        if not isinstance(summary, str):
            raise AgentLoopError(
                f"the loop function returned {type(summary).__name__}, not a summary string"
            )
        return summary


__all__ = [
    "AgentLoop",
    "AgentLoopError",
    "BlockingToolbox",
    "ChildTask",
    "ChildToolbox",
    "FunctionLoop",
]
