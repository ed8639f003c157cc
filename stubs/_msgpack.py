"""A pure-Python msgpack codec for the subset the hermes-sandbox RPC protocol uses.

It is embedded in the generated hermes_tools.py when the sandbox's Python has no msgpack.
"""

import struct

__all__ = ["MAX_DEPTH", "MsgpackError", "packb", "unpackb"]

# Containers may nest this deep (the outermost container is level 1).
MAX_DEPTH = 512


class MsgpackError(ValueError):
    """Raised by unpackb for any malformed or unsupported input."""


# ---------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------

_P_U8 = struct.Struct(">BB").pack
_P_U16 = struct.Struct(">BH").pack
_P_U32 = struct.Struct(">BI").pack
_P_U64 = struct.Struct(">BQ").pack
_P_I8 = struct.Struct(">Bb").pack
_P_I16 = struct.Struct(">Bh").pack
_P_I32 = struct.Struct(">Bi").pack
_P_I64 = struct.Struct(">Bq").pack
_P_F64 = struct.Struct(">Bd").pack


def _pack_int(obj, buf):
    # Same choices as msgpack-python: the smallest format, unsigned formats for
    # values >= 0 and signed formats for negative values.
    if obj >= 0:
        if obj < 0x80:
            buf.append(obj)
        elif obj < 0x100:
            buf += _P_U8(0xCC, obj)
        elif obj < 0x10000:
            buf += _P_U16(0xCD, obj)
        elif obj < 0x100000000:
            buf += _P_U32(0xCE, obj)
        elif obj < 0x10000000000000000:
            buf += _P_U64(0xCF, obj)
        else:
            raise OverflowError("int too big to pack: %d" % obj)
    elif obj >= -0x20:
        buf.append(obj + 0x100)
    elif obj >= -0x80:
        buf += _P_I8(0xD0, obj)
    elif obj >= -0x8000:
        buf += _P_I16(0xD1, obj)
    elif obj >= -0x80000000:
        buf += _P_I32(0xD2, obj)
    elif obj >= -0x8000000000000000:
        buf += _P_I64(0xD3, obj)
    else:
        raise OverflowError("int too small to pack: %d" % obj)


def _pack_utf8(data, buf):
    n = len(data)
    if n < 0x20:
        buf.append(0xA0 | n)
    elif n < 0x100:
        buf += _P_U8(0xD9, n)
    elif n < 0x10000:
        buf += _P_U16(0xDA, n)
    elif n < 0x100000000:
        buf += _P_U32(0xDB, n)
    else:
        raise ValueError("str too large to pack: %d bytes" % n)
    buf += data


def _pack_bin(data, buf):
    n = len(data)
    if n < 0x100:
        buf += _P_U8(0xC4, n)
    elif n < 0x10000:
        buf += _P_U16(0xC5, n)
    elif n < 0x100000000:
        buf += _P_U32(0xC6, n)
    else:
        raise ValueError("bytes too large to pack: %d bytes" % n)
    buf += data


def _pack_header(n, fix, b16, buf):
    # fixarray/fixmap, then array16/map16 (b16) and array32/map32 (b16 + 1).
    if n < 0x10:
        buf.append(fix | n)
    elif n < 0x10000:
        buf += _P_U16(b16, n)
    elif n < 0x100000000:
        buf += _P_U32(b16 + 1, n)
    else:
        raise ValueError("container too large to pack: %d items" % n)


def _pack(obj, buf, depth):
    t = type(obj)
    if t is str:
        data = obj.encode("utf-8")
        if len(data) < 0x20:  # fixstr, the common case
            buf.append(0xA0 | len(data))
            buf += data
        else:
            _pack_utf8(data, buf)
    elif t is int:
        if 0 <= obj < 0x80:  # positive fixint, the common case
            buf.append(obj)
        else:
            _pack_int(obj, buf)
    elif t is dict:
        if depth > MAX_DEPTH:
            raise ValueError("nesting deeper than %d levels" % MAX_DEPTH)
        _pack_header(len(obj), 0x80, 0xDE, buf)
        depth += 1
        for key, value in obj.items():
            _pack(key, buf, depth)
            _pack(value, buf, depth)
    elif t is list or t is tuple:
        if depth > MAX_DEPTH:
            raise ValueError("nesting deeper than %d levels" % MAX_DEPTH)
        _pack_header(len(obj), 0x90, 0xDC, buf)
        depth += 1
        for item in obj:
            _pack(item, buf, depth)
    elif obj is None:
        buf.append(0xC0)
    elif obj is True:
        buf.append(0xC3)
    elif obj is False:
        buf.append(0xC2)
    elif t is float:
        buf += _P_F64(0xCB, obj)
    elif t is bytes or t is bytearray:
        _pack_bin(obj, buf)
    # Subclasses of the supported types (IntEnum, OrderedDict, ...), as msgpack does.
    elif isinstance(obj, int):
        _pack_int(int(obj), buf)
    elif isinstance(obj, str):
        _pack_utf8(obj.encode("utf-8"), buf)
    elif isinstance(obj, float):
        buf += _P_F64(0xCB, obj)
    elif isinstance(obj, (bytes, bytearray)):
        _pack_bin(obj, buf)
    elif isinstance(obj, memoryview):
        _pack_bin(obj.tobytes(), buf)
    elif isinstance(obj, dict):
        _pack(dict(obj.items()), buf, depth)
    elif isinstance(obj, (list, tuple)):
        _pack(list(obj), buf, depth)
    else:
        raise TypeError("can not serialize %r object" % (t.__name__,))


def packb(obj):
    """Serialise obj exactly as ``msgpack.packb(obj, use_bin_type=True)`` does."""
    buf = bytearray()
    _pack(obj, buf, 1)
    return bytes(buf)


# ---------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------

_U16 = struct.Struct(">H").unpack_from
_U32 = struct.Struct(">I").unpack_from

# Fixed-size scalars: type byte -> (unpack_from, size).
_SCALARS = {
    0xCA: (struct.Struct(">f").unpack_from, 4),
    0xCB: (struct.Struct(">d").unpack_from, 8),
    0xCC: (struct.Struct(">B").unpack_from, 1),
    0xCD: (_U16, 2),
    0xCE: (_U32, 4),
    0xCF: (struct.Struct(">Q").unpack_from, 8),
    0xD0: (struct.Struct(">b").unpack_from, 1),
    0xD1: (struct.Struct(">h").unpack_from, 2),
    0xD2: (struct.Struct(">i").unpack_from, 4),
    0xD3: (struct.Struct(">q").unpack_from, 8),
}

# Variable-length str/bin: type byte -> (unpack_from for the length, its size, is_str).
_VARLEN = {
    0xC4: (struct.Struct(">B").unpack_from, 1, False),
    0xC5: (_U16, 2, False),
    0xC6: (_U32, 4, False),
    0xD9: (struct.Struct(">B").unpack_from, 1, True),
    0xDA: (_U16, 2, True),
    0xDB: (_U32, 4, True),
}

_NO_KEY = object()


def unpackb(data):
    """Decode exactly one msgpack object from bytes, bytearray or memoryview.

    Raises MsgpackError for truncated, trailing, malformed or unsupported input.
    """
    if type(data) is not bytes:
        data = memoryview(data).tobytes()
    try:
        return _unpack(data)
    except MsgpackError:
        raise
    except (IndexError, struct.error, UnicodeDecodeError, TypeError) as exc:
        raise MsgpackError("invalid msgpack data: %s" % (exc,)) from exc


def _unpack(data):
    # Iterative, so hostile nesting cannot exhaust the Python stack. Each open
    # container is a frame [container, items_left, pending_key, is_map].
    n = len(data)
    pos = 0
    stack = []
    while True:
        b = data[pos]  # IndexError at end of data: truncated
        pos += 1
        if b < 0x80:
            obj = b
        elif b >= 0xE0:
            obj = b - 0x100
        elif 0xA0 <= b < 0xC0:
            end = pos + (b & 0x1F)
            if end > n:
                raise MsgpackError("truncated str at offset %d" % (pos - 1))
            obj = data[pos:end].decode("utf-8")
            pos = end
        elif b < 0xA0 or b >= 0xDC:
            # fixmap, fixarray, array16, array32, map16, map32
            if b < 0x90:
                count = b & 0x0F
                is_map = True
            elif b < 0xA0:
                count = b & 0x0F
                is_map = False
            else:
                if b & 1:
                    count = _U32(data, pos)[0]
                    pos += 4
                else:
                    count = _U16(data, pos)[0]
                    pos += 2
                is_map = b >= 0xDE
            if len(stack) >= MAX_DEPTH:
                raise MsgpackError("nesting deeper than %d levels" % MAX_DEPTH)
            if count:
                # Every item takes at least one byte: reject impossible counts early.
                if (count << is_map) > n - pos:
                    raise MsgpackError("truncated container at offset %d" % pos)
                if is_map:
                    stack.append([{}, count, _NO_KEY, True])
                else:
                    stack.append([[], count, None, False])
                continue
            obj = {} if is_map else []
        elif b == 0xC0:
            obj = None
        elif b == 0xC2:
            obj = False
        elif b == 0xC3:
            obj = True
        elif b in _SCALARS:
            unpack_from, size = _SCALARS[b]
            obj = unpack_from(data, pos)[0]
            pos += size
        elif b in _VARLEN:
            unpack_from, size, is_str = _VARLEN[b]
            pos += size
            end = pos + unpack_from(data, pos - size)[0]
            if end > n:
                raise MsgpackError("truncated str/bin at offset %d" % (pos - size - 1))
            obj = data[pos:end]
            if is_str:
                obj = obj.decode("utf-8")
            pos = end
        else:
            # 0xc1 (never used), ext 8/16/32 and fixext 1/2/4/8/16 (incl. timestamps)
            raise MsgpackError("unsupported msgpack type byte 0x%02x at offset %d" % (b, pos - 1))

        # Attach obj to the innermost open container, closing finished ones.
        while stack:
            frame = stack[-1]
            container = frame[0]
            if frame[3]:
                key = frame[2]
                if key is _NO_KEY:
                    frame[2] = obj
                    break
                container[key] = obj  # TypeError for an unhashable key
                frame[2] = _NO_KEY
            else:
                container.append(obj)
            frame[1] -= 1
            if frame[1]:
                break
            stack.pop()
            obj = container
        else:
            if pos != n:
                raise MsgpackError("%d trailing bytes after the object" % (n - pos))
            return obj
