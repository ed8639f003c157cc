"""The config file: what a user sets once, in YAML; the command line overrides it.

Looked up at ``--config PATH``, else ``$HERMES_SANDBOX_CONFIG``, else
``$XDG_CONFIG_HOME/hermes-sandbox/config.yaml`` (``~/.config/...``). A missing default
file means all defaults; a missing file that was named explicitly is an error. Unknown
keys are refused, so a typo does not silently do nothing, and so are values out of range
(a timeout of 0, an allowlist regex that does not compile). Example::

    backend: local
    tools: [read_file, write_file, terminal]
    workspace_root: ~/work
    limits:
      timeout: 120
      max_tool_calls: 100
    env:                      # passed into every script's scrubbed environment
      PIP_INDEX_URL: https://pypi.example/simple
    providers:                # set on the host for tools that need them (web_search, ...)
      SEARXNG_URL: http://127.0.0.1:8888
    approvals:
      allowlist:              # dangerous commands allowed without asking
        - "rm -rf ./build"                      # this exact command
        - "re:systemctl restart (nginx|redis)"  # re: a regex a flagged part must match
    backends:                 # each backend's settings (docs/backends.md)
      local:
        python: /usr/bin/python3
      docker:
        image: python:3.12-slim
        memory: 2g
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hermes_sandbox.allowlist import ALLOWLIST_REGEX_PREFIX
from hermes_sandbox.environments import BACKENDS, BackendSettings, get_settings_class
from hermes_sandbox.environments.settings import Place, config_place
from hermes_sandbox.errors import ConfigError
from hermes_sandbox.spill import DEFAULT_SPILL_RETENTION

if TYPE_CHECKING:  # PyYAML is imported when a config file is read
    import yaml

ENV_VAR = "HERMES_SANDBOX_CONFIG"
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    timeout: float = 300.0
    max_tool_calls: int = 50
    max_stdout_bytes: int = 50_000
    max_stderr_bytes: int = 10_000
    max_spill_bytes: int = 5_000_000
    kill_grace: float = 2.0
    spill_retention: float = DEFAULT_SPILL_RETENTION  # seconds a spill file is kept

    def problems(self) -> Iterator[tuple[str, str]]:
        if not self.timeout > 0:
            yield "timeout", f"must be more than 0 seconds, got {self.timeout:g}"
        if not self.kill_grace >= 0:
            yield "kill_grace", f"must be 0 seconds or more, got {self.kill_grace:g}"
        if not self.spill_retention > 0:
            yield "spill_retention", f"must be more than 0 seconds, got {self.spill_retention:g}"
        for name in ("max_tool_calls", "max_stdout_bytes", "max_stderr_bytes", "max_spill_bytes"):
            if getattr(self, name) < 0:
                yield name, f"must be 0 or more, got {getattr(self, name)}"


@dataclass(frozen=True, slots=True)
class ApprovalsConfig:
    allowlist: list[str] = field(default_factory=list)

    def problems(self) -> Iterator[tuple[str, str]]:
        for index, entry in enumerate(self.allowlist):
            if not entry.strip():
                yield f"allowlist[{index}]", "an entry must not be empty"
            elif entry.startswith(ALLOWLIST_REGEX_PREFIX):
                try:
                    re.compile(entry[len(ALLOWLIST_REGEX_PREFIX) :])
                except re.error as exc:
                    yield f"allowlist[{index}]", f"{entry!r} is not a valid regex: {exc}"


@dataclass(frozen=True, slots=True)
class Config:
    backend: str = "local"
    tools: list[str] | None = None
    toolsets: list[str] | None = None
    cwd: str | None = None
    workspace_root: str | None = None
    spill_dir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    providers: dict[str, str] = field(default_factory=dict)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    approvals: ApprovalsConfig = field(default_factory=ApprovalsConfig)
    # One section per backend, ``backends.NAME``: the fields of its settings class
    # (environments/settings.py), checked by that class when the file is read.
    backends: dict[str, Any] = field(default_factory=dict)
    path: str | None = field(default=None, compare=False)  # where it was read from

    def problems(self) -> Iterator[tuple[str, str]]:
        if self.backend not in BACKENDS:
            known = ", ".join(BACKENDS)
            yield "backend", f"unknown backend {self.backend!r}; choose one of: {known}"
        for section in ("env", "providers"):
            for name in getattr(self, section):
                if not _VARIABLE_NAME.fullmatch(name):
                    yield f"{section}.{name}", "not a valid environment variable name"
        for name, section in self.backends.items():
            if name not in BACKENDS:
                yield f"backends.{name}", f"unknown backend; known: {', '.join(BACKENDS)}"
            elif section is not None and not isinstance(section, dict):
                yield f"backends.{name}", f"expected a mapping, got {_describe(section)}"

    def backend_layer(self, backend: str) -> tuple[dict[str, Any], Place]:
        """The config file's section for ``backend`` as a settings layer, with its place
        (``backends.NAME.FIELD in PATH``)."""
        return dict(self.backends.get(backend) or {}), config_place(backend, self.path)

    def backend_settings(self, backend: str) -> BackendSettings:
        """The settings the config file gives ``backend`` (its defaults where it gives
        none); raise SettingError naming the bad value and the file."""
        return get_settings_class(backend).build([self.backend_layer(backend)])

    def apply_providers(self, environ: typing.MutableMapping[str, str] = os.environ) -> None:
        """Export provider settings to the host's environment, where tools read them;
        a variable already set wins."""
        for name, value in self.providers.items():
            environ.setdefault(name, value)


def default_path() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "hermes-sandbox", "config.yaml")


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}" if not isinstance(value, dict) else "a mapping"


def _convert(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        inner = [o for o in options if o is not type(None)]
        return _convert(value, inner[0], where)
    if dataclasses.is_dataclass(hint):
        if value is None:
            return _build(hint, {}, where)
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {_describe(value)}")
        return _build(hint, value, where)
    if origin is list:
        (item,) = typing.get_args(hint)
        if isinstance(value, str) and item is str:
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {_describe(value)}")
        return [_convert(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {_describe(value)}")
        _, item = typing.get_args(hint)
        if item is Any:  # a backend's own section: its settings class checks it
            return {str(k): v for k, v in value.items()}
        return {str(k): _convert(v, str, f"{where}.{k}") for k, v in value.items()}
    if hint is str:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ConfigError(f"{where}: expected text, got {_describe(value)}")
        return str(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {_describe(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected a whole number, got {_describe(value)}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {_describe(value)}")
        return float(value)
    raise ConfigError(f"{where}: unsupported setting type {hint!r}")  # pragma: no cover


def _build(cls: Any, data: dict[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.name != "path"}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(
            f"{where}: unknown setting{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(str, unknown))}; known here: {', '.join(sorted(names))}"
        )
    values = {
        name: _convert(value, hints[name], f"{where}.{name}" if where else name)
        for name, value in data.items()
    }
    built = cls(**values)
    checks = built.problems() if hasattr(built, "problems") else iter(())
    first = next(checks, None)
    if first is not None:
        name, problem = first
        raise ConfigError(f"{where}.{name}: {problem}" if where else f"{name}: {problem}")
    return built


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error on one line: where, then what (PyYAML's own text spans several)."""
    import yaml

    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        what = "; ".join(part for part in (exc.context, exc.problem) if part)
        return f"line {mark.line + 1}, column {mark.column + 1}: {what}"
    return " ".join(str(exc).split())


def parse_config(text: str, source: str = "config") -> Config:
    """Parse YAML text into a Config; raise ConfigError naming the bad setting."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML, {_yaml_problem(exc)}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of settings")
    try:
        config = _build(Config, data, "")
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    config = dataclasses.replace(config, path=source)
    for backend in config.backends:
        config.backend_settings(backend)  # a bad value is refused now, with its place
    return config


def load_config(path: str | None = None) -> Config:
    """Read the config file (see the module docstring for where it is looked up)."""
    explicit = path or os.environ.get(ENV_VAR)
    target = os.path.expanduser(explicit) if explicit else default_path()
    try:
        with open(target, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"config file not found: {target}") from None
        return Config()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {target}: {exc.strerror or exc}") from None
    return parse_config(text, target)


def add_to_allowlist(path: str, pattern: str) -> None:
    """Persist an "always allow" approval: append ``pattern`` to approvals.allowlist.

    The file is rewritten whole (comments in it are lost), atomically, keeping its
    permissions; a new file is made readable by its owner only, since a config may hold
    provider keys. Raises :class:`ConfigError` when the file cannot be read, parsed or
    written.
    """
    import tempfile  # here only: reading a config file writes none

    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        data, mode = {}, 0o600
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML, {_yaml_problem(exc)}") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of settings")
    approvals = data.get("approvals") or {}
    if not isinstance(approvals, dict):
        raise ConfigError(f"{path}: approvals: expected a mapping")
    allowlist = approvals.get("allowlist") or []
    if not isinstance(allowlist, list):
        raise ConfigError(f"{path}: approvals.allowlist: expected a list")
    if pattern not in allowlist:
        allowlist.append(pattern)
    approvals["allowlist"] = allowlist
    data["approvals"] = approvals
    directory = os.path.dirname(os.path.abspath(path))
    temp = None
    try:
        os.makedirs(directory, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=".config-", suffix=".yaml.tmp", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yaml.safe_dump(data, f, sort_keys=False)
        os.chmod(temp, mode)
        os.replace(temp, path)
    except OSError as exc:
        if temp is not None:
            try:
                os.unlink(temp)
            except OSError:
                pass
        raise ConfigError(f"cannot write config file {path}: {exc.strerror or exc}") from exc
