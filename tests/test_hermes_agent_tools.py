"""Hermes Agent's real tools served to scripts: hermes-agent from PyPI in a fresh venv
beside our wheel, a registry mirrored from its own, and a script that calls read_file,
write_file and terminal through Hermes's own handlers, getting Hermes's result shapes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# Building the venv (hermes-agent from PyPI) counts against the first test using it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SCRIPT = textwrap.dedent(
    """\
    import json
    from hermes_tools import read_file, write_file, terminal
    wrote = write_file("notes/hello.txt", "hello from hermes\\n")
    read = read_file("notes/hello.txt")
    ran = terminal("echo ran-by-hermes && pwd")
    print(json.dumps({"wrote": wrote, "read": read, "ran": ran}))
    """
)

HOST = textwrap.dedent(
    """\
    import json, sys
    from hermes_sandbox import execute_code
    from hermes_sandbox.tools.hermes_agent import mirror_hermes_tools

    served = mirror_hermes_tools(["read_file", "write_file", "terminal"])
    result = execute_code(
        sys.stdin.read(), registry=served,
        tools=["read_file", "write_file", "terminal"], timeout=120,
    )
    print(json.dumps(result.to_dict()))
    """
)


def _host(python: Path, cwd: Path, code: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), "-c", code],
        input=stdin,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_script_calls_hermes_own_handlers(hermes_agent_python: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    done = _host(hermes_agent_python, work, HOST, SCRIPT)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["status"] == "success", result
    assert result["tool_calls_made"] == 3
    seen = json.loads(result["output"])

    # Hermes's own shapes: write_file reports what it created, read_file numbers lines,
    # terminal has output/exit_code/error. They acted in the host's working directory.
    assert (work / "notes" / "hello.txt").read_text() == "hello from hermes\n"
    assert seen["wrote"]["bytes_written"] == len("hello from hermes\n")
    assert seen["wrote"]["dirs_created"] is True
    assert seen["wrote"]["resolved_path"] == str(work / "notes" / "hello.txt")
    assert seen["read"]["content"].startswith("1|hello from hermes")
    assert seen["read"]["total_lines"] == 1
    assert seen["ran"] == {"output": f"ran-by-hermes\n{work}", "exit_code": 0, "error": None}


def test_blocked_and_unknown_hermes_tools_are_refused(
    hermes_agent_python: Path, tmp_path: Path
) -> None:
    probe = textwrap.dedent(
        """\
        from hermes_sandbox import SandboxError
        from hermes_sandbox.tools.hermes_agent import mirror_hermes_tools
        for names in (["delegate_task"], ["no_such_tool"]):
            try:
                mirror_hermes_tools(names)
            except SandboxError as exc:
                print(type(exc).__name__, exc)
        """
    )
    done = _host(hermes_agent_python, tmp_path, probe)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first.startswith("ToolModuleError") and "never served to scripts" in first
    assert second.startswith("ToolModuleError") and "has no tool 'no_such_tool'" in second


def test_without_hermes_agent_the_error_says_how_to_install_it(tmp_path: Path) -> None:
    # This environment has no hermes-agent; a neutral cwd keeps the repository's own
    # tools/ folder off sys.path.
    probe = (
        "from hermes_sandbox.tools.hermes_agent import mirror_hermes_tools\n"
        "from hermes_sandbox import SandboxError\n"
        "try:\n    mirror_hermes_tools()\nexcept SandboxError as exc:\n    print(exc)\n"
    )
    done = _host(Path(sys.executable), tmp_path, probe)
    assert done.returncode == 0, done.stderr
    assert "pip install hermes-agent" in done.stdout


def test_the_example_runs(hermes_agent_python: Path, tmp_path: Path) -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "hermes_agent_tools.py"
    done = subprocess.run(
        [str(hermes_agent_python), str(example)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("success\n1|hello from Hermes's own write_file"), done.stdout
    assert "hello.txt" in done.stdout
    assert list(tmp_path.iterdir()) == []  # the example cleaned up after itself
