"""What a tool is: the registry, its entries, toolsets, argument handling, discovery,
the ``@tool`` decorator, and the built-in sandbox tools."""

from hermes_sandbox.tools.decorator import tool
from hermes_sandbox.tools.discovery import (
    discover_builtin_tools,
    discover_package,
    discover_tools_directory,
)
from hermes_sandbox.tools.loader import (
    ToolModuleError,
    load_builtin_tools,
    load_tools,
    load_tools_module,
)
from hermes_sandbox.tools.registry import (
    ToolContext,
    ToolEntry,
    ToolRegistry,
    registry,
    tool_error,
    tool_result,
)
from hermes_sandbox.tools.toolsets import (
    BLOCKED_TOOLS,
    SANDBOX_TOOLS,
    Toolset,
    ToolsetError,
    create_toolset,
    resolve_toolset,
    resolve_toolsets,
    tools_for_run,
)

__all__ = [
    "BLOCKED_TOOLS",
    "SANDBOX_TOOLS",
    "ToolContext",
    "ToolEntry",
    "ToolModuleError",
    "ToolRegistry",
    "Toolset",
    "ToolsetError",
    "create_toolset",
    "discover_builtin_tools",
    "discover_package",
    "discover_tools_directory",
    "load_builtin_tools",
    "load_tools",
    "load_tools_module",
    "registry",
    "resolve_toolset",
    "resolve_toolsets",
    "tool",
    "tool_error",
    "tool_result",
    "tools_for_run",
]
