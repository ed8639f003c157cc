"""``hermes-sandbox delegate``: hand one goal to a child agent driven by a model behind an
OpenAI-compatible endpoint, and print its result (sandbox/delegation.py)."""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import anyio

from hermes_sandbox.delegation import (
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_MAX_DEPTH,
    AsyncDelegationHost,
    DelegationResult,
)
from hermes_sandbox.errors import UsageError
from hermes_sandbox.openai_loop import OpenAIChatLoop
from hermes_sandbox.runner import RunOptions

DEFAULT_KEY_VARIABLE = "OPENAI_API_KEY"


def add_delegate_command(commands: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Add the ``delegate`` subcommand; ``parents`` carry the tool and run options."""
    delegate = commands.add_parser(
        "delegate",
        parents=parents,
        help="hand a goal to a child agent driven by a chat-completions model",
        description="Run a child agent on GOAL in its own sandbox: a model behind an "
        "OpenAI-compatible chat-completions endpoint drives it with execute_code and the "
        "chosen tools, and may delegate further. --timeout and --max-tool-calls bound the "
        "whole delegation, its children's included.",
    )
    delegate.add_argument("--goal", required=True, help="what the child should accomplish")
    delegate.add_argument("--context", help="what the child needs to know")
    delegate.add_argument("--model", required=True, help="the model's name at the endpoint")
    delegate.add_argument(
        "--base-url",
        default=os.environ.get("OPENAI_BASE_URL"),
        metavar="URL",
        help="the endpoint, e.g. http://localhost:11434/v1 (default: $OPENAI_BASE_URL)",
    )
    delegate.add_argument(
        "--api-key-env",
        metavar="NAME",
        help=f"the variable holding the API key (default: {DEFAULT_KEY_VARIABLE}; none is "
        "sent when it is unset)",
    )
    delegate.add_argument(
        "--max-depth",
        type=int,
        default=DEFAULT_MAX_DEPTH,
        metavar="N",
        help=f"how deep children may delegate in turn (default: {DEFAULT_MAX_DEPTH})",
    )
    delegate.add_argument(
        "--max-concurrent",
        type=int,
        default=DEFAULT_MAX_CONCURRENT,
        metavar="N",
        help=f"children running at once under one parent (default: {DEFAULT_MAX_CONCURRENT})",
    )
    delegate.add_argument(
        "--max-turns", type=int, default=20, metavar="N", help="model turns per child"
    )
    delegate.add_argument(
        "--request-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long to wait for one answer of the model (default: 120)",
    )
    delegate.add_argument(
        "--json", action="store_true", help="print the result (and its children's) as JSON"
    )


def _loop(args: argparse.Namespace) -> OpenAIChatLoop:
    if not args.base_url:
        raise UsageError("delegate needs --base-url (or OPENAI_BASE_URL): the endpoint's URL")
    variable = args.api_key_env or DEFAULT_KEY_VARIABLE
    if args.api_key_env and not os.environ.get(variable):
        raise UsageError(f"--api-key-env {variable}: no such variable in this environment")
    return OpenAIChatLoop(
        base_url=args.base_url,
        model=args.model,
        api_key_env=variable,
        max_turns=args.max_turns,
        request_timeout=args.request_timeout,
    )


async def _delegate_with_signals(
    make_host: Callable[[], AsyncDelegationHost], goal: str, context: str | None
) -> DelegationResult:
    """Delegate, turning SIGINT and SIGTERM into cancelling the child."""
    host = make_host()
    async with anyio.create_task_group() as tasks:

        async def watch_signals() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    host.cancel()

        tasks.start_soon(watch_signals)
        result = await host.delegate(goal, context=context)
        tasks.cancel_scope.cancel()
    return result


def run_delegate_command(args: argparse.Namespace) -> int:
    # The shared helpers of the command line, imported here: cli.py imports this module.
    from hermes_sandbox import cli

    config = cli._prepare(args)
    options: RunOptions = cli._run_options(args, config)
    if args.max_depth < 1 or args.max_concurrent < 1:
        raise UsageError("--max-depth and --max-concurrent must be at least 1")
    make_host = functools.partial(
        AsyncDelegationHost,
        _loop(args),
        options=options,
        timeout=args.timeout,
        max_depth=args.max_depth,
        max_concurrent=args.max_concurrent,
    )
    result = anyio.run(_delegate_with_signals, make_host, args.goal, args.context)
    if args.json:
        sys.stdout.write(result.to_json() + "\n")
    else:
        if result.summary:
            sys.stdout.write(result.summary.rstrip("\n") + "\n")
        if result.status != "success":
            sys.stderr.write(f"hermes-sandbox: {result.status}: {result.error}\n")
    return 0 if result.ok else 1


__all__ = ["add_delegate_command", "run_delegate_command"]
