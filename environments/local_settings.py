"""The local backend's settings (:class:`LocalSettings`), apart from the backend itself
(environments/local.py), so that reading them, as the command line does to send a run
to the sessions daemon, imports neither the event loop nor the launch machinery."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar

from hermes_sandbox.environments.settings import BackendSettings
from hermes_sandbox.errors import SandboxError

# How a local launch is contained (environments/isolation.py).
ISOLATION_MODES = ("auto", "bwrap", "none")


@dataclass(frozen=True, slots=True)
class LocalSettings(BackendSettings):
    """Settings of the local backend: this machine, as this user."""

    backend: ClassVar[str] = "local"
    without_image: ClassVar[str] = "it runs on this machine as it is"
    network_setting: ClassVar[tuple[str, Any] | None] = ("network", True)
    isolation_field: ClassVar[str | None] = "isolation"

    python: str | None = None  # the interpreter scripts run with; None: this process's
    # auto, bwrap or none (environments/isolation.py); None: $HERMES_SANDBOX_ISOLATION,
    # else auto.
    isolation: str | None = None
    network: bool = False  # the host's network under bwrap (without it, there is no other)

    def check(self) -> None:
        if self.python is not None:
            if not self.python:
                raise ValueError("python must be a command name or a path, not empty")
            object.__setattr__(self, "python", os.path.expanduser(self.python))
        if self.isolation is not None and self.isolation not in ISOLATION_MODES:
            raise ValueError(
                f"isolation must be one of {', '.join(ISOLATION_MODES)}, got {self.isolation!r}"
            )

    def availability(self) -> str | None:
        from hermes_sandbox.environments.isolation import choose_isolation

        try:
            choose_isolation(self)
        except SandboxError as exc:  # bwrap asked for and not working, a bad variable
            return str(exc)
        return None

    def details(self) -> dict[str, str]:
        from hermes_sandbox.environments.isolation import describe_isolation

        return {"isolation": describe_isolation(self)}
