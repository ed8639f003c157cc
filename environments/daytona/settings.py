"""The daytona backend's settings: which sandbox, from what, with which limits.

Credentials are never settings: the SDK reads ``DAYTONA_API_KEY`` (and
``DAYTONA_API_URL``, ``DAYTONA_TARGET``) from the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hermes_sandbox.environments.settings import BackendSettings
from hermes_sandbox.errors import BackendNotAvailable

NO_CREDENTIALS = (
    "the daytona backend needs Daytona credentials: set DAYTONA_API_KEY (an API key from "
    "the Daytona dashboard), or DAYTONA_JWT_TOKEN and DAYTONA_ORGANIZATION_ID; and "
    "DAYTONA_API_URL for a Daytona other than app.daytona.io"
)
LABEL_PREFIX = "hermes-sandbox."
_CREDENTIALS_ADVICE = (
    "is not a daytona backend setting: credentials stay out of config files; set "
    "DAYTONA_API_KEY in the environment instead"
)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class DaytonaSettings(BackendSettings):
    """Settings of the daytona backend: which Daytona sandbox, and how it is made.

    Credentials are never settings: the SDK reads ``DAYTONA_API_KEY`` (and
    ``DAYTONA_API_URL``, ``DAYTONA_TARGET``) from the environment.
    """

    backend: ClassVar[str] = "daytona"
    image_field: ClassVar[str | None] = "image"
    network_setting: ClassVar[tuple[str, Any] | None] = ("network_block_all", False)
    refused: ClassVar[Mapping[str, str]] = {
        "api_key": _CREDENTIALS_ADVICE,
        "jwt_token": _CREDENTIALS_ADVICE,
    }

    image: str | None = None  # a registry image Daytona builds a snapshot from
    snapshot: str | None = None  # a Daytona snapshot; neither: Daytona's default snapshot
    cpu: int | None = None  # cores; cpu, memory and disk apply to an image only
    memory: int | None = None  # GiB
    disk: int | None = None  # GiB
    network_block_all: bool = True  # no network from the sandbox
    auto_stop_interval: int = 15  # idle minutes before Daytona stops it (0: never)
    name: str | None = None  # resume the sandbox of this name, or create it with the name
    labels: Mapping[str, str] = field(default_factory=dict)
    persist: bool = False  # keep the sandbox after the run; resumed by name or by task
    task_id: str | None = None  # with persist: the task whose sandbox is resumed
    target: str | None = None  # the Daytona region
    api_url: str | None = None  # default: $DAYTONA_API_URL, else Daytona's cloud
    python: str = "python3"  # the sandbox's interpreter: commands and files need it
    workdir: str | None = None  # where commands start; default: the sandbox's own
    create_timeout: float = 180.0  # seconds to create (or start) the sandbox

    def check(self) -> None:
        object.__setattr__(self, "labels", dict(self.labels))
        if self.image is not None and self.snapshot is not None:
            raise ValueError("give image or snapshot, not both")
        for name in ("image", "snapshot", "name", "task_id", "target", "api_url", "workdir"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        for name in ("cpu", "memory", "disk"):
            value = getattr(self, name)
            if value is None:
                continue
            if not _is_int(value) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
            if self.image is None:
                raise ValueError(
                    f"{name} applies only to a sandbox made from an image (set image=...); "
                    "a snapshot brings its own resources"
                )
        if not _is_int(self.auto_stop_interval) or self.auto_stop_interval < 0:
            raise ValueError(
                "auto_stop_interval must be whole minutes >= 0 (0: never stop), "
                f"got {self.auto_stop_interval!r}"
            )
        for name in ("network_block_all", "persist"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.python, str) or not self.python:
            raise ValueError(f"python must be a command name or path, got {self.python!r}")
        if self.workdir is not None and not self.workdir.startswith("/"):
            raise ValueError(f"workdir must be an absolute path, got {self.workdir!r}")
        if isinstance(self.create_timeout, bool) or not isinstance(
            self.create_timeout, int | float
        ):
            raise ValueError(f"create_timeout must be seconds, got {self.create_timeout!r}")
        if not self.create_timeout > 0:
            raise ValueError(f"create_timeout must be > 0, got {self.create_timeout!r}")
        for key, value in self.labels.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(f"labels map strings to strings, got {key!r}: {value!r}")
        reserved = [key for key in self.labels if key.startswith(LABEL_PREFIX)]
        if reserved:
            raise ValueError(f"labels starting with {LABEL_PREFIX!r} are reserved: {reserved}")

    def availability(self) -> str | None:
        from hermes_sandbox.environments.daytona.environment import _load_sdk

        try:
            _load_sdk()
        except BackendNotAvailable as exc:
            return str(exc)
        has_key = os.environ.get("DAYTONA_API_KEY")
        has_jwt = os.environ.get("DAYTONA_JWT_TOKEN") and os.environ.get("DAYTONA_ORGANIZATION_ID")
        return None if has_key or has_jwt else NO_CREDENTIALS


__all__ = ["NO_CREDENTIALS", "DaytonaSettings"]
