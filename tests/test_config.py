"""The YAML config file: parsing, refusal of unknown keys, lookup, persistence."""

from __future__ import annotations

import pytest
import yaml

from sandbox.config import (
    Config,
    ConfigError,
    LimitsConfig,
    add_to_allowlist,
    load_config,
    parse_config,
)


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
    assert config.backends.local.python == "/usr/bin/python3"


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
        ("backends: {local: {pyton: x}}", "backends.local: unknown setting pyton"),
        ("limits: [", "not valid YAML"),
    ],
)
def test_bad_settings_are_refused_with_their_place(text, message):
    with pytest.raises(ConfigError) as info:
        parse_config(text, "my.yaml")
    assert str(info.value).startswith("my.yaml: ")
    assert message in str(info.value)


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
