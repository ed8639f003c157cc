"""Framing: how one message becomes bytes on a stream and back.

A frame is a 4-byte unsigned big-endian length ``N`` followed by ``N`` bytes, the body,
which is one msgpack-encoded map::

    +--------+--------+--------+--------+=================================+
    |           N (uint32, BE)          |  msgpack map, exactly N bytes    |
    +--------+--------+--------+--------+=================================+

``N`` is at least 1 and at most the receiver's cap (4 MiB unless configured). A receiver
that reads a header over its cap stops there: it never reads or buffers the body.
Extension types (the timestamp included) are never valid: a body holding one is
malformed.

:class:`FrameSplitter` (bytes in, bodies out) and :class:`FrameDecoder` (bytes in,
messages out) are sans-I/O so that every transport, a socket, a relay stream or a
file, shares them. The RPC server splits frames but decodes a request's body itself,
so that it can check the token before it decodes the arguments (rpc/messages.py).
The stub side (stubs/_client.py) carries its own stdlib-only copy of the same few
lines; docs/protocol.md is the contract both follow.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import AsyncIterator
from typing import Any, Protocol

import msgpack

from hermes_sandbox.rpc import DEFAULT_MAX_FRAME_SIZE
from hermes_sandbox.rpc.errors import ConnectionClosed, FrameError, FrameTooLarge

HEADER = struct.Struct(">I")
HEADER_SIZE = HEADER.size
_RECEIVE_CHUNK = 256 * 1024

_packer_options = {"use_bin_type": True}
# A reply whose result is shorter than this is packed by its thread's own Packer, kept
# from call to call (building one costs more than packing a short reply); its buffer
# stays as small as they are.
_KEPT_PACKER_UP_TO = 16 * 1024
_packers = threading.local()


def _pack(message: dict[str, Any]) -> bytes | memoryview:
    """The msgpack body of ``message``: for any but a reply (id and result) with a short
    result, a view of a new packer's own buffer (``packb`` would copy that buffer into a
    bytes object, a copy of every byte of a large reply)."""
    result = message.get("result")
    if type(result) is str and len(result) < _KEPT_PACKER_UP_TO and len(message) == 2:
        try:
            pack = _packers.pack
        except AttributeError:
            pack = _packers.pack = msgpack.Packer(**_packer_options).pack
        body: bytes = pack(message)
        return body
    packer = msgpack.Packer(autoreset=False, **_packer_options)
    packer.pack(message)
    return packer.getbuffer()


def encode_frame(message: dict[str, Any]) -> bytes:
    """Encode one message map as a whole frame: header and body."""
    body = _pack(message)
    return HEADER.pack(len(body)) + body


def encode_frame_parts(message: dict[str, Any]) -> tuple[bytes, bytes | memoryview]:
    """One message as its frame's header and body, not joined: a large body is then
    written without the copy that joining it to four bytes costs."""
    body = _pack(message)
    return HEADER.pack(len(body)), body


def decode_body(body: bytes | memoryview) -> dict[str, Any]:
    """Decode a frame body; raise :class:`FrameError` unless it is exactly one msgpack map."""
    try:
        message = msgpack.unpackb(body, raw=False, strict_map_key=False, max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise FrameError(f"frame body is not valid msgpack: {exc}") from exc
    if not isinstance(message, dict):
        raise FrameError(f"frame body is a msgpack {type(message).__name__}, not a map")
    return message


class FrameSplitter:
    """Turn a byte stream, fed in arbitrary pieces, into frame bodies, undecoded.

    :meth:`feed` raises :class:`FrameTooLarge` as soon as a header over the cap is seen,
    and :class:`FrameError` for an empty frame. After an error the splitter is
    unusable: the stream has lost sync.
    """

    __slots__ = ("_buffer", "_max_frame_size", "_need")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._buffer = bytearray()
        self._max_frame_size = max_frame_size
        self._need = 0  # body length of the frame being assembled, 0 while reading a header

    @property
    def pending(self) -> int:
        """Bytes held that do not yet make a whole frame."""
        return len(self._buffer)

    @property
    def inside_frame(self) -> bool:
        """Whether the stream stopped now would end inside a frame."""
        return bool(self._buffer) or bool(self._need)

    def feed(self, data: bytes) -> list[bytes]:
        if not self._buffer and not self._need and type(data) is bytes:
            return self._feed_whole(data)
        buffer = self._buffer
        buffer += data
        bodies: list[bytes] = []
        while True:
            if not self._need:
                if len(buffer) < HEADER_SIZE:
                    return bodies
                (size,) = HEADER.unpack_from(buffer)
                self._check(size)
                self._need = size
                del buffer[:HEADER_SIZE]
            if len(buffer) < self._need:
                return bodies
            size, self._need = self._need, 0
            if len(buffer) == size:
                body = bytes(buffer)
                buffer.clear()
            else:
                body = bytes(buffer[:size])
                del buffer[:size]
            bodies.append(body)

    def _feed_whole(self, data: bytes) -> list[bytes]:
        """:meth:`feed` with nothing held, the common case of a stream of small frames
        each read whole: the bodies are sliced from ``data`` itself, and only an
        unfinished frame's bytes are copied into the buffer (leaving the state the
        byte-by-byte path would)."""
        bodies: list[bytes] = []
        offset = 0
        end = len(data)
        while end - offset >= HEADER_SIZE:
            (size,) = HEADER.unpack_from(data, offset)
            self._check(size)
            start = offset + HEADER_SIZE
            offset = start + size
            if offset > end:
                self._need = size
                self._buffer += memoryview(data)[start:]
                return bodies
            bodies.append(data[start:offset])
        if offset < end:
            self._buffer += memoryview(data)[offset:]
        return bodies

    def _check(self, size: int) -> None:
        if size == 0:
            raise FrameError("frame of length 0")
        if size > self._max_frame_size:
            raise FrameTooLarge(size, self._max_frame_size)


class FrameDecoder(FrameSplitter):
    """Turn a byte stream, fed in arbitrary pieces, into decoded message maps.

    :meth:`feed` raises what :class:`FrameSplitter` raises, and :class:`FrameError` for
    a body that is not a msgpack map.
    """

    __slots__ = ()

    def feed(self, data: bytes) -> list[dict[str, Any]]:  # type: ignore[override]
        return [decode_body(body) for body in super().feed(data)]


class ByteReceiver(Protocol):
    """Anything frames can be read from: an anyio byte stream, a relay channel, ..."""

    async def receive(self, max_bytes: int = 65536) -> bytes: ...


async def iter_messages(
    stream: ByteReceiver, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
) -> AsyncIterator[dict[str, Any]]:
    """Yield each message read from ``stream`` until a clean end of stream.

    Raises :class:`ConnectionClosed` if the stream ends inside a frame, and the
    :class:`FrameError` family for bytes that are not frames.
    """
    import anyio  # local: keeps this module importable without an event loop library

    decoder = FrameDecoder(max_frame_size)
    while True:
        try:
            data = await stream.receive(_RECEIVE_CHUNK)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            if decoder.inside_frame:
                raise ConnectionClosed("stream ended inside a frame") from None
            return
        for message in decoder.feed(data):
            yield message
