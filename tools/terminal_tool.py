"""The terminal tool: run a foreground shell command where the script runs.

Before running, the command goes through the run's approval policy (``ctx.approval``, a
:class:`tools.approval_policy.ApprovalPolicy`); a run without one gets a policy with no one
to ask, so dangerous commands are refused by default.
"""

from __future__ import annotations

from typing import Any

from hermes_sandbox.tools.approval_policy import ApprovalPolicy
from hermes_sandbox.tools.registry import ToolContext, registry, tool_error, tool_result
from hermes_sandbox.truncation import cut_middle_encoded

DEFAULT_TIMEOUT = 180
MAX_TIMEOUT = 3600
MAX_OUTPUT_CHARS = 50_000

# No callback: refuses every dangerous command. Holds no state, so it is shared.
_REFUSING_POLICY = ApprovalPolicy()

TERMINAL_SCHEMA = {
    "name": "terminal",
    "description": (
        "Run a shell command in the foreground and wait for it. Returns {output, exit_code}: "
        "output is stdout and stderr together, its middle cut out past 50,000 bytes. "
        "A command still running after timeout seconds is killed (exit_code 124, and "
        "output ends with [Command timed out after Ns]). "
        "Dangerous commands (recursive deletes, force pushes, writes to disks or /etc, "
        "piping downloads into a shell, stopping services...) need a human's approval: "
        'without it the result is {"error": ..., "approval_required": true}.'
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The command, run with /bin/sh -c."},
            "timeout": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_TIMEOUT,
                "default": DEFAULT_TIMEOUT,
                "description": "Seconds to wait before killing the command.",
            },
            "workdir": {
                "type": "string",
                "description": "Directory to run in (default: the script's working directory).",
            },
        },
        "required": ["command"],
    },
}


async def terminal(args: dict[str, Any], ctx: ToolContext) -> str:
    # Registered with validate_args=False: the arguments are coerced but checked here, so
    # a call that meant execute_code gets advice instead of "command: required".
    command = args.get("command")
    if command is None and "code" in args:
        return tool_error(
            "terminal runs shell commands and takes command=...; it got code=..., which "
            "is execute_code's argument. To run Python code, call the execute_code tool; "
            "to run a shell command, pass it as command."
        )
    if not isinstance(command, str) or not command.strip():
        return tool_error("terminal needs a command (a non-empty string)")
    timeout = args.get("timeout", DEFAULT_TIMEOUT)
    if not isinstance(timeout, int) or isinstance(timeout, bool):
        return tool_error(f"timeout must be a whole number of seconds, got {timeout!r}")
    if not 1 <= timeout <= MAX_TIMEOUT:
        return tool_error(f"timeout must be between 1 and {MAX_TIMEOUT} seconds, got {timeout}")
    workdir = args.get("workdir")
    if workdir is not None and not isinstance(workdir, str):
        return tool_error(f"workdir must be a path (a string), got {workdir!r}")
    cwd = ctx.resolve(workdir) if isinstance(workdir, str) and workdir else ctx.cwd
    try:
        info = await ctx.environment.stat(cwd)
    except OSError:
        return tool_error(f"workdir does not exist: {cwd}")
    if info.kind != "directory":
        return tool_error(f"workdir is not a directory: {cwd}")
    policy = ctx.approval if ctx.approval is not None else _REFUSING_POLICY
    refusal = await policy.check(command)
    if refusal is not None:
        return tool_error(refusal, approval_required=True)
    done = await ctx.environment.execute(command, timeout=timeout, cwd=cwd)
    output = cut_middle_encoded(done.output, MAX_OUTPUT_CHARS)
    if done.timed_out:
        # Said in output too: a model that reads only output must not take a killed
        # command's partial output for its whole output.
        notice = f"[Command timed out after {timeout}s]"
        output = f"{output}\n{notice}" if output else notice
    result: dict[str, Any] = {"output": output, "exit_code": done.exit_code}
    if done.timed_out:
        result["error"] = f"Command timed out after {timeout}s and was killed"
    return tool_result(result)


registry.register(
    name="terminal",
    toolset="terminal",
    schema=TERMINAL_SCHEMA,
    handler=terminal,
    emoji="💻",
    validate_args=False,
)
