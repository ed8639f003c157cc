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

from __future__ import annotations

from typing import TYPE_CHECKING

from hermes_sandbox.lazy import lazy_names

# Each public name -> the module that defines it. They are imported at first use (PEP
# 562), so ``hermes-sandbox run`` does not import the agent loops, the delegation host
# or every backend's settings to run one script.
_LAZY = {
    "AgentLoop": "hermes_sandbox.agent_loop",
    "ChildTask": "hermes_sandbox.agent_loop",
    "ChildToolbox": "hermes_sandbox.agent_loop",
    "FunctionLoop": "hermes_sandbox.agent_loop",
    "execute_code": "hermes_sandbox.api",
    "execute_code_async": "hermes_sandbox.api",
    "AsyncDelegationHost": "hermes_sandbox.delegation",
    "DelegationHost": "hermes_sandbox.delegation",
    "DelegationResult": "hermes_sandbox.delegation",
    "register_delegate_task": "hermes_sandbox.delegation",
    "BackendSettings": "hermes_sandbox.environments",
    "DaytonaSettings": "hermes_sandbox.environments",
    "DockerSettings": "hermes_sandbox.environments",
    "LocalSettings": "hermes_sandbox.environments",
    "ModalSettings": "hermes_sandbox.environments",
    "SingularitySettings": "hermes_sandbox.environments",
    "SSHSettings": "hermes_sandbox.environments",
    "AgentLoopError": "hermes_sandbox.errors",
    "ConfigError": "hermes_sandbox.errors",
    "SandboxError": "hermes_sandbox.errors",
    "SettingError": "hermes_sandbox.errors",
    "register_execute_code": "hermes_sandbox.execute_code_tool",
    "Budget": "hermes_sandbox.gate",
    "ToolCallBudget": "hermes_sandbox.gate",
    "OpenAIChatLoop": "hermes_sandbox.openai_loop",
    "ExecutionResult": "hermes_sandbox.result",
    "RunError": "hermes_sandbox.runner",
    "RunOptions": "hermes_sandbox.options",
    "run_code": "hermes_sandbox.runner",
    "AsyncSession": "hermes_sandbox.session",
    "Session": "hermes_sandbox.session",
    "ApprovalPolicy": "hermes_sandbox.tools.approval_policy",
    "tool": "hermes_sandbox.tools.decorator",
    "ToolContext": "hermes_sandbox.tools.registry",
    "ToolRegistry": "hermes_sandbox.tools.registry",
    "registry": "hermes_sandbox.tools.registry",
    "tool_error": "hermes_sandbox.tools.registry",
    "tool_result": "hermes_sandbox.tools.registry",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY)

if TYPE_CHECKING:
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
    from hermes_sandbox.options import RunOptions
    from hermes_sandbox.result import ExecutionResult
    from hermes_sandbox.runner import RunError, run_code
    from hermes_sandbox.session import AsyncSession, Session
    from hermes_sandbox.tools.approval_policy import ApprovalPolicy
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
