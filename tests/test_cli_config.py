"""The command line with the config file and dangerous-command approvals, end to end: real
``python -m hermes_sandbox`` processes, and a real pseudo-terminal for the approval prompt."""

from __future__ import annotations

import json
import os
import select
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from httpserver import LocalHTTPServer, Reply, Request
from test_cli import CLI, assert_usage_error, cli, cli_env

from hermes_sandbox.config import parse_config
from hermes_sandbox.tools.approval import normalise_command

WEB_VARS = (
    "SEARXNG_URL",
    "BRAVE_SEARCH_API_KEY",
    "TAVILY_API_KEY",
    "HERMES_WEB_SEARCH_PROVIDER",
    "HERMES_WEB_EXTRACT",
    "FIRECRAWL_API_KEY",
)
# Flagged by the approval table (it carries SQL DROP text) but harmless: it only appends
# a line to ran.log in the current directory, so each run of it is counted.
FLAGGED = r"printf '%s\n' 'DROP TABLE a' >> ran.log"
# a regex sees the normalised words (quotes removed), not the text as written
FLAGGED_REGEX = r"re:printf %s\\n DROP TABLE \w+"
PROMPT = "Allow it? [o]nce, [s]ession, [a]lways, [N]o:"

TERMINAL_TWICE = f"""\
import json
from hermes_tools import terminal
for _ in range(2):
    print(json.dumps(terminal({FLAGGED!r})))
"""


def write_config(path: Path, settings: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(settings))
    return path


def default_config(cwd: Path) -> Path:
    """Where the command line looks for its config file in these tests (see cli_env)."""
    return cwd / "xdg-config" / "hermes-sandbox" / "config.yaml"


def runs(cwd: Path) -> list[str]:
    log = cwd / "ran.log"
    return log.read_text().splitlines() if log.exists() else []


def results(done: subprocess.CompletedProcess | str) -> list[dict]:
    """The JSON lines the script printed, from a --json run's output."""
    text = done if isinstance(done, str) else done.stdout
    output = json.loads(text)["output"]
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


# -- the config file, and the flags over it -----------------------------------------------

PROBE = """\
import json, os
from hermes_tools import read_file
try:
    from hermes_tools import terminal
    has_terminal = True
except ImportError:
    has_terminal = False
calls = [read_file("data.txt"), read_file("data.txt")]
print(json.dumps({
    "cwd": os.getcwd(),
    "env": [os.environ.get("FROM_CONFIG"), os.environ.get("OVERRIDDEN")],
    "terminal": has_terminal,
    "budget_errors": sum("error" in call for call in calls),
}))
"""


def probe(tmp_path: Path, *flags: str) -> dict:
    done = cli("run", str(tmp_path / "probe.py"), "--json", *flags, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (found,) = results(done)
    return found


def test_config_values_apply_when_flags_are_absent_and_flags_win(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    for name in ("from-config", "from-flag"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "data.txt").write_text("x\n")
    write_config(
        default_config(tmp_path),
        {
            "tools": ["read_file"],
            "cwd": str(tmp_path / "from-config"),
            "env": {"FROM_CONFIG": "config", "OVERRIDDEN": "config"},
            "limits": {"max_tool_calls": 1},
        },
    )
    found = probe(tmp_path)
    assert os.path.basename(found["cwd"]) == "from-config"
    assert found["env"] == ["config", "config"]
    assert found["terminal"] is False
    assert found["budget_errors"] == 1  # the second call is over the config's budget

    found = probe(
        tmp_path,
        "--tools", "read_file,terminal",
        "--cwd", str(tmp_path / "from-flag"),
        "--env", "OVERRIDDEN=flag",
        "--max-tool-calls", "5",
    )  # fmt: skip
    assert os.path.basename(found["cwd"]) == "from-flag"
    assert found["env"] == ["config", "flag"]  # --env adds to the config's env
    assert found["terminal"] is True
    assert found["budget_errors"] == 0


def test_toolsets_flag_replaces_the_configs_tool_selection(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "data.txt").write_text("x\n")
    write_config(default_config(tmp_path), {"tools": ["read_file"], "toolsets": ["terminal"]})
    assert probe(tmp_path)["terminal"] is True
    assert probe(tmp_path, "--toolsets", "file")["terminal"] is False


def test_timeout_from_the_config_and_over_it(tmp_path):
    (tmp_path / "slow.py").write_text("import time\ntime.sleep(1.5)\nprint('done')\n")
    config = write_config(tmp_path / "my.yaml", {"limits": {"timeout": 0.5}})
    done = cli("run", "slow.py", "--json", "--config", str(config), cwd=tmp_path)
    assert done.returncode == 124, done.stderr
    assert json.loads(done.stdout)["status"] == "timeout"
    done = cli("run", "slow.py", "--json", "--config", str(config), "--timeout", "30", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output"] == "done\n"


def test_backend_from_the_config_and_over_it(tmp_path):
    (tmp_path / "script.py").write_text("print('ran')\n")
    write_config(default_config(tmp_path), {"backend": "ssh"})
    # the ssh backend needs settings the config does not give: it is the one the run
    # tried, and it says so
    assert_usage_error(cli("run", "script.py", cwd=tmp_path), "ssh", "host")
    done = cli("run", "script.py", "--backend", "local", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ran\n"


def test_a_backend_section_is_checked_by_its_backend(tmp_path):
    (tmp_path / "script.py").write_text("print('ran')\n")
    write_config(default_config(tmp_path), {"backends": {"ssh": {"hots": "x"}}})
    assert_usage_error(cli("run", "script.py", cwd=tmp_path), "backends.ssh", "hots")
    write_config(default_config(tmp_path), {"backend": "ssh", "backends": {"ssh": {"host": "h"}}})
    # the section reaches the backend: with a host set, it goes on to connect (and
    # fails there, on a name that does not resolve), overridden by -o
    done = cli("run", "script.py", "-o", "host=no-such-host.invalid", cwd=tmp_path)
    assert done.returncode != 0
    assert "no-such-host.invalid" in done.stderr


def test_output_limits_and_spill_dir_from_the_config(tmp_path):
    (tmp_path / "loud.py").write_text("print('x' * 5000)\n")
    spill = tmp_path / "spill"
    write_config(
        default_config(tmp_path),
        {"spill_dir": str(spill), "limits": {"max_stdout_bytes": 1000}},
    )
    done = cli("run", "loud.py", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["stdout_truncated"] is True
    assert result["stdout_bytes_captured"] == 1000
    assert result["stdout_bytes_total"] == 5001
    assert [p.stat().st_size for p in spill.iterdir()] == [5001]


def test_workspace_root_from_the_config(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "inside.txt").write_text("in\n")
    (tmp_path / "outside.txt").write_text("out\n")
    (tmp_path / "script.py").write_text(
        "import json\nfrom hermes_tools import read_file\n"
        f"print(json.dumps(read_file({str(tmp_path / 'ws' / 'inside.txt')!r})))\n"
        f"print(json.dumps(read_file({str(tmp_path / 'outside.txt')!r})))\n"
    )
    write_config(default_config(tmp_path), {"workspace_root": str(tmp_path / "ws")})
    done = cli("run", "script.py", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    inside, outside = results(done)
    assert "in" in inside["content"]
    assert "outside the workspace" in outside["error"]


def test_local_python_from_the_config(tmp_path):
    """backends.local.python runs the script: a stand-in interpreter records its argv."""
    record = tmp_path / "argv.txt"
    stand_in = tmp_path / "stand-in-python"
    stand_in.write_text(
        f'#!/bin/sh\nprintf \'%s\\n\' "$@" > {record}\nexec {sys.executable} "$@"\n'
    )
    stand_in.chmod(0o755)
    (tmp_path / "script.py").write_text("print('through the stand-in')\n")
    write_config(default_config(tmp_path), {"backends": {"local": {"python": str(stand_in)}}})
    done = cli("run", "script.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "through the stand-in\n"
    assert record.read_text().strip().endswith("script.py")


def test_local_python_from_the_command_line(tmp_path):
    """-o python=... for the local backend, as docs/backends.md says."""
    record = tmp_path / "argv.txt"
    stand_in = tmp_path / "stand-in-python"
    stand_in.write_text(
        f'#!/bin/sh\nprintf \'%s\\n\' "$@" > {record}\nexec {sys.executable} "$@"\n'
    )
    stand_in.chmod(0o755)
    (tmp_path / "script.py").write_text("print('through the stand-in')\n")
    done = cli("run", "script.py", "-o", f"python={stand_in}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "through the stand-in\n"
    assert record.read_text().strip().endswith("script.py")


def test_a_bad_backend_value_names_its_place(tmp_path):
    (tmp_path / "script.py").write_text("print('ran')\n")
    done = cli("run", "script.py", "--backend", "docker", "-o", "cpus=abc", cwd=tmp_path)
    assert_usage_error(done, "-o cpus=abc: expected a number, got 'abc'")
    config = write_config(default_config(tmp_path), {"backends": {"docker": {"memory": "lots"}}})
    done = cli("run", "script.py", cwd=tmp_path)
    assert_usage_error(done, f"backends.docker.memory in {config}: must be a size")
    write_config(default_config(tmp_path), {})
    done = cli("run", "script.py", "--image", "python:3.12-slim", cwd=tmp_path)
    assert_usage_error(done, "--image: the local backend runs no image")


def test_config_shapes_the_stub(tmp_path):
    write_config(default_config(tmp_path), {"tools": ["write_file"]})
    done = cli("stub", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "\ndef write_file(" in done.stdout
    assert "def read_file(" not in done.stdout


# -- providers ------------------------------------------------------------------------------


def without_web_settings() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in WEB_VARS}


def tools_listing(done: subprocess.CompletedProcess) -> dict[str, str]:
    assert done.returncode == 0, done.stderr
    return {line.split()[0]: line for line in done.stdout.splitlines()}


def test_providers_are_exported_before_the_tools_load(tmp_path):
    pytest.importorskip("httpx")
    env = without_web_settings()
    listed = tools_listing(cli("tools", cwd=tmp_path, env=env))
    assert " unavailable " in listed["web_search"]
    assert (
        "(configured by SEARXNG_URL, BRAVE_SEARCH_API_KEY, TAVILY_API_KEY)"
        in (listed["web_search"])
    )

    def searxng(request: Request) -> Reply:
        query = request.param("q")
        return Reply.json({"results": [{"url": "https://example.org/", "title": f"{query}!"}]})

    with LocalHTTPServer() as server:
        server.route("/search", searxng)
        config = write_config(tmp_path / "web.yaml", {"providers": {"SEARXNG_URL": server.url()}})
        listed = tools_listing(cli("tools", "--config", str(config), cwd=tmp_path, env=env))
        assert " available " in listed["web_search"]

        (tmp_path / "search.py").write_text(
            "import json\nfrom hermes_tools import web_search\n"
            "print(json.dumps(web_search('hermes')))\n"
        )
        done = cli(
            "run", "search.py", "--json", "--tools", "web_search", "--config", str(config),
            cwd=tmp_path, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        (found,) = results(done)
        assert found["provider"] == "searxng"
        assert [r["title"] for r in found["results"]] == ["hermes!"]
        assert server.requests[-1].param("q") == "hermes"


# -- bad config files: exit 2, one line, no traceback -------------------------------------


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("limits: {timeot: 3}\n", ["limits", "timeot", "unknown setting"]),
        ("tools: [read_file\nlimits: {}\n", ["not valid YAML", "line"]),
        ("limits: {timeout: -1}\n", ["limits.timeout", "more than 0"]),
        ("approvals: {allowlist: ['re:(']}\n", ["approvals.allowlist[0]", "regex"]),
        ("env: {'A B': x}\n", ["env.A B", "variable name"]),
        ("backend: nosuch\n", ["backend", "nosuch"]),
    ],
    ids=["unknown-key", "bad-yaml", "bad-value", "bad-regex", "bad-env-name", "bad-backend"],
)
@pytest.mark.parametrize("command", ["run", "stub", "tools"])
def test_a_bad_config_file_is_one_line(tmp_path, text, words, command):
    (tmp_path / "script.py").write_text("print(1)\n")
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    args = ["run", "script.py"] if command == "run" else [command]
    done = cli(*args, "--config", str(config), cwd=tmp_path)
    assert_usage_error(done, str(config), *words)


def test_a_bad_default_config_file_is_one_line_too(tmp_path):
    (tmp_path / "script.py").write_text("print(1)\n")
    default_config(tmp_path).parent.mkdir(parents=True)
    default_config(tmp_path).write_text("limits: [\n")
    assert_usage_error(cli("run", "script.py", cwd=tmp_path), "config.yaml", "not valid YAML")


@pytest.mark.parametrize("command", ["run", "stub", "tools"])
def test_a_missing_config_file_is_an_error(tmp_path, command):
    (tmp_path / "script.py").write_text("print(1)\n")
    args = ["run", "script.py"] if command == "run" else [command]
    done = cli(*args, "--config", "missing.yaml", cwd=tmp_path)
    assert_usage_error(done, "config file not found", "missing.yaml")


def test_a_bad_allow_command_regex_is_one_line(tmp_path):
    (tmp_path / "script.py").write_text("print(1)\n")
    done = cli("run", "script.py", "--allow-command", "re:(", cwd=tmp_path)
    assert_usage_error(done, "--allow-command", "re:(")


# -- dangerous commands without a terminal ---------------------------------------------------


def test_a_flagged_command_is_refused_without_a_terminal(tmp_path):
    (tmp_path / "script.py").write_text(TERMINAL_TWICE)
    done = cli("run", "script.py", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for result in results(done):
        assert result["approval_required"] is True
        assert "no one can approve" in result["error"]
    assert runs(tmp_path) == []


@pytest.mark.parametrize("entry", [FLAGGED, FLAGGED_REGEX], ids=["exact", "regex"])
def test_allow_command_lets_a_flagged_command_run(tmp_path, entry):
    (tmp_path / "script.py").write_text(TERMINAL_TWICE)
    config = write_config(default_config(tmp_path), {"limits": {"timeout": 60}})
    before = config.read_text()
    done = cli("run", "script.py", "--json", "--allow-command", entry, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [r.get("exit_code") for r in results(done)] == [0, 0]
    assert runs(tmp_path) == ["DROP TABLE a", "DROP TABLE a"]
    assert config.read_text() == before  # for this invocation only: nothing saved


def test_the_configs_allowlist_lets_a_flagged_command_run(tmp_path):
    (tmp_path / "script.py").write_text(TERMINAL_TWICE)
    write_config(default_config(tmp_path), {"approvals": {"allowlist": [FLAGGED_REGEX]}})
    done = cli("run", "script.py", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert runs(tmp_path) == ["DROP TABLE a", "DROP TABLE a"]


def test_a_script_read_from_stdin_is_never_asked(tmp_path):
    """With ``-`` stdin holds the script, so nobody can answer there: refused, not asked."""
    done = cli("run", "-", "--json", cwd=tmp_path, stdin=TERMINAL_TWICE)
    assert done.returncode == 0, done.stderr
    assert all(r["approval_required"] for r in results(done))


# -- the prompt on a real terminal -----------------------------------------------------------

# Run the command line as the leader of a new session whose controlling terminal is its
# stdin, as a shell would, so that Ctrl-C typed on the terminal is a SIGINT to it.
SESSION_LEADER = (
    "import fcntl, os, sys, termios\n"
    "os.setsid()\n"
    "fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
)


class TerminalSession:
    """``hermes-sandbox`` with stdin and stderr on a pseudo-terminal, stdout on a pipe.

    ``expect(text)`` reads what it writes on the terminal until ``text`` appears;
    ``type(text)`` types on the keyboard; ``finish()`` waits for the exit.
    """

    def __init__(self, *args: str, cwd: Path) -> None:
        self.master, slave = os.openpty()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", SESSION_LEADER, *CLI[1:], *args],
                cwd=cwd,
                stdin=slave,
                stdout=subprocess.PIPE,
                stderr=slave,
                env=cli_env(cwd),
            )
        finally:
            os.close(slave)
        self.screen = ""

    def _read(self, deadline: float) -> bool:
        """Read what is there; False once the terminal is closed on the other side."""
        ready, _, _ = select.select([self.master], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return True
        try:
            chunk = os.read(self.master, 4096)
        except OSError:  # EIO: every process holding the terminal has gone
            return False
        self.screen += chunk.decode(errors="replace")
        return bool(chunk)

    def expect(self, text: str, count: int = 1, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.screen.count(text) < count:
            if time.monotonic() > deadline or not self._read(deadline):
                raise AssertionError(f"{text!r} x{count} never appeared; terminal:\n{self.screen}")

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def finish(self, timeout: float = 30) -> tuple[int, str]:
        """Wait for the exit; the exit code and what was written to stdout."""
        stdout, _ = self.process.communicate(timeout=timeout)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and self._read(deadline):
            pass
        return self.process.returncode, stdout.decode()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.process.stdout:
            self.process.stdout.close()
        os.close(self.master)


@pytest.fixture
def terminal_session():
    sessions: list[TerminalSession] = []

    def start(*args: str, cwd: Path) -> TerminalSession:
        sessions.append(TerminalSession(*args, cwd=cwd))
        return sessions[-1]

    yield start
    for session in sessions:
        session.close()


def test_session_approval_is_asked_once(tmp_path, terminal_session):
    (tmp_path / "script.py").write_text(TERMINAL_TWICE)
    session = terminal_session("run", "script.py", "--json", cwd=tmp_path)
    session.expect(PROMPT)
    assert FLAGGED in session.screen
    assert "- it drops a database, schema or table (SQL DROP)" in session.screen
    session.type("s\n")
    code, stdout = session.finish()
    assert code == 0, session.screen
    assert [r.get("exit_code") for r in results(stdout)] == [0, 0]
    assert runs(tmp_path) == ["DROP TABLE a", "DROP TABLE a"]
    assert session.screen.count(PROMPT) == 1  # the second, identical command was not asked
    assert not default_config(tmp_path).exists()  # "session" saves nothing


def test_always_approval_is_saved_to_the_config_file(tmp_path, terminal_session):
    (tmp_path / "script.py").write_text(TERMINAL_TWICE)
    config = write_config(tmp_path / "my.yaml", {"limits": {"timeout": 60}})
    config.chmod(0o600)
    session = terminal_session("run", "script.py", "--json", "--config", str(config), cwd=tmp_path)
    session.expect(PROMPT)
    session.type("a\n")
    code, stdout = session.finish()
    assert code == 0, session.screen
    assert [r.get("exit_code") for r in results(stdout)] == [0, 0]
    assert runs(tmp_path) == ["DROP TABLE a", "DROP TABLE a"]
    assert session.screen.count(PROMPT) == 1
    assert f"added to the allowlist in {config}" in session.screen
    saved = yaml.safe_load(config.read_text())
    assert saved == {
        "limits": {"timeout": 60},
        "approvals": {"allowlist": [normalise_command(FLAGGED)]},
    }
    assert stat.S_IMODE(config.stat().st_mode) == 0o600  # it may hold provider keys

    # the next run, with no terminal at all, is allowed by the saved entry
    done = cli("run", "script.py", "--json", "--config", str(config), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert len(runs(tmp_path)) == 4


def test_always_approval_without_a_config_file_creates_the_default_one(tmp_path, terminal_session):
    (tmp_path / "script.py").write_text(TERMINAL_TWICE)
    session = terminal_session("run", "script.py", "--json", cwd=tmp_path)
    session.expect(PROMPT)
    session.type("always\n")
    code, _ = session.finish()
    assert code == 0, session.screen
    config = default_config(tmp_path)
    assert yaml.safe_load(config.read_text()) == {
        "approvals": {"allowlist": [normalise_command(FLAGGED)]}
    }
    assert stat.S_IMODE(config.stat().st_mode) == 0o600


def test_enter_denies_and_an_unknown_answer_asks_again(tmp_path, terminal_session):
    (tmp_path / "script.py").write_text(TERMINAL_TWICE)
    session = terminal_session("run", "script.py", "--json", cwd=tmp_path)
    session.expect(PROMPT)
    session.type("maybe\n")
    session.expect("Please answer o, s, a or n.")
    session.expect(PROMPT, count=2)
    session.type("\n")  # the default: no
    session.expect(PROMPT, count=3)  # denied, so the second call asks again
    session.type("o\n")
    code, stdout = session.finish()
    assert code == 0, session.screen
    denied, allowed = results(stdout)
    assert denied["approval_required"] is True
    assert "the human denied it" in denied["error"]
    assert allowed["exit_code"] == 0
    assert runs(tmp_path) == ["DROP TABLE a"]


def test_control_characters_in_the_command_are_shown_escaped(tmp_path, terminal_session):
    hidden = "printf '%s\\n' 'DROP TABLE a' >> ran.log # \x1b[2K\r innocent"
    (tmp_path / "script.py").write_text(
        f"import json\nfrom hermes_tools import terminal\nprint(json.dumps(terminal({hidden!r})))\n"
    )
    session = terminal_session("run", "script.py", "--json", cwd=tmp_path)
    session.expect(PROMPT)
    assert "\x1b" not in session.screen
    assert r"# \x1b[2K\r innocent" in session.screen
    session.type("n\n")
    code, _ = session.finish()
    assert code == 0, session.screen


def test_ctrl_c_at_the_prompt_interrupts_the_run(tmp_path, terminal_session):
    (tmp_path / "script.py").write_text(TERMINAL_TWICE)
    session = terminal_session("run", "script.py", "--json", cwd=tmp_path)
    session.expect(PROMPT)
    started = time.monotonic()
    session.type("\x03")  # Ctrl-C, turned into SIGINT by the terminal
    code, stdout = session.finish(timeout=20)
    assert code == 130, session.screen
    assert time.monotonic() - started < 18  # finish() gives up at 20 s
    assert json.loads(stdout)["status"] == "interrupted"
    assert "Traceback" not in session.screen
    assert runs(tmp_path) == []


def test_sigterm_at_the_prompt_stops_the_run(tmp_path, terminal_session):
    (tmp_path / "script.py").write_text(TERMINAL_TWICE)
    session = terminal_session("run", "script.py", "--json", cwd=tmp_path)
    session.expect(PROMPT)
    session.process.send_signal(signal.SIGTERM)
    code, stdout = session.finish(timeout=20)
    assert json.loads(stdout)["status"] == "interrupted"
    assert code == 130, session.screen


def test_the_readme_example_config_is_valid():
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    example = readme.split("```yaml\n", 1)[1].split("```", 1)[0]
    config = parse_config(example, "README.md")
    assert config.approvals.allowlist[1].startswith("re:")


def test_old_spill_files_are_swept_at_the_start_of_a_run(tmp_path):
    (tmp_path / "loud.py").write_text("print('x' * 5000)\n")
    spill = tmp_path / "spill"
    spill.mkdir()
    two_hours_ago = time.time() - 7200
    old, fresh, other = spill / "stdout-old.txt", spill / "stdout-fresh.txt", spill / "notes.txt"
    for path in (old, fresh, other):
        path.write_text("kept?\n")
    os.utime(old, (two_hours_ago, two_hours_ago))
    os.utime(other, (two_hours_ago, two_hours_ago))
    write_config(
        default_config(tmp_path),
        {"spill_dir": str(spill), "limits": {"max_stdout_bytes": 1000, "spill_retention": 3600}},
    )
    done = cli("run", "loud.py", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    spilled = json.loads(done.stdout)["stdout_spill_path"]
    assert not old.exists()  # older than the hour kept
    assert fresh.exists() and other.exists()  # too young, and not a spill file
    assert os.path.getsize(spilled) == 5001  # this run's own


def test_spill_retention_must_be_positive(tmp_path):
    (tmp_path / "script.py").write_text("print(1)\n")
    write_config(default_config(tmp_path), {"limits": {"spill_retention": 0}})
    done = cli("run", "script.py", cwd=tmp_path)
    assert done.returncode != 0
    assert "spill_retention" in done.stderr
