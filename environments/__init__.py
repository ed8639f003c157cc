"""Where code runs: the Environment seam and the backends that implement it.

Backends are looked up by name in :data:`BACKENDS`; each entry names the module and
class to import, so a backend's SDK is imported only when that backend is used.
"""

from __future__ import annotations

import importlib

from hermes_sandbox.environments.base import CommandResult, Environment, FileStat, SandboxProcess
from hermes_sandbox.environments.errors import BackendError, BackendNotAvailable, EnvironmentFailure

# name -> "module:Class", or None for a name reserved for a backend not built yet.
BACKENDS: dict[str, str | None] = {
    "local": "hermes_sandbox.environments.local:LocalEnvironment",
    "docker": "hermes_sandbox.environments.docker:DockerEnvironment",
    "ssh": "hermes_sandbox.environments.ssh:SSHEnvironment",
    "singularity": "hermes_sandbox.environments.singularity:SingularityEnvironment",
    "modal": "hermes_sandbox.environments.modal:ModalEnvironment",
    "daytona": "hermes_sandbox.environments.daytona:DaytonaEnvironment",
}


def available_backends() -> list[str]:
    return [name for name, target in BACKENDS.items() if target is not None]


def get_environment_class(name: str) -> type[Environment]:
    """The Environment class for a backend name; raise BackendNotAvailable with advice."""
    if name not in BACKENDS:
        raise BackendNotAvailable(
            f"unknown backend {name!r}; choose one of: {', '.join(available_backends())}"
        )
    target = BACKENDS[name]
    if target is None:
        raise BackendNotAvailable(
            f"the {name} backend is not available in this version of hermes-sandbox yet; "
            f"available now: {', '.join(available_backends())}"
        )
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:  # a backend module itself imports its SDK lazily
        raise BackendNotAvailable(f"the {name} backend cannot be loaded: {exc}") from exc
    cls: type[Environment] = getattr(module, class_name)
    return cls


__all__ = [
    "BACKENDS",
    "BackendError",
    "BackendNotAvailable",
    "CommandResult",
    "Environment",
    "EnvironmentFailure",
    "FileStat",
    "SandboxProcess",
    "available_backends",
    "get_environment_class",
]
