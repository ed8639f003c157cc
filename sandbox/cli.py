"""The command line: ``hermes-sandbox run SCRIPT.py`` and friends."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

import anyio

from environments import BACKENDS, BackendError
from sandbox.result import INTERRUPTED_EXIT_CODE, ExecutionResult
from sandbox.runner import RunError, RunOptions, resolve_tools, run_code
from stubs import StubError, generate_stub
from tools import (
    ToolModuleError,
    ToolsetError,
    load_builtin_tools,
    load_tools_module,
    registry,
    tools_for_run,
)

USAGE_ERROR = 2


class CLIError(Exception):
    """Bad input from the command line; printed as one line, exit code 2."""


def _split_list(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]


def _parse_env(items: Sequence[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not name.isidentifier():
            raise CLIError(f"--env needs NAME or NAME=VALUE, got {item!r}")
        if eq:
            env[name] = value
        elif name in os.environ:
            env[name] = os.environ[name]
        else:
            raise CLIError(f"--env {name}: no such variable in this environment")
    return env


def _read_script(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    if os.path.isdir(path):
        raise CLIError(f"{path} is a directory; give the path of a Python script")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise CLIError(f"script not found: {path}") from None
    except UnicodeDecodeError:
        raise CLIError(f"{path} is not UTF-8 text; give a Python script") from None
    except OSError as exc:
        raise CLIError(f"cannot read {path}: {exc.strerror or exc}") from None


def _load_tools(modules: Sequence[str]) -> None:
    load_builtin_tools()
    for spec in modules:
        try:
            load_tools_module(spec)
        except ToolModuleError as exc:
            raise CLIError(str(exc)) from None


def _selected_tools(args: argparse.Namespace) -> list[str] | None:
    """--tools plus the tools of --toolsets; None (the default set) when neither is given."""
    try:
        return tools_for_run(_split_list(args.tools), _split_list(args.toolsets), registry)
    except ToolsetError as exc:
        raise CLIError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hermes-sandbox",
        description="Run a Python script that calls tools through hermes_tools, in a sandbox.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    tool_args = argparse.ArgumentParser(add_help=False)
    tool_args.add_argument(
        "--tools",
        metavar="A,B,C",
        help="tools the script may call (default: every built-in sandbox tool)",
    )
    tool_args.add_argument(
        "--toolsets",
        metavar="A,B",
        help="toolsets whose tools the script may call, added to --tools (e.g. file,terminal)",
    )
    tool_args.add_argument(
        "--tools-module",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE (dotted name or .py path) that registers extra tools; repeatable",
    )

    run = commands.add_parser(
        "run", parents=[tool_args], help="run a script", description="Run a script."
    )
    run.add_argument("script", help="the script to run, or - to read it from standard input")
    run.add_argument("--json", action="store_true", help="print the result as one JSON object")
    run.add_argument("--timeout", type=float, default=300, metavar="SECONDS")
    run.add_argument("--max-tool-calls", type=int, default=50, metavar="N")
    run.add_argument("--cwd", metavar="DIR", help="working directory of the script")
    run.add_argument(
        "--backend",
        default="local",
        metavar="NAME",
        help=f"where the script runs: {', '.join(BACKENDS)} (default: local)",
    )
    run.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="pass a variable to the script (its environment is scrubbed otherwise)",
    )

    commands.add_parser(
        "stub",
        parents=[tool_args],
        help="print the generated hermes_tools.py",
        description="Print the hermes_tools.py a script would get.",
    )
    commands.add_parser("tools", parents=[tool_args], help="list the tools this host serves")
    return parser


def _print_result(result: ExecutionResult, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(result.to_json() + "\n")
        return
    if result.output:
        sys.stdout.write(result.output if result.output.endswith("\n") else result.output + "\n")
    sys.stdout.flush()
    if result.status != "success" and result.error:
        sys.stderr.write(f"hermes-sandbox: {result.status}: {result.error}\n")
    if result.warning:
        sys.stderr.write(f"hermes-sandbox: {result.warning}\n")


async def _run_with_signals(code: str, options: RunOptions) -> ExecutionResult:
    """Run, turning SIGINT and SIGTERM into an orderly stop of the script."""
    interrupt = anyio.Event()
    async with anyio.create_task_group() as tasks:

        async def watch_signals() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    interrupt.set()

        tasks.start_soon(watch_signals)
        try:
            result = await run_code(code, options, interrupt=interrupt)
        except Exception as exc:  # re-raised below, not wrapped in an ExceptionGroup
            failure: Exception | None = exc
        else:
            failure = None
        tasks.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return result


def _cmd_run(args: argparse.Namespace) -> int:
    if args.backend not in BACKENDS:
        raise CLIError(f"unknown backend {args.backend!r}; choose one of: {', '.join(BACKENDS)}")
    _load_tools(args.tools_module)
    code = _read_script(args.script)
    options = RunOptions(
        backend=args.backend,
        tools=_selected_tools(args),
        timeout=args.timeout,
        max_tool_calls=args.max_tool_calls,
        cwd=args.cwd,
        env=_parse_env(args.env),
    )
    result = anyio.run(_run_with_signals, code, options)
    _print_result(result, args.json)
    if result.exit_code is None:
        return 1
    return result.exit_code if 0 <= result.exit_code <= 255 else 1


def _cmd_stub(args: argparse.Namespace) -> int:
    _load_tools(args.tools_module)
    tools = resolve_tools(registry, _selected_tools(args))
    sys.stdout.write(generate_stub(registry.get_definitions(tools)))
    return 0


def _cmd_tools(args: argparse.Namespace) -> int:
    _load_tools(args.tools_module)
    for name in registry.names():
        entry = registry.get(name)
        assert entry is not None
        state = "available" if registry.is_available(name) else "unavailable"
        summary = entry.description.split(". ")[0].strip()
        summary += f" (needs {', '.join(entry.requires_env)})" if entry.requires_env else ""
        sys.stdout.write(f"{name:<16} {entry.toolset:<10} {state:<11} {summary}\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handlers = {"run": _cmd_run, "stub": _cmd_stub, "tools": _cmd_tools}
    try:
        return handlers[args.command](args)
    except (CLIError, RunError, BackendError, StubError) as exc:
        sys.stderr.write(f"hermes-sandbox: error: {exc}\n")
        return USAGE_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("hermes-sandbox: interrupted\n")
        return INTERRUPTED_EXIT_CODE
