"""Hermes Agent's own terminal cases (tests/tools/test_terminal_tool.py in its
repository, and the terminal case of tests/tools/test_code_execution.py), run against
the terminal tool as registered.

Commands whose only question is what would run go to the package's FakeEnvironment
with a command handler, which records each command instead of running it; the rest run
for real on a LocalEnvironment. The comment on each case names the reference test.
Cases where this project deliberately differs assert its own behaviour and end in
``_DIFFERENT``; docs/compatibility.md lists each with the reason.
"""

from __future__ import annotations

import shlex
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from toolcalls import call_tool

from hermes_sandbox.environments.base import CommandResult
from hermes_sandbox.environments.testing import FakeEnvironment, FakeSettings
from hermes_sandbox.tools import load_builtin_tools, registry
from hermes_sandbox.tools.approval import ApprovalPolicy
from hermes_sandbox.tools.registry import ToolContext

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def recorder() -> AsyncIterator[FakeEnvironment]:
    """Records every command and answers it without running it."""
    settings = FakeSettings(command_handler=lambda command: CommandResult("recorded", 0))
    async with FakeEnvironment(settings) as environment:
        yield environment


def allowing() -> ApprovalPolicy:
    """A policy whose human approves every flagged command, so nothing is refused."""
    return ApprovalPolicy(callback=lambda command, description: "once")


def recording_ctx(recorder: FakeEnvironment, cwd: Path) -> ToolContext:
    load_builtin_tools()
    return ToolContext(task_id="t", environment=recorder, cwd=str(cwd), approval=allowing())


# test_searching_for_sudo_does_not_trigger_rewrite,
# test_printf_literal_sudo_does_not_trigger_rewrite,
# test_non_command_argument_named_sudo_does_not_trigger_rewrite: a command that only
# mentions sudo runs exactly as written.
@pytest.mark.parametrize(
    "command",
    [
        pytest.param(
            "rg --line-number --no-heading --with-filename 'sudo' . | head -n 20",
            id="test_searching_for_sudo_does_not_trigger_rewrite",
        ),
        pytest.param("printf '%s\\n' sudo", id="test_printf_literal_sudo_does_not_trigger_rewrite"),
        pytest.param(
            "grep -n sudo README.md",
            id="test_non_command_argument_named_sudo_does_not_trigger_rewrite",
        ),
    ],
)
async def test_sudo_mentions_run_as_written(
    recorder: FakeEnvironment, tmp_path: Path, command: str
) -> None:
    result = await call_tool(recording_ctx(recorder, tmp_path), "terminal", command=command)
    assert result == {"output": "recorded", "exit_code": 0}
    assert recorder.commands == [command]


# test_actual_sudo_command_uses_configured_password,
# test_actual_sudo_after_leading_env_assignment_is_rewritten,
# test_explicit_empty_sudo_password_tries_empty_without_prompt,
# test_cached_sudo_password_is_used_when_env_is_unset,
# test_registered_sudo_callback_is_used_without_interactive_env,
# test_transform_sudo_command_pipes_one_password_line_per_invocation: DIFFERENT. There a
# real sudo is rewritten to "sudo -S -p ''" and fed the host's SUDO_PASSWORD (or a cached
# or prompted one). Here a command runs as written and the host's sudo password never
# reaches the sandbox: a script must not gain the host user's privileges.
@pytest.mark.parametrize(
    "command",
    [
        "sudo apt install -y ripgrep",
        "DEBUG=1 sudo whoami",
        "sudo true",
        "echo ok && sudo whoami",
        "echo ok | sudo tee /tmp/hermes-test",
        "sudo true && sudo whoami",
    ],
)
async def test_sudo_is_never_fed_a_password_DIFFERENT(
    recorder: FakeEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    monkeypatch.setenv("SUDO_PASSWORD", "testpass")
    await call_tool(recording_ctx(recorder, tmp_path), "terminal", command=command)
    assert recorder.commands == [command]
    assert "testpass" not in repr(recorder.commands)


# test_terminal_schema_discourages_single_command_wrappers: the schema stands alone, so it
# is usable where execute_code is disabled.
def test_schema_does_not_name_execute_code() -> None:
    load_builtin_tools()
    description = registry.get("terminal").schema["function"]["description"]
    assert "execute_code" not in description


# test_terminal_schema_advertises_persistent_env_state: DIFFERENT. There the terminal is
# one long-lived shell whose exported variables and cwd persist between calls. Here each
# call is a fresh shell (a script's calls may run at once, from several threads, and one
# call's state must not leak into another's), and the schema does not promise persistence.
async def test_each_call_is_a_fresh_shell_DIFFERENT(tool_ctx: ToolContext) -> None:
    description = registry.get("terminal").schema["function"]["description"]
    assert "persist" not in description
    await call_tool(tool_ctx, "terminal", command="export HERMES_CASE_VAR=set; cd /")
    result = await call_tool(tool_ctx, "terminal", command='echo "[${HERMES_CASE_VAR:-}]"; pwd')
    assert result["output"].split() == ["[]", tool_ctx.cwd]


# test_validate_workdir_blocks_shell_metacharacters_in_windows_paths (its POSIX half):
# a workdir that is not a directory is refused and nothing runs.
@pytest.mark.parametrize(
    "workdir",
    ["/tmp/project; rm -rf /", "/tmp/project$(whoami)", "/tmp/project\nwhoami"],
    ids=["semicolon", "subst", "newline"],
)
async def test_workdir_with_shell_syntax_runs_nothing(
    recorder: FakeEnvironment, tmp_path: Path, workdir: str
) -> None:
    result = await call_tool(
        recording_ctx(recorder, tmp_path), "terminal", command="pwd", workdir=workdir
    )
    assert "workdir does not exist" in result["error"]
    assert recorder.commands == []


# The same, DIFFERENT: the reference refuses such a workdir even when it is a real
# directory. Here the workdir is handed to the process as its directory and never pasted
# into shell text, so a directory with such a name is usable and runs nothing extra.
@pytest.mark.parametrize("name", ["p; echo PWNED", "p$(echo PWNED)", "p`echo PWNED`"])
async def test_real_directory_with_shell_syntax_is_safe_DIFFERENT(
    tool_ctx: ToolContext, workspace: Path, name: str
) -> None:
    (workspace / name).mkdir()
    result = await call_tool(tool_ctx, "terminal", command="pwd", workdir=name)
    assert result == {"output": f"{workspace / name}\n", "exit_code": 0}


# tests/tools/test_code_execution.py::TestExecuteCodeEdgeCases::
# test_terminal_code_argument_points_to_execute_code
async def test_code_argument_points_to_execute_code(tool_ctx: ToolContext) -> None:
    error = (await call_tool(tool_ctx, "terminal", code="print(1)"))["error"]
    assert "code" in error and "execute_code" in error and "command" in error
    assert "NoneType" not in error


async def test_real_commands_run(tool_ctx: ToolContext, workspace: Path) -> None:
    """A guard on this file's fixtures: the real environment runs in the workspace."""
    result = await call_tool(
        tool_ctx, "terminal", command=f"cd {shlex.quote(str(workspace))} && echo ok"
    )
    assert result == {"output": "ok\n", "exit_code": 0}


# tests/tools/test_arg_coercion.py::TestProjectToolArgs::test_real_terminal_force_is_stripped
# and TestForceBypassIntegration::test_force_stripped_before_handler: an argument the model
# adds (force=true) cannot get a dangerous command past approval.
async def test_force_cannot_bypass_approval(recorder: FakeEnvironment, tmp_path: Path) -> None:
    load_builtin_tools()
    ctx = ToolContext(task_id="t", environment=recorder, cwd=str(tmp_path))  # no one to ask
    result = await call_tool(ctx, "terminal", command="rm -rf /", force=True)
    assert result["approval_required"] is True
    assert recorder.commands == []


# TestProjectToolArgs.test_real_terminal_declared_args_preserved: the declared arguments
# reach the command (here timeout and workdir; this terminal has no background or pty).
async def test_declared_terminal_arguments_are_used(tool_ctx: ToolContext, workspace: Path) -> None:
    (workspace / "sub").mkdir()
    result = await call_tool(tool_ctx, "terminal", command="pwd", timeout=60, workdir="sub")
    assert result == {"output": f"{workspace / 'sub'}\n", "exit_code": 0}
