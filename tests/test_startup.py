"""What start-up leaves out: ``hermes-sandbox run`` of one script imports no SDK, no
jsonschema, no PyYAML without a config file and no agent loop, and what it defers is
still checked (the built-in schemas, the regular expressions, the public names).

Structural, not timed: the speed itself is a row of scripts/bench (cold.cli.local).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
from test_cli import cli_env
from test_named_sessions import Sessions, stop_daemon

import hermes_sandbox
import hermes_sandbox.environments as environments
import hermes_sandbox.environments.exec_stream as exec_stream
from hermes_sandbox.environments.local import launch_argv
from hermes_sandbox.redaction import clean_for_model
from hermes_sandbox.stubs.generate import program_source, relay_source
from hermes_sandbox.tools import load_builtin_tools, registry
from hermes_sandbox.tools.approval import DANGEROUS_PATTERNS
from hermes_sandbox.tools.arguments import ToolArguments, schemas_checked_elsewhere
from hermes_sandbox.tools.command_rules import LazyPattern
from hermes_sandbox.tools.routine_patterns import ROUTINE_PATTERNS

# Modules a run of print(1) on the local backend has no use for.
NOT_IMPORTED = (
    "jsonschema",
    "docker",
    "paramiko",
    "modal",
    "daytona",
    "httpx",
    "yaml",
    "hermes_sandbox.delegation",
    "hermes_sandbox.openai_loop",
    "hermes_sandbox.environments.docker",
    "hermes_sandbox.environments.ssh",
    # The other transports' servers (and ctypes, which rpc.files brings), and the
    # exec-stream machinery the relay runs over: local spawns its scripts itself.
    "hermes_sandbox.environments.exec_stream",
    "hermes_sandbox.rpc.files",
    "hermes_sandbox.rpc.relay",
    "ctypes",
    # The patch engine: the patch tool registers with its schema alone.
    "hermes_sandbox.tools.patch_format",
    "hermes_sandbox.tools.patch_plan",
    "hermes_sandbox.tools.patch_hunks",
    # A run's task id is secrets.token_hex: uuid would bring platform.
    "uuid",
    "platform",
    # The supervisor's path and the stub sources are read beside their modules.
    "importlib.resources",
    "zipfile",
    # The command detector: the run's approval policy loads it at its first check.
    "hermes_sandbox.tools.approval",
    "hermes_sandbox.tools.shell_words",
    "hermes_sandbox.tools.routine_patterns",
    # The blocking portal: a run dispatches its calls in its own event loop.
    "hermes_sandbox.tools.async_bridge",
    "anyio.from_thread",
    # The web tools' machinery: unconfigured, their check_fns read the environment only.
    "hermes_sandbox.tools.web.providers",
    "hermes_sandbox.tools.web.direct",
    "hermes_sandbox.tools.web.guard",
    # The patch tool's diffs.
    "difflib",
)

# The console script's entry point, run in-process; then sys.modules, into a file
# (stdout is the script's).
PROGRAM = textwrap.dedent(
    """\
    import json, sys
    from hermes_sandbox.cli import main

    status = main(["run", sys.argv[1]])
    with open(sys.argv[2], "w") as f:
        json.dump({"status": status, "modules": sorted(sys.modules)}, f)
    """
)


def test_run_of_print_1_imports_no_sdk_and_no_jsonschema(tmp_path: Path) -> None:
    script = tmp_path / "print1.py"
    script.write_text("print(1)\n")
    report = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(script), str(report)],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=cli_env(tmp_path),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"
    seen = json.loads(report.read_text())
    assert seen["status"] == 0
    modules = set(seen["modules"])
    assert "hermes_sandbox.tools.file_tools" in modules  # the tools did load
    imported = [m for m in NOT_IMPORTED if m in modules]
    assert imported == []


# What a `run --session` leaves to the sessions daemon: the runner and the event loop, the
# tools (without --tools-module or a toolset), the approval machinery, the daemon's own
# modules, msgpack, logging, and the Python layer of socket.
SESSION_RUN_NOT_IMPORTED = (
    "anyio",
    "asyncio",
    "hermes_sandbox.runner",
    "hermes_sandbox.session",
    "hermes_sandbox.named_sessions",
    "hermes_sandbox.environments.base",
    "hermes_sandbox.environments.local",
    "hermes_sandbox.environments.isolation",
    "hermes_sandbox.rpc.framing",
    "hermes_sandbox.rpc.server",
    "hermes_sandbox.tools",
    "hermes_sandbox.tools.approval",
    "hermes_sandbox.stubs",
    "msgpack",
    "logging",
    "socket",
    "subprocess",
    "tempfile",
)

SESSION_PROGRAM = textwrap.dedent(
    """\
    import json, sys
    from hermes_sandbox.cli import main

    status = main(["run", *sys.argv[2:]])
    with open(sys.argv[1], "w") as f:
        json.dump({"status": status, "modules": sorted(sys.modules)}, f)
    """
)


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[Sessions]:
    cli = Sessions(tmp_path, tmp_path / "sessions")
    try:
        yield cli
    finally:
        stop_daemon(cli.directory)


def session_run(sessions: Sessions, *args: str) -> tuple[int, set[str], str]:
    """``run ARGS`` by the console script's main(), in a process of its own: its status,
    the modules it imported, its stdout."""
    report = sessions.cwd / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", SESSION_PROGRAM, str(report), *args],
        cwd=sessions.cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=sessions.env,
        timeout=120,
    )
    assert "Traceback" not in done.stderr, done.stderr
    seen = json.loads(report.read_text())
    return seen["status"], set(seen["modules"]), done.stdout


def test_a_session_run_sends_its_script_without_the_runner_or_the_tools(
    sessions: Sessions,
) -> None:
    first = sessions.script("first.py", "x = 41\n")
    assert sessions("run", "--session", "s", first).returncode == 0  # the daemon is warm
    second = sessions.script("second.py", "x += 1\nprint(x)\n")
    status, modules, stdout = session_run(sessions, "--session", "s", second)
    assert (status, stdout) == (0, "42\n")
    assert "hermes_sandbox.cli_sessions" in modules  # the parse saw the client
    assert [m for m in SESSION_RUN_NOT_IMPORTED if m in modules] == []

    # A toolset is resolved against the registry here, as before: the tools load for it.
    status, modules, stdout = session_run(sessions, "--session", "t", "--toolsets", "file", first)
    assert (status, stdout) == (0, "")
    assert "hermes_sandbox.tools.file_tools" in modules


def test_builtin_tool_schemas_are_valid() -> None:
    """The built-in tools register without the jsonschema check; it is made here."""
    load_builtin_tools()
    names = registry.names()
    assert {"read_file", "terminal", "web_search"} <= set(names)
    for name in names:
        parameters = registry.get(name).schema["function"]["parameters"]
        cls = jsonschema.validators.validator_for(
            parameters, default=jsonschema.Draft202012Validator
        )
        cls.check_schema(parameters)


def test_a_deferred_bad_schema_fails_at_its_first_validation() -> None:
    bad = {"type": "object", "properties": {"x": {"type": "integr"}}}
    with pytest.raises(ValueError, match="invalid parameters schema"):
        ToolArguments(bad)
    with schemas_checked_elsewhere():
        deferred = ToolArguments(bad)
    with pytest.raises(ValueError, match="invalid parameters schema"):
        deferred.problems({"x": "not an integer"})
    with pytest.raises(ValueError, match="invalid parameters schema"):
        ToolArguments(bad)  # the deferral ended with the block


def test_every_deferred_regex_compiles() -> None:
    patterns = []
    for row in (*DANGEROUS_PATTERNS, *ROUTINE_PATTERNS):
        patterns += [row.regex, row.programs, row.unless_programs]
    lazy = [p for p in patterns if isinstance(p, LazyPattern)]
    assert len(lazy) > 100
    for pattern in lazy:
        assert pattern.compiled.pattern == pattern.pattern
    assert LazyPattern("a+b", 0).fullmatch("aab")
    with pytest.raises(Exception, match="unterminated"):
        LazyPattern("(", 0).search("x")  # a bad one fails where it is used
    assert clean_for_model("\x1b[31mkey sk-abcdefghijklmnopqrstuvwxyz0123\x1b[0m") == (
        "key sk-abc...0123"
    )


def test_public_names_resolve_lazily() -> None:
    for name in hermes_sandbox.__all__:
        assert getattr(hermes_sandbox, name) is not None, name
    assert set(hermes_sandbox.__all__) <= set(dir(hermes_sandbox))
    assert hermes_sandbox.DockerSettings is environments.DockerSettings
    assert environments.ExecStreamEnvironment is exec_stream.ExecStreamEnvironment
    assert environments.SSHSettings.backend == "ssh"
    with pytest.raises(AttributeError):
        _ = hermes_sandbox.no_such_name
    with pytest.raises(AttributeError):
        _ = environments.NoSuchSettings


# What the supervisor, started for every local launch outside a sandbox, leaves to the
# launch: it forks and execs itself, polls its pipes, removes nothing (the keeper does),
# and sets signals with _signal (signal's enums, through enum, were a fifth of its
# start-up).
SUPERVISOR_NOT_IMPORTED = ("subprocess", "selectors", "shutil", "threading", "signal", "enum")


def test_the_supervisor_starts_without_subprocess_selectors_shutil_or_enum(
    tmp_path: Path,
) -> None:
    lifeline, keep = os.pipe()
    try:
        argv = launch_argv(
            [sys.executable, "-c", "import sys; sys.stderr.write('ran\\n'); sys.exit(3)"],
            lifeline=lifeline,
        )
        assert argv[1:3] == ["-E", "-S"]
        done = subprocess.run(
            [argv[0], "-X", "importtime", *argv[1:]],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            pass_fds=(lifeline,),
        )
    finally:
        os.close(lifeline)
        os.close(keep)
    assert done.returncode == 3  # the launch's status, as before
    lines = done.stderr.splitlines()
    assert "ran" in lines
    imported = {line.split("|")[-1].strip() for line in lines if line.startswith("import time")}
    assert "_proctree" in imported  # the parse saw the supervisor's imports
    assert [m for m in SUPERVISOR_NOT_IMPORTED if m in imported] == []


# What the stream relay, started for every relayed run (docker, ssh; local with
# --transport relay), leaves out: the Python layers of signal and socket (enum), and
# selectors (collections), about 5 ms of each start; it uses their C modules and polls.
RELAY_NOT_IMPORTED = ("selectors", "signal", "socket", "enum", "collections", "subprocess")


def test_the_relay_starts_without_selectors_socket_signal_or_enum(tmp_path: Path) -> None:
    (tmp_path / "_hermes_relay.py").write_text(relay_source())
    (tmp_path / "_hermes_msgpack.py").write_text(program_source("_msgpack.py"))
    done = subprocess.run(  # no site, as a sandbox's Python without msgpack; input ends at once
        [sys.executable, "-S", "-X", "importtime", str(tmp_path / "_hermes_relay.py")],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    imported = {line.split("|")[-1].strip() for line in lines if line.startswith("import time")}
    assert {"_socket", "_signal", "select", "ctypes"} <= imported  # the parse saw its imports
    assert [m for m in RELAY_NOT_IMPORTED if m in imported] == []


FDS_REPORT = (
    "import os; fds = os.listdir('/proc/self/fd');"
    " print(sorted(int(n) for n in fds if os.path.exists('/proc/self/fd/' + n)))"
)


def run_launch(command: list[str]) -> str:
    """Start ``command`` through the supervisor, itself given a lifeline and a stray
    descriptor as the runner might; its stdout."""
    lifeline, keep = os.pipe()
    stray, stray_keep = os.pipe()
    try:
        done = subprocess.run(
            launch_argv(command, lifeline=lifeline),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            pass_fds=(lifeline, stray),
        )
    finally:
        for fd in (lifeline, keep, stray, stray_keep):
            os.close(fd)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_supervisors_launch_inherits_no_descriptor_but_0_1_2() -> None:
    # (listdir's own descriptor is closed by the time each is checked)
    assert run_launch([sys.executable, "-c", FDS_REPORT]).strip() == "[0, 1, 2]"


def test_the_supervisors_launch_ignores_no_signal_it_ignores() -> None:
    """An ignored signal stays ignored across an exec: SIGINT (the supervisor's),
    SIGPIPE and SIGXFSZ (Python's) must be back to their defaults in the launch."""
    status = run_launch(["cat", "/proc/self/status"])
    ignored = int(
        next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16
    )
    for number in (signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ):
        assert not ignored & (1 << (number - 1)), f"{number!r} is ignored in the launch"


# The program leaves without the interpreter's teardown of its modules, but does what
# an exit owes: other threads waited for, the exit functions run, stdout flushed, and
# the status main() returned.
PROGRAM_EXIT = textwrap.dedent(
    """\
    import atexit, sys, threading
    from hermes_sandbox import cli

    returned = threading.Event()
    real_main = cli.main

    def main():  # console_main's main(), which says when it has returned
        try:
            return real_main()
        finally:
            returned.set()

    def late():  # still running when main() returns, however long the run took
        returned.wait()
        print("the thread finished")

    cli.main = main
    atexit.register(lambda: print("the exit function ran"))
    threading.Thread(target=late).start()
    sys.argv = ["hermes-sandbox", "run", sys.argv[1]]
    cli.console_main()
    """
)


def test_the_program_exits_as_an_exit_would(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text("print('y' * 30000)\nraise SystemExit(3)\n")
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM_EXIT, str(script)],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=cli_env(tmp_path),
        timeout=120,
    )
    assert done.returncode == 3, done.stderr  # the script's status, as main() returned it
    lines = done.stdout.splitlines()
    assert lines == ["y" * 30000, "the thread finished", "the exit function ran"]
    assert "Script exited with code 3" in done.stderr
