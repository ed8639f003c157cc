"""Frames and the RPC server: how a script's tool calls reach the host and come back.

This package knows the wire (framing, messages, transports, the server loop); it knows
nothing of tools, backends or how a script is run.
"""

from hermes_sandbox.rpc.errors import (
    CallRefused,
    ConnectionClosed,
    FrameError,
    FrameTooLarge,
    RPCError,
)
from hermes_sandbox.rpc.framing import DEFAULT_MAX_FRAME_SIZE, FrameDecoder, encode_frame
from hermes_sandbox.rpc.messages import Request
from hermes_sandbox.rpc.server import RequestHandler, RPCServer
from hermes_sandbox.rpc.unix import serve_unix_socket

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
