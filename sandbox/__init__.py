"""hermes-sandbox: run an agent's Python script and serve its tool calls on the host.

The public API. Everything a user needs is importable from here::

    from hermes_sandbox import execute_code

    result = execute_code("from hermes_tools import terminal\\nprint(terminal('ls'))")
    print(result.status, result.output)

A run's backend is named (``backend="docker"``) or given as its typed settings
(``backend=DockerSettings(image="python:3.12-slim")``), one class per backend.

Tools are registered on :data:`registry` with ``registry.register(...)`` or the
:func:`tool` decorator; :func:`register_execute_code` registers the execute_code tool,
whose schema lists them for the model. The layers are subpackages
(``hermes_sandbox.environments``, ``hermes_sandbox.rpc``, ``hermes_sandbox.tools``,
``hermes_sandbox.stubs``).
"""

from hermes_sandbox.agent_loop import AgentLoop, ChildTask, ChildToolbox, FunctionLoop
from hermes_sandbox.api import execute_code, execute_code_async
from hermes_sandbox.delegation import (
    AsyncDelegationHost,
    DelegationHost,
    DelegationResult,
    register_delegate_task,
)
from hermes_sandbox.environments import (
    BackendSettings,
    DaytonaSettings,
    DockerSettings,
    LocalSettings,
    ModalSettings,
    SingularitySettings,
    SSHSettings,
)
from hermes_sandbox.errors import AgentLoopError, ConfigError, SandboxError, SettingError
from hermes_sandbox.execute_code_tool import register_execute_code
from hermes_sandbox.gate import Budget, ToolCallBudget
from hermes_sandbox.openai_loop import OpenAIChatLoop
from hermes_sandbox.result import ExecutionResult
from hermes_sandbox.runner import RunError, RunOptions, run_code
from hermes_sandbox.session import AsyncSession, Session
from hermes_sandbox.tools.approval import ApprovalPolicy
from hermes_sandbox.tools.decorator import tool
from hermes_sandbox.tools.registry import (
    ToolContext,
    ToolRegistry,
    registry,
    tool_error,
    tool_result,
)

__version__ = "0.1.0.dev0"

__all__ = [
    "AgentLoop",
    "AgentLoopError",
    "ApprovalPolicy",
    "AsyncDelegationHost",
    "AsyncSession",
    "BackendSettings",
    "Budget",
    "ChildTask",
    "ChildToolbox",
    "ConfigError",
    "DaytonaSettings",
    "DelegationHost",
    "DelegationResult",
    "DockerSettings",
    "ExecutionResult",
    "FunctionLoop",
    "LocalSettings",
    "ModalSettings",
    "OpenAIChatLoop",
    "RunError",
    "RunOptions",
    "SSHSettings",
    "SandboxError",
    "Session",
    "SettingError",
    "SingularitySettings",
    "ToolCallBudget",
    "ToolContext",
    "ToolRegistry",
    "__version__",
    "execute_code",
    "execute_code_async",
    "register_delegate_task",
    "register_execute_code",
    "registry",
    "run_code",
    "tool",
    "tool_error",
    "tool_result",
]
