"""The modal backend's settings: which app, image and limits its sandbox has."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from hermes_sandbox.environments.settings import DEFAULT_PYTHON_IMAGE, BackendSettings
from hermes_sandbox.errors import BackendNotAvailable

DEFAULT_APP_NAME = "hermes-sandbox"
DEFAULT_IMAGE = DEFAULT_PYTHON_IMAGE
MAX_SANDBOX_SECONDS = 24 * 3600  # Modal's longest sandbox lifetime
_NAME_RE = re.compile(r"^[a-zA-Z0-9._-]{1,64}$")  # Modal's rule for object names


def _positive_number(name: str, value: Any, *, integer: bool = False) -> None:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not value > 0:
        kind = "a whole number" if integer else "a number"
        raise ValueError(f"{name} must be {kind} > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class ModalSettings(BackendSettings):
    """Settings of the modal backend: a Modal Sandbox, its image and its limits.

    ``image`` is a registry tag (``Image.from_registry``); it must have ``python``
    (3.6 or newer) on its PATH. ``memory`` is in MiB. ``timeout`` is the sandbox's own
    lifetime in seconds: Modal ends it then, whatever runs, so make it longer than the
    runs it serves. ``sandbox_name`` resumes the running sandbox of that name in the
    app (or creates it under that name); ``persist`` keeps it after the run.
    """

    backend: ClassVar[str] = "modal"
    image_field: ClassVar[str | None] = "image"
    network_setting: ClassVar[tuple[str, Any] | None] = ("block_network", False)

    app_name: str = DEFAULT_APP_NAME
    image: str = DEFAULT_IMAGE
    cpu: float | None = 1.0
    memory: int | None = 1024
    timeout: int = 900
    idle_timeout: int | None = None
    block_network: bool = True
    sandbox_name: str | None = None
    persist: bool = False
    region: str | tuple[str, ...] | None = None
    cloud: str | None = None
    modal_environment: str | None = None  # Modal's environment; None: the profile's default
    python: str = "python3"
    workdir: str = "/workspace"  # made at start if missing; scripts and commands start here

    def check(self) -> None:
        if isinstance(self.region, list | tuple):
            object.__setattr__(self, "region", tuple(str(r) for r in self.region))
        for name in ("app_name", "image", "python", "workdir"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        if not _NAME_RE.match(self.app_name):
            raise ValueError(
                f"app_name may hold only letters, digits, '-', '_' and '.' (at most 64), "
                f"got {self.app_name!r}"
            )
        if self.sandbox_name is not None and not _NAME_RE.match(str(self.sandbox_name)):
            raise ValueError(
                f"sandbox_name may hold only letters, digits, '-', '_' and '.' (at most 64), "
                f"got {self.sandbox_name!r}"
            )
        if self.cpu is not None:
            _positive_number("cpu", self.cpu)
        if self.memory is not None:
            _positive_number("memory (MiB)", self.memory, integer=True)
        _positive_number("timeout (seconds)", self.timeout, integer=True)
        if self.timeout > MAX_SANDBOX_SECONDS:
            raise ValueError(f"timeout can be at most {MAX_SANDBOX_SECONDS} s, got {self.timeout}")
        if self.idle_timeout is not None:
            _positive_number("idle_timeout (seconds)", self.idle_timeout, integer=True)
        for name in ("block_network", "persist"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.persist and self.sandbox_name is None:
            raise ValueError(
                "persist needs a sandbox_name: a kept sandbox is found again by its name"
            )
        if not self.workdir.startswith("/"):
            raise ValueError(f"workdir must be an absolute path, got {self.workdir!r}")

    def availability(self) -> str | None:
        """No SDK or no credentials (no network call: whether Modal accepts them shows
        at start)."""
        from hermes_sandbox.environments.modal.environment import _credentials_problem, _modal

        try:
            sdk = _modal()
        except BackendNotAvailable as exc:
            return str(exc)
        return _credentials_problem(sdk)


__all__ = ["DEFAULT_APP_NAME", "DEFAULT_IMAGE", "ModalSettings"]
