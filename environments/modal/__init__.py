"""The modal backend: scripts run in a Modal Sandbox, through the ``modal`` SDK.

:mod:`.settings` holds :class:`ModalSettings`; the rest is imported on first use of one
of its names (the SDK itself only when a sandbox is started).
"""

from __future__ import annotations

import importlib
from typing import Any

from hermes_sandbox.environments.modal.settings import (
    DEFAULT_APP_NAME,
    DEFAULT_IMAGE,
    ModalSettings,
)


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module(f"{__name__}.environment"), name)


__all__ = ["DEFAULT_APP_NAME", "DEFAULT_IMAGE", "ModalSettings"]
