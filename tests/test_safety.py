"""End-to-end tests of the security envelope: the scrubbed environment, where the run's
secrets travel (and where they do not), the socket's permissions and token check, and
the removal of the staging directory."""

from __future__ import annotations

import json
import os
import textwrap

import pytest
from conftest import RAW_ASK

from hermes_sandbox.childenv import SCRIPT_DEFAULTS, scrub_environment, timezone_setting

SECRET_NAMES = (
    "OPENAI_API_KEY",
    "MY_TOKEN",
    "DB_PASSWORD",
    "SENTRY_DSN",
    "SLACK_WEBHOOK_URL",
    "GH_AUTH",
    "AWS_SECRET_ACCESS_KEY",
    "SOME_CREDS",
    "X_BEARER",
    # Names that start like harmless ones but carry a secret marker.
    "HOME_API_KEY",
    "LC_SECRET",
    "XDG_AUTH_TOKEN",
    "TERM_PASSWD",
    "PATH_CREDENTIALS",
)
SECRETS = {name: f"s3cr3t-value-of-{name.lower()}" for name in SECRET_NAMES}
NOT_ALLOWLISTED = {
    "RANDOM_VAR": "random-value",
    "BYPASS_CACHE": "bypass-value",
    # They start like allowed names, and carry no secret marker: only an exact-name
    # allowlist keeps them out (issue #11).
    "USER_PASS": "user-pass-value",
    "USERDB_URL": "postgres://u:pw@db/users",
    "HOMEASSISTANT_PIN": "1234",
    "XDG_SESSION_COOKIE": "cookie-value",
    "PATHWAY_SECRETS_FILE": "/srv/s.json",
    "TERM_SERVER_PIN": "9876",
}
ALLOWED = ("PATH", "HOME", "LANG", "LC_TIME")

DUMP_ENV = """
import json, os
from hermes_tools import terminal
shell = terminal("env")["output"]
print(json.dumps({"script": dict(os.environ), "terminal": shell}))
"""


@pytest.fixture
def host_secrets(monkeypatch):
    for name, value in {**SECRETS, **NOT_ALLOWLISTED}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("LC_TIME", "C.UTF-8")


def test_script_and_terminal_see_a_scrubbed_environment(run, host_secrets):
    result = run(DUMP_ENV)
    assert result.status == "success", result.output
    seen = json.loads(result.output)
    script_env, terminal_env = seen["script"], seen["terminal"]
    for name in [*SECRETS, *NOT_ALLOWLISTED]:
        assert name not in script_env, f"{name} reached the script"
        assert f"{name}=" not in terminal_env, f"{name} reached the terminal tool"
    for value in [*SECRETS.values(), *NOT_ALLOWLISTED.values()]:
        assert value not in terminal_env
        assert value not in script_env.values()
    for name in ALLOWED:
        assert script_env[name] == os.environ[name]
        assert f"\n{name}={os.environ[name]}\n" in "\n" + terminal_env
    # The run's own secret is the script's alone, not its shell commands'.
    assert "HERMES_RPC_TOKEN" in script_env
    assert "HERMES_RPC_TOKEN" not in terminal_env


def test_only_exact_names_and_the_locale_family_pass_the_scrubber():
    host = {name: "v" for name in [*SECRETS, *NOT_ALLOWLISTED]}
    allowed = ["PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TERM", "TMPDIR"]
    allowed += ["TZ", "SHELL", "VIRTUAL_ENV", "XDG_RUNTIME_DIR", "LC_ALL", "LC_CTYPE"]
    host.update({name: "ok" for name in allowed})
    env = scrub_environment(host)
    assert {name for name in env if name not in SCRIPT_DEFAULTS} == set(allowed)
    # the lower-case spelling of an allowed name is another variable
    assert scrub_environment({"path": "x", "Home": "y"}) == SCRIPT_DEFAULTS


def test_the_agents_time_zone_becomes_tz_and_its_locations_pass(run, monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.setenv("HERMES_TIMEZONE", "  Asia/Kolkata ")
    monkeypatch.setenv("HERMES_HOME", "/srv/hermes-home")
    monkeypatch.setenv("HERMES_PROFILE", "work")
    monkeypatch.setenv("HERMES_BASE_URL", "http://not-for-scripts")
    result = run(
        """
        import json, os, time
        from hermes_tools import terminal
        shell = terminal("date +%z; echo $TZ")["output"].split()
        print(json.dumps({"env": dict(os.environ), "offset": time.strftime("%z"),
                          "shell": shell}))
        """
    )
    assert result.status == "success", result.output
    seen = json.loads(result.output)
    assert seen["env"]["TZ"] == "Asia/Kolkata"
    assert seen["offset"] == "+0530" and seen["shell"] == ["+0530", "Asia/Kolkata"]
    assert "HERMES_TIMEZONE" not in seen["env"]
    assert seen["env"]["HERMES_HOME"] == "/srv/hermes-home"
    assert seen["env"]["HERMES_PROFILE"] == "work"
    assert "HERMES_BASE_URL" not in seen["env"]


def test_the_time_zone_and_hermes_locations_in_the_scrubber():
    host = {"TZ": "UTC", "HERMES_HOME": "/h", "HERMES_PROFILE": "p", "HERMES_TIMEZONE": "X"}
    host |= {"HERMES_CONFIG": "/h/c.yaml", "HERMES_ENV": "/h/.env", "HERMES_KANBAN_DB": "db"}
    env = scrub_environment(host, timezone=timezone_setting(host))
    assert {k: v for k, v in env.items() if k not in SCRIPT_DEFAULTS} == {
        "TZ": "X",
        "HERMES_HOME": "/h",
        "HERMES_PROFILE": "p",
        "HERMES_CONFIG": "/h/c.yaml",
        "HERMES_ENV": "/h/.env",
    }
    # unset or blank: the host's TZ stays; the caller's explicit TZ wins over the setting
    assert timezone_setting({"HERMES_TIMEZONE": "  "}) is None
    assert scrub_environment({"TZ": "UTC"}, timezone=None)["TZ"] == "UTC"
    assert scrub_environment({}, {"TZ": "Europe/Paris"}, timezone="X")["TZ"] == "Europe/Paris"
    # a container starts from nothing of the host's, but gets the time zone
    assert scrub_environment({}, timezone="Asia/Tokyo")["TZ"] == "Asia/Tokyo"


def test_explicit_env_passes(run, host_secrets):
    result = run(DUMP_ENV, env={"RANDOM_VAR": "x"})
    seen = json.loads(result.output)
    assert seen["script"]["RANDOM_VAR"] == "x"
    assert "BYPASS_CACHE" not in seen["script"]
    assert "OPENAI_API_KEY" not in seen["script"]


def test_token_and_endpoint_travel_in_the_environment_not_argv(run, transport):
    result = run(
        """
        import json, os, stat
        name = "HERMES_RPC_DIR" if "HERMES_RPC_DIR" in os.environ else "HERMES_RPC_SOCKET"
        endpoint = os.environ[name]
        with open("/proc/self/cmdline", "rb") as f:
            cmdline = f.read().decode()
        with open("/proc/self/environ", "rb") as f:
            environ = f.read().decode()
        print(json.dumps({
            "token": os.environ["HERMES_RPC_TOKEN"],
            "name": name,
            "endpoint": endpoint,
            "cmdline": cmdline,
            "environ": environ,
            "mode": stat.S_IMODE(os.stat(endpoint).st_mode),
            "is_socket": stat.S_ISSOCK(os.stat(endpoint).st_mode),
            "dir_mode": stat.S_IMODE(os.stat(os.path.dirname(endpoint)).st_mode),
        }))
        """
    )
    assert result.status == "success", result.output
    seen = json.loads(result.output)
    assert len(seen["token"]) >= 32
    assert seen["token"] not in seen["cmdline"]
    assert seen["endpoint"] not in seen["cmdline"]
    assert f"HERMES_RPC_TOKEN={seen['token']}" in seen["environ"].split("\0")
    assert f"{seen['name']}={seen['endpoint']}" in seen["environ"].split("\0")
    assert seen["dir_mode"] == 0o700
    if transport == "files":
        assert seen["name"] == "HERMES_RPC_DIR"
        assert seen["mode"] == 0o700  # the calls directory itself
    else:
        assert seen["is_socket"]
        assert seen["mode"] == 0o600


def test_each_run_gets_a_fresh_token(run):
    code = "import os\nprint(os.environ['HERMES_RPC_TOKEN'])"
    tokens = {run(code).output.strip() for _ in range(3)}
    assert len(tokens) == 3
    assert all(tokens)


def test_wrong_token_is_refused_and_not_counted(run, tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("content\n")
    result = run(
        f"""
        import json, os
        from hermes_tools import read_file
{textwrap.indent(RAW_ASK, " " * 8)}
        request = {{"id": 7, "tool": "read_file", "args": {{"path": {str(data)!r}}}}}
        replies = [
            ask({{**request, "token": "wrong"}}),
            ask({{**request, "token": ""}}),
            ask({{**request, "token": os.environ["HERMES_RPC_TOKEN"][:-1]}}),
            ask(request),  # no token at all
        ]
        good = read_file({str(data)!r})
        print(json.dumps({{"replies": replies, "good": good}}))
        """
    )
    assert result.status == "success", result.output
    seen = json.loads(result.output)
    for reply in seen["replies"]:
        assert reply["id"] == 7
        assert "result" not in reply
        assert reply["error"]["kind"] == "unauthorized"
    assert seen["good"]["content"] == "content\n"
    assert result.tool_calls_made == 1  # only the authorized call


PRINT_STAGE = """
import os, time
print(os.environ["PYTHONPATH"].split(os.pathsep)[0], flush=True)
time.sleep({sleep})
"""


@pytest.mark.parametrize(("sleep", "status"), [(0, "success"), (60, "timeout")])
def test_staging_directory_is_removed(run, sleep, status):
    result = run(PRINT_STAGE.format(sleep=sleep), timeout=1.5)
    assert result.status == status
    stage = result.output.splitlines()[0]
    assert os.path.basename(stage).startswith("hermes-sandbox-")
    assert not os.path.exists(stage)
