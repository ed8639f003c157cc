"""Tests for rpc/framing.py: FrameDecoder fed by hand, and iter_messages over in-memory streams.

The wire is a 4-byte big-endian length then one msgpack map. These tests build frames
with struct and msgpack directly, so a mistake shared by encode_frame and FrameDecoder
cannot hide itself.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable
from typing import Any

import anyio
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_sandbox.rpc.errors import ConnectionClosed, FrameError, FrameTooLarge, RPCError
from hermes_sandbox.rpc.framing import (
    DEFAULT_MAX_FRAME_SIZE,
    HEADER_SIZE,
    FrameDecoder,
    FrameSplitter,
    decode_body,
    encode_frame,
    encode_frame_parts,
    iter_messages,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def frame_of(message: Any) -> bytes:
    """A frame built by hand: the reference the code under test must agree with."""
    body = msgpack.packb(message, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def raw_frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


MESSAGES = [
    {"id": 1, "tool": "echo", "args": {"text": "hello"}, "token": "t0k"},
    {"id": 2, "result": '{"ok": true}'},
    {"id": None, "error": {"kind": "bad_frame", "message": "nope"}},
    {"id": 2**63 - 1, "tool": "ünïcode ☃", "args": {"blob": b"\x00\xff" * 40}, "token": ""},
    {"id": 4, "args": {"nested": [1, [2, [3, {"k": -1.5}]]], "big": "x" * 70_000}},
]


# -- FrameDecoder -------------------------------------------------------------------


def test_header_layout_is_big_endian_uint32() -> None:
    frame = encode_frame({"a": 1})
    assert HEADER_SIZE == 4
    assert frame[:4] == struct.pack(">I", len(frame) - 4)
    assert frame == frame_of({"a": 1})


@pytest.mark.parametrize("size", [0, 100, 300_000, 5 << 20])
def test_frame_parts_are_the_frame_and_survive_the_next_encoding(size: int) -> None:
    """encode_frame_parts hands out a view of its packer's buffer: joined it is the
    frame, and a later encoding does not change it."""
    message = {"id": 7, "result": "r" * size, "blob": b"\x00" * (size // 2)}
    header, body = encode_frame_parts(message)
    kept = bytes(header) + bytes(body)
    encode_frame_parts({"id": 8, "result": "s" * size})
    encode_frame({"id": 9, "result": "t" * size})
    assert header + body == kept == encode_frame(message) == frame_of(message)
    assert msgpack.unpackb(body, raw=False) == message


def test_bytes_survive_as_bin_not_str() -> None:
    frame = encode_frame({"blob": b"\xff\x00", "text": "\xff"})
    (message,) = FrameDecoder().feed(frame)
    assert message == {"blob": b"\xff\x00", "text": "\xff"}
    assert type(message["blob"]) is bytes
    assert type(message["text"]) is str


def test_one_whole_frame() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(frame_of(MESSAGES[0])) == [MESSAGES[0]]
    assert decoder.pending == 0


def test_many_frames_in_one_chunk() -> None:
    stream = b"".join(frame_of(m) for m in MESSAGES)
    decoder = FrameDecoder()
    assert decoder.feed(stream) == MESSAGES
    assert decoder.pending == 0


def test_split_at_every_byte_boundary() -> None:
    # Two frames back to back, cut once at every offset, including inside each header.
    stream = frame_of(MESSAGES[0]) + frame_of(MESSAGES[1])
    for cut in range(len(stream) + 1):
        decoder = FrameDecoder()
        got = decoder.feed(stream[:cut])
        got += decoder.feed(stream[cut:])
        assert got == MESSAGES[:2], f"cut at byte {cut}"
        assert decoder.pending == 0


def test_whole_frames_and_held_bytes_split_alike() -> None:
    """A feed with nothing held slices its bodies from the bytes given (the common
    case); it must leave what it holds of an unfinished frame, and yield, exactly what
    feeding through the held buffer does, whatever type the bytes come as."""
    stream = b"".join(frame_of(m) for m in MESSAGES[:3])
    bodies = [frame_of(m)[HEADER_SIZE:] for m in MESSAGES[:3]]
    for cut in range(len(stream) + 1):
        for kind in (bytes, bytearray, memoryview):
            splitter = FrameSplitter()
            got = splitter.feed(kind(stream[:cut]))
            held = splitter.pending, splitter.inside_frame
            slow = FrameSplitter()  # one byte a feed: past the first, through held bytes
            for offset in range(cut):
                slow.feed(stream[offset : offset + 1])
            expected_held = slow.pending, slow.inside_frame
            assert held == expected_held, (cut, kind)
            got += splitter.feed(kind(stream[cut:]))
            assert got == bodies, (cut, kind)
            assert all(type(body) is bytes for body in got)
            assert splitter.pending == 0 and not splitter.inside_frame


def test_fed_one_byte_at_a_time() -> None:
    stream = b"".join(frame_of(m) for m in MESSAGES[:4])
    decoder = FrameDecoder()
    got: list[dict[str, Any]] = []
    ends = []
    for offset in range(len(stream)):
        out = decoder.feed(stream[offset : offset + 1])
        if out:
            ends.append(offset + 1)
        got += out
    assert got == MESSAGES[:4]
    # Each message comes out exactly when its last byte arrives, not later.
    boundaries = []
    total = 0
    for m in MESSAGES[:4]:
        total += len(frame_of(m))
        boundaries.append(total)
    assert ends == boundaries


def test_empty_feed_yields_nothing() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(b"") == []
    frame = frame_of({"x": 1})
    assert decoder.feed(frame[:2]) == []
    assert decoder.feed(b"") == []
    assert decoder.pending == 2
    assert decoder.feed(frame[2:]) == [{"x": 1}]


def test_pending_counts_bytes_held() -> None:
    frame = frame_of({"x": "y" * 10})
    decoder = FrameDecoder()
    decoder.feed(frame[:3])
    assert decoder.pending == 3
    decoder.feed(frame[3:-1])
    # The header has been consumed: only the partial body is held.
    assert decoder.pending == len(frame) - 1 - HEADER_SIZE
    decoder.feed(frame[-1:])
    assert decoder.pending == 0


def test_zero_length_frame_is_a_frame_error() -> None:
    with pytest.raises(FrameError, match="length 0") as info:
        FrameDecoder().feed(struct.pack(">I", 0))
    assert not isinstance(info.value, FrameTooLarge)


def test_zero_length_frame_after_a_good_one() -> None:
    decoder = FrameDecoder()
    with pytest.raises(FrameError):
        decoder.feed(frame_of({"a": 1}) + struct.pack(">I", 0))


@pytest.mark.parametrize("size", [DEFAULT_MAX_FRAME_SIZE + 1, 2**30, 2**32 - 1])
def test_header_over_default_cap_raises_on_the_header_alone(size: int) -> None:
    decoder = FrameDecoder()
    # Only the four header bytes exist: if the decoder wanted the body first, it
    # would return [] here and the test would fail.
    with pytest.raises(FrameTooLarge) as info:
        decoder.feed(struct.pack(">I", size))
    assert info.value.size == size
    assert info.value.limit == DEFAULT_MAX_FRAME_SIZE
    assert isinstance(info.value, FrameError)
    assert isinstance(info.value, RPCError)


def test_header_over_cap_fed_byte_by_byte() -> None:
    decoder = FrameDecoder(max_frame_size=1024)
    header = struct.pack(">I", 1025)
    for byte in header[:3]:
        assert decoder.feed(bytes([byte])) == []
    with pytest.raises(FrameTooLarge, match="1025") as info:
        decoder.feed(header[3:])
    assert (info.value.size, info.value.limit) == (1025, 1024)


def test_frame_exactly_at_the_cap_is_accepted() -> None:
    body = msgpack.packb({"pad": "x" * 100})
    decoder = FrameDecoder(max_frame_size=len(body))
    assert decoder.feed(raw_frame(body)) == [{"pad": "x" * 100}]
    with pytest.raises(FrameTooLarge):
        FrameDecoder(max_frame_size=len(body) - 1).feed(raw_frame(body)[:4])


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"\xc1", id="never-used-byte"),
        pytest.param(b"\xc1\xc1\xc1\xc1", id="garbage"),
        pytest.param(b"\x82\xa1a", id="truncated-map"),
        pytest.param(b"\xa5ab", id="truncated-str"),
        pytest.param(msgpack.packb({"a": 1}) + msgpack.packb(2), id="trailing-data"),
        pytest.param(b"\xa2\xff\xfe", id="str-not-utf8"),
    ],
)
def test_body_that_is_not_msgpack(body: bytes) -> None:
    with pytest.raises(FrameError, match="not valid msgpack") as info:
        FrameDecoder().feed(raw_frame(body))
    assert not isinstance(info.value, FrameTooLarge)
    # msgpack's own errors do not leak: they are the cause, not the error.
    assert info.value.__cause__ is not None


@pytest.mark.parametrize(
    "value",
    [[1, 2, 3], 7, -1, "text", b"bytes", None, True, 1.5, []],
    ids=repr,
)
def test_body_that_is_msgpack_but_not_a_map(value: Any) -> None:
    with pytest.raises(FrameError, match="not a map"):
        FrameDecoder().feed(frame_of(value))


def test_decode_body_accepts_int_keys_and_memoryview() -> None:
    body = msgpack.packb({1: "one", "two": 2})
    assert decode_body(memoryview(body)) == {1: "one", "two": 2}


# -- property: any message map, any chunking ----------------------------------------

keys = st.text(max_size=12) | st.integers(min_value=-(2**63), max_value=2**64 - 1)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
    | st.binary(max_size=40)
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=6) | st.dictionaries(keys, children, max_size=6),
    max_leaves=15,
)
message_maps = st.dictionaries(keys, values, max_size=8)


def chunked(data: bytes, sizes: list[int]) -> list[bytes]:
    """Cut data into pieces of the given sizes, cycling through them."""
    if not sizes:
        return [data]
    pieces, offset, i = [], 0, 0
    while offset < len(data):
        size = sizes[i % len(sizes)]
        pieces.append(data[offset : offset + size])
        offset += size
        i += 1
    return pieces


def same(a: Any, b: Any) -> bool:
    """Equality that also tells -0.0 from 0.0 and 1 from True."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack(">d", a) == struct.pack(">d", b) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


@given(
    st.lists(message_maps, min_size=1, max_size=6),
    st.lists(st.integers(min_value=1, max_value=40), max_size=12),
)
@settings(max_examples=100, deadline=None)
def test_random_maps_roundtrip_in_random_chunks(
    messages: list[dict[Any, Any]], sizes: list[int]
) -> None:
    stream = b"".join(encode_frame(m) for m in messages)
    decoder = FrameDecoder()
    got: list[dict[Any, Any]] = []
    for piece in chunked(stream, sizes):
        got += decoder.feed(piece)
    assert len(got) == len(messages)
    for out, sent in zip(got, messages, strict=True):
        assert same(out, sent), (out, sent)
    assert decoder.pending == 0


@given(
    st.lists(message_maps, min_size=1, max_size=4),
    st.lists(st.integers(min_value=1, max_value=40), max_size=12),
)
@settings(max_examples=30, deadline=None)
def test_random_maps_roundtrip_through_iter_messages(
    messages: list[dict[Any, Any]], sizes: list[int]
) -> None:
    stream = b"".join(encode_frame(m) for m in messages)
    got = anyio.run(collect, ChunkStream(chunked(stream, sizes)), backend="asyncio")
    assert len(got) == len(messages)
    for out, sent in zip(got, messages, strict=True):
        assert same(out, sent)


# -- iter_messages over in-memory streams -------------------------------------------


class ChunkStream:
    """A ByteReceiveStream that hands out given chunks, then ends the way it is told."""

    def __init__(self, chunks: Iterable[bytes], end: type[Exception] = anyio.EndOfStream) -> None:
        self._chunks = list(chunks)
        self._end = end
        self.max_bytes_seen: list[int] = []

    async def receive(self, max_bytes: int = 65536) -> bytes:
        await anyio.lowlevel.checkpoint()
        self.max_bytes_seen.append(max_bytes)
        if not self._chunks:
            raise self._end
        return self._chunks.pop(0)


class MemoryByteStream:
    """A byte receive stream over an anyio memory object stream (the other end sends bytes)."""

    def __init__(self, receive: anyio.abc.ObjectReceiveStream[bytes]) -> None:
        self._receive = receive

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return await self._receive.receive()


async def collect(stream: Any, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> list[Any]:
    return [m async for m in iter_messages(stream, max_frame_size)]


@pytest.mark.anyio
async def test_iter_messages_over_a_memory_object_stream() -> None:
    send, receive = anyio.create_memory_object_stream[bytes](100)
    stream = b"".join(frame_of(m) for m in MESSAGES)
    async with send, receive:
        got: list[Any] = []

        async def writer() -> None:
            async with send:
                for offset in range(0, len(stream), 7):
                    await send.send(stream[offset : offset + 7])

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(writer)
            with anyio.fail_after(5):
                got = await collect(MemoryByteStream(receive))
    assert got == MESSAGES


@pytest.mark.anyio
async def test_iter_messages_yields_each_message_before_the_stream_ends() -> None:
    # A server must act on a request while the client is still connected: the first
    # message has to come out before the second chunk is even sent.
    send, receive = anyio.create_memory_object_stream[bytes](0)
    async with send, receive:
        messages = iter_messages(MemoryByteStream(receive))
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(send.send, frame_of({"n": 1}))
            with anyio.fail_after(2):
                assert await anext(messages) == {"n": 1}
            tasks.start_soon(send.send, frame_of({"n": 2}))
            with anyio.fail_after(2):
                assert await anext(messages) == {"n": 2}
            await send.aclose()
            with anyio.fail_after(2), pytest.raises(StopAsyncIteration):
                await anext(messages)


@pytest.mark.anyio
async def test_many_frames_in_one_chunk_from_a_stream() -> None:
    stream = ChunkStream([b"".join(frame_of(m) for m in MESSAGES)])
    assert await collect(stream) == MESSAGES


@pytest.mark.anyio
async def test_every_split_point_through_a_stream() -> None:
    data = frame_of(MESSAGES[0]) + frame_of(MESSAGES[1])
    for cut in range(len(data) + 1):
        pieces = [p for p in (data[:cut], data[cut:]) if p]
        assert await collect(ChunkStream(pieces)) == MESSAGES[:2], f"cut at {cut}"


@pytest.mark.anyio
@pytest.mark.parametrize(
    "end", [anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError]
)
async def test_clean_end_yields_nothing_more(end: type[Exception]) -> None:
    assert await collect(ChunkStream([frame_of({"a": 1})], end=end)) == [{"a": 1}]
    assert await collect(ChunkStream([], end=end)) == []


@pytest.mark.anyio
@pytest.mark.parametrize(
    "end", [anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError]
)
@pytest.mark.parametrize("cut", [1, 3, 4, 5, -1], ids=lambda c: f"cut{c}")
async def test_stream_ending_mid_frame_is_connection_closed(end: type[Exception], cut: int) -> None:
    # cut 1 and 3: inside the header; 4: header whole, no body; 5 and -1: inside the body.
    second = frame_of({"b": "two"})
    stream = ChunkStream([frame_of({"a": 1}), second[:cut]], end=end)
    got = []
    with pytest.raises(ConnectionClosed) as info:
        async for message in iter_messages(stream):
            got.append(message)
    assert got == [{"a": 1}]  # what came whole before the break is still delivered
    assert isinstance(info.value, ConnectionError)
    assert isinstance(info.value, RPCError)


@pytest.mark.anyio
async def test_stream_with_a_zero_length_frame() -> None:
    with pytest.raises(FrameError):
        await collect(ChunkStream([frame_of({"a": 1}), struct.pack(">I", 0)]))


@pytest.mark.anyio
async def test_stream_with_a_header_over_the_cap_stops_at_the_header() -> None:
    # The stream holds only a header; the body never exists. FrameTooLarge must come out
    # instead of a ConnectionClosed at the end of the stream.
    stream = ChunkStream([struct.pack(">I", 2000)])
    with pytest.raises(FrameTooLarge):
        await collect(stream, max_frame_size=1024)
    assert len(stream.max_bytes_seen) == 1  # it did not ask for more bytes


@pytest.mark.anyio
async def test_stream_with_a_body_that_is_not_a_map() -> None:
    with pytest.raises(FrameError, match="not a map"):
        await collect(ChunkStream([frame_of([1, 2])]))
    with pytest.raises(FrameError, match="not valid msgpack"):
        await collect(ChunkStream([raw_frame(b"\xc1\xc1")]))
