"""The exception tree of the RPC layer.

::

    RPCError
    ├── FrameError                  bytes on the wire that are not a valid frame
    │   └── FrameTooLarge           a frame header announced more than the size cap
    ├── ConnectionClosed            the peer went away (EOF, reset)
    └── CallRefused                 a request the host answers with an error reply
                                    (bad token, unknown or disallowed tool, budget spent)

Errors from the far side travel as data (an error *kind* and a message, see
:mod:`rpc.messages`); this tree is only what code on the host catches.
"""

from __future__ import annotations


class RPCError(Exception):
    """Root of every error the RPC layer raises."""


class FrameError(RPCError):
    """The peer sent bytes that are not a frame (bad length, undecodable body, not a map)."""


class FrameTooLarge(FrameError):
    """A frame header announced a body larger than the cap; the body is never read."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the {limit}-byte cap")
        self.size = size
        self.limit = limit


class ConnectionClosed(RPCError, ConnectionError):
    """The stream ended or broke before a whole frame arrived."""


class CallRefused(RPCError):
    """A request that gets an error reply instead of a result.

    ``kind`` is one of the error kinds in :mod:`rpc.messages`; it and ``message`` go back
    to the caller verbatim.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
