"""Running one script: stage it, serve its tool calls, enforce the limits, shape the result.

This is where the layers meet: an environment from environments/ runs the script, a
server from rpc/ answers it, the registry from tools/ does the work, and the stub from
stubs/ is what the script imports.
"""

from __future__ import annotations

import ast
import logging
import os
import posixpath
import secrets
import shlex
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import anyio

from hermes_sandbox.childenv import scrub_environment, timezone_setting
from hermes_sandbox.environments import (
    BackendError,
    Environment,
    Runtime,
    SandboxProcess,
    get_environment_class,
)
from hermes_sandbox.errors import RunError
from hermes_sandbox.gate import Budget, ToolGate
from hermes_sandbox.hints import failure_hint
from hermes_sandbox.options import RunOptions
from hermes_sandbox.output import (
    CappedOutput,
    default_spill_dir,
    spill_notice,
)
from hermes_sandbox.redaction import clean_for_model
from hermes_sandbox.result import INTERRUPTED_EXIT_CODE, TIMEOUT_EXIT_CODE, ExecutionResult, Status
from hermes_sandbox.rpc import RPCServer
from hermes_sandbox.rpc.server import RequestHandler
from hermes_sandbox.spill import sweep_spill_dir
from hermes_sandbox.streaming import OutputCallback, StreamedOutput
from hermes_sandbox.stubs import (
    CLIENT_MODULE,
    RELAY_MODULE,
    STUB_MODULE,
    client_code_file,
    code_file_name,
    relay_code_file,
    relay_source,
    stub_files,
)
from hermes_sandbox.tools import BLOCKED_TOOLS, SANDBOX_TOOLS, load_builtin_tools
from hermes_sandbox.tools.registry import ToolContext, ToolRegistry
from hermes_sandbox.tools.registry import registry as default_registry
from hermes_sandbox.transports import (
    SHARED_DIRECTORY_TRANSPORTS,
    TRANSPORTS,
    Script,
    TransportUnavailable,
    check_transport,
    choose_transport,
    needs_relay,
)

log = logging.getLogger(__name__)

SCRIPT_NAME = "script.py"
STDIN_NAME = "stdin"
DRAIN_SECONDS = 2.0
# The modules beside a script that it imports are copied with it into a sandbox that
# does not see this host's files: at most this many, this many bytes in all, else none.
MAX_SIBLING_FILES = 64
MAX_SIBLING_BYTES = 8 * 1024 * 1024


def resolve_tools(registry: ToolRegistry, requested: Sequence[str] | None) -> list[str]:
    """The tools a run may call: the caller's list checked against the registry, or
    every available built-in sandbox tool. Raises RunError naming what is wrong."""
    if requested is None:
        return [name for name in SANDBOX_TOOLS if registry.is_available(name)]
    names = list(dict.fromkeys(n.strip() for n in requested if n.strip()))
    blocked = [n for n in names if n in BLOCKED_TOOLS]
    if blocked:
        raise RunError(
            f"{', '.join(blocked)} can never be called from inside a script; "
            "remove it from the tools list"
        )
    unknown = [n for n in names if n not in registry]
    if unknown:
        known = ", ".join(n for n in registry.names() if n not in BLOCKED_TOOLS)
        raise RunError(
            f"unknown tool{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}. "
            f"Known tools: {known}"
        )
    unavailable = [n for n in names if not registry.is_available(n)]
    if unavailable:
        details = []
        for name in unavailable:
            entry = registry.get(name)
            needs = (
                f" (configured by {', '.join(entry.requires_env)})"
                if entry and entry.requires_env
                else ""
            )
            details.append(name + needs)
        raise RunError(f"not available on this host: {', '.join(details)}")
    return names


def _error_line(stderr: str) -> str | None:
    """The last line of a traceback ("ValueError: boom"), if stderr ends with one."""
    for line in reversed(stderr.strip().splitlines()):
        line = line.strip()
        if line:
            if ":" not in line:
                return None
            head = line.split(":", 1)[0]
            if head.isidentifier() or ("." in head and head.replace(".", "").isidentifier()):
                return line[:300]
            return None
    return None


async def _pump(stream: Any, sink: CappedOutput, streamed: StreamedOutput | None) -> None:
    try:
        async for chunk in stream:
            if streamed is None:
                sink.feed(chunk)
            else:
                await streamed.feed(chunk)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass


T = TypeVar("T")


async def wait_within(
    body: Callable[[], Awaitable[T]], timeout: float, interrupt: anyio.Event | None
) -> tuple[Status | None, T | None]:
    """Await ``body()`` for at most ``timeout`` seconds, or until ``interrupt`` is set:
    ``(None, its result)``, else ``("timeout" | "interrupted", None)``. One script's run
    and one persistent interpreter's cell both wait this way."""
    cut: Status | None = None
    result: T | None = None
    with anyio.move_on_after(timeout) as deadline:
        async with anyio.create_task_group() as waiters:

            async def on_interrupt() -> None:
                nonlocal cut
                assert interrupt is not None
                await interrupt.wait()
                cut = "interrupted"
                waiters.cancel_scope.cancel()

            if interrupt is not None:
                waiters.start_soon(on_interrupt)
            result = await body()
            waiters.cancel_scope.cancel()
    if deadline.cancelled_caught:
        return "timeout", None
    return cut, (None if cut else result)


async def _supervise(
    process: SandboxProcess,
    stdout: CappedOutput,
    stderr: CappedOutput,
    *,
    timeout: float,
    kill_grace: float,
    interrupt: anyio.Event | None,
    on_stdout: OutputCallback | None = None,
    on_stderr: OutputCallback | None = None,
) -> tuple[Status, int | None]:
    """Wait for the script within the limits; kill it and all it started; drain output
    (into the capped sinks, and line by line to the callbacks given)."""
    status: Status = "success"
    exit_code: int | None = None
    streams = [
        (process.stdout, stdout, StreamedOutput(stdout, on_stdout) if on_stdout else None),
        (process.stderr, stderr, StreamedOutput(stderr, on_stderr) if on_stderr else None),
    ]
    try:
        async with anyio.create_task_group() as pumps:
            for source, sink, streamed in streams:
                pumps.start_soon(_pump, source, sink, streamed)
            cut, exit_code = await wait_within(process.wait, timeout, interrupt)
            status = cut or status
            with anyio.CancelScope(shield=True):
                await process.kill(kill_grace)  # the script's leftovers too
            # Every writer is gone now; give the pipes a moment to deliver the rest.
            pumps.cancel_scope.deadline = anyio.current_time() + DRAIN_SECONDS
        for _, _, streamed in streams:
            if streamed is not None:
                await streamed.flush()  # a last line without its newline
    finally:
        with anyio.CancelScope(shield=True):
            await process.aclose()
    if status == "timeout":
        return status, TIMEOUT_EXIT_CODE
    if status == "interrupted":
        return status, INTERRUPTED_EXIT_CODE
    if exit_code is not None and exit_code < 0:
        exit_code = 128 - exit_code  # killed by a signal: report it as a shell would
    return ("success" if exit_code == 0 else "error"), exit_code


def make_environment(
    options: RunOptions, explicit_env: Mapping[str, str] | None
) -> tuple[Environment, dict[str, str]]:
    """The run's environment, and the variables its scripts start from: a backend that
    shares the host starts from the host's scrubbed environment, any other from only
    what the caller passed (the host's PATH or HOME mean nothing in a container); every
    one gets the agent's time zone as TZ."""
    cls = get_environment_class(options.backend_name)
    settings = options.backend_settings()
    base_env = scrub_environment(
        os.environ if cls.shares_host else {}, explicit_env, timezone=timezone_setting(os.environ)
    )
    environment = cls.for_run(
        settings,
        env=base_env,
        kill_grace=options.kill_grace,
        task_id=options.task_id,
        python=options.python,
    )
    return environment, base_env


@dataclass(frozen=True, slots=True)
class Plan:
    """A run's checked options and what follows from them before anything starts: the
    registry that serves its calls, the tools it may call and the stub files that
    declare them. One plan serves every run of a session."""

    options: RunOptions
    registry: ToolRegistry
    tools: list[str]
    files: Mapping[str, bytes]


def plan_run(options: RunOptions | None, registry: ToolRegistry | None) -> Plan:
    """Check ``options`` and resolve the tools; raise :class:`RunError`."""
    options = (options or RunOptions()).validate()
    if registry is None:
        registry = default_registry
        load_builtin_tools()
    tools = resolve_tools(registry, options.tools)
    try:
        check_transport(options.transport)
    except TransportUnavailable as exc:
        raise RunError(str(exc)) from None
    return Plan(options, registry, tools, stub_files(registry.get_definitions(tools)))


STAGE_PREFIX = "hermes-sandbox-"


@dataclass(slots=True)
class StageAtLaunch:
    """A one-shot run's stage not made yet: the relay's exec makes it with ``files``
    (stubs, relay, script) and the relay removes it after the script's exit, saying so
    (``removed``); else :func:`remove_stage` still has to."""

    files: Mapping[str, bytes]
    removed: bool = False


@dataclass(frozen=True, slots=True)
class Stage:
    """A started environment made ready for scripts: the transport chosen and a private
    stage directory holding the stub files (and the relay, where it is needed). Each
    run writes its script there; :func:`remove_stage` removes it. With ``at_launch``
    the directory is only named yet: the one run's launch makes it."""

    runtime: Runtime
    transport: str
    path: str
    base_env: Mapping[str, str]
    at_launch: StageAtLaunch | None = None


async def open_stage(
    runtime: Runtime,
    plan: Plan,
    base_env: Mapping[str, str],
    script: StagedScript | None = None,
) -> Stage:
    """Choose the transport for ``runtime``, make the stage and write the stub files,
    and ``script``'s files with them (a one-shot run stages everything at once; over
    the relay, where the runtime can, in the relay's own exec: the stage is then only
    named here). Raises RunError (a transport that cannot work there) and
    BackendError."""
    try:
        transport = choose_transport(plan.options.transport, runtime)
    except TransportUnavailable as exc:
        raise RunError(str(exc)) from None
    log.info("tool calls take the %s transport", transport)
    parent = runtime.shared_directory if transport in SHARED_DIRECTORY_TRANSPORTS else None
    files = dict(plan.files)
    if runtime.runs_this_python:  # the client compiled here runs there as it is
        code_name, code = client_code_file()
        files[code_name] = code
    if needs_relay(transport, runtime):
        files[RELAY_MODULE] = relay_source().encode()
        code_name, code = relay_code_file()  # run instead of the source by a same Python
        files[code_name] = code
    if script is not None:
        files.update(script.files)
    if script is not None and transport == "relay":
        fresh = runtime.fresh_stage_path(STAGE_PREFIX)
        if fresh is not None:
            log.info("the relay's exec makes the stage %s", fresh)
            return Stage(runtime, transport, fresh, dict(base_env), StageAtLaunch(files))
    clock = time.monotonic()
    path = await runtime.make_stage(STAGE_PREFIX, files, parent=parent)
    what = "the script" if script is not None else "the stubs"
    log.info("staged %s in %s in %.2fs", what, path, _since(clock))
    return Stage(runtime, transport, path, dict(base_env))


def _modules_beside(script_path: str | None) -> set[str]:
    """The names a script could import from its own directory on this host."""
    if script_path is None:
        return set()
    try:
        entries = list(os.scandir(os.path.dirname(script_path)))
    except OSError:
        return set()
    names: set[str] = set()
    for entry in entries:
        stem, ext = os.path.splitext(entry.name)
        if ext == ".py" or (not ext and entry.is_dir()):
            names.add(stem)
    return names


def _imported_modules(source: str | bytes) -> set[str]:
    """The top-level modules that ``source`` imports by name (absolute imports; what a
    syntax error hides is not looked for)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _siblings(script_path: str, code: str, reserved: set[str]) -> dict[str, bytes]:
    """The modules beside ``script_path`` that the script imports, and those they
    import, as single .py files (not packages) to copy with it, by file name; none when
    they are more or bigger than the limits."""
    directory = os.path.dirname(script_path)
    found: dict[str, bytes] = {}
    total = 0
    wanted = list(_imported_modules(code))
    while wanted:
        name = wanted.pop() + ".py"
        path = os.path.join(directory, name)
        if name in found or name in reserved or path == script_path:
            continue
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_SIBLING_BYTES + 1)
        except OSError:  # not beside the script: the stdlib, an installed package
            continue
        total += len(data)
        if len(found) >= MAX_SIBLING_FILES or total > MAX_SIBLING_BYTES:
            log.info("not copying the modules beside %s: more than the limits", script_path)
            return {}
        found[name] = data
        wanted.extend(_imported_modules(data))
    return found


@dataclass(frozen=True, slots=True)
class StagedScript:
    """A run's own files in the stage: the script under ``name`` (None: its own file
    runs in place) with the modules beside it that it imports, and its stdin (if
    ``stdin``), each by file name in ``files``."""

    files: Mapping[str, bytes]
    name: str | None
    stdin: bool

    def argv(self, stage: str, options: RunOptions) -> tuple[list[str], str | None]:
        """The script's command line after the interpreter, and its stdin file (None:
        /dev/null), with the stage at ``stage``."""
        stdin_path = posixpath.join(stage, STDIN_NAME) if self.stdin else None
        if self.name is None:
            assert options.script_path is not None
            return [options.script_path, *options.argv], stdin_path
        return [posixpath.join(stage, self.name), *options.argv], stdin_path


def _script_files(
    runtime: Runtime, code: str, stub_names: Sequence[str], options: RunOptions
) -> StagedScript:
    """What the run stages of its own beside ``stub_names`` (the names the stage holds
    already): its stdin, and its script with the modules beside it that it imports,
    unless the script runs in place."""
    files: dict[str, bytes] = {}
    if options.stdin is not None:
        files[STDIN_NAME] = options.stdin
    stdin = options.stdin is not None
    if _runs_in_place(runtime, options):
        return StagedScript(files, None, stdin)
    reserved = {*stub_names, STDIN_NAME}
    name = SCRIPT_NAME
    if options.script_path is not None:
        name = os.path.basename(options.script_path)
        if name in reserved or not name:
            name = SCRIPT_NAME
        siblings = _siblings(options.script_path, code, {*reserved, name})
        files.update(siblings)
        if siblings:
            log.info("copying the modules beside the script: %s", ", ".join(sorted(siblings)))
    files[name] = code.encode("utf-8")
    return StagedScript(files, name, stdin)


def _runs_in_place(runtime: Runtime, options: RunOptions) -> bool:
    """Whether the script's own file runs, in its directory: on a backend that shares
    this host, when that directory is in the script's working directory (which a
    contained local run always sees, bwrap or not); else a copy is staged."""
    if options.script_path is None or not getattr(runtime, "shares_host", False):
        return False
    cwd = os.path.realpath(options.cwd or runtime.default_cwd or os.getcwd())
    directory = os.path.realpath(os.path.dirname(options.script_path))
    return directory == cwd or directory.startswith(cwd.rstrip(os.sep) + os.sep)


async def remove_stage(runtime: Runtime, stage: str) -> str | None:
    """Remove the stage directory; what went wrong, if anything (a sandbox that went
    away mid-run takes its stage with it: the result, not an exception, says so)."""
    try:
        await runtime.remove_tree(stage)
    except (BackendError, OSError) as exc:
        log.warning("could not remove the stage %s: %s", stage, exc)
        return str(exc)
    return None


def run_sinks(options: RunOptions) -> tuple[CappedOutput, CappedOutput]:
    """The capped sinks a run's stdout and stderr go to, under ``options``' caps."""
    stdout = CappedOutput(
        options.max_stdout_bytes,
        spill_limit=options.max_spill_bytes,
        spill_dir=options.spill_dir,
    )
    return stdout, CappedOutput(options.max_stderr_bytes)


def tool_context(stage: Stage, options: RunOptions, cwd: str) -> ToolContext:
    """What the tools a run calls see: its task, environment, directory and policy."""
    return ToolContext(
        # 32 hex digits, as uuid4().hex was, without importing uuid (and platform)
        task_id=options.task_id or secrets.token_hex(16),
        environment=stage.runtime,
        cwd=cwd,
        approval=options.approval,
        workspace_root=options.workspace_root,
    )


def launch_script(
    stage: Stage,
    handler: RequestHandler,
    argv: list[str],
    cwd: str,
    options: RunOptions,
    extra_env: Mapping[str, str] | None = None,
    *,
    stdin_path: str | None = None,
    files: Mapping[str, bytes] | None = None,
    make_stage: bool = False,
) -> tuple[RPCServer, AbstractAsyncContextManager[Any]]:
    """The launch of ``argv`` in ``stage`` over the stage's transport, with a server of
    its own (a fresh token) answering its calls with ``handler``: entering the launch
    starts the program and serves it, and yields the running process; leaving it ends
    both. The program's stdin reads ``stdin_path`` (a file in the stage), else nothing;
    ``files`` are written into the stage (by name) before it starts; with
    ``make_stage`` the relay's exec makes the stage first and the relay removes it
    after the program's exit."""
    token = secrets.token_urlsafe(32)
    server = RPCServer(handler, token=token, max_frame_size=options.max_frame_size)
    pythonpath = stage.base_env.get("PYTHONPATH")
    child_env = {
        **stage.base_env,
        **(extra_env or {}),
        "HERMES_RPC_TOKEN": token,
        "HERMES_RPC_MAX_FRAME": str(options.max_frame_size),
        "PYTHONPATH": stage.path + (os.pathsep + pythonpath if pythonpath else ""),
    }
    script = Script(
        stage=stage.path,
        argv=argv,
        env=child_env,
        cwd=cwd,
        stdin_path=stdin_path,
        files=dict(files or {}),
        make_stage=make_stage,
        remove_after=make_stage,
    )
    return server, TRANSPORTS[stage.transport](stage.runtime, server, script)


async def run_in_stage(
    stage: Stage,
    code: str,
    plan: Plan,
    *,
    options: RunOptions | None = None,
    interrupt: anyio.Event | None = None,
    on_stdout: OutputCallback | None = None,
    on_stderr: OutputCallback | None = None,
    started: float | None = None,
    staged: StagedScript | None = None,
) -> ExecutionResult:
    """Run ``code`` in ``stage`` under ``options`` (default: the plan's) and return its
    result; the environment and the stage stay as they are. ``started`` is when the
    caller's clock for the result's duration began (default: now); ``staged`` is the
    script's files when :func:`open_stage` wrote them already."""
    started = time.monotonic() if started is None else started
    options = options or plan.options
    if not isinstance(code, str):
        raise RunError(f"code must be a string, got {type(code).__name__}")
    runtime = stage.runtime
    budget = Budget(options.max_tool_calls, parent=options.budget)
    if options.budget is not None:
        left = options.budget.remaining_time()
        if left is not None and left < options.timeout:
            options = replace(options, timeout=max(left, 0.001))
    await anyio.to_thread.run_sync(
        sweep_spill_dir, options.spill_dir or default_spill_dir(), options.spill_retention
    )
    stdout, stderr = run_sinks(options)
    lost: str | None = None  # why the sandbox went away mid-run, if it did
    cwd = options.cwd or runtime.default_cwd
    try:
        script = staged or _script_files(runtime, code, _stub_names(plan), options)
        script_argv, stdin_path = script.argv(stage.path, options)
        gate = ToolGate(plan.registry, plan.tools, budget, tool_context(stage, options, cwd))
        # Files not staged yet go with the launch (over the relay: in its own exec), all
        # of them when the launch makes the stage.
        at_launch = stage.at_launch
        files = script.files if at_launch is None and not staged else {}
        if at_launch is not None:
            files = at_launch.files
        server, launch = launch_script(
            stage,
            gate,
            [runtime.python, *script_argv],
            cwd,
            options,
            stdin_path=stdin_path,
            files=files,
            make_stage=at_launch is not None,
        )
        log.info("running %s in %s", shlex.join([runtime.python, *script_argv]), cwd)
        clock = time.monotonic()
        try:
            async with launch as process:
                status, exit_code = await _supervise(
                    process,
                    stdout,
                    stderr,
                    timeout=options.timeout,
                    kill_grace=options.kill_grace,
                    interrupt=interrupt,
                    on_stdout=on_stdout,
                    on_stderr=on_stderr,
                )
                if status == "interrupted":
                    server.abandon()  # end now: no drain of the calls in flight
                lost = getattr(process, "lost", None)
            if at_launch is not None:  # read once the launch has ended: the relay is done
                at_launch.removed = getattr(process, "stage_removed", False)
            log.info("the script ended (%s) after %.2fs", status, _since(clock))
        except TransportUnavailable as exc:
            raise RunError(str(exc)) from None
    finally:
        stdout.close()
    return shape_result(
        status,
        exit_code,
        stdout,
        stderr,
        calls=gate.calls_made,
        duration=time.monotonic() - started,
        timeout=options.timeout,
        tools=plan.tools,
        lost=lost,
        unstaged=set()
        if _runs_in_place(runtime, options)
        else _modules_beside(options.script_path),
    )


def _stub_names(plan: Plan) -> list[str]:
    return [*plan.files, RELAY_MODULE, code_file_name(CLIENT_MODULE)]


def _since(clock: float) -> float:
    return time.monotonic() - clock


def with_cleanup_problem(result: ExecutionResult, problem: str | None) -> ExecutionResult:
    """``result`` with a warning that the stage could not be removed, if it could not."""
    if not problem:
        return result
    note = f"The run's staging directory could not be removed: {problem}"
    result.add_warning(note)
    return result


async def run_code(
    code: str,
    options: RunOptions | None = None,
    *,
    registry: ToolRegistry | None = None,
    interrupt: anyio.Event | None = None,
    on_stdout: OutputCallback | None = None,
    on_stderr: OutputCallback | None = None,
) -> ExecutionResult:
    """Run ``code`` as a script under ``options`` and return its result: start the
    environment, stage, run, then remove the stage and close the environment (a
    :class:`~hermes_sandbox.session.AsyncSession` keeps them for many runs).

    Setting ``interrupt`` stops the script (status ``interrupted``). Cancelling the
    calling task kills the script too before the cancellation goes on. ``on_stdout``
    and ``on_stderr`` get the output line by line as it is printed (see
    :mod:`sandbox.streaming`). Raises :class:`RunError` for options that make no sense
    and :class:`environments.BackendError` when the backend cannot be used.
    """
    started = time.monotonic()
    plan = plan_run(options, registry)
    if not isinstance(code, str):
        raise RunError(f"code must be a string, got {type(code).__name__}")
    environment, base_env = make_environment(plan.options, plan.options.env)
    try:
        log.info("starting the %s backend", plan.options.backend_name)
        clock = time.monotonic()
        runtime = await environment.start()
        log.info("the %s backend started in %.2fs", plan.options.backend_name, _since(clock))
        # The script goes into the stage with the stub files: one step, not two.
        script = _script_files(runtime, code, _stub_names(plan), plan.options)
        stage = await open_stage(runtime, plan, base_env, script)
        cleanup_problem: str | None = None
        try:
            result = await run_in_stage(
                stage,
                code,
                plan,
                interrupt=interrupt,
                on_stdout=on_stdout,
                on_stderr=on_stderr,
                started=started,
                staged=script,
            )
        finally:
            removed = stage.at_launch is not None and stage.at_launch.removed
            # Else it goes with the environment, or the relay removed it already.
            if not runtime.discards_on_close and not removed:
                with anyio.CancelScope(shield=True):
                    cleanup_problem = await remove_stage(runtime, stage.path)
    finally:
        with anyio.CancelScope(shield=True):
            await environment.aclose()
    return with_cleanup_problem(result, cleanup_problem)


def shape_result(
    status: Status,
    exit_code: int | None,
    stdout: CappedOutput,
    stderr: CappedOutput,
    *,
    calls: int,
    duration: float,
    timeout: float,
    tools: Sequence[str],
    lost: str | None = None,
    unstaged: set[str] | None = None,
) -> ExecutionResult:
    output = clean_for_model(stdout.text())
    stderr_text = clean_for_model(stderr.text())
    if stderr_text:
        output = (
            f"{output}\n--- stderr ---\n{stderr_text}"
            if output
            else f"--- stderr ---\n{stderr_text}"
        )
    error: str | None = None
    hint: str | None = None
    if status == "timeout":
        shown = f"{timeout:g}"
        error = f"Script timed out after {shown}s and was killed."
        output = f"{output}\n\n⏰ {error}" if output else f"⏰ {error}"
    elif status == "interrupted":
        error = "Script was interrupted and stopped."
        output = f"{output}\n[execution interrupted]" if output else "[execution interrupted]"
    elif status == "error" and lost:
        error = (
            "The connection to the sandbox was lost before the script finished "
            f"({lost}); the script may not have run to its end."
        )
    elif status == "error":
        error = f"Script exited with code {exit_code}"
        last = _error_line(stderr_text)
        if last:
            error += f": {last}"
        hint = failure_hint(stderr_text, tools, beside=unstaged or ())
    total = stdout.buffer.total
    captured = stdout.shown_bytes
    warning = None
    if stdout.truncated:
        warning = (
            "stdout was truncated: the script did run, but only the head and tail of its "
            "output are shown."
        )
        if stdout.spill_path:
            warning += " " + spill_notice(stdout.spill_path, for_model=True)
        elif stdout.spill_error:
            warning += f" ({stdout.spill_error})"
    return ExecutionResult(
        status=status,
        output=output,
        exit_code=exit_code,
        tool_calls_made=calls,
        duration_seconds=round(duration, 3),
        error=error,
        stdout_truncated=stdout.truncated,
        stdout_bytes_captured=captured,
        stdout_bytes_total=total,
        stdout_bytes_omitted=total - captured,
        warning=warning,
        stdout_spill_path=stdout.spill_path,
        hint=hint,
    )


__all__ = ["STUB_MODULE", "RunError", "RunOptions", "resolve_tools", "run_code"]
