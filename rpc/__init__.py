"""Frames and the RPC server: how a script's tool calls reach the host and come back.

This package knows the wire (framing, messages, transports, the server loop); it knows
nothing of tools, backends or how a script is run.
"""

from typing import TYPE_CHECKING

from hermes_sandbox.lazy import lazy_names
from hermes_sandbox.rpc.errors import (
    CallRefused,
    ConnectionClosed,
    FrameError,
    FrameTooLarge,
    RPCError,
)

if TYPE_CHECKING:
    from hermes_sandbox.rpc.framing import FrameDecoder, encode_frame
    from hermes_sandbox.rpc.messages import Request
    from hermes_sandbox.rpc.server import RequestHandler, RPCServer
    from hermes_sandbox.rpc.unix import serve_unix_socket

# The frame size cap of rpc/framing.py, kept here so that reading it (RunOptions' default)
# does not import msgpack. Requests are small: large results travel host -> script, and
# a request's biggest payload is write_file's content. Everything a peer sends before
# its token is checked is bounded by this (docs/protocol.md section 2, docs/security.md).
DEFAULT_MAX_FRAME_SIZE = 4 * 1024 * 1024

# Imported at first use (PEP 562), so that the command line builds the options of a run
# it sends to the sessions daemon without the server or msgpack.
__getattr__, __dir__ = lazy_names(
    __name__,
    {
        "FrameDecoder": "hermes_sandbox.rpc.framing",
        "encode_frame": "hermes_sandbox.rpc.framing",
        "Request": "hermes_sandbox.rpc.messages",
        "RequestHandler": "hermes_sandbox.rpc.server",
        "RPCServer": "hermes_sandbox.rpc.server",
        "serve_unix_socket": "hermes_sandbox.rpc.unix",
    },
)

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "CallRefused",
    "ConnectionClosed",
    "FrameDecoder",
    "FrameError",
    "FrameTooLarge",
    "RPCError",
    "RPCServer",
    "Request",
    "RequestHandler",
    "encode_frame",
    "serve_unix_socket",
]
