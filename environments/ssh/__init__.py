"""The ssh backend: scripts and commands run as a user on a remote host.

:mod:`.settings` holds :class:`SSHSettings` (imported with this package, no paramiko
needed); the rest is imported on first use of one of its names.
"""

from __future__ import annotations

import importlib
from typing import Any

from hermes_sandbox.environments.ssh.settings import (
    DEFAULT_KNOWN_HOSTS,
    OPENSSH_MAX_SESSIONS,
    SSHSettings,
)


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module(f"{__name__}.environment"), name)


__all__ = ["DEFAULT_KNOWN_HOSTS", "OPENSSH_MAX_SESSIONS", "SSHSettings"]
