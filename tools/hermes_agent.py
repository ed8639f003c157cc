"""Hermes Agent's own tools, served to scripts: mirror entries of hermes-agent's registry.

With hermes-agent installed beside hermes-sandbox (they share no top-level name), a
registry made here answers a script's ``read_file``, ``terminal``, ... with Hermes's own
handlers, through ``hermes_tools`` as usual, and the script gets Hermes's own result
shapes. Those handlers act where Hermes's terminal backend is configured
(``TERMINAL_ENV``, local by default, in the host's working directory), not inside the
sandbox the script runs in. docs/compatibility.md says more.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from hermes_sandbox.errors import ToolModuleError
from hermes_sandbox.tools.registry import ToolContext, ToolRegistry

# What Hermes's execute_code lets a script call (its SANDBOX_ALLOWED_TOOLS).
HERMES_SANDBOX_TOOLS = (
    "web_search",
    "web_extract",
    "read_file",
    "write_file",
    "search_files",
    "patch",
    "terminal",
)
# Never served to a script, whatever is asked: they act on the agent itself.
HERMES_BLOCKED_TOOLS = frozenset(
    {"execute_code", "delegate_task", "clarify", "memory", "send_message"}
)


def hermes_agent_registry() -> Any:
    """hermes-agent's own ``tools.registry.registry``, its built-in tools discovered.

    Raises ToolModuleError when hermes-agent is not installed in this environment.
    """
    try:
        module = importlib.import_module("tools.registry")
    except ImportError as exc:
        raise ToolModuleError(
            f"hermes-agent is not importable here ({exc}); install it beside "
            "hermes-sandbox: pip install hermes-agent"
        ) from exc
    theirs = getattr(module, "registry", None)
    if theirs is None or not hasattr(theirs, "get_entry") or not hasattr(module, "ToolEntry"):
        raise ToolModuleError(
            f"the top-level 'tools' package at {module.__file__} is not hermes-agent's; "
            "another package installs a 'tools' too"
        )
    if not theirs.get_all_tool_names():
        module.discover_builtin_tools()
    return theirs


def mirror_hermes_tools(
    names: Iterable[str] | None = None,
    *,
    into: ToolRegistry | None = None,
) -> ToolRegistry:
    """A registry whose tools ``names`` are hermes-agent's, dispatched by its registry.

    ``names`` defaults to what Hermes's own execute_code lets scripts call. Each tool
    keeps Hermes's schema, toolset and availability check; a call runs Hermes's handler
    with the run's task id. ``into`` adds them to an existing registry (replacing tools
    of the same name there); by default a new one is made, to pass as
    ``execute_code(..., registry=...)``. Raises ToolModuleError when hermes-agent is
    missing, or a name is not one of its tools or is blocked.
    """
    theirs = hermes_agent_registry()
    wanted = list(HERMES_SANDBOX_TOOLS if names is None else names)
    blocked = sorted(set(wanted) & HERMES_BLOCKED_TOOLS)
    if blocked:
        raise ToolModuleError(
            f"these Hermes tools are never served to scripts: {', '.join(blocked)}"
        )
    registry = ToolRegistry() if into is None else into
    for name in wanted:
        entry = theirs.get_entry(name)
        if entry is None:
            known = ", ".join(sorted(theirs.get_all_tool_names()))
            raise ToolModuleError(f"hermes-agent has no tool {name!r}; its tools: {known}")
        registry.register(
            name=name,
            toolset=entry.toolset,
            schema={**entry.schema, "name": name},
            handler=_dispatcher(theirs, name),
            check_fn=entry.check_fn,
            requires_env=tuple(entry.requires_env or ()),
            description=entry.description or "",
            emoji=entry.emoji or "",
            max_result_size_chars=entry.max_result_size_chars,
            # Hermes's handlers word their own advice on bad arguments.
            validate_args=False,
            override=True,
        )
    return registry


def _dispatcher(theirs: Any, name: str) -> Any:
    def handle(args: dict[str, Any], ctx: ToolContext | None = None) -> Any:
        kwargs = {"task_id": ctx.task_id} if ctx is not None else {}
        return theirs.dispatch(name, args, **kwargs)

    handle.__name__ = f"hermes_{name}"
    return handle


__all__ = [
    "HERMES_BLOCKED_TOOLS",
    "HERMES_SANDBOX_TOOLS",
    "hermes_agent_registry",
    "mirror_hermes_tools",
]
