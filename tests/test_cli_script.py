"""``hermes-sandbox run script.py`` behaves like ``python script.py``, tested through the
real command line as a subprocess, on the local backend and on docker: the script's
name, its directory's modules, its arguments after ``--`` and its piped stdin; and the
command line around it (--json errors, --max-output-bytes, -v, --version, bare help)."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import IMAGE
from test_cli import CLI, RESULT_KEYS, cli, cli_env

from hermes_sandbox import __version__

SCRIPT = textwrap.dedent(
    """\
    import os, sys
    from helpers import shout
    print(shout("name"), os.path.basename(__file__), os.path.basename(sys.argv[0]))
    print(shout("args"), sys.argv[1:])
    print(shout("stdin"), repr(sys.stdin.read()))
    if "--fail" in sys.argv:
        raise ValueError("asked to fail")
    """
)


@pytest.fixture(params=["local", "docker"])
def backend(request: pytest.FixtureRequest) -> list[str]:
    """The command-line flags of a backend; docker needs the engine (fails under CI
    without it)."""
    if request.param == "local":
        return ["--backend", "local"]
    request.getfixturevalue("engine")
    return ["--backend", "docker", "--image", IMAGE]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A script with a module of its own beside it, in a directory that is not the cwd."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "analysis.py").write_text(SCRIPT)
    (job / "helpers.py").write_text("from words import suffix\ndef shout(s): return s + suffix\n")
    (job / "words.py").write_text("suffix = ':'\n")
    (tmp_path / "elsewhere").mkdir()
    return job


def run_json(*args: str, cwd: Path, stdin: str | None = None) -> tuple[dict[str, Any], int]:
    """Run with --json (put before the script's arguments); the result and exit code."""
    at = args.index("--") if "--" in args else len(args)
    done = cli(*args[:at], "--json", *args[at:], cwd=cwd, stdin=stdin)
    assert "Traceback" not in done.stderr, done.stderr[-800:]
    return json.loads(done.stdout), done.returncode


def test_a_script_runs_like_python_script_py(project: Path, backend: list[str]) -> None:
    """Sibling modules import (and theirs too), __file__ and sys.argv[0] are the
    script's own name, arguments after -- reach sys.argv, piped stdin reaches stdin."""
    script = str(project / "analysis.py")
    result, code = run_json(
        "run",
        script,
        *backend,
        "--",
        "one",
        "--two",
        "-",
        cwd=project.parent / "elsewhere",
        stdin="line 1\nline 2\n",
    )
    assert (result["status"], code) == ("success", 0), result
    assert result["output"].splitlines() == [
        "name: analysis.py analysis.py",
        "args: ['one', '--two', '-']",
        "stdin: 'line 1\\nline 2\\n'",
    ]


def test_a_traceback_names_the_script(project: Path, backend: list[str]) -> None:
    result, code = run_json(
        "run", str(project / "analysis.py"), *backend, "--", "--fail", cwd=project
    )
    assert (result["status"], code) == ("error", 1), result
    assert 'analysis.py", line 7, in <module>' in result["output"]
    assert "script.py" not in result["output"]
    assert result["error"].endswith("ValueError: asked to fail")


def test_on_local_the_script_runs_in_its_own_directory(project: Path) -> None:
    """On the local backend the file itself runs: __file__ is its real path, so data
    beside it is found the way python would find it."""
    (project / "data.txt").write_text("beside\n")
    (project / "reader.py").write_text(
        "import os\n"
        "print(__file__)\n"
        "print(open(os.path.join(os.path.dirname(__file__), 'data.txt')).read(), end='')\n"
    )
    result, code = run_json("run", "job/reader.py", cwd=project.parent)
    assert (result["status"], code) == ("success", 0), result
    assert result["output"] == f"{project / 'reader.py'}\nbeside\n"


def test_a_missing_own_module_is_not_blamed_on_the_sandbox(project: Path) -> None:
    (project / "uses.py").write_text("import helperz\n")
    result, _ = run_json("run", str(project / "uses.py"), cwd=project)
    assert result["status"] == "error"
    assert "not installed" not in result["hint"]
    assert "beside the script" in result["hint"]


def test_a_package_beside_the_script_that_docker_cannot_see_is_named(
    project: Path, engine: Any
) -> None:
    """Only one-file modules are copied into a sandbox that does not share this host;
    the hint names a package beside the script as the missing one, not the sandbox."""
    (project / "pkg").mkdir()
    (project / "pkg" / "__init__.py").write_text("")
    (project / "uses.py").write_text("import pkg\n")
    result, _ = run_json(
        "run", str(project / "uses.py"), "--backend", "docker", "--image", IMAGE, cwd=project
    )
    assert result["status"] == "error", result
    assert "'pkg' is beside the script on this host" in result["hint"]


def test_a_stdin_that_is_never_closed_ends_at_the_timeout(project: Path) -> None:
    """The writer keeps the pipe open: the run does not hang, it ends at its timeout
    with an error that says why (the script never started)."""
    process = subprocess.Popen(
        [*CLI, "run", str(project / "analysis.py"), "--timeout", "2", "--json"],
        cwd=project,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(project),
    )
    try:
        assert process.stdin is not None
        process.stdin.write("some input, and the pipe stays open\n")
        process.stdin.flush()
        code = process.wait(timeout=60)  # generous: the bound is the run's 2 s timeout
        assert process.stdout is not None
        result = json.loads(process.stdout.read())
    finally:
        process.kill()
        process.communicate()
    assert code == 124
    assert result["status"] == "timeout"
    assert "standard input was still open" in result["error"]


def test_stdin_is_the_script_when_the_script_is_dash(tmp_path: Path) -> None:
    done = cli("run", "-", "--json", cwd=tmp_path, stdin="import sys\nprint(sys.stdin.read())\n")
    assert json.loads(done.stdout)["output"] == "\n"


def test_no_stdin_reads_as_empty(project: Path) -> None:
    result, _ = run_json("run", str(project / "analysis.py"), cwd=project)
    assert "stdin: ''" in result["output"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["run", "missing.py"], ["script not found", "missing.py"]),
        (["run", "ok.py", "--tools", "no_such_tool"], ["unknown tool", "no_such_tool"]),
        (["run", "ok.py", "--timeout", "abc"], ["--timeout", "abc"]),
        (["run", "ok.py", "--bogus-option"], ["--bogus-option"]),
        (["run", "ok.py", "--backend", "nowhere"], ["unknown backend", "nowhere"]),
        (["run", "ok.py", "--max-output-bytes", "0"], ["--max-output-bytes"]),
        (["run"], ["script"]),
    ],
)
def test_bad_input_under_json_is_a_json_error_result(
    tmp_path: Path, args: list[str], words: list[str]
) -> None:
    (tmp_path / "ok.py").write_text("print('never run')\n")
    done = cli(*args, "--json", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    result = json.loads(done.stdout)
    assert set(result) == RESULT_KEYS | {"error"}
    assert (result["status"], result["exit_code"], result["output"]) == ("error", 2, "")
    for word in words:
        assert word in result["error"]
    assert done.stderr.startswith("hermes-sandbox: error:")


def test_bad_input_without_json_is_one_line_on_stderr(tmp_path: Path) -> None:
    done = cli("run", "ok.py", "--timeout", "abc", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.strip().splitlines() == [
        "hermes-sandbox: error: argument --timeout: invalid float value: 'abc' "
        "(see hermes-sandbox run --help)"
    ]


def test_script_arguments_without_dash_dash_are_refused_with_the_way(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text("print('never run')\n")
    done = cli("run", "ok.py", "one", cwd=tmp_path)
    assert done.returncode == 2 and "a script's own arguments go after --" in done.stderr


def test_arguments_after_dash_dash_are_refused_by_other_commands(tmp_path: Path) -> None:
    done = cli("tools", "--", "x", cwd=tmp_path)
    assert done.returncode == 2 and "takes none" in done.stderr


BIG = "import sys\nsys.stdout.write('x' * 120000 + '\\nEND\\n')\n"


def test_a_person_sees_no_instruction_for_a_model(tmp_path: Path) -> None:
    """Truncated output at a terminal: where the full output is and how to raise the
    cap, not the read_file instruction written for a model (which --json keeps)."""
    (tmp_path / "big.py").write_text(BIG)
    done = cli("run", "big.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "END" in done.stdout and len(done.stdout) < 100_000
    assert "The full output is in" in done.stderr
    assert "--max-output-bytes" in done.stderr
    assert "read_file" not in done.stderr
    result, _ = run_json("run", "big.py", cwd=tmp_path)
    assert "read_file(path=" in result["warning"]
    os.unlink(result["stdout_spill_path"])


def test_max_output_bytes_raises_the_cap(tmp_path: Path) -> None:
    (tmp_path / "big.py").write_text(BIG)
    done = cli("run", "big.py", "--max-output-bytes", "200000", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "x" * 120000 + "\nEND\n"
    assert "truncated" not in done.stderr


def test_verbose_says_what_the_runtime_does(project: Path) -> None:
    done = cli("run", "-v", str(project / "analysis.py"), cwd=project)
    assert done.returncode == 0, done.stderr
    for words in (
        "starting the local backend",
        "backend started in",
        "tool calls take the unix transport",
        "staged the script in",
        "the script ended (success) after",
    ):
        assert words in done.stderr
    quiet = cli("run", str(project / "analysis.py"), cwd=project)
    assert quiet.stderr == ""


def test_version(tmp_path: Path) -> None:
    done = cli("--version", cwd=tmp_path)
    assert (done.returncode, done.stdout.strip()) == (0, f"hermes-sandbox {__version__}")


def test_bare_command_prints_help(tmp_path: Path) -> None:
    """No command: the full help (every command) on stderr, exit 2 as for any usage
    error, so that a script that forgot its command does not pass silently."""
    done = cli(cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("usage: hermes-sandbox")
    for command in ("run", "stub", "tools", "schema", "backends"):
        assert f"\n    {command} " in done.stderr
