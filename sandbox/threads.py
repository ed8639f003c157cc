"""The host's worker-thread pools: tool work and the kill each have their own.

anyio runs blocking calls in threads limited by one shared default limiter (40
threads). Tool calls are the script's to make, so a hostile script can make them
block: a file swapped for a named pipe between the check and the open once held all
40 threads, and the kill, which also needs a thread, waited forever. So blocking work
that a tool call starts runs on :func:`tool_limiter`, and killing a run's processes on
:func:`kill_limiter`; neither ever waits for the other, nor for anyio's default pool.
This module imports nothing of the package, so every layer may use it.
"""

from __future__ import annotations

import anyio
from anyio.lowlevel import RunVar

TOOL_THREADS = 16
"""Worker threads for tool calls (file I/O, sync handlers, approval prompts), per loop."""

KILL_THREADS = 8
"""Worker threads for finding and killing a run's processes, per event loop."""

TOOL_CALL_DRAIN_SECONDS = 10.0
"""How long the end of a run waits for the tool calls still in flight to answer before
it abandons them (:meth:`hermes_sandbox.rpc.RPCServer.drain`): a tool that blocks
cannot hold a run past its timeout by more than this."""

_TOOL_LIMITER: RunVar[anyio.CapacityLimiter] = RunVar("hermes_sandbox_tool_limiter")
_KILL_LIMITER: RunVar[anyio.CapacityLimiter] = RunVar("hermes_sandbox_kill_limiter")


def _limiter(var: RunVar[anyio.CapacityLimiter], threads: int) -> anyio.CapacityLimiter:
    try:
        return var.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(threads)
        var.set(limiter)
        return limiter


def tool_limiter() -> anyio.CapacityLimiter:
    """The current event loop's limiter for blocking work that a tool call starts.
    Call it from async code (it is per loop, like anyio's own default)."""
    return _limiter(_TOOL_LIMITER, TOOL_THREADS)


def kill_limiter() -> anyio.CapacityLimiter:
    """The current event loop's limiter for killing processes; tool calls never use
    it, so a script cannot hold the threads its own kill needs."""
    return _limiter(_KILL_LIMITER, KILL_THREADS)
