"""Frames and the RPC server: how a script's tool calls reach the host and come back.

This package knows the wire (framing, messages, transports, the server loop); it knows
nothing of tools, backends or how a script is run.
"""

from rpc.errors import CallRefused, ConnectionClosed, FrameError, FrameTooLarge, RPCError
from rpc.framing import DEFAULT_MAX_FRAME_SIZE, FrameDecoder, encode_frame
from rpc.messages import Request
from rpc.server import RequestHandler, RPCServer
from rpc.unix import serve_unix_socket

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
