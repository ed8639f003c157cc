"""The RPC layer's errors, defined with the rest of the tree in :mod:`hermes_sandbox.errors`."""

from hermes_sandbox.errors import (
    CallRefused,
    ConnectionClosed,
    FrameError,
    FrameTooLarge,
    RelayError,
    RPCError,
)

__all__ = [
    "CallRefused",
    "ConnectionClosed",
    "FrameError",
    "FrameTooLarge",
    "RPCError",
    "RelayError",
]
