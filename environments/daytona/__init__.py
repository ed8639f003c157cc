"""The daytona backend: a Daytona cloud sandbox, through the daytona SDK.

:mod:`.settings` holds :class:`DaytonaSettings`; the rest is imported on first use of
one of its names (the SDK itself only when a sandbox is started).
"""

from __future__ import annotations

import importlib
from typing import Any

from hermes_sandbox.environments.daytona.settings import NO_CREDENTIALS, DaytonaSettings


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module(f"{__name__}.environment"), name)


__all__ = ["NO_CREDENTIALS", "DaytonaSettings"]
