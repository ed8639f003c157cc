"""The two wire messages, a request and a reply, and the error kinds a reply can carry.

Request (script -> host)::

    {"id": int, "tool": str, "args": map, "token": str}

Reply (host -> script), exactly one per request, with the request's id::

    {"id": int, "result": str}                              the tool ran
    {"id": int | nil, "error": {"kind": str, "message": str}} it did not

``result`` is the tool's result as JSON text, which the caller parses. ``id`` is nil
only when the request it answers had no usable id (a frame that could not be decoded).
See docs/protocol.md for the whole contract.

A request is read in two steps so that a peer without the token costs the host only
bounded work (docs/security.md, "Before authentication"): :meth:`Envelope.parse` walks
the map without building its values, decoding only the small fields (``id``, ``tool``,
``token``) and keeping ``args`` as undecoded bytes; :meth:`Envelope.request` checks the
token, and only then decodes the arguments.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any

import msgpack

from hermes_sandbox.rpc.errors import CallRefused, FrameError

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
# Encoded sizes past which a field is not decoded at all before the token is checked:
# a key longer than any known one is an unknown key; a longer id, tool or token is
# invalid. Each decode is then at most this many bytes, whatever the frame holds.
_MAX_KEY_BYTES = 16
MAX_FIELD_BYTES = 1024
_TOO_LONG = object()
_FIELDS = ("id", "tool", "token", "args")


def _decode_small(data: memoryview) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, max_ext_len=0)
    except Exception as exc:  # ext types, bad UTF-8, ...: the frame is malformed
        raise FrameError(f"frame body is not valid msgpack: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Envelope:
    """A request map read without decoding its arguments (they stay msgpack bytes)."""

    id: Any
    tool: Any
    token: Any
    args: memoryview | None

    @classmethod
    def parse(cls, body: bytes) -> Envelope:
        """Walk one frame body; raise :class:`FrameError` unless it is one msgpack map.

        The cost is linear in the body and allocates nothing per element: values are
        skipped, and only fields of at most :data:`MAX_FIELD_BYTES` are decoded.
        """
        view = memoryview(body)
        unpacker = msgpack.Unpacker(max_buffer_size=max(len(body), 1))
        unpacker.feed(body)
        fields: dict[str, Any] = {}
        try:
            entries = unpacker.read_map_header()
            for _ in range(entries):
                start = unpacker.tell()
                unpacker.skip()
                key_end = unpacker.tell()
                unpacker.skip()
                end = unpacker.tell()
                if key_end - start > _MAX_KEY_BYTES:
                    continue  # longer than any key we know: an unknown key, ignored
                key = _decode_small(view[start:key_end])
                if key not in _FIELDS:
                    continue
                if key == "args":
                    fields[key] = view[key_end:end]
                elif end - key_end > MAX_FIELD_BYTES:
                    fields[key] = _TOO_LONG
                else:
                    fields[key] = _decode_small(view[key_end:end])
            trailing = len(body) - unpacker.tell()
        except FrameError:
            raise
        except Exception as exc:  # msgpack raises several unrelated types for bad input
            raise FrameError(f"frame body is not a valid msgpack map: {exc}") from exc
        if trailing:
            raise FrameError(f"frame body has {trailing} bytes after its map")
        return cls(fields.get("id"), fields.get("tool"), fields.get("token"), fields.get("args"))

    @property
    def reply_id(self) -> int | None:
        """The id to answer with, or None if the request has none usable."""
        request_id = self.id
        if type(request_id) is int and 0 <= request_id <= _MAX_ID:
            return request_id
        return None

    def request(self, token: bytes) -> Request:
        """The request, once its token matches ``token`` (compared in constant time).

        Raises :class:`CallRefused` (``bad_request``, ``unauthorized``) and, for
        arguments that are not valid msgpack, :class:`FrameError`. The arguments are
        decoded only after the token has been checked.
        """
        request_id = self.reply_id
        if request_id is None:
            raise CallRefused(BAD_REQUEST, "request 'id' must be a non-negative integer")
        tool = self.tool
        if not isinstance(tool, str) or not tool:
            raise CallRefused(
                BAD_REQUEST,
                f"request 'tool' must be a non-empty string of at most {MAX_FIELD_BYTES} bytes",
            )
        if not isinstance(self.token, str):
            raise CallRefused(UNAUTHORIZED, "request carries no token")
        if not token or not hmac.compare_digest(self.token.encode("utf-8", "surrogatepass"), token):
            raise CallRefused(UNAUTHORIZED, "Unauthorized RPC request: bad token")
        args: Any = {}
        if self.args is not None:
            try:
                args = msgpack.unpackb(self.args, raw=False, strict_map_key=False, max_ext_len=0)
            except Exception as exc:
                raise FrameError(f"request 'args' is not valid msgpack: {exc}") from exc
        if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
            raise CallRefused(BAD_REQUEST, "request 'args' must be a map with string keys")
        return Request(request_id, tool, args, self.token)


@dataclass(frozen=True, slots=True)
class Request:
    id: int
    tool: str
    args: dict[str, Any]
    token: str

    def to_message(self) -> dict[str, Any]:
        return {"id": self.id, "tool": self.tool, "args": self.args, "token": self.token}


def result_reply(request_id: int, result: str) -> dict[str, Any]:
    return {"id": request_id, "result": result}


def error_reply(request_id: int | None, kind: str, message: str) -> dict[str, Any]:
    return {"id": request_id, "error": {"kind": kind, "message": message}}
