"""What stands between a request and a tool: the allowlist and the call budget."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from hermes_sandbox.rpc import CallRefused, Request
from hermes_sandbox.rpc import messages as kinds
from hermes_sandbox.tools.registry import ToolContext, ToolRegistry


class ToolCallBudget:
    """A count of tool calls that may still be made.

    A budget may draw on a ``parent`` too (a delegated child charged to its parent):
    a call is allowed only when every budget up the chain has room, and then charges
    them all. Thread-safe.
    """

    def __init__(self, limit: int, parent: ToolCallBudget | None = None) -> None:
        if limit < 0:
            raise ValueError("a tool-call budget cannot be negative")
        self.limit = limit
        self.used = 0
        self.parent = parent
        self._lock = threading.Lock()

    def _chain(self) -> list[ToolCallBudget]:
        chain, node = [], self
        while node is not None:
            chain.append(node)
            node = node.parent
        return chain

    def try_spend(self) -> bool:
        chain = self._chain()
        for budget in chain:
            budget._lock.acquire()
        try:
            if any(b.used >= b.limit for b in chain):
                return False
            for budget in chain:
                budget.used += 1
            return True
        finally:
            for budget in reversed(chain):
                budget._lock.release()


class ToolGate:
    """The RPC request handler of one run: checks, charges, dispatches."""

    def __init__(
        self,
        registry: ToolRegistry,
        allowed: Iterable[str],
        budget: ToolCallBudget,
        context: ToolContext,
    ) -> None:
        self._registry = registry
        self.allowed = frozenset(allowed)
        self.budget = budget
        self._context = context
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
        self.calls_made += 1
