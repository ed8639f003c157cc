"""The singularity backend: one Apptainer (or SingularityCE) instance per task.

:mod:`.settings` holds :class:`SingularitySettings`; the rest is imported on first use
of one of its names.
"""

from __future__ import annotations

import importlib
from typing import Any

from hermes_sandbox.environments.singularity.settings import (
    IMAGE_VAR,
    Bind,
    SingularitySettings,
    find_executable,
)


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module(f"{__name__}.environment"), name)


__all__ = ["IMAGE_VAR", "Bind", "SingularitySettings", "find_executable"]
