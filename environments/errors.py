"""Errors of the environment layer.

::

    BackendError
    ├── BackendNotAvailable     the backend cannot be used here: unknown name, reserved
    │   │                       for a later release, or its SDK or engine is missing
    │   └── SpawnNotAvailable   this backend starts processes only through the relay
    └── EnvironmentFailure      the environment broke while in use (start, exec, I/O)
"""

from __future__ import annotations


class BackendError(Exception):
    """Root of every error an environment raises."""


class BackendNotAvailable(BackendError):
    """The named backend cannot be used; the message says what to do about it."""


class EnvironmentFailure(BackendError):
    """The environment failed while starting, running a command or moving files."""


class SpawnNotAvailable(BackendNotAvailable, NotImplementedError):
    """The backend cannot start a process with separate output streams itself; the
    runtime starts scripts there through the stream relay instead."""
