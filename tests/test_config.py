"""The YAML config file: parsing, refusal of unknown keys, lookup, persistence."""

from __future__ import annotations

import stat

import pytest
import yaml

from hermes_sandbox.config import (
    Config,
    ConfigError,
    LimitsConfig,
    add_to_allowlist,
    load_config,
    parse_config,
)
from hermes_sandbox.errors import SettingError


def test_empty_file_gives_defaults():
    assert parse_config("") == Config(path="config")


def test_full_example_parses_into_typed_values():
    config = parse_config(
        """
        backend: local
        tools: read_file, terminal
        toolsets: [file]
        workspace_root: ~/work
        env: {PIP_INDEX_URL: "http://x", NUMBER: 3}
        providers: {SEARXNG_URL: "http://127.0.0.1:1"}
        limits: {timeout: 5, max_tool_calls: 7}
        approvals: {allowlist: ["rm -rf ./build"]}
        backends: {local: {python: /usr/bin/python3}}
        """
    )
    assert config.tools == ["read_file", "terminal"]
    assert config.toolsets == ["file"]
    assert config.env == {"PIP_INDEX_URL": "http://x", "NUMBER": "3"}
    assert config.limits == LimitsConfig(timeout=5.0, max_tool_calls=7)
    assert isinstance(config.limits.timeout, float)
    assert config.approvals.allowlist == ["rm -rf ./build"]
    assert config.backend_settings("local").python == "/usr/bin/python3"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("limits: {timeot: 3}", "limits: unknown setting timeot"),
        ("bakend: local", "unknown setting bakend"),
        ("limits: {timeout: abc}", "limits.timeout: expected a number"),
        ("limits: {max_tool_calls: 2.5}", "limits.max_tool_calls: expected a whole number"),
        ("limits: {max_tool_calls: true}", "expected a whole number"),
        ("tools: 3", "tools: expected a list"),
        ("env: [a, b]", "env: expected a mapping"),
        ("- just a list", "top level must be a mapping"),
        ("backends: {dockr: {}}", "backends.dockr: unknown backend"),
        ("backends: {docker: [a]}", "backends.docker: expected a mapping"),
        ("limits: [", "not valid YAML, line 1, column 10"),
        ("limits: {timeout: 0}", "limits.timeout: must be more than 0"),
        ("limits: {max_stdout_bytes: -1}", "limits.max_stdout_bytes: must be 0 or more"),
        ("limits: {kill_grace: -2}", "limits.kill_grace: must be 0 seconds or more"),
        ("backend: dockr", "backend: unknown backend 'dockr'"),
        ("approvals: {allowlist: ['re:[']}", "approvals.allowlist[0]: 're:[' is not a valid"),
        ("approvals: {allowlist: ['  ']}", "approvals.allowlist[0]: an entry must not be"),
        ("providers: {'BAD-NAME': x}", "providers.BAD-NAME: not a valid environment variable"),
        ("limits:\n", ""),  # an empty section is the defaults, not an error
    ],
)
def test_bad_settings_are_refused_with_their_place(text, message):
    if not message:
        assert parse_config(text, "my.yaml") == Config()
        return
    with pytest.raises(ConfigError) as info:
        parse_config(text, "my.yaml")
    assert str(info.value).startswith("my.yaml: ")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("backends: {local: {pyton: x}}", "backends.local in my.yaml: unknown local backend"),
        ("backends: {docker: {memory: lots}}", "backends.docker.memory in my.yaml: must be a size"),
        ("backends: {docker: {cpus: abc}}", "backends.docker.cpus in my.yaml: expected a number"),
        ("backends: {docker: {network: maybe}}", "backends.docker.network in my.yaml: expected"),
        ("backends: {ssh: {port: 22}}", "backends.ssh in my.yaml: the ssh backend needs a host"),
        ("backends: {daytona: {api_key: k}}", "backends.daytona.api_key in my.yaml: api_key is"),
    ],
)
def test_a_backend_section_is_checked_by_its_settings_class(text, message):
    with pytest.raises(SettingError) as info:
        parse_config(text, "my.yaml")
    assert str(info.value).startswith(message)
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)


def test_lookup_order(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("HERMES_SANDBOX_CONFIG", raising=False)
    assert load_config() == Config()  # no default file: defaults

    default = tmp_path / "xdg" / "hermes-sandbox" / "config.yaml"
    default.parent.mkdir(parents=True)
    default.write_text("limits: {timeout: 11}\n")
    assert load_config().limits.timeout == 11

    via_env = tmp_path / "env.yaml"
    via_env.write_text("limits: {timeout: 22}\n")
    monkeypatch.setenv("HERMES_SANDBOX_CONFIG", str(via_env))
    assert load_config().limits.timeout == 22

    explicit = tmp_path / "explicit.yaml"
    explicit.write_text("limits: {timeout: 33}\n")
    assert load_config(str(explicit)).limits.timeout == 33


def test_a_named_file_that_is_missing_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(str(tmp_path / "nope.yaml"))


def test_providers_are_exported_without_overriding(monkeypatch):
    environ = {"ALREADY": "mine"}
    parse_config("providers: {ALREADY: theirs, NEW: value}").apply_providers(environ)
    assert environ == {"ALREADY": "mine", "NEW": "value"}


def test_always_approvals_are_persisted_once(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("limits: {timeout: 9}\n")
    add_to_allowlist(str(path), "rm -rf ./build")
    add_to_allowlist(str(path), "rm -rf ./build")
    add_to_allowlist(str(path), "systemctl restart app")
    data = yaml.safe_load(path.read_text())
    assert data["limits"] == {"timeout": 9}
    assert data["approvals"]["allowlist"] == ["rm -rf ./build", "systemctl restart app"]
    assert load_config(str(path)).approvals.allowlist == data["approvals"]["allowlist"]


def test_persisting_keeps_the_files_mode_and_makes_new_files_private(tmp_path):
    shared = tmp_path / "shared.yaml"
    shared.write_text("backend: local\n")
    shared.chmod(0o640)
    add_to_allowlist(str(shared), "make deploy")
    assert stat.S_IMODE(shared.stat().st_mode) == 0o640
    fresh = tmp_path / "new" / "config.yaml"
    add_to_allowlist(str(fresh), "make deploy")
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600
    assert load_config(str(fresh)).approvals.allowlist == ["make deploy"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new", "shared.yaml"]  # no temp


@pytest.mark.parametrize(
    ("text", "message"),
    [("limits: [", "not valid YAML"), ("- a list", "mapping"), ("approvals: 3", "approvals")],
)
def test_persisting_into_a_bad_file_is_a_config_error(tmp_path, text, message):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        add_to_allowlist(str(path), "make deploy")
    assert path.read_text() == text
