"""Tests for stubs/_msgpack.py, the pure-Python msgpack codec, against msgpack-python."""

import ast
import math
import struct
import time
from collections import OrderedDict
from enum import IntEnum

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_sandbox.stubs import _msgpack
from hermes_sandbox.stubs._msgpack import MsgpackError

INT_MIN = -(2**63)
INT_MAX = 2**64 - 1


def ref_packb(obj):
    return msgpack.packb(obj, use_bin_type=True)


def ref_unpackb(data):
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def same(a, b):
    """Structural equality that also checks exact types, float bits and NaN."""
    if isinstance(a, tuple):
        a = list(a)
    if isinstance(b, tuple):
        b = list(b)
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return struct.pack(">d", a) == struct.pack(">d", b)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        if list(a) != list(b):
            return False
        return all(same(a[k], b[k]) for k in a)
    return a == b


ints = st.integers(min_value=INT_MIN, max_value=INT_MAX)
texts = st.text() | st.text(st.characters(min_codepoint=0x10000), max_size=5)
scalars = (
    st.none()
    | st.booleans()
    | ints
    | st.floats()
    | st.sampled_from([math.inf, -math.inf, math.nan, -0.0, 0.0])
    | texts
    | st.binary()
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=20) | st.dictionaries(texts | ints, children, max_size=20)
    ),
    max_leaves=60,
)


# -- property tests -----------------------------------------------------------


@given(values)
@settings(max_examples=200, deadline=None)
def test_packb_matches_msgpack(x):
    assert _msgpack.packb(x) == ref_packb(x)


@given(values)
@settings(max_examples=200, deadline=None)
def test_packb_roundtrips_through_msgpack(x):
    assert same(ref_unpackb(_msgpack.packb(x)), x)


@given(values)
@settings(max_examples=200, deadline=None)
def test_unpackb_reads_msgpack_output(x):
    assert same(_msgpack.unpackb(ref_packb(x)), x)


@given(values)
@settings(max_examples=100, deadline=None)
def test_own_roundtrip(x):
    assert same(_msgpack.unpackb(_msgpack.packb(x)), x)


@given(st.floats(width=32))
def test_unpackb_float32(x):
    packed = msgpack.packb(x, use_single_float=True)
    assert packed[0] == 0xCA
    assert same(_msgpack.unpackb(packed), ref_unpackb(packed))


# -- boundaries -------------------------------------------------------------

# Each int boundary with the first byte msgpack-python packs it with.
INT_FORMATS = {
    0: 0x00, 127: 0x7F, 128: 0xCC, 255: 0xCC, 256: 0xCD, 65535: 0xCD, 65536: 0xCE,
    2**32 - 1: 0xCE, 2**32: 0xCF, 2**64 - 1: 0xCF,
    -1: 0xFF, -32: 0xE0, -33: 0xD0, -128: 0xD0, -129: 0xD1, -32768: 0xD1, -32769: 0xD2,
    -(2**31): 0xD2, -(2**31) - 1: 0xD3, -(2**63): 0xD3,
}  # fmt: skip
INT_EDGES = [*INT_FORMATS, 1, 2**63 - 1, 2**63, -(2**63) + 1]
SIZE_EDGES = [0, 1, 15, 16, 31, 32, 255, 256, 65535, 65536]


@pytest.mark.parametrize("x", INT_EDGES)
def test_int_boundaries(x):
    packed = _msgpack.packb(x)
    assert packed == ref_packb(x)
    assert same(_msgpack.unpackb(packed), x)


@pytest.mark.parametrize(("x", "first_byte"), INT_FORMATS.items())
def test_int_formats(x, first_byte):
    assert _msgpack.packb(x)[0] == first_byte


@pytest.mark.parametrize("x", [0.0, -0.0, 1.5, math.inf, -math.inf, math.nan, 1e308, 5e-324])
def test_float_boundaries(x):
    packed = _msgpack.packb(x)
    assert packed == ref_packb(x)
    assert len(packed) == 9
    assert same(_msgpack.unpackb(packed), x)


@pytest.mark.parametrize("n", SIZE_EDGES)
def test_str_boundaries(n):
    x = "a" * n
    packed = _msgpack.packb(x)
    assert packed == ref_packb(x)
    assert _msgpack.unpackb(packed) == x


@pytest.mark.parametrize("n", [31, 32, 255, 256])
def test_str_length_counts_utf8_bytes(n):
    x = "\U0001f600" * (n // 4) + "a" * (n % 4)  # 4 UTF-8 bytes per emoji
    packed = _msgpack.packb(x)
    assert packed == ref_packb(x)
    assert _msgpack.unpackb(packed) == x


@pytest.mark.parametrize("n", SIZE_EDGES)
def test_bin_boundaries(n):
    x = b"\xff" * n
    packed = _msgpack.packb(x)
    assert packed == ref_packb(x)
    assert _msgpack.unpackb(packed) == x
    assert _msgpack.packb(bytearray(x)) == packed
    assert _msgpack.packb(memoryview(x)) == packed


@pytest.mark.parametrize("n", SIZE_EDGES)
def test_array_boundaries(n):
    x = list(range(n))
    packed = _msgpack.packb(x)
    assert packed == ref_packb(x)
    assert _msgpack.packb(tuple(x)) == packed
    assert _msgpack.unpackb(packed) == x


@pytest.mark.parametrize("n", SIZE_EDGES)
def test_map_boundaries(n):
    x = {i: None for i in range(n)}
    packed = _msgpack.packb(x)
    assert packed == ref_packb(x)
    assert _msgpack.unpackb(packed) == x


def test_constants_and_subclasses():
    class Color(IntEnum):
        RED = 300

    class MyStr(str):
        pass

    for x in [None, True, False, Color.RED, MyStr("hi"), OrderedDict(a=1), (1, (2, 3))]:
        assert _msgpack.packb(x) == ref_packb(x)


def test_unpackb_accepts_buffers():
    packed = ref_packb({"a": [1, b"x", "y"]})
    for data in (packed, bytearray(packed), memoryview(packed)):
        assert _msgpack.unpackb(data) == {"a": [1, b"x", "y"]}


def test_rpc_message():
    msg = {
        "id": 17,
        "tool": "read_file",
        "args": {"path": "/tmp/x.txt", "offset": 1, "limit": 500},
        "token": "t" * 43,
    }
    assert _msgpack.packb(msg) == ref_packb(msg)
    assert _msgpack.unpackb(ref_packb(msg)) == msg


def test_nesting_limit():
    ok = []
    for _ in range(_msgpack.MAX_DEPTH - 1):
        ok = [ok]
    packed = _msgpack.packb(ok)
    assert packed == ref_packb(ok)
    assert _msgpack.unpackb(packed) == ok
    with pytest.raises(ValueError):
        _msgpack.packb([ok])
    with pytest.raises(MsgpackError):
        _msgpack.unpackb(b"\x91" + packed)
    with pytest.raises(MsgpackError):
        _msgpack.unpackb(b"\x81\xc0" + packed)


def test_packb_circular_reference():
    x = []
    x.append(x)
    with pytest.raises(ValueError):
        _msgpack.packb(x)


# -- errors -----------------------------------------------------------------


def test_truncated_input():
    x = {
        "a": [1, -200, 70000, 2**40, -(2**40), 1.5, None, True, False],
        "b": {"c": b"\x00" * 300, "d": "e" * 40, 7: "x" * 70000},
        "z": [[], {}, ""],
    }
    packed = _msgpack.packb(x)
    assert _msgpack.unpackb(packed) == x
    for cut in range(len(packed)):
        with pytest.raises(MsgpackError):
            _msgpack.unpackb(packed[:cut])


@pytest.mark.parametrize("tail", [b"\x00", b"\xc0", b"\xc1", b"garbage"])
def test_trailing_bytes(tail):
    with pytest.raises(MsgpackError):
        _msgpack.unpackb(ref_packb([1, 2]) + tail)


def test_never_used_byte():
    with pytest.raises(MsgpackError):
        _msgpack.unpackb(b"\xc1")
    with pytest.raises(MsgpackError):
        _msgpack.unpackb(b"\x92\x01\xc1")


@pytest.mark.parametrize(
    "data",
    [
        b"\xd4\x01\x00",  # fixext 1
        b"\xd5\x01" + b"\x00" * 2,  # fixext 2
        b"\xd6\x01" + b"\x00" * 4,  # fixext 4
        b"\xd7\x01" + b"\x00" * 8,  # fixext 8
        b"\xd8\x01" + b"\x00" * 16,  # fixext 16
        b"\xc7\x01\x05\x00",  # ext 8
        b"\xc8\x00\x01\x05\x00",  # ext 16
        b"\xc9\x00\x00\x00\x01\x05\x00",  # ext 32
        msgpack.packb(msgpack.ExtType(5, b"abc")),
        msgpack.packb(msgpack.Timestamp(0)),  # timestamp 32
        msgpack.packb(msgpack.Timestamp(2**34, 1)),  # timestamp 96
        msgpack.packb([msgpack.Timestamp(1, 5)]),  # timestamp 64, nested
    ],
)
def test_ext_types_rejected(data):
    with pytest.raises(MsgpackError):
        _msgpack.unpackb(data)


@pytest.mark.parametrize(
    "data",
    [
        b"\xdb\xff\xff\xff\xffabc",  # str32 of 2**32-1 bytes
        b"\xc6\xff\xff\xff\xffabc",  # bin32
        b"\xdd\xff\xff\xff\xff\x01\x02\x03",  # array32
        b"\xdf\xff\xff\xff\xff\x01\x02\x03",  # map32
        b"\x91\xda\xff\xffabc",  # str16 inside an array
    ],
)
def test_huge_declared_length(data):
    start = time.perf_counter()
    with pytest.raises(MsgpackError):
        _msgpack.unpackb(data)
    assert time.perf_counter() - start < 0.1


def test_map_half_count():
    # A map of n pairs needs at least 2n bytes: 3 bytes cannot hold 2 pairs.
    with pytest.raises(MsgpackError):
        _msgpack.unpackb(b"\xde\x00\x02\x01\x02\x03")


def test_deep_nesting_is_msgpack_error():
    with pytest.raises(MsgpackError):
        _msgpack.unpackb(b"\x91" * 10000 + b"\xc0")
    with pytest.raises(MsgpackError):
        _msgpack.unpackb(b"\x81\xc0" * 10000 + b"\xc0")


@pytest.mark.parametrize("data", [b"\xa2\xff\xfe", b"\xd9\x01\x80", b"\x91\xa3a\xed\xa0"])
def test_invalid_utf8(data):
    with pytest.raises(MsgpackError) as info:
        _msgpack.unpackb(data)
    assert isinstance(info.value.__cause__, UnicodeDecodeError)


@pytest.mark.parametrize("data", [b"\x81\x90\xc0", b"\x81\x80\xc0", b"\x81\x91\x01\x02"])
def test_unhashable_map_key(data):
    with pytest.raises(MsgpackError):
        _msgpack.unpackb(data)


def test_empty_input():
    with pytest.raises(MsgpackError):
        _msgpack.unpackb(b"")


def test_unpackb_rejects_non_buffer():
    with pytest.raises(TypeError):
        _msgpack.unpackb("text")


@pytest.mark.parametrize("x", [object(), {1, 2}, frozenset(), 1j, [1, object()], {"a": {3}}])
def test_packb_unsupported_type(x):
    with pytest.raises(TypeError, match=r"set|object|complex|frozenset"):
        _msgpack.packb(x)


@pytest.mark.parametrize("x", [2**64, -(2**63) - 1, [2**100]])
def test_packb_int_out_of_range(x):
    with pytest.raises(OverflowError):
        _msgpack.packb(x)


def test_source_parses_as_python_38():
    with open(_msgpack.__file__, encoding="utf-8") as f:
        source = f.read()
    ast.parse(source, feature_version=(3, 8))
