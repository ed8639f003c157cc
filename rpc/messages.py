"""The two wire messages, a request and a reply, and the error kinds a reply can carry.

Request (script -> host)::

    {"id": int, "tool": str, "args": map, "token": str}

Reply (host -> script), exactly one per request, with the request's id::

    {"id": int, "result": str}                              the tool ran
    {"id": int | nil, "error": {"kind": str, "message": str}} it did not

``result`` is the tool's result as JSON text, which the caller parses. ``id`` is nil
only when the request it answers had no usable id (a frame that could not be decoded).
See docs/protocol.md for the whole contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hermes_sandbox.rpc.errors import CallRefused

# Error kinds. A client must treat an unknown kind like "internal".
UNAUTHORIZED = "unauthorized"  # the token is missing or wrong
UNKNOWN_TOOL = "unknown_tool"  # no tool of that name exists on the host
NOT_ALLOWED = "not_allowed"  # the tool exists but this run may not call it
BUDGET_EXHAUSTED = "budget_exhausted"  # the run's tool-call budget is spent
BAD_REQUEST = "bad_request"  # a well-formed frame whose map is not a valid request
BAD_FRAME = "bad_frame"  # bytes that are not a frame; the connection is closed after
FRAME_TOO_LARGE = "frame_too_large"  # header over the cap; closed without reading the body
INTERNAL = "internal"  # the host failed in a way that is not the caller's fault

ERROR_KINDS = frozenset(
    {
        UNAUTHORIZED,
        UNKNOWN_TOOL,
        NOT_ALLOWED,
        BUDGET_EXHAUSTED,
        BAD_REQUEST,
        BAD_FRAME,
        FRAME_TOO_LARGE,
        INTERNAL,
    }
)

_MAX_ID = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Request:
    id: int
    tool: str
    args: dict[str, Any]
    token: str

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> Request:
        """Validate a decoded map as a request; raise :class:`CallRefused` (bad_request)."""
        request_id = message.get("id")
        if type(request_id) is not int or not 0 <= request_id <= _MAX_ID:
            raise CallRefused(BAD_REQUEST, "request 'id' must be a non-negative integer")
        tool = message.get("tool")
        if not isinstance(tool, str) or not tool:
            raise CallRefused(BAD_REQUEST, "request 'tool' must be a non-empty string")
        args = message.get("args", {})
        if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
            raise CallRefused(BAD_REQUEST, "request 'args' must be a map with string keys")
        token = message.get("token")
        if not isinstance(token, str):
            raise CallRefused(UNAUTHORIZED, "request carries no token")
        return cls(request_id, tool, args, token)

    def to_message(self) -> dict[str, Any]:
        return {"id": self.id, "tool": self.tool, "args": self.args, "token": self.token}


def result_reply(request_id: int, result: str) -> dict[str, Any]:
    return {"id": request_id, "result": result}


def error_reply(request_id: int | None, kind: str, message: str) -> dict[str, Any]:
    return {"id": request_id, "error": {"kind": kind, "message": message}}


def request_id_of(message: dict[str, Any]) -> int | None:
    """The id to answer a possibly invalid request with, or None if it has none usable."""
    request_id = message.get("id")
    if type(request_id) is int and 0 <= request_id <= _MAX_ID:
        return request_id
    return None
