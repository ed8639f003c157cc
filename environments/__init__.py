"""Where code runs: the Environment seam, the backends that implement it, and their
typed settings.

Backends are looked up by name in :data:`BACKENDS`; each entry names the module and
class to import, so a backend's SDK is imported only when that backend is used. Each
environment class names its settings class (``settings_class``), and each settings
class names its backend (``backend``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from hermes_sandbox.environments.errors import BackendError, BackendNotAvailable, EnvironmentFailure
from hermes_sandbox.environments.settings import BackendSettings
from hermes_sandbox.lazy import lazy_names

if TYPE_CHECKING:
    from hermes_sandbox.environments.base import (
        CommandResult,
        Environment,
        ExecStream,
        FileStat,
        Runtime,
        SandboxProcess,
    )
    from hermes_sandbox.environments.daytona.settings import DaytonaSettings
    from hermes_sandbox.environments.docker.settings import DockerSettings
    from hermes_sandbox.environments.exec_stream import ExecStreamEnvironment
    from hermes_sandbox.environments.local_settings import LocalSettings
    from hermes_sandbox.environments.modal.settings import ModalSettings
    from hermes_sandbox.environments.singularity.settings import SingularitySettings
    from hermes_sandbox.environments.ssh.settings import SSHSettings

# Imported at first use (PEP 562): the seam itself (base, with the event loop), so that
# reading settings (the command line sending a run to the sessions daemon) imports no
# backend; the backends' settings classes, so that a run on one backend does not import
# the others' modules; ExecStreamEnvironment, since the local backend spawns its
# scripts itself.
_LAZY_NAMES = {
    "CommandResult": "hermes_sandbox.environments.base",
    "Environment": "hermes_sandbox.environments.base",
    "ExecStream": "hermes_sandbox.environments.base",
    "FileStat": "hermes_sandbox.environments.base",
    "Runtime": "hermes_sandbox.environments.base",
    "SandboxProcess": "hermes_sandbox.environments.base",
    "LocalSettings": "hermes_sandbox.environments.local_settings",
    "ExecStreamEnvironment": "hermes_sandbox.environments.exec_stream",
    "DaytonaSettings": "hermes_sandbox.environments.daytona.settings",
    "DockerSettings": "hermes_sandbox.environments.docker.settings",
    "ModalSettings": "hermes_sandbox.environments.modal.settings",
    "SingularitySettings": "hermes_sandbox.environments.singularity.settings",
    "SSHSettings": "hermes_sandbox.environments.ssh.settings",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY_NAMES)


# name -> "module:Class" of its environment.
BACKENDS: dict[str, str] = {
    "local": "hermes_sandbox.environments.local:LocalEnvironment",
    "docker": "hermes_sandbox.environments.docker.environment:DockerEnvironment",
    "ssh": "hermes_sandbox.environments.ssh.environment:SSHEnvironment",
    "singularity": "hermes_sandbox.environments.singularity.environment:SingularityEnvironment",
    "modal": "hermes_sandbox.environments.modal.environment:ModalEnvironment",
    "daytona": "hermes_sandbox.environments.daytona.environment:DaytonaEnvironment",
}


# name -> "module:Class" of its settings, where they can be imported without the
# environment (tests/test_backend_settings.py holds each equal to its environment's
# settings_class). A backend not here (register_backend) is found through its environment.
BACKEND_SETTINGS: dict[str, str] = {
    "local": "hermes_sandbox.environments.local_settings:LocalSettings",
    "docker": "hermes_sandbox.environments.docker.settings:DockerSettings",
    "ssh": "hermes_sandbox.environments.ssh.settings:SSHSettings",
    "singularity": "hermes_sandbox.environments.singularity.settings:SingularitySettings",
    "modal": "hermes_sandbox.environments.modal.settings:ModalSettings",
    "daytona": "hermes_sandbox.environments.daytona.settings:DaytonaSettings",
}


def register_backend(name: str, target: str) -> None:
    """Add a backend to the table: ``name`` -> ``"module:Class"`` of its environment,
    whose ``settings_class`` has ``backend = name``. For a backend outside this package
    (docs/backends.md, "Adding a backend"); a name already taken is refused."""
    if BACKENDS.get(name, target) != target:
        raise ValueError(f"the backend name {name!r} is taken by {BACKENDS[name]}")
    if ":" not in target:
        raise ValueError(f"a backend is found as 'module:Class', got {target!r}")
    BACKENDS[name] = target


def available_backends() -> list[str]:
    """The backend names, in the table's order."""
    return list(BACKENDS)


def get_environment_class(name: str) -> type[Environment]:
    """The Environment class for a backend name; raise BackendNotAvailable with advice."""
    target = BACKENDS.get(name)
    if target is None:
        raise BackendNotAvailable(
            f"unknown backend {name!r}; choose one of: {', '.join(available_backends())}"
        )
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:  # a backend module itself imports its SDK lazily
        raise BackendNotAvailable(f"the {name} backend cannot be loaded: {exc}") from exc
    cls: type[Environment] = getattr(module, class_name)
    return cls


def get_settings_class(name: str) -> type[BackendSettings]:
    """The settings class of a backend name; raise BackendNotAvailable if unknown."""
    target = BACKEND_SETTINGS.get(name) if name in BACKENDS else None
    if target is None:
        return get_environment_class(name).settings_class
    module_name, _, class_name = target.partition(":")
    cls: type[BackendSettings] = getattr(importlib.import_module(module_name), class_name)
    return cls


__all__ = [
    "BACKENDS",
    "BACKEND_SETTINGS",
    "BackendError",
    "BackendNotAvailable",
    "BackendSettings",
    "CommandResult",
    "DaytonaSettings",
    "DockerSettings",
    "Environment",
    "EnvironmentFailure",
    "ExecStream",
    "ExecStreamEnvironment",
    "FileStat",
    "LocalSettings",
    "ModalSettings",
    "Runtime",
    "SSHSettings",
    "SandboxProcess",
    "SingularitySettings",
    "available_backends",
    "get_environment_class",
    "get_settings_class",
    "register_backend",
]
