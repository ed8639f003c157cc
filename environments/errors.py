"""The environment layer's errors, defined with the rest of the tree in
:mod:`hermes_sandbox.errors`."""

from hermes_sandbox.errors import (
    BackendError,
    BackendNotAvailable,
    EnvironmentFailure,
    SpawnNotAvailable,
)

__all__ = ["BackendError", "BackendNotAvailable", "EnvironmentFailure", "SpawnNotAvailable"]
