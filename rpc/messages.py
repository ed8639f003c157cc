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
from typing import Any, NamedTuple

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
# Longest tool name accepted. The token has no limit of its own: one of another length
# simply does not match.
MAX_TOOL_NAME = 1024
_INVALID = object()  # a field whose value is a container or an ext: never decoded
_FIELDS = ("id", "tool", "token")
# First bytes of the msgpack types that hold other values (map, array) or are
# extensions: skipped, never built, in the envelope.
_NESTED = frozenset(
    [*range(0x80, 0xA0), 0xC7, 0xC8, 0xC9, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8, 0xDC, 0xDD, 0xDE, 0xDF]
)


# What a request's arguments may hold (decode_args): values in all, map keys and
# containers counted, and levels of nesting. Far above any tool's needs; they bound
# what one frame can cost the host after its token is checked.
MAX_ARG_VALUES = 65_536
MAX_ARG_DEPTH = 256
_MAPS = frozenset([*range(0x80, 0x90), 0xDE, 0xDF])
_ARRAYS = frozenset([*range(0x90, 0xA0), 0xDC, 0xDD])


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

        The cost is linear in the body and allocates nothing per element: only scalar
        keys and the scalar values of ``id``, ``tool`` and ``token`` are built (a string
        at most the body's size); every other value is skipped unread.
        """
        unpacker = msgpack.Unpacker(
            raw=False, max_buffer_size=max(len(body), 1), max_ext_len=0, strict_map_key=False
        )
        unpacker.feed(body)
        fields: dict[str, Any] = {}
        args: memoryview | None = None
        try:
            entries = unpacker.read_map_header()
            for _ in range(entries):
                if body[unpacker.tell()] in _NESTED:
                    unpacker.skip()  # a key that is a container: not one of ours
                    unpacker.skip()
                    continue
                key = unpacker.unpack()
                start = unpacker.tell()
                if key == "args":
                    unpacker.skip()
                    args = memoryview(body)[start : unpacker.tell()]
                elif key in _FIELDS and body[start] not in _NESTED:
                    fields[key] = unpacker.unpack()
                else:
                    unpacker.skip()
                    if key in _FIELDS:
                        fields[key] = _INVALID
            trailing = len(body) - unpacker.tell()
        except Exception as exc:  # msgpack raises several unrelated types for bad input
            raise FrameError(f"frame body is not a valid msgpack map: {exc}") from exc
        if trailing:
            raise FrameError(f"frame body has {trailing} bytes after its map")
        return cls(fields.get("id"), fields.get("tool"), fields.get("token"), args)

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
        if not isinstance(tool, str) or not tool or len(tool) > MAX_TOOL_NAME:
            raise CallRefused(
                BAD_REQUEST,
                f"request 'tool' must be a non-empty string of at most {MAX_TOOL_NAME} characters",
            )
        if not isinstance(self.token, str):
            raise CallRefused(UNAUTHORIZED, "Unauthorized RPC request: no token")
        if not token or not hmac.compare_digest(self.token.encode("utf-8", "surrogatepass"), token):
            raise CallRefused(UNAUTHORIZED, "Unauthorized RPC request: bad token")
        args: Any = {} if self.args is None else decode_args(self.args)
        if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
            raise CallRefused(BAD_REQUEST, "request 'args' must be a map with string keys")
        return Request(request_id, tool, args, self.token)


def token_suffix(token: bytes) -> bytes | None:
    """The bytes a well-formed request from the stub client ends with: its last entry,
    ``"token": <token>``, as msgpack packs it (see :func:`quick_request`); None for an
    empty token, which refuses everything."""
    if not token:
        return None
    return msgpack.packb("token") + msgpack.packb(token.decode("utf-8", "surrogatepass"))


def quick_request(body: bytes, suffix: bytes | None, token: str) -> Request | None:
    """The request in ``body`` when it has the common shape, else None (the caller
    then takes the careful path, :meth:`Envelope.parse` and :meth:`Envelope.request`,
    which gives every refusal its exact reason).

    The common shape: a small body that ends with the run's token as its last entry
    (``suffix``, from :func:`token_suffix`), compared in constant time *before* any of
    it is decoded, and that decodes to exactly the four fields, each valid. A body no
    longer than the token entry plus :data:`MAX_ARG_DEPTH` bytes cannot pass the
    argument limits of :func:`decode_args` (each value and each level of nesting takes
    a byte), so msgpack may build it at once, the one C call saving the walk.
    """
    if suffix is None or len(body) - len(suffix) > MAX_ARG_DEPTH or len(body) <= len(suffix):
        return None
    if not hmac.compare_digest(body[-len(suffix) :], suffix):
        return None
    try:
        message = msgpack.unpackb(body, raw=False, strict_map_key=False, max_ext_len=0)
    except Exception:
        return None
    if type(message) is not dict or len(message) != 4:
        return None
    request_id = message.get("id")
    tool = message.get("tool")
    args = message.get("args")
    # The suffix may have been the end of another value (an argument's text): the
    # token entry itself must match too. (Not secret any more: the body holds it.)
    if message.get("token") != token:
        return None
    if (
        type(request_id) is not int
        or not 0 <= request_id <= _MAX_ID
        or type(tool) is not str
        or not tool
        or len(tool) > MAX_TOOL_NAME
        or type(args) is not dict
    ):
        return None
    for key in args:
        if type(key) is not str:
            return None
    return Request(request_id, tool, args, token)


def decode_args(data: bytes | memoryview) -> Any:
    """Decode a request's arguments at a cost bounded whatever the bytes hold.

    msgpack builds every value it reads, so a few MiB of empty arrays once cost ~75x
    their size and seconds of the event loop. Here each container's length is counted
    against :data:`MAX_ARG_VALUES` before any of its values is built, and nesting stops
    at :data:`MAX_ARG_DEPTH`; strings and other scalars are built by msgpack (each at
    most the frame's size). Raises :class:`CallRefused` (``bad_request``) past a limit,
    :class:`FrameError` for bytes that are not one msgpack value.
    """
    try:
        if len(data) <= MAX_ARG_DEPTH:
            # Each value and each level of nesting takes a byte at least: these bytes
            # cannot pass either limit, so msgpack may build them at once (the fast path
            # of small calls).
            return msgpack.unpackb(data, raw=False, strict_map_key=False, max_ext_len=0)
        unpacker = msgpack.Unpacker(
            raw=False, max_buffer_size=len(data), max_ext_len=0, strict_map_key=False
        )
        unpacker.feed(data)
        return _read_value(unpacker, memoryview(data), [MAX_ARG_VALUES], 0)
    except CallRefused:
        raise
    except Exception as exc:  # msgpack's several types, an unhashable key
        raise FrameError(f"request 'args' is not valid msgpack: {exc}") from exc


def _read_value(unpacker: msgpack.Unpacker, view: memoryview, left: list[int], depth: int) -> Any:
    """One value of :func:`decode_args`; ``left`` is the count of values still allowed.
    (A module function, not a closure: a closure calling itself is a reference cycle
    that would keep every request's unpacker alive until the garbage collector runs.)"""
    first = view[unpacker.tell()]
    is_map = first in _MAPS
    if not is_map and first not in _ARRAYS:
        return unpacker.unpack()  # a scalar: at most the frame's size
    if depth >= MAX_ARG_DEPTH:
        raise CallRefused(BAD_REQUEST, f"request 'args' nest deeper than {MAX_ARG_DEPTH} levels")
    size = unpacker.read_map_header() if is_map else unpacker.read_array_header()
    left[0] -= size * 2 if is_map else size
    if left[0] < 0:
        raise CallRefused(BAD_REQUEST, f"request 'args' hold more than {MAX_ARG_VALUES} values")
    depth += 1
    if not is_map:
        return [_read_value(unpacker, view, left, depth) for _ in range(size)]
    mapping = {}
    for _ in range(size):
        key = _read_value(unpacker, view, left, depth)
        mapping[key] = _read_value(unpacker, view, left, depth)
    return mapping


class Request(NamedTuple):
    """A request whose token matched, its arguments decoded. Immutable; a tuple, so
    that one is built at a tuple's cost on every call (a frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__``: three times slower)."""

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
