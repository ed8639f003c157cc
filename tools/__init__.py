"""What a tool is: the registry, its entries, and the built-in sandbox tools."""

from tools.loader import ToolModuleError, load_builtin_tools, load_tools_module
from tools.registry import (
    ToolContext,
    ToolEntry,
    ToolRegistry,
    registry,
    tool_error,
    tool_result,
)

# Tools a script may call when the caller does not say (those that are registered).
SANDBOX_TOOLS = (
    "web_search",
    "web_extract",
    "read_file",
    "write_file",
    "search_files",
    "patch",
    "terminal",
)
# Never callable from inside a script, whatever the caller allows.
BLOCKED_TOOLS = frozenset({"execute_code", "delegate_task"})

__all__ = [
    "BLOCKED_TOOLS",
    "SANDBOX_TOOLS",
    "ToolContext",
    "ToolEntry",
    "ToolModuleError",
    "ToolRegistry",
    "load_builtin_tools",
    "load_tools_module",
    "registry",
    "tool_error",
    "tool_result",
]
