"""The Python API: ``execute_code`` and its async twin."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from hermes_sandbox.environments import BackendSettings
from hermes_sandbox.result import ExecutionResult
from hermes_sandbox.runner import RunOptions, run_code
from hermes_sandbox.streaming import OutputCallback
from hermes_sandbox.tools.registry import ToolRegistry


async def execute_code_async(
    code: str,
    *,
    backend: str | BackendSettings = "local",
    tools: Sequence[str] | None = None,
    timeout: float = 300,
    max_tool_calls: int = 50,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    registry: ToolRegistry | None = None,
    interrupt: anyio.Event | None = None,
    on_stdout: OutputCallback | None = None,
    on_stderr: OutputCallback | None = None,
    **options: Any,
) -> ExecutionResult:
    """Run ``code`` in a sandbox and return its result; for anyio and asyncio callers.

    ``backend`` is where it runs: a backend's name (``"docker"``) or its settings
    (``DockerSettings(image=...)``; see docs/backends.md), with ``backend_options``, a
    mapping of the settings' fields, over them.
    ``tools`` limits what the script may call (default: every built-in sandbox tool);
    ``env`` adds variables to the scrubbed environment the script gets; other keyword
    arguments are fields of :class:`sandbox.runner.RunOptions`. Cancelling the call
    kills the script. ``on_stdout`` and ``on_stderr`` get the output line by line as
    the script prints it (docs/sessions.md). Raises :class:`sandbox.runner.RunError`
    for bad options and :class:`environments.BackendError` when the backend cannot be
    used.

    Dangerous terminal commands (recursive deletes of broad paths, writes to disks,
    ``curl | sh``...; see :mod:`tools.approval`) are refused, and the script gets
    ``{"error": ..., "approval_required": true}``, unless ``approval`` allows them: a
    :class:`tools.approval.ApprovalPolicy` whose ``allowlist`` lists allowed commands
    (exact, or ``re:`` and a regex) and whose callback asks a human, answering
    ``"once"``, ``"session"``, ``"always"`` or ``"deny"``. Pass one policy to several
    runs to share its session approvals; its ``on_always`` hook is where to save an
    "always". ``workspace_root`` keeps the file tools inside one directory.
    """
    run_options = RunOptions(
        backend=backend,
        tools=None if tools is None else tuple(tools),
        timeout=timeout,
        max_tool_calls=max_tool_calls,
        cwd=cwd,
        env=env,
        **options,
    )
    return await run_code(
        code,
        run_options,
        registry=registry,
        interrupt=interrupt,
        on_stdout=on_stdout,
        on_stderr=on_stderr,
    )


def execute_code(
    code: str,
    *,
    backend: str | BackendSettings = "local",
    tools: Sequence[str] | None = None,
    timeout: float = 300,
    max_tool_calls: int = 50,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    **options: Any,
) -> ExecutionResult:
    """Run ``code`` in a sandbox and return its result. Blocks until it is done.

    Safe to call from many threads at once, and from a thread that runs an event loop
    (the run then gets a private loop in a helper thread). See
    :func:`execute_code_async` for the arguments and errors.
    """
    call = functools.partial(
        execute_code_async,
        code,
        backend=backend,
        tools=tools,
        timeout=timeout,
        max_tool_calls=max_tool_calls,
        cwd=cwd,
        env=env,
        **options,
    )
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.run(call)
    box: dict[str, Any] = {}

    def in_thread() -> None:
        try:
            box["result"] = anyio.run(call)
        except BaseException as exc:
            box["error"] = exc

    worker = threading.Thread(target=in_thread, name="hermes-sandbox-run")
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    result: ExecutionResult = box["result"]
    return result
