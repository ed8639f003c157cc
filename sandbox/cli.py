"""The command line: ``hermes-sandbox run SCRIPT.py`` and friends.

Settings come from the config file (:mod:`sandbox.config`), then the command line: a
flag that is given wins over the file, a flag that is not leaves the file's value (or
its default). Dangerous terminal commands are put to the person at the terminal, when
there is one, by :class:`TerminalPrompt`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from hermes_sandbox import __version__
from hermes_sandbox.config import Config, ConfigError, add_to_allowlist, default_path, load_config
from hermes_sandbox.environments import BACKENDS, get_settings_class
from hermes_sandbox.environments.settings import PROGRESS_LOGGER
from hermes_sandbox.errors import SandboxError, UsageError
from hermes_sandbox.options import RunOptions
from hermes_sandbox.output import spill_notice
from hermes_sandbox.result import INTERRUPTED_EXIT_CODE, TIMEOUT_EXIT_CODE, ExecutionResult
from hermes_sandbox.transports import TRANSPORTS

# What only a run in this process needs (the runner, the event loop, the tools, the
# approval prompt) is imported where it is used: a `run --session` sends its script to
# the sessions daemon with none of it (tests/test_startup.py holds them out).
if TYPE_CHECKING:
    import anyio

    from hermes_sandbox.tools.approval_policy import Approval, ApprovalPolicy

USAGE_ERROR = 2
# Commands whose parser needs nothing beyond this module: a command line naming one of
# them builds only these, so `hermes-sandbox run` does not import the delegation host, the
# sessions daemon or the execute_code tool to parse its arguments.
_CORE_COMMANDS = frozenset({"run", "stub", "tools", "backends"})
MAX_STDIN_BYTES = 64 * 1024 * 1024


class _StdinStillOpen(Exception):
    """The piped stdin was still open when the run's timeout came (a result, not an
    error of the command line: main never sees it)."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises its usage errors, so that main() reports them the one way
    (a JSON result under --json) instead of exiting from inside parse_args."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def _split_list(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]


def _parse_env(items: Sequence[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not name.isidentifier():
            raise UsageError(f"--env needs NAME or NAME=VALUE, got {item!r}")
        if eq:
            env[name] = value
        elif name in os.environ:
            env[name] = os.environ[name]
        else:
            raise UsageError(f"--env {name}: no such variable in this environment")
    return env


def _piped_stdin() -> int | None:
    """The fd of this process's stdin when something is piped or redirected into it (a
    pipe, a file, a socket), not a terminal and not /dev/null; else None."""
    try:
        fd = sys.stdin.fileno()
        mode = os.fstat(fd).st_mode
    except (AttributeError, ValueError, OSError):
        return None
    if stat.S_ISFIFO(mode) or stat.S_ISREG(mode) or stat.S_ISSOCK(mode):
        return fd
    return None


def _read_stdin(fd: int, timeout: float) -> bytes:
    """All of ``fd`` up to its end, within ``timeout`` seconds and MAX_STDIN_BYTES.

    Raises _StdinStillOpen when the writer keeps it open past the timeout, UsageError
    when it holds too much."""
    import selectors

    deadline = time.monotonic() + timeout
    waits = not stat.S_ISREG(os.fstat(fd).st_mode)  # a file is always readable
    chunks: list[bytes] = []
    size = 0
    with selectors.DefaultSelector() as selector:
        if waits:
            selector.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if waits and (left <= 0 or not selector.select(left)):
                raise _StdinStillOpen(
                    f"standard input was still open after the run's timeout ({timeout:g}s), "
                    "so the script was not started: close the pipe, or run with "
                    "</dev/null if the script does not read its input"
                )
            data = os.read(fd, 1 << 16)
            if not data:
                return b"".join(chunks)
            size += len(data)
            if size > MAX_STDIN_BYTES:
                raise UsageError(
                    f"standard input holds more than {MAX_STDIN_BYTES} bytes; give the "
                    "script a file path instead"
                )
            chunks.append(data)


def _read_script(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    if os.path.isdir(path):
        raise UsageError(f"{path} is a directory; give the path of a Python script")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise UsageError(f"script not found: {path}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text; give a Python script") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None


def _load_tools(modules: Sequence[str]) -> None:
    from hermes_sandbox.tools import load_builtin_tools, load_tools

    load_builtin_tools()
    for spec in modules:
        load_tools(spec)


def _prepare(args: argparse.Namespace, *, load_tools: bool = True) -> Config:
    """Read the config file, export its provider settings, load the tools (unless not
    ``load_tools``); the config."""
    config = load_config(args.config)
    config.apply_providers()  # before the tools load: web tools look for their provider
    if load_tools:
        _load_tools(args.tools_module)
    return config


def _selected_tools(args: argparse.Namespace, config: Config) -> list[str] | None:
    """--tools plus the tools of --toolsets; None (the default set) when neither is given.

    The selection is one setting: either flag replaces both ``tools`` and ``toolsets`` of
    the config file, so ``--tools read_file`` means read_file alone, never read_file
    plus the toolsets the file names.
    """
    if args.tools is None and args.toolsets is None:
        tools, toolsets = config.tools, config.toolsets
    else:
        tools, toolsets = _split_list(args.tools), _split_list(args.toolsets)
    if tools is None and toolsets is None:
        return None  # the run's default set: nothing to resolve, no tools to import
    from hermes_sandbox.tools import load_builtin_tools, registry, tools_for_run

    if toolsets is not None:
        load_builtin_tools()  # its members are looked up (loaded already, but for --session)
    return tools_for_run(tools, toolsets, registry)


# -- approvals ---------------------------------------------------------------------------

# Each answer -> the value of its tools.approval_policy.Approval.
_ANSWERS = {
    "o": "once",
    "once": "once",
    "s": "session",
    "session": "session",
    "a": "always",
    "always": "always",
    "": "deny",
    "n": "deny",
    "no": "deny",
}
PROMPT = "Allow it? [o]nce, [s]ession, [a]lways, [N]o: "


def _shown(text: str) -> str:
    """``text`` fit for a terminal: control and invisible characters, which could hide
    part of a command from the person asked, are shown escaped."""
    return "".join(c if c.isprintable() or c == "\n" else repr(c)[1:-1] for c in text)


class TerminalPrompt:
    """An approval callback that asks the person at the terminal, on stderr and stdin.

    Async on purpose: it waits for the answer with :func:`anyio.wait_readable` on the
    terminal, so the event loop keeps serving other calls and a Ctrl-C (which stops the
    run) cancels the question. A blocking ``input()`` would run in a worker thread that
    cannot be cancelled, and would keep the process alive after Ctrl-C until Enter.
    Questions from concurrent calls are asked one at a time. Input typed before the
    question is discarded, so keys pressed earlier cannot answer it.
    """

    def __init__(self, stdin_fd: int, stderr: TextIO) -> None:
        self._fd = stdin_fd
        self._stderr = stderr
        self._lock: anyio.Lock | None = None

    async def __call__(self, command: str, reasons: list[str]) -> Approval:
        import termios

        import anyio

        from hermes_sandbox.tools.approval_policy import Approval

        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            lines = _shown(command).splitlines() or [""]
            text = "\nhermes-sandbox: the script wants to run a dangerous command:\n"
            text += "".join(f"    {line}\n" for line in lines)
            text += "".join(f"  - it {_shown(reason)}\n" for reason in reasons)
            self._write(text)
            try:
                termios.tcflush(self._fd, termios.TCIFLUSH)
            except (OSError, termios.error):
                pass
            while True:
                self._write(PROMPT)
                line = await self._read_line()
                if line is None:  # end of input
                    self._write("\n")
                    return Approval.DENY
                answer = _ANSWERS.get(line.strip().lower())
                if answer is not None:
                    return Approval(answer)
                self._write("Please answer o, s, a or n.\n")

    def _write(self, text: str) -> None:
        self._stderr.write(text)
        self._stderr.flush()

    async def _read_line(self) -> str | None:
        import anyio

        try:
            await anyio.wait_readable(self._fd)
        except anyio.get_cancelled_exc_class():
            self._write("\n")  # the run ended while asking: leave the line clean
            raise
        data = os.read(self._fd, 4096)
        if not data:
            return None
        return data.decode(errors="replace").splitlines()[0] if data.strip() else ""


def _can_prompt(args: argparse.Namespace) -> bool:
    """True when a person can answer: stdin and stderr are a terminal, and stdin is not
    where the script came from."""
    if getattr(args, "script", None) == "-":
        return False
    try:
        return os.isatty(sys.stdin.fileno()) and os.isatty(sys.stderr.fileno())
    except (AttributeError, ValueError, OSError):  # closed or replaced streams
        return False


def _approval_policy(
    args: argparse.Namespace, config: Config, *, for_run: bool = True
) -> ApprovalPolicy | None:
    """The run's one policy: the config's allowlist and --allow-command entries; asks at
    the terminal when there is one, else refuses; "always" answers saved to the file.

    Not ``for_run`` (a --session run, whose policy the daemon holds): only the
    --allow-command entries are checked, and None is the answer."""
    if args.allow_command or for_run:
        from hermes_sandbox.tools.approval_policy import ApprovalPolicy
    for entry in args.allow_command:
        try:
            ApprovalPolicy(allowlist=[entry])
        except ValueError as exc:
            raise UsageError(f"--allow-command: {exc}") from None
    if not for_run:
        return None
    path = config.path or default_path()

    def save(entry: str) -> None:
        try:
            add_to_allowlist(path, entry)
        except ConfigError as exc:
            sys.stderr.write(
                f"hermes-sandbox: warning: allowed for this run only, not saved: {exc}\n"
            )
        else:
            sys.stderr.write(f"hermes-sandbox: added to the allowlist in {path}\n")

    prompt = TerminalPrompt(sys.stdin.fileno(), sys.stderr) if _can_prompt(args) else None
    return ApprovalPolicy(
        prompt,
        allowlist=[*config.approvals.allowlist, *args.allow_command],
        on_always=save,
    )


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; given a ``command`` of :data:`_CORE_COMMANDS`, the
    other commands' parsers (and their modules) are left out."""
    parser = _Parser(
        prog="hermes-sandbox",
        description="Run a Python script that calls tools through hermes_tools, in a sandbox.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    tool_args = _Parser(add_help=False)
    tool_args.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="say on stderr what the runtime does: backend start, staging, transport, timings",
    )
    tool_args.add_argument(
        "--tools",
        metavar="A,B,C",
        help="tools the script may call (default: the config's tools and toolsets, else "
        "every built-in sandbox tool)",
    )
    tool_args.add_argument(
        "--toolsets",
        metavar="A,B",
        help="toolsets whose tools the script may call, added to --tools (e.g. file,terminal); "
        "either flag replaces the config's tools and toolsets",
    )
    tool_args.add_argument(
        "--tools-module",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE (dotted name, .py path, or a directory of tool files) that "
        "registers extra tools; repeatable",
    )
    tool_args.add_argument(
        "--config",
        metavar="PATH",
        help=(
            "the YAML config file (default: $HERMES_SANDBOX_CONFIG, else "
            "~/.config/hermes-sandbox/config.yaml if it exists)"
        ),
    )

    # The options of a run, shared by run and delegate.
    run_args = _Parser(add_help=False)
    # Defaults of None: "not given", so the config file's value applies.
    run_args.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="wall-clock limit (default: the config's limits.timeout, else 300)",
    )
    run_args.add_argument(
        "--max-tool-calls",
        type=int,
        metavar="N",
        help="tool-call budget (default: the config's limits.max_tool_calls, else 50)",
    )
    run_args.add_argument(
        "--max-output-bytes",
        type=int,
        metavar="N",
        help="how much of the script's stdout the result keeps, head and tail (default: "
        "the config's limits.max_stdout_bytes, else 50000); the rest goes to a spill file",
    )
    run_args.add_argument("--cwd", metavar="DIR", help="working directory of the script")
    run_args.add_argument(
        "--backend",
        metavar="NAME",
        help=f"where the script runs: {', '.join(BACKENDS)} (default: the config's, else local)",
    )
    run_args.add_argument(
        "--transport",
        choices=["auto", *TRANSPORTS],
        default="auto",
        help="how tool calls reach the host: the fastest that works (auto), a Unix "
        "socket in a directory shared with the sandbox, request files there, or the "
        "stream relay over the backend's exec stream",
    )
    run_args.add_argument(
        "--image",
        metavar="IMAGE",
        help="the image of a backend that runs one (each says which of its settings this "
        "is); it needs a python3 with its standard library",
    )
    run_args.add_argument(
        "--backend-option",
        "-o",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the backend, over the config file's backends.NAME section "
        "(e.g. -o memory=2g -o cpus=2); the value is read by the "
        "setting's type (none unsets; lists and mappings as YAML)",
    )
    run_args.add_argument(
        "--network",
        action="store_true",
        help="give a sandbox network access, for a backend that can block it (default: "
        "none, loopback only; on local, under bwrap)",
    )
    run_args.add_argument(
        "--isolation",
        metavar="auto|bwrap|none",
        help="how the local backend contains the script: under bubblewrap (bwrap), or "
        "not at all (none); auto: bwrap where it works (default: the config's "
        "backends.local.isolation, else $HERMES_SANDBOX_ISOLATION, else auto)",
    )
    run_args.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="pass a variable to the script (its environment is scrubbed otherwise); "
        "added to the config's env",
    )
    run_args.add_argument(
        "--allow-command",
        action="append",
        default=[],
        metavar="PATTERN",
        help="allow a dangerous terminal command for this run, as an entry of the config's "
        "approvals.allowlist: an exact command, or re:REGEX; repeatable",
    )

    run = commands.add_parser(
        "run",
        parents=[tool_args, run_args],
        help="run a script",
        description="Run a script as python would: arguments after -- reach its sys.argv, "
        "piped standard input reaches its stdin, and its directory is on its sys.path.",
        usage="%(prog)s [options] SCRIPT [-- ARG...]",
    )
    run.add_argument("script", help="the script to run, or - to read it from standard input")
    # What follows -- is the script's sys.argv[1:], taken off before parsing (main).
    run.add_argument("--json", action="store_true", help="print the result as one JSON object")
    run.add_argument(
        "--session",
        metavar="NAME",
        help="run as a cell of the named warm session (made by the first such run; its "
        "globals survive between runs); see `hermes-sandbox sessions`",
    )
    if command not in _CORE_COMMANDS:
        from hermes_sandbox.cli_delegate import add_delegate_command
        from hermes_sandbox.cli_sessions import add_sessions_command

        add_delegate_command(commands, [tool_args, run_args])
        add_sessions_command(commands)

    commands.add_parser(
        "stub",
        parents=[tool_args],
        help="print the generated hermes_tools.py",
        description="Print the hermes_tools.py a script would get.",
    )
    commands.add_parser("tools", parents=[tool_args], help="list the tools this host serves")
    if command not in _CORE_COMMANDS:
        _add_schema_command(commands, tool_args)
    backends = commands.add_parser(
        "backends",
        help="list the backends, whether each can be used here, and why not",
        description="List every backend, whether it can be used on this machine with the "
        "config file's settings, and if not, why and what to do. Nothing is started.",
    )
    backends.add_argument("--config", metavar="PATH", help="the config file to read")
    backends.add_argument("--json", action="store_true", help="print a JSON list")
    return parser


def _add_schema_command(commands: Any, tool_args: argparse.ArgumentParser) -> None:
    from hermes_sandbox.execute_code_tool import FORMATS

    schema = commands.add_parser(
        "schema",
        parents=[tool_args],
        help="print the execute_code tool definition to give a model",
        description="Print, as JSON, the execute_code tool definition a model would get for "
        "these tools and limits: every tool the script may call, with its signature and "
        "description, and the run's timeout, tool-call budget and output caps.",
    )
    schema.add_argument(
        "--format",
        choices=FORMATS,
        default="openai",
        help='openai: {"type": "function", "function": {...}} (default); '
        "anthropic: {name, description, input_schema}",
    )
    schema.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="the run's wall-clock limit, as for run (default: the config's, else 300)",
    )
    schema.add_argument(
        "--max-tool-calls",
        type=int,
        metavar="N",
        help="the run's tool-call budget, as for run (default: the config's, else 50)",
    )


def _print_result(result: ExecutionResult, as_json: bool, *, shown_live: bool = False) -> None:
    if as_json:
        sys.stdout.write(result.to_json() + "\n")
        return
    # The result's warning is written for a model (page the spill file with read_file);
    # a person gets the same facts without the instruction.
    warning = result.warning
    if warning and result.stdout_spill_path:
        path = result.stdout_spill_path
        warning = warning.replace(
            spill_notice(path, for_model=True), spill_notice(path, for_model=False)
        )
        warning += " Raise the cap with --max-output-bytes N."
    if result.output and not shown_live:
        sys.stdout.write(result.output if result.output.endswith("\n") else result.output + "\n")
    sys.stdout.flush()
    if result.status != "success" and result.error:
        sys.stderr.write(f"hermes-sandbox: {result.status}: {result.error}\n")
    if warning:
        sys.stderr.write(f"hermes-sandbox: {warning}\n")


def _write_live(stream: TextIO) -> Callable[[str], None]:
    def write(text: str) -> None:
        stream.write(text)
        stream.flush()

    return write


async def _run_with_signals(code: str, options: RunOptions, live: bool = False) -> ExecutionResult:
    """Run, turning SIGINT and SIGTERM into an orderly stop of the script; with ``live``,
    the script's output is shown as it prints."""
    import signal

    import anyio

    from hermes_sandbox.runner import run_code

    interrupt = anyio.Event()
    async with anyio.create_task_group() as tasks:

        async def watch_signals() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    interrupt.set()

        tasks.start_soon(watch_signals)
        try:
            result = await run_code(
                code,
                options,
                interrupt=interrupt,
                on_stdout=_write_live(sys.stdout) if live else None,
                on_stderr=_write_live(sys.stderr) if live else None,
            )
        except Exception as exc:  # re-raised below, not wrapped in an ExceptionGroup
            failure: Exception | None = exc
        else:
            failure = None
        tasks.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return result


def _run_options(args: argparse.Namespace, config: Config, *, for_run: bool = True) -> RunOptions:
    """The command line over the config file, as RunOptions; not ``for_run`` (a --session
    run, sent to the daemon), with no approval policy but its entries checked."""
    backend = config.backend if args.backend is None else args.backend
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
    limits = config.limits
    timeout = limits.timeout if args.timeout is None else args.timeout
    calls = limits.max_tool_calls if args.max_tool_calls is None else args.max_tool_calls
    max_stdout = limits.max_stdout_bytes
    if args.max_output_bytes is not None:
        if args.max_output_bytes <= 0:
            raise UsageError(f"--max-output-bytes must be positive, got {args.max_output_bytes}")
        max_stdout = args.max_output_bytes
    # The backend's settings, built once: the config file's section, then -o, --image,
    # --network and --isolation, each refused with its place if it does not fit.
    settings_class = get_settings_class(backend)
    settings = settings_class.build(
        [
            config.backend_layer(backend),
            *settings_class.parse_options(args.backend_option),
            *settings_class.flag_layers(
                image=args.image, network=args.network, isolation=args.isolation
            ),
        ]
    )
    return RunOptions(
        backend=settings,
        tools=_selected_tools(args, config),
        timeout=timeout,
        max_tool_calls=calls,
        cwd=config.cwd if args.cwd is None else args.cwd,
        env={**config.env, **_parse_env(args.env)},
        max_stdout_bytes=max_stdout,
        max_stderr_bytes=limits.max_stderr_bytes,
        max_spill_bytes=max(limits.max_spill_bytes, max_stdout),
        spill_retention=limits.spill_retention,
        kill_grace=limits.kill_grace,
        spill_dir=os.path.expanduser(config.spill_dir) if config.spill_dir else None,
        workspace_root=config.workspace_root,
        approval=_approval_policy(args, config, for_run=for_run),
        transport=args.transport,
    )


def _cmd_run(args: argparse.Namespace) -> int:
    # A --session run loads tools only to import a --tools-module here as the daemon will
    # (an error in one is reported the same), or for a toolset's members.
    for_run = args.session is None
    if for_run or args.tools_module:  # a --session run is logged by the daemon (daemon.log)
        _log_to_stderr(args.verbose)
    config = _prepare(args, load_tools=for_run or bool(args.tools_module))
    options = _run_options(args, config, for_run=for_run)
    code = _read_script(args.script)
    options = dataclasses.replace(
        options,
        script_path=None if args.script == "-" else args.script,
        argv=args.script_args,
    )
    stdin_fd = None if args.script == "-" else _piped_stdin()
    if args.session is not None:  # the sessions daemon runs it (sandbox/named_sessions.py)
        if stdin_fd is not None:
            options = dataclasses.replace(options, stdin=b"")
        from hermes_sandbox.cli_sessions import run_request

        allowlist = [*config.approvals.allowlist, *args.allow_command]
        result = run_request(args.session, code, options, args.tools_module, allowlist)
        _print_result(result, args.json)
        return _exit_status(result)
    if stdin_fd is not None:
        try:
            data = _read_stdin(stdin_fd, options.timeout)
        except _StdinStillOpen as exc:
            result = ExecutionResult(
                status="timeout",
                output="",
                exit_code=TIMEOUT_EXIT_CODE,
                tool_calls_made=0,
                duration_seconds=round(options.timeout, 3),
                error=str(exc),
            )
            _print_result(result, args.json)
            return TIMEOUT_EXIT_CODE
        options = dataclasses.replace(options, stdin=data)
    # A person at the terminal sees the output as it comes; a program reading a pipe
    # or --json gets the result, as before.
    live = not args.json and sys.stdout.isatty()
    import anyio

    result = anyio.run(_run_with_signals, code, options, live)
    _print_result(result, args.json, shown_live=live)
    return _exit_status(result)


def _exit_status(result: ExecutionResult) -> int:
    if result.exit_code is None:
        return 1
    return result.exit_code if 0 <= result.exit_code <= 255 else 1


def _cmd_stub(args: argparse.Namespace) -> int:
    from hermes_sandbox.runner import resolve_tools
    from hermes_sandbox.stubs import generate_stub
    from hermes_sandbox.tools import registry

    config = _prepare(args)
    tools = resolve_tools(registry, _selected_tools(args, config))
    sys.stdout.write(generate_stub(registry.get_definitions(tools)))
    return 0


def _cmd_tools(args: argparse.Namespace) -> int:
    from hermes_sandbox.tools import registry

    _prepare(args)
    for name in registry.names():
        entry = registry.get(name)
        assert entry is not None
        state = "available" if registry.is_available(name) else "unavailable"
        summary = entry.description.split(". ")[0].strip()
        # requires_env may list alternatives (any one search provider will do): not "needs"
        if entry.requires_env:
            summary += f" (configured by {', '.join(entry.requires_env)})"
        sys.stdout.write(f"{name:<16} {entry.toolset:<10} {state:<11} {summary}\n")
    return 0


def _limit_options(args: argparse.Namespace, config: Config) -> RunOptions:
    """The limits a run would have: --timeout and --max-tool-calls over the config's."""
    limits = config.limits
    return RunOptions(
        timeout=limits.timeout if args.timeout is None else args.timeout,
        max_tool_calls=(
            limits.max_tool_calls if args.max_tool_calls is None else args.max_tool_calls
        ),
        max_stdout_bytes=limits.max_stdout_bytes,
        max_stderr_bytes=limits.max_stderr_bytes,
    ).validate()


def _cmd_schema(args: argparse.Namespace) -> int:
    from hermes_sandbox.execute_code_tool import build_schema, tool_definition
    from hermes_sandbox.runner import resolve_tools
    from hermes_sandbox.tools import registry

    config = _prepare(args)
    tools = resolve_tools(registry, _selected_tools(args, config))
    schema = build_schema(tools, registry=registry, options=_limit_options(args, config))
    definition = tool_definition(schema, args.format)
    sys.stdout.write(json.dumps(definition, indent=2, ensure_ascii=False) + "\n")
    return 0


def _cmd_backends(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    rows: list[dict[str, Any]] = []
    for name in BACKENDS:
        details: dict[str, str] = {}
        try:
            settings = config.backend_settings(name)
            reason = settings.availability()
            details = settings.details()
        except SandboxError as exc:  # settings that do not fit, a backend that cannot load
            reason = str(exc)
        rows.append({"backend": name, "available": reason is None, "reason": reason, **details})
    if args.json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return 0
    for row in rows:
        state = "available" if row["available"] else "not available"
        line = f"{row['backend']:<12} {state}"
        if row["reason"]:
            line += f": {' '.join(str(row['reason']).split())}"
        sys.stdout.write(line + "\n")
        for key, value in row.items():
            if key not in ("backend", "available", "reason"):
                sys.stdout.write(f"{'':<12} {key}: {value}\n")
    return 0


def _split_script_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """The command line before the first ``--``, and the script's arguments after it."""
    if "--" not in argv:
        return argv, []
    at = argv.index("--")
    return argv[:at], argv[at + 1 :]


def _report_error(message: str, as_json: bool) -> int:
    """A usage or setup error: one stderr line, and under --json a result like a run's
    (status error) on stdout for a program to parse."""
    message = " ".join(line.strip() for line in message.splitlines() if line.strip())
    sys.stderr.write(f"hermes-sandbox: error: {message}\n")
    if as_json:
        result = ExecutionResult(
            status="error",
            output="",
            exit_code=USAGE_ERROR,
            tool_calls_made=0,
            duration_seconds=0.0,
            error=message,
        )
        sys.stdout.write(result.to_json() + "\n")
    return USAGE_ERROR


def _log_to_stderr(verbose: bool) -> None:
    """Show the runtime's log on stderr: its progress (an image pull) always, all it
    does with -v."""
    import logging  # not at import: a --session run logs nothing here (_cmd_run)

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("hermes-sandbox: %(message)s"))
    root = logging.getLogger("hermes_sandbox")
    root.addHandler(handler)
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    logging.getLogger(PROGRESS_LOGGER).setLevel(logging.INFO)


def _cmd_delegate(args: argparse.Namespace) -> int:
    from hermes_sandbox.cli_delegate import run_delegate_command

    return run_delegate_command(args)


def _cmd_sessions(args: argparse.Namespace) -> int:
    from hermes_sandbox.cli_sessions import run_sessions_command

    return run_sessions_command(args)


def main(argv: Sequence[str] | None = None) -> int:
    argv, script_args = _split_script_args(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser(argv[0] if argv else None)
    try:
        args = parser.parse_args(argv)
        if script_args and args.command != "run":
            raise UsageError(f"arguments after -- are for a script: {args.command} takes none")
        args.script_args = script_args
    except UsageError as exc:  # before parsing is done: look for --json by hand
        message = str(exc)
        if message.startswith("unrecognized arguments") and "run" in argv:
            message = message.replace(" (see", "; a script's own arguments go after -- (see")
        return _report_error(message, "--json" in argv)
    if args.command is None:  # bare hermes-sandbox: what it can do, as a usage error
        parser.print_help(sys.stderr)
        return USAGE_ERROR
    if args.command != "run":  # which sets up its log itself
        _log_to_stderr(getattr(args, "verbose", False))
    handlers = {
        "run": _cmd_run,
        "stub": _cmd_stub,
        "tools": _cmd_tools,
        "schema": _cmd_schema,
        "backends": _cmd_backends,
        "delegate": _cmd_delegate,
        "sessions": _cmd_sessions,
    }
    try:
        return handlers[args.command](args)
    except SandboxError as exc:
        return _report_error(str(exc), getattr(args, "json", False))
    except KeyboardInterrupt:
        sys.stderr.write("hermes-sandbox: interrupted\n")
        return INTERRUPTED_EXIT_CODE


def console_main() -> NoReturn:
    """The program (the console script, ``python -m hermes_sandbox``): :func:`main`, then
    out without the interpreter's teardown of every module, which took a fifth of a
    ``hermes-sandbox run`` of ``print(1)`` (docs/benchmarks.md).

    What an exit owes is still done, in the interpreter's order: other non-daemon
    threads are waited for, the exit functions run (logging's flush among them), and
    stdout and stderr are flushed. If a flush fails (a closed pipe), the interpreter's
    own exit takes over and reports it as it always has. An exception out of main()
    is not caught here: it ends the program as usual.
    """
    import atexit
    import threading

    status = main()
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        raise SystemExit(status) from None
    os._exit(status)
