"""End-to-end tests of the command line, run as a real subprocess: ``python -m hermes_sandbox``
(and the installed ``hermes-sandbox`` entry point once)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "hermes_sandbox"]
RESULT_KEYS = {
    "status",
    "output",
    "exit_code",
    "tool_calls_made",
    "duration_seconds",
    "stdout_truncated",
    "stdout_bytes_captured",
    "stdout_bytes_total",
    "stdout_bytes_omitted",
}


def cli_env(cwd: Path, env: dict | None = None) -> dict[str, str]:
    """``env`` (default: this process's) kept from the user's own config file: the
    default config file is looked for under ``cwd/xdg-config``, and HERMES_SANDBOX_CONFIG
    is unset."""
    env = dict(os.environ if env is None else env)
    env.pop("HERMES_SANDBOX_CONFIG", None)
    env["XDG_CONFIG_HOME"] = str(cwd / "xdg-config")
    return env


def cli(*args: str, cwd: Path, stdin: str | None = None, env: dict | None = None):
    """Run the command line to completion; return the CompletedProcess (text)."""
    return subprocess.run(
        [*CLI, *args],
        cwd=cwd,
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=cli_env(cwd, env),
        timeout=60,
    )


def assert_usage_error(done: subprocess.CompletedProcess, *words: str) -> None:
    """Exit 2, a single 'hermes-sandbox: error: ...' line naming ``words``, no traceback;
    on stdout nothing, or under --json the same error as a result with status error."""
    assert "Traceback" not in done.stderr, done.stderr[-800:]
    assert done.returncode == 2, done.stderr[-800:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("hermes-sandbox: error: ")
    for word in words:
        assert word in lines[0]
    if "--json" not in done.args:
        assert done.stdout == ""
        return
    result = json.loads(done.stdout)
    assert (result["status"], result["exit_code"]) == ("error", 2)
    assert result["error"] == lines[0].removeprefix("hermes-sandbox: error: ")


@pytest.fixture
def write(tmp_path):
    """``write(name, text)``: a dedented file in tmp_path; returns its path."""

    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return _write


# -- run ---------------------------------------------------------------------------------


def test_run_prints_output_and_exits_with_the_script_code(tmp_path, write):
    write("script.py", "import sys\nprint('hello from the script')\nsys.exit(5)\n")
    done = cli("run", "script.py", cwd=tmp_path)
    assert done.returncode == 5
    assert done.stdout == "hello from the script\n"
    assert "code 5" in done.stderr


def test_run_success_uses_tools(tmp_path, write):
    write("data.txt", "one\ntwo\n")
    write(
        "script.py",
        """
        from hermes_tools import read_file, terminal
        print(read_file("data.txt")["total_lines"], terminal("echo hi")["output"].strip())
        """,
    )
    done = cli("run", "script.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "2 hi\n"
    assert done.stderr == ""


def test_installed_entry_point(tmp_path, write):
    name = "hermes-sandbox"
    path = os.path.join(sysconfig.get_path("scripts"), name)
    if not os.path.exists(path):
        path = shutil.which(name)
    if path is None:
        pytest.skip(f"the {name} entry point is not installed (pip install -e .)")
    write("script.py", "print(6 * 7)\n")
    done = subprocess.run(
        [path, "run", "script.py", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output"] == "42\n"


def test_json_success_has_exactly_the_result_keys(tmp_path, write):
    write("script.py", "print('ok')\n")
    done = cli("run", "script.py", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1  # one JSON object on one line
    result = json.loads(done.stdout)
    assert set(result) == RESULT_KEYS
    assert result["status"] == "success"
    assert result["output"] == "ok\n"
    assert result["exit_code"] == 0
    assert result["tool_calls_made"] == 0
    assert result["stdout_bytes_total"] == result["stdout_bytes_captured"] == 3
    assert result["stdout_bytes_omitted"] == 0
    assert result["stdout_truncated"] is False


def test_json_error_adds_the_error_key(tmp_path, write):
    write("script.py", "raise ValueError('boom')\n")
    done = cli("run", "script.py", "--json", cwd=tmp_path)
    assert done.returncode == 1
    result = json.loads(done.stdout)
    assert set(result) == RESULT_KEYS | {"error"}
    assert result["status"] == "error"
    assert result["error"] == "Script exited with code 1: ValueError: boom"


def test_script_from_stdin(tmp_path):
    done = cli("run", "-", "--json", cwd=tmp_path, stdin="print('from stdin')\n")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output"] == "from stdin\n"


def test_tools_limits_what_the_script_can_import(tmp_path, write):
    write(
        "script.py",
        """
        from hermes_tools import read_file
        try:
            from hermes_tools import terminal
        except ImportError:
            print("no terminal")
        else:
            print("terminal imported")
        """,
    )
    done = cli("run", "script.py", "--tools", "read_file", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "no terminal\n"


def test_env_passes_a_named_variable(tmp_path, write):
    write(
        "script.py",
        "import os\nprint(os.environ.get('MY_SETTING'), os.environ.get('OTHER_SETTING'))\n",
    )
    env = {**os.environ, "MY_SETTING": "from-host"}
    done = cli("run", "script.py", cwd=tmp_path, env=env)
    assert done.stdout == "None None\n"  # not on the allowlist: scrubbed
    done = cli(
        "run", "script.py", "--env", "MY_SETTING", "--env", "OTHER_SETTING=given",
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "from-host given\n"


def test_cwd_sets_the_working_directory(tmp_path, write):
    write("script.py", "import os\nprint(os.getcwd())\n")
    workdir = tmp_path / "work"
    workdir.mkdir()
    done = cli("run", str(tmp_path / "script.py"), "--cwd", str(workdir), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert os.path.realpath(done.stdout.strip()) == os.path.realpath(workdir)


def test_timeout_exits_124(tmp_path, write):
    write("script.py", "import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    done = cli("run", "script.py", "--timeout", "1", "--json", cwd=tmp_path)
    assert done.returncode == 124
    result = json.loads(done.stdout)
    assert result["status"] == "timeout"
    assert result["exit_code"] == 124
    assert result["output"].startswith("started\n")


def test_sigint_interrupts_the_run_and_kills_the_script(
    tmp_path, write, wait_for_pids, assert_gone
):
    pidfile = tmp_path / "pids"
    write(
        "script.py",
        f"""
        import os, subprocess, time
        child = subprocess.Popen(["sleep", "300"])
        with open({str(pidfile)!r} + ".tmp", "w") as f:
            f.write(f"{{os.getpid()}} {{child.pid}}")
        os.replace({str(pidfile)!r} + ".tmp", {str(pidfile)!r})
        time.sleep(300)
        """,
    )
    with subprocess.Popen(
        [*CLI, "run", "script.py", "--json"],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            pids = wait_for_pids(pidfile, 2)
            process.send_signal(signal.SIGINT)
            stdout, stderr = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == 130, stderr
    assert json.loads(stdout)["status"] == "interrupted"
    assert "Traceback" not in stderr
    assert_gone(pids, "Ctrl-C")


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("transport", "signum"),
    [
        ("unix", signal.SIGINT),
        ("files", signal.SIGINT),
        ("relay", signal.SIGINT),
        ("unix", signal.SIGTERM),
    ],
    ids=["unix-SIGINT", "files-SIGINT", "relay-SIGINT", "unix-SIGTERM"],
)
def test_sigint_at_an_approval_prompt_ends_the_run_promptly(tmp_path, write, transport, signum):
    """A tool waiting at the terminal's approval prompt is a call in flight; Ctrl-C
    must end the command at once, not after the drain that a timeout gets."""
    import pty
    import select

    from hermes_sandbox.threads import TOOL_CALL_DRAIN_SECONDS

    write(
        "script.py",
        """
        from hermes_tools import terminal
        terminal(command="echo 'DROP TABLE t' > /dev/null")
        """,
    )
    master, slave = pty.openpty()
    try:
        with subprocess.Popen(
            [*CLI, "run", "script.py", "--json", "--transport", transport],
            cwd=tmp_path,
            env=cli_env(tmp_path),
            stdin=slave,
            stdout=subprocess.PIPE,
            stderr=slave,
            text=True,
        ) as process:
            try:
                seen = b""
                deadline = time.monotonic() + 60
                while b"Allow it?" not in seen and time.monotonic() < deadline:
                    if select.select([master], [], [], 1)[0]:
                        seen += os.read(master, 4096)
                assert b"Allow it?" in seen, seen.decode(errors="replace")
                asked = time.monotonic()
                process.send_signal(signum)
                stdout, _ = process.communicate(timeout=60)
                elapsed = time.monotonic() - asked
            finally:
                if process.poll() is None:
                    process.kill()
    finally:
        os.close(master)
        os.close(slave)
    assert process.returncode == 130, stdout
    assert json.loads(stdout)["status"] == "interrupted"
    assert elapsed < TOOL_CALL_DRAIN_SECONDS, f"Ctrl-C took {elapsed:.1f} s to end the run"


# -- custom tools and the stub ------------------------------------------------------------

DOUBLE_TOOL = """
from hermes_sandbox.tools.registry import registry, tool_result

registry.register(
    name="double",
    toolset="test_cli",
    schema={
        "name": "double",
        "description": "Double a number.",
        "parameters": {
            "type": "object",
            "properties": {"x": {"type": "integer", "description": "The number."}},
            "required": ["x"],
        },
    },
    handler=lambda args: tool_result(value=args["x"] * 2),
)
"""


def test_tools_module_registers_a_callable_tool(tmp_path, write):
    module = write("double_tool.py", DOUBLE_TOOL)
    write("script.py", "from hermes_tools import double\nprint(double(21)['value'])\n")
    done = cli(
        "run", "script.py", "--tools-module", str(module), "--tools", "double", "--json",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["output"] == "42\n"
    assert result["tool_calls_made"] == 1


def test_stub_prints_only_the_chosen_tools(tmp_path):
    done = cli("stub", "--tools", "read_file", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    compile(done.stdout, "hermes_tools.py", "exec")
    assert "\ndef read_file(" in done.stdout
    assert "def terminal(" not in done.stdout
    assert "def write_file(" not in done.stdout


# -- usage errors: exit 2, one line, no traceback ----------------------------------------


def test_unknown_tool(tmp_path, write):
    write("script.py", "print(1)\n")
    assert_usage_error(cli("run", "script.py", "--tools", "nope", cwd=tmp_path), "nope")


def test_stub_unknown_tool(tmp_path):
    assert_usage_error(cli("stub", "--tools", "nope", cwd=tmp_path), "nope")


def test_missing_script(tmp_path):
    assert_usage_error(cli("run", "missing.py", cwd=tmp_path), "missing.py", "not found")


def test_directory_as_script(tmp_path):
    (tmp_path / "adir").mkdir()
    assert_usage_error(cli("run", "adir", cwd=tmp_path), "adir", "directory")


def test_unknown_backend(tmp_path, write):
    write("script.py", "print(1)\n")
    assert_usage_error(cli("run", "script.py", "--backend", "nosuch", cwd=tmp_path), "nosuch")


def test_backend_without_its_settings(tmp_path, write):
    write("script.py", "print(1)\n")
    done = cli("run", "script.py", "--backend", "ssh", cwd=tmp_path)
    assert_usage_error(done, "ssh", "needs a host")


def test_backend_options_on_the_command_line(tmp_path, write):
    write("script.py", "print(1)\n")
    done = cli("run", "script.py", "--backend", "ssh", "-o", "bogus=1", cwd=tmp_path)
    assert_usage_error(done, "unknown", "bogus")
    done = cli("run", "script.py", "-o", "novalue", cwd=tmp_path)
    assert_usage_error(done, "KEY=VALUE")


def test_network_is_refused_where_it_means_nothing(tmp_path, write):
    write("script.py", "print(1)\n")
    done = cli("run", "script.py", "--backend", "ssh", "--network", cwd=tmp_path)
    assert_usage_error(done, "--network", "ssh")


def test_tools_module_that_raises(tmp_path, write):
    write("script.py", "print(1)\n")
    write("broken_tools.py", "raise RuntimeError('cannot set up')\n")
    done = cli("run", "script.py", "--tools-module", "broken_tools.py", cwd=tmp_path)
    assert_usage_error(done, "broken_tools.py", "RuntimeError", "cannot set up")


def test_tools_module_missing(tmp_path, write):
    write("script.py", "print(1)\n")
    done = cli("run", "script.py", "--tools-module", "./no_such_tools.py", cwd=tmp_path)
    assert_usage_error(done, "no_such_tools.py", "not found")


def test_missing_working_directory(tmp_path, write):
    write("script.py", "print(1)\n")
    done = cli("run", "script.py", "--cwd", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert_usage_error(done, "nowhere", "working directory")


def test_timeout_must_be_positive(tmp_path, write):
    write("script.py", "print(1)\n")
    assert_usage_error(cli("run", "script.py", "--timeout", "0", cwd=tmp_path), "timeout")


@pytest.mark.parametrize("transport", ["unix", "relay"])
def test_transport_can_be_forced(tmp_path, write, transport):
    write("script.py", "from hermes_tools import terminal\nprint(terminal('echo via')['output'])")
    done = cli("run", "script.py", "--transport", transport, "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["output"] == "via\n\n"
    assert result["tool_calls_made"] == 1


def test_unknown_transport_is_a_usage_error(tmp_path, write):
    write("script.py", "print(1)\n")
    done = cli("run", "script.py", "--transport", "pigeon", cwd=tmp_path)
    assert done.returncode == 2
    assert "pigeon" in done.stderr and "Traceback" not in done.stderr


def test_tools_module_can_be_a_directory_of_tool_files(tmp_path, write):
    (tmp_path / "mytools").mkdir()
    write(
        "mytools/triple.py",
        "from hermes_sandbox import registry, tool_result\n"
        "registry.register(name='triple', toolset='math',\n"
        "    handler=lambda args: tool_result(value=args['x'] * 3),\n"
        "    schema={'name': 'triple', 'description': 'Triple x.', 'parameters': {\n"
        "        'type': 'object', 'properties': {'x': {'type': 'number'}},\n"
        "        'required': ['x']}})\n",
    )
    # a helper beside it that registers nothing must not even be imported
    write("mytools/notes.py", "raise SystemExit('a helper module was imported')\n")
    write("script.py", "from hermes_tools import triple\nprint(triple(4)['value'])\n")
    done = cli("run", "script.py", "--tools-module", "mytools", "--tools", "triple", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "12\n"


def test_backends_lists_each_backend_and_why_not(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MODAL_", "DAYTONA_"))}
    env["DOCKER_HOST"] = f"unix://{tmp_path}/no-engine.sock"
    env["PATH"] = "/usr/bin:/bin"  # no apptainer here
    env["MODAL_CONFIG_PATH"] = str(tmp_path / "no-modal.toml")
    done = cli("backends", "--json", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    rows = {row["backend"]: row for row in json.loads(done.stdout)}
    assert list(rows) == ["local", "docker", "ssh", "singularity", "modal", "daytona"]
    assert rows["local"] == {
        "backend": "local",
        "available": True,
        "reason": None,
        "isolation": "none (as asked)",  # conftest: HERMES_SANDBOX_ISOLATION=none
    }
    expected = {
        "docker": "no-engine.sock",
        "ssh": "host",
        "singularity": "apptainer",
        "modal": "MODAL_TOKEN_ID",
        "daytona": "DAYTONA_API_KEY",
    }
    for name, word in expected.items():
        assert rows[name]["available"] is False, rows[name]
        assert word in rows[name]["reason"], rows[name]
    # the config's sections count: with a host, ssh is available as far as can be told
    config = tmp_path / "config.yaml"
    config.write_text("backends:\n  ssh:\n    host: build.example\n")
    done = cli("backends", "--config", str(config), cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines()}
    assert lines["ssh"].split()[1] == "available"
    assert "not available" in lines["docker"]
