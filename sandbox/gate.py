"""What stands between a request and a tool: the allowlist and the budget."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from hermes_sandbox.rpc import CallRefused, Request
from hermes_sandbox.rpc import messages as kinds
from hermes_sandbox.tools.registry import ToolContext, ToolRegistry


class Budget:
    """What a run or an agent may still spend: tool calls, wall time and output bytes.

    ``limit`` is the number of tool calls; ``timeout`` (seconds from now) and
    ``max_output_bytes`` are unbounded when None. A budget may draw on a ``parent`` (a
    delegated child charged to its parent, a script charged to its agent): a spend is
    allowed only when every budget up the chain has room, and then charges them all, so
    a child never spends more than its parent has left. Thread-safe.
    """

    def __init__(
        self,
        limit: int,
        parent: Budget | None = None,
        *,
        timeout: float | None = None,
        max_output_bytes: int | None = None,
    ) -> None:
        if limit < 0:
            raise ValueError("a tool-call budget cannot be negative")
        if timeout is not None and timeout < 0:
            raise ValueError("a time budget cannot be negative")
        if max_output_bytes is not None and max_output_bytes < 0:
            raise ValueError("an output budget cannot be negative")
        self.limit = limit
        self.used = 0
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.max_output_bytes = max_output_bytes
        self.output_used = 0
        self.parent = parent
        self._lock = threading.Lock()

    def _chain(self) -> list[Budget]:
        chain: list[Budget] = []
        node: Budget | None = self
        while node is not None:
            chain.append(node)
            node = node.parent
        return chain

    def _spend(self, calls: int, output: int) -> bool:
        if self.parent is None:  # a run's own budget, the common case: one lock, no list
            with self._lock:
                if calls and self.used + calls > self.limit:
                    return False
                if (
                    self.max_output_bytes is not None
                    and self.output_used + output > self.max_output_bytes
                ):
                    return False
                self.used += calls
                self.output_used += output
                return True
        chain = self._chain()
        for budget in chain:
            budget._lock.acquire()
        try:
            for b in chain:
                if calls and b.used + calls > b.limit:
                    return False
                if b.max_output_bytes is not None and b.output_used + output > b.max_output_bytes:
                    return False
            for b in chain:
                b.used += calls
                b.output_used += output
            return True
        finally:
            for budget in reversed(chain):
                budget._lock.release()

    def try_spend(self) -> bool:
        """Charge one tool call up the chain; False (nothing charged) when one is spent."""
        return self._spend(1, 0)

    def try_spend_output(self, size: int) -> bool:
        """Charge ``size`` bytes of output up the chain; False (nothing charged) when
        they do not fit in what is left."""
        return self._spend(0, size)

    def remaining_calls(self) -> int:
        """Tool calls that may still be made: the least left anywhere up the chain."""
        return min(b.limit - b.used for b in self._chain())

    def remaining_time(self) -> float | None:
        """Seconds left before the nearest deadline up the chain (0 when one passed);
        None when no budget in the chain has one."""
        deadlines = [b.deadline for b in self._chain() if b.deadline is not None]
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())

    def remaining_output(self) -> int | None:
        """Output bytes that may still be produced; None when unbounded."""
        left = [
            b.max_output_bytes - b.output_used
            for b in self._chain()
            if b.max_output_bytes is not None
        ]
        return min(left) if left else None

    def exhausted(self) -> str | None:
        """Which part of the budget is spent ("tool calls", "time", "output"), or None."""
        if self.remaining_calls() <= 0:
            return "tool calls"
        if self.remaining_time() == 0:
            return "time"
        if self.remaining_output() == 0:
            return "output"
        return None

    def child(
        self,
        max_tool_calls: int | None = None,
        *,
        timeout: float | None = None,
        max_output_bytes: int | None = None,
    ) -> Budget:
        """A budget drawn from this one: each limit as asked, or all that is left; what
        the child spends is charged here too, and it can never spend more than is left."""
        calls = self.remaining_calls() if max_tool_calls is None else max_tool_calls
        left = self.remaining_time()
        if timeout is None or (left is not None and left < timeout):
            timeout = left
        return Budget(
            max(0, calls), parent=self, timeout=timeout, max_output_bytes=max_output_bytes
        )


# The name this budget had when it counted tool calls only.
ToolCallBudget = Budget


class ToolGate:
    """The RPC request handler of one run: checks, charges, dispatches.

    Thread-safe: a transport that serves in threads calls :meth:`answer_now` and
    :meth:`answer_blocking` from several threads at once while the loop calls it too;
    the budget is charged under its own locks (and may be shared with delegated
    children), the count of calls made under the gate's.
    """

    def __init__(
        self,
        registry: ToolRegistry,
        allowed: Iterable[str],
        budget: Budget,
        context: ToolContext,
    ) -> None:
        self._registry = registry
        self.allowed = frozenset(allowed)
        self.budget = budget
        self._context = context
        self._lock = threading.Lock()
        self.calls_made = 0

    def answer_now(self, request: Request) -> str | None:
        """Answer on the spot, without a task: refusals, and tools that run inline.

        Returns None when the call needs :meth:`__call__` (its tool may block or await);
        raises CallRefused like it.
        """
        if request.tool in self.allowed and not self._registry.runs_inline(request.tool):
            return None
        self._admit(request.tool)
        return self._registry.dispatch(request.tool, request.args, self._context)

    def answer_blocking(self, request: Request) -> str | None:
        """Answer on this thread, blocking as long as a sync tool does (call it from a
        worker thread, never the loop). Returns None for an async tool, which needs
        the loop (:meth:`__call__`); raises CallRefused like it."""
        if request.tool in self.allowed and self._registry.runs_async(request.tool):
            return None
        self._admit(request.tool)
        return self._registry.dispatch(request.tool, request.args, self._context)

    async def __call__(self, request: Request) -> str:
        self._admit(request.tool)
        return await self._registry.adispatch(request.tool, request.args, self._context)

    def _admit(self, name: str) -> None:
        """Check the allowlist and charge the budget; raise CallRefused if refused."""
        if name not in self.allowed:
            allowed = ", ".join(sorted(self.allowed)) or "(none)"
            if name not in self._registry:
                raise CallRefused(
                    kinds.UNKNOWN_TOOL, f"Unknown tool: {name}. Tools in this run: {allowed}"
                )
            raise CallRefused(
                kinds.NOT_ALLOWED,
                f"Tool '{name}' is not allowed in this run. Tools in this run: {allowed}",
            )
        if not self.budget.try_spend():
            raise CallRefused(
                kinds.BUDGET_EXHAUSTED,
                f"Tool call limit reached ({self.budget.limit}). No more tool calls are "
                "allowed in this run; finish with what you have.",
            )
        with self._lock:
            self.calls_made += 1
