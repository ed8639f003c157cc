"""The execute_code tool: how an agent hands a script to the runtime.

It is registered on the registry like any other tool, so an agent that serves tools
from the registry gets it for free; its schema is built from the tools enabled for the
session (a disabled tool is not mentioned anywhere in it), and it can never be called
from inside a script (tools.BLOCKED_TOOLS).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from hermes_sandbox.runner import RunError, RunOptions, run_code
from hermes_sandbox.tools import (
    SANDBOX_TOOLS,
    ToolContext,
    ToolRegistry,
    load_builtin_tools,
    tool_error,
)
from hermes_sandbox.tools.registry import registry as default_registry

NAME = "execute_code"

_SUMMARIES = {
    "read_file": "read_file(path, offset=1, limit=500) -> {content, total_lines, ...}",
    "write_file": "write_file(path, content) -> {status, path, bytes_written}",
    "patch": "patch(path, old_string, new_string, replace_all=False) or patch(mode='patch', "
    "patch=TEXT) -> {status, ...}",
    "search_files": "search_files(pattern, target='content', path='.', file_glob=None, "
    "limit=50) -> {matches, ...}",
    "terminal": "terminal(command, timeout=180, workdir=None) -> {output, exit_code}",
    "web_search": "web_search(query, limit=5) -> {results: [{url, title, description}]}",
    "web_extract": "web_extract(urls, char_limit=15000) -> {results: [{url, title, content}]}",
}


def sandbox_tools_for(registry: ToolRegistry, enabled: Sequence[str] | None) -> list[str]:
    """The tools a script may call: the session's enabled tools that are sandbox tools
    and available here (all available sandbox tools when ``enabled`` is None)."""
    wanted = SANDBOX_TOOLS if enabled is None else [t for t in SANDBOX_TOOLS if t in enabled]
    return [name for name in wanted if registry.is_available(name)]


def build_schema(tools: Sequence[str]) -> dict[str, Any]:
    """The OpenAI function schema of execute_code for a script that may call ``tools``."""
    if tools:
        listing = "\n".join(f"- {_SUMMARIES.get(name, name + '(...)')}" for name in tools)
        imports = f"from hermes_tools import {', '.join(tools)}"
        tool_text = (
            f"Functions it can import ({imports}):\n{listing}\n"
            "Each returns the tool's result already parsed (a dict); a failed call returns "
            '{"error": "..."} instead of raising. Calls from several threads run at once.\n'
        )
    else:
        tool_text = "No tools can be called from the script in this session.\n"
    description = (
        "Run a Python script in a sandbox and get back what it prints. Use it to chain "
        "many tool calls in one step: loop, filter and combine results in code, and print "
        "only what you need.\n"
        f"{tool_text}"
        "Helpers: json_parse(text), shell_quote(s), retry(fn, max_attempts=3).\n"
        "Limits: a wall-clock timeout, a tool-call budget, stdout capped at 50,000 bytes "
        "(head and tail kept; the full text is saved to a file whose path is returned). "
        "Returns JSON with status (success, error, timeout, interrupted), output, "
        "exit_code, tool_calls_made and duration_seconds."
    )
    return {
        "name": NAME,
        "description": description,
        "parameters": {
            "type": "object",
            "properties": {
                "code": {
                    "type": "string",
                    "description": "The whole Python script to run.",
                },
                "reset": {
                    "type": "boolean",
                    "description": (
                        "Start from a fresh interpreter. Every call runs in a new process "
                        "today, so this is accepted and changes nothing yet."
                    ),
                },
            },
            "required": ["code"],
        },
    }


def _bad_arguments(args: dict[str, Any]) -> str | None:
    if "code" not in args and "command" in args:
        return tool_error(
            "execute_code runs a Python script, not a shell command: call the terminal tool "
            "with `command`, or pass `code` such as "
            "\"from hermes_tools import terminal\\nprint(terminal('ls')['output'])\""
        )
    code = args.get("code")
    if code is None:
        return tool_error("execute_code needs `code`: the Python script to run, as a string")
    if not isinstance(code, str):
        return tool_error(
            f"`code` must be a string holding the Python script, not {type(code).__name__}; "
            "join the lines with newlines"
        )
    if not code.strip():
        return tool_error("`code` is empty: pass the Python script to run")
    return None


def register_execute_code(
    registry: ToolRegistry | None = None,
    *,
    enabled_tools: Sequence[str] | None = None,
    options: RunOptions | None = None,
) -> None:
    """(Re-)register execute_code for a session whose enabled tools are ``enabled_tools``.

    ``options`` are the run defaults (backend, limits, ...); the tools a script may call
    are always derived from ``enabled_tools``.
    """
    registry = default_registry if registry is None else registry
    if registry is default_registry:
        load_builtin_tools()
    tools = sandbox_tools_for(registry, enabled_tools)
    base = dataclasses.replace(options or RunOptions(), tools=tuple(tools))

    async def handle(args: dict[str, Any], ctx: ToolContext | None) -> str:
        problem = _bad_arguments(args)
        if problem:
            return problem
        run_options = base
        if ctx is not None and base.task_id is None:
            run_options = dataclasses.replace(base, task_id=ctx.task_id)
        try:
            result = await run_code(args["code"], run_options, registry=registry)
        except RunError as exc:
            return tool_error(str(exc))
        return result.to_json()

    registry.register(
        name=NAME,
        toolset="code_execution",
        schema=build_schema(tools),
        handler=handle,
        description="Run a Python script that can call tools; returns what it prints.",
        emoji="🐍",
        override=True,
        # The handler words its own advice for the usual wrong calls (a shell command,
        # code that is not a string); generic schema errors would say less.
        validate_args=False,
    )
