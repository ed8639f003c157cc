"""hermes-sandbox: run an agent's Python script and serve its tool calls on the host.

This package ties the layers together (environments/, rpc/, tools/, stubs/): it stages
a script, runs it, enforces the limits and shapes the result. The public API::

    from sandbox import execute_code
    result = execute_code("from hermes_tools import terminal\\nprint(terminal('ls'))")
    print(result.status, result.output)
"""

from sandbox.api import execute_code, execute_code_async
from sandbox.gate import ToolCallBudget
from sandbox.result import ExecutionResult
from sandbox.runner import RunError, RunOptions, run_code

__all__ = [
    "ExecutionResult",
    "RunError",
    "RunOptions",
    "ToolCallBudget",
    "execute_code",
    "execute_code_async",
    "run_code",
]
