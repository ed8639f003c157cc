"""Toolsets: named groups of tools, built from tool names and other toolsets.

A :class:`Toolset` lists ``tools`` and ``includes`` (names of other toolsets);
:func:`resolve_toolset` expands the includes recursively into tool names. Besides the
tools it lists, a toolset also holds every registered tool whose ``toolset`` is its name,
and a name that no toolset defines but that registered tools use (a plugin's
``@tool(toolset="math")``) resolves to those tools. ``"all"`` and ``"*"`` mean every
registered tool.

Built-in toolsets: file, terminal, web, sandbox (file + terminal + web) and all; custom
ones are made at run time with :func:`create_toolset`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hermes_sandbox.errors import ToolsetError
from hermes_sandbox.tools.registry import ToolRegistry
from hermes_sandbox.tools.registry import registry as default_registry

log = logging.getLogger(__name__)

ALL = "all"
_ALL_NAMES = frozenset({ALL, "*"})

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


@dataclass(frozen=True, slots=True)
class Toolset:
    """A named group: its own ``tools`` and the toolsets it ``includes``."""

    name: str
    description: str = ""
    tools: tuple[str, ...] = ()
    includes: tuple[str, ...] = ()


BUILTIN_TOOLSETS: dict[str, Toolset] = {
    t.name: t
    for t in (
        Toolset(
            "file",
            "Read, write, patch and search files",
            ("read_file", "write_file", "patch", "search_files"),
        ),
        Toolset("terminal", "Run shell commands", ("terminal",)),
        Toolset("web", "Search the web and extract pages", ("web_search", "web_extract")),
        Toolset(
            "sandbox",
            "Everything a sandboxed script may call",
            includes=("file", "terminal", "web"),
        ),
        Toolset(ALL, "Every registered tool"),
    )
}

_lock = threading.Lock()
_toolsets: dict[str, Toolset] = dict(BUILTIN_TOOLSETS)


def _names(value: Iterable[str] | str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    return tuple(dict.fromkeys(value))


def create_toolset(
    name: str,
    tools: Iterable[str] = (),
    includes: Iterable[str] = (),
    description: str = "",
    *,
    override: bool = False,
) -> Toolset:
    """Define (or redefine) a toolset at run time and return it.

    Included toolsets may be defined later; unknown ones are skipped, with a warning,
    when the toolset is resolved. Raises :class:`ToolsetError` for an empty name, for
    ``"all"``/``"*"``, and for a built-in toolset's name unless ``override``.
    """
    if not name or not isinstance(name, str):
        raise ToolsetError("a toolset needs a non-empty string name")
    if name in _ALL_NAMES:
        raise ToolsetError(f"{name!r} is reserved: it always means every registered tool")
    toolset = Toolset(name, description, _names(tools), _names(includes))
    with _lock:
        if name in BUILTIN_TOOLSETS and not override:
            raise ToolsetError(f"{name!r} is a built-in toolset; pass override=True to replace it")
        _toolsets[name] = toolset
    return toolset


def delete_toolset(name: str) -> bool:
    """Forget a custom toolset (a replaced built-in one comes back); whether it was there."""
    with _lock:
        if name in BUILTIN_TOOLSETS:
            replaced = _toolsets.get(name) is not BUILTIN_TOOLSETS[name]
            _toolsets[name] = BUILTIN_TOOLSETS[name]
            return replaced
        return _toolsets.pop(name, None) is not None


def get_toolset(name: str) -> Toolset | None:
    """The definition of toolset ``name``, if one is defined ("*" is "all")."""
    return _toolsets.get(ALL if name == "*" else name)


def toolset_names(registry: ToolRegistry | None = None) -> list[str]:
    """Every toolset name: the defined ones and those registered tools use, sorted."""
    registry = default_registry if registry is None else registry
    return sorted(set(_toolsets) | set(registry.toolsets()))


def is_known_toolset(name: str, registry: ToolRegistry | None = None) -> bool:
    """Whether ``name`` is a defined toolset, "all"/"*", or used by a registered tool."""
    registry = default_registry if registry is None else registry
    return name in _ALL_NAMES or name in _toolsets or name in registry.toolsets()


def resolve_toolset(name: str, registry: ToolRegistry | None = None) -> list[str]:
    """The tool names in toolset ``name``, includes expanded, each once, in a stable order.

    Order: the toolset's own tools as listed, then the registered tools of that
    toolset (by name), then each included toolset's in turn. Cycles and diamonds are
    expanded once. ``"all"``/``"*"`` give every registered tool, sorted. An unknown
    name gives ``[]`` and a warning. Listed tools need not be registered.
    """
    registry = default_registry if registry is None else registry
    if name in _ALL_NAMES:
        return registry.names()
    if not is_known_toolset(name, registry):
        known = ", ".join(toolset_names(registry))
        log.warning("unknown toolset %r; known toolsets: %s", name, known)
        return []
    found: dict[str, None] = {}
    _expand(name, registry, found, set())
    return list(found)


def _expand(name: str, registry: ToolRegistry, found: dict[str, None], seen: set[str]) -> None:
    if name in seen:
        return
    seen.add(name)
    if name in _ALL_NAMES:
        found.update(dict.fromkeys(registry.names()))
        return
    toolset = _toolsets.get(name)
    members = registry.names(toolset=name)
    if toolset is None and not members:
        log.warning("unknown toolset %r (included by another toolset); skipped", name)
        return
    if toolset is not None:
        found.update(dict.fromkeys(toolset.tools))
    found.update(dict.fromkeys(members))
    for included in toolset.includes if toolset is not None else ():
        _expand(included, registry, found, seen)


def resolve_toolsets(names: Iterable[str], registry: ToolRegistry | None = None) -> list[str]:
    """The union of several toolsets (see :func:`resolve_toolset`), in order, each once."""
    found: dict[str, None] = {}
    for name in names:
        found.update(dict.fromkeys(resolve_toolset(name, registry)))
    return list(found)


def tools_for_run(
    tools: Sequence[str] | None,
    toolsets: Sequence[str] | None,
    registry: ToolRegistry | None = None,
) -> list[str] | None:
    """The tool list a run asks for: named ``tools`` plus the tools of ``toolsets``.

    None when neither is given (the run's default applies). Named tools are kept as
    they are, for the run to check. From toolsets come only the tools that are
    registered, available here and not blocked for scripts. Raises
    :class:`ToolsetError` for an unknown toolset, and for one with no such tool.
    """
    if tools is None and toolsets is None:
        return None
    registry = default_registry if registry is None else registry
    chosen: dict[str, None] = dict.fromkeys(tools or ())
    unknown = [n for n in toolsets or () if not is_known_toolset(n, registry)]
    if unknown:
        raise ToolsetError(
            f"unknown toolset{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}. "
            f"Known toolsets: {', '.join(toolset_names(registry))}"
        )
    for name in toolsets or ():
        members = [t for t in resolve_toolset(name, registry) if t not in BLOCKED_TOOLS]
        usable = [t for t in members if t in registry and registry.is_available(t)]
        if not usable:
            raise ToolsetError(
                f"toolset {name!r} has no tool available on this host"
                + (f" ({'; '.join(_why_not(t, registry) for t in members)})" if members else "")
            )
        chosen.update(dict.fromkeys(usable))
    return list(chosen)


def _why_not(tool: str, registry: ToolRegistry) -> str:
    entry = registry.get(tool)
    if entry is None:
        return f"{tool}: not registered"
    if entry.requires_env:
        return f"{tool}: configured by {', '.join(entry.requires_env)}"
    return f"{tool}: unavailable"


__all__ = [
    "ALL",
    "BLOCKED_TOOLS",
    "BUILTIN_TOOLSETS",
    "SANDBOX_TOOLS",
    "Toolset",
    "ToolsetError",
    "create_toolset",
    "delete_toolset",
    "get_toolset",
    "is_known_toolset",
    "resolve_toolset",
    "resolve_toolsets",
    "tools_for_run",
    "toolset_names",
]
