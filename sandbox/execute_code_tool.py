"""The execute_code tool: how an agent hands a script to the runtime.

It is registered on the registry like any other tool, so an agent that serves tools
from the registry gets it for free. Its schema is generated from the registry: every
tool a script may call, with the signature hermes_tools.py declares for it and the
start of its description, and the limits of the run. A tool the session does not
enable is not mentioned anywhere in it, and execute_code itself can never be called
from inside a script (tools.BLOCKED_TOOLS).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from hermes_sandbox.runner import RunError, RunOptions, resolve_tools
from hermes_sandbox.stubs import tool_signature
from hermes_sandbox.task_sessions import (
    DEFAULT_IDLE_SECONDS,
    TaskSessions,
    checked_idle_seconds,
    close_all_sessions,
    close_task_session,
)
from hermes_sandbox.tools import (
    BLOCKED_TOOLS,
    ToolContext,
    ToolEntry,
    ToolRegistry,
    load_builtin_tools,
    tool_error,
)
from hermes_sandbox.tools.registry import registry as default_registry

NAME = "execute_code"
# The shapes a framework hands a tool definition to a model in.
FORMATS = ("openai", "anthropic")
# A tool's summary in the listing: its first line, cut to whole sentences within this.
SUMMARY_CHARS = 200
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "code": {
            "type": "string",
            "description": "The whole Python script to run.",
        },
        "reset": {
            "type": "boolean",
            "description": (
                "Start from a fresh sandbox: the files and processes earlier scripts of "
                "this task left in it are removed first. Each script runs in a new process "
                "either way."
            ),
        },
    },
    "required": ["code"],
}


def script_tools(
    registry: ToolRegistry,
    enabled_tools: Sequence[str] | None,
    options: RunOptions | None = None,
) -> list[str]:
    """The tools a script run by execute_code may call, in the session's order.

    ``enabled_tools`` is the session's tool list, built-in tools and the host's own
    alike: the ones a script can never call (execute_code itself, delegate_task) and
    those unavailable here are left out. ``options.tools``, when set, narrows it
    further. With no session list, a run's default applies: ``options.tools``, else
    every available built-in sandbox tool.

    Raises :class:`RunError` for a name that is not registered (register the tool
    first, or leave it out), and for a string where a list of names belongs.
    """
    allowed = None if options is None else options.tools
    if isinstance(enabled_tools, str) or isinstance(allowed, str):
        raise RunError(
            "enabled_tools and RunOptions.tools are lists of tool names, not a string: "
            'write ["terminal", "read_file"]'
        )
    if enabled_tools is None:
        return resolve_tools(registry, allowed)
    odd = [n for n in enabled_tools if not isinstance(n, str)]
    if odd:
        raise RunError(f"enabled_tools holds {odd[0]!r}, not a tool name: list names as strings")
    names = list(dict.fromkeys(enabled_tools))
    unknown = [n for n in names if n not in registry and n not in BLOCKED_TOOLS]
    if unknown:
        raise RunError(
            f"enabled_tools names tool{'s' if len(unknown) > 1 else ''} that "
            f"{'are' if len(unknown) > 1 else 'is'} not registered: {', '.join(unknown)}. "
            "Register each (registry.register or @tool) before register_execute_code, "
            "or leave it out"
        )
    names = [n for n in names if n not in BLOCKED_TOOLS and registry.is_available(n)]
    if allowed is not None:
        names = [n for n in names if n in allowed]
    return names


def _cut(text: str, limit: int) -> str:
    """``text`` kept to the whole sentences that fit in ``limit`` characters; a first
    sentence longer than that is cut at a word and marked with "..."."""
    if len(text) <= limit:
        return text
    kept = ""
    for sentence in _SENTENCE_END.split(text):
        candidate = f"{kept} {sentence}" if kept else sentence
        if len(candidate) > limit:
            break
        kept = candidate
    if kept:
        return kept
    return text[: limit - 3].rsplit(" ", 1)[0].rstrip(" ,;:") + "..."


def summary(description: str, limit: int = SUMMARY_CHARS) -> str:
    """The start of a tool's description for the listing: its first line, kept to the
    whole sentences that fit in ``limit`` characters, then the description's first
    sentence that starts with "Returns" if that was not kept (a script needs the shape
    of what a tool gives back)."""
    lines = description.strip().splitlines()
    text = _cut(" ".join(lines[0].split()), limit) if lines else ""
    sentences = _SENTENCE_END.split(" ".join(description.split()))
    returns = next((s for s in sentences if s.startswith("Returns ")), None)
    if returns is not None and returns not in text:
        text = f"{text} {_cut(returns, limit)}".strip()
    return text


def _duration(seconds: float) -> str:
    """``300`` as "5-minute", ``90`` as "90-second", ``3600`` as "1-hour"."""
    for size, unit in ((3600, "hour"), (60, "minute")):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}-{unit}"
    return f"{seconds:g}-second"


def _size(count: int) -> str:
    """``50_000`` bytes as "50KB" (decimal units, as the reference writes them)."""
    for size, unit in ((1_000_000, "MB"), (1_000, "KB")):
        if count >= size and count % size == 0:
            return f"{count // size}{unit}"
    return f"{count:,} bytes"


def limits_text(options: RunOptions) -> str:
    """The limits a run under ``options`` enforces, in one sentence for the model."""
    calls = options.max_tool_calls
    if calls == 0:
        budget = "no tool calls (each one returns an error)"
    else:
        budget = f"at most {calls} tool call{'s' if calls != 1 else ''} per script "
        budget += "(calls past that return an error)"
    return (
        f"Limits: {_duration(options.timeout)} timeout (the script and all it started "
        f"are killed), {budget}, stdout capped at {_size(options.max_stdout_bytes)} "
        "(head and tail kept; the full text is saved to a file whose path is returned) "
        f"and stderr at {_size(options.max_stderr_bytes)}."
    )


def _tool_listing(registry: ToolRegistry, tools: Sequence[str]) -> str:
    if not tools:
        return "No tools can be called from the script in this session.\n"
    lines = []
    for name in tools:
        entry = registry.get(name)
        if entry is None:
            raise RunError(f"tool {name!r} is not registered")
        text = summary(entry.schema["function"].get("description") or entry.description)
        lines.append(f"- {tool_signature(entry.schema)}" + (f": {text}" if text else ""))
    return (
        f"The script can import these functions (from hermes_tools import {', '.join(tools)}):\n"
        + "\n".join(lines)
        + "\nEach returns the tool's result already parsed (a dict for the built-in tools); "
        'a failed call returns {"error": "..."} instead of raising. A parameter left as '
        "None takes the tool's default; help(hermes_tools.NAME) shows a tool's whole "
        "description. Calls from several threads run at once.\n"
    )


def build_schema(
    tools: Sequence[str],
    *,
    registry: ToolRegistry | None = None,
    options: RunOptions | None = None,
) -> dict[str, Any]:
    """The function schema of execute_code (name, description, parameters) for a script
    that may call ``tools`` (registered in ``registry``) under the limits of ``options``.

    Raises :class:`RunError` for a tool that is not registered, and
    :class:`~hermes_sandbox.stubs.StubError` for one whose name cannot be a Python
    function (the script could not import it either).
    """
    registry = default_registry if registry is None else registry
    options = options or RunOptions()
    description = (
        "Run a Python script in a sandbox and get back what it prints. Use it to chain "
        "many tool calls in one step: loop, filter and combine results in code, and print "
        "only what you need.\n"
        f"{_tool_listing(registry, tools)}"
        "Helpers: json_parse(text), shell_quote(s), retry(fn, max_attempts=3).\n"
        f"{limits_text(options)}\n"
        "Returns JSON with status (success, error, timeout, interrupted), output, "
        "exit_code, tool_calls_made and duration_seconds."
    )
    return {"name": NAME, "description": description, "parameters": PARAMETERS}


def tool_definition(schema: dict[str, Any], format: str = "openai") -> dict[str, Any]:
    """A function schema as a model API takes it: ``openai`` gives
    ``{"type": "function", "function": {...}}``, ``anthropic`` gives
    ``{"name", "description", "input_schema"}``. Raises ValueError for another format.
    """
    function = schema.get("function", schema)
    if format == "openai":
        return {"type": "function", "function": function}
    if format == "anthropic":
        return {
            "name": function["name"],
            "description": function["description"],
            "input_schema": function["parameters"],
        }
    raise ValueError(f"unknown format {format!r}; choose one of: {', '.join(FORMATS)}")


def _bad_arguments(args: dict[str, Any]) -> str | None:
    if "code" not in args and "command" in args:
        return tool_error(
            "execute_code runs a Python script, not a shell command: call the terminal tool "
            "with `command`, or pass `code` such as "
            "\"from hermes_tools import terminal\\nprint(terminal('ls')['output'])\""
        )
    code = args.get("code")
    shell = " (a shell command goes to the terminal tool as `command`)"
    if code is None:
        return tool_error(
            "execute_code needs `code`: the Python script to run, as a string" + shell
        )
    if not isinstance(code, str):
        return tool_error(
            f"`code` must be a string holding the Python script, not {type(code).__name__}; "
            "join the lines with newlines"
        )
    if not code.strip():
        return tool_error("`code` is empty: pass the Python script to run" + shell)
    return None


# The warm sessions of each registry's execute_code, by id(registry).
_registered_sessions: dict[int, TaskSessions] = {}


def register_execute_code(
    registry: ToolRegistry | None = None,
    *,
    enabled_tools: Sequence[str] | None = None,
    options: RunOptions | None = None,
    persistent: bool = False,
    idle_seconds: float | None = DEFAULT_IDLE_SECONDS,
) -> ToolEntry:
    """(Re-)register execute_code for a session whose enabled tools are ``enabled_tools``,
    and return its entry (``entry.schema`` is the OpenAI-format definition).

    The schema lists exactly the tools a script may then call (see
    :func:`script_tools`), registered ones of the host's own included, and states the
    limits of ``options`` (the run defaults: backend, timeout, budget, output caps...).
    Call it again when the session's tools change. Raises :class:`RunError` for an
    enabled tool that is not registered and for options that make no sense.

    Scripts of one task id (the ToolContext's, else ``options.task_id``, else
    "default") run in one warm sandbox, kept until :func:`close_task_session` (call it
    when the task ends) or :func:`close_all_sessions` (at shutdown; also run at exit),
    or until no script of the task has run for ``idle_seconds`` (1800 s; None: never),
    when it is closed by itself and the task's next script starts in a new one (its
    result's ``warning`` says so); ``reset`` makes it anew. Raises ValueError for an
    ``idle_seconds`` that is not positive. Registering again closes the sessions of the previous
    registration on the same registry. With ``persistent=True`` each task's sandbox
    keeps one interpreter whose globals survive between scripts (see
    :class:`~hermes_sandbox.session.AsyncSession`); ``reset`` discards them.
    """
    registry = default_registry if registry is None else registry
    if registry is default_registry:
        load_builtin_tools()
    options = (options or RunOptions()).validate()
    tools = script_tools(registry, enabled_tools, options)
    base = dataclasses.replace(options, tools=tuple(tools))
    checked_idle_seconds(idle_seconds)  # before the previous sessions go
    previous = _registered_sessions.get(id(registry))
    if previous is not None:
        previous.close_all()
    sessions = _registered_sessions[id(registry)] = TaskSessions(
        base, registry, persistent=persistent, idle_seconds=idle_seconds
    )

    async def handle(args: dict[str, Any], ctx: ToolContext | None) -> str:
        problem = _bad_arguments(args)
        if problem:
            return problem
        task_id = base.task_id or (ctx.task_id if ctx is not None else None) or "default"
        try:
            result = await sessions.run(task_id, args["code"], reset=bool(args.get("reset")))
        except RunError as exc:
            return tool_error(str(exc))
        return result.to_json()

    return registry.register(
        name=NAME,
        toolset="code_execution",
        schema=build_schema(tools, registry=registry, options=base),
        handler=handle,
        description="Run a Python script that can call tools; returns what it prints.",
        emoji="🐍",
        override=True,
        # The handler words its own advice for the usual wrong calls (a shell command,
        # code that is not a string); generic schema errors would say less.
        validate_args=False,
    )


__all__ = [
    "FORMATS",
    "NAME",
    "build_schema",
    "close_all_sessions",
    "close_task_session",
    "limits_text",
    "register_execute_code",
    "script_tools",
    "summary",
    "tool_definition",
]
