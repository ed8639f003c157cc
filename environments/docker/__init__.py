"""The docker backend: one long-lived, locked-down container per task.

:mod:`.settings` holds :class:`DockerSettings` (imported with this package, no SDK
needed); :mod:`.environment` the environment itself, imported on first use of one of
its names, so the docker SDK is loaded only when the backend is used.
"""

from __future__ import annotations

import importlib
from typing import Any

from hermes_sandbox.environments.docker.settings import (
    FALLBACK_IMAGE,
    IMAGE_VAR,
    DockerSettings,
    Mount,
)


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module(f"{__name__}.environment"), name)


__all__ = ["FALLBACK_IMAGE", "IMAGE_VAR", "DockerSettings", "Mount"]
