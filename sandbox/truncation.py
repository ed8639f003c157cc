"""Cutting text to size by keeping its head and tail, with one marker for what was left out.

Script output, a command's output, tool results and web pages are all cut this way::

    <head>
    ... [12,345 characters omitted] ...
    <tail>

The count is in bytes where bytes were counted (a process's output, see
:func:`decode_ends`) and in characters otherwise. This module imports nothing of the
package, so every layer may use it, as it may use :mod:`hermes_sandbox.errors`.
"""

from __future__ import annotations

import re

HEAD_SHARE = 0.4  # of what is kept; the tail, where errors and results tend to be, gets the rest


def omission_marker(omitted: int, unit: str = "characters") -> str:
    """The line that stands where ``omitted`` characters (or bytes) were cut out."""
    return f"\n... [{omitted:,} {unit} omitted] ...\n"


def keep_ends(text: str, keep: int, *, head_share: float = HEAD_SHARE) -> str:
    """``text`` with only ``keep`` of its characters, head and tail, around the marker.

    ``text`` itself when it has no more than ``keep`` characters.
    """
    if keep >= len(text):
        return text
    keep = max(keep, 0)
    head = int(keep * head_share)
    tail = keep - head
    return text[:head] + omission_marker(len(text) - keep) + text[len(text) - tail :]


def cut_middle(text: str, limit: int, *, head_share: float = HEAD_SHARE) -> str:
    """``text`` in at most ``limit`` characters, marker included.

    Unchanged when it fits; else its head and tail around the marker, the head taking
    ``head_share`` of what is kept. A limit too small to hold the marker keeps only the
    head.
    """
    if len(text) <= limit:
        return text
    keep = limit - len(omission_marker(len(text)))  # the longest marker this text can need
    if keep <= 0:
        return text[: max(limit, 0)]
    return keep_ends(text, keep, head_share=head_share)


def decode_ends(head: bytes, omitted: int, tail: bytes) -> str:
    """The kept head and tail of a byte stream as text, around the marker in bytes.

    A UTF-8 character split by a cut is dropped rather than shown as a replacement
    character; anything else undecodable is replaced.
    """
    return (
        trim_utf8_end(head).decode("utf-8", "replace")
        + omission_marker(omitted, "bytes")
        + trim_utf8_start(tail).decode("utf-8", "replace")
    )


def trim_utf8_end(data: bytes) -> bytes:
    """Drop an incomplete UTF-8 sequence cut off at the end of ``data``."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead byte or ASCII
            need = 1 if byte < 0x80 else 2 if byte >> 5 == 6 else 3 if byte >> 4 == 14 else 4
            return data[:-back] if need > back else data
    return data


def trim_utf8_start(data: bytes) -> bytes:
    """Drop continuation bytes left at the start of ``data`` by a cut."""
    start = 0
    while start < min(3, len(data)) and data[start] & 0xC0 == 0x80:
        start += 1
    return data[start:]


_ESCAPED_CONTROLS = re.compile("[\x00-\x08\x0b-\x0c\x0e-\x1f]")


def encoded_size(text: str) -> int:
    """Bytes ``text`` takes in UTF-8, each control character but tab, newline and CR
    counted as the 6-byte ``\\u00XX`` escape JSON writes for it. Its JSON string (with
    ``ensure_ascii=False``) is at most this plus one byte per quote, backslash, tab,
    newline or CR: the escapes every text pays, as the script's own text would."""
    return len(text.encode("utf-8")) + 5 * len(_ESCAPED_CONTROLS.findall(text))


def decode_head_within(data: bytes, budget: int) -> tuple[str, int]:
    """The longest start of ``data`` whose decoded text has an :func:`encoded_size` of at
    most ``budget``, and how many bytes of ``data`` it shows.

    A byte that is not UTF-8 decodes to U+FFFD (3 bytes) and a control byte becomes a
    ``\\u00XX`` escape (6 bytes) in JSON, so a byte cap alone lets the text grow 3x and
    its JSON 6x.
    """
    return _fit(data, budget, from_start=True)


def decode_tail_within(data: bytes, budget: int) -> tuple[str, int]:
    """The shortest end of ``data`` whose decoded text has an :func:`encoded_size` of at
    most ``budget``, and how many bytes of ``data`` it shows; see
    :func:`decode_head_within`."""
    return _fit(data, budget, from_start=False)


def cut_middle_encoded(text: str, limit: int, *, head_share: float = HEAD_SHARE) -> str:
    """``text`` cut like :func:`cut_middle`, but so that its :func:`encoded_size`, not its
    length in characters, is at most ``limit`` (marker included).

    For text decoded from a process's bytes: each undecodable byte became U+FFFD (3
    bytes) and each control byte costs a 6-byte escape in JSON, so a cap in characters
    would let such output take 3x to 6x the room it is given. The omitted count is in
    characters.
    """
    if encoded_size(text) <= limit:
        return text
    keep = limit - len(omission_marker(len(text)))  # the longest marker this text can need
    if keep <= 0:
        return decode_head_within(text.encode("utf-8", "surrogatepass")[:limit], limit)[0]
    head_budget = int(keep * head_share)
    tail_budget = keep - head_budget
    # Each byte shown costs at least one byte of encoded size: no more is ever needed.
    data = text.encode("utf-8", "surrogatepass")
    head, _ = decode_head_within(data[:head_budget], head_budget)
    tail, _ = decode_tail_within(data[len(data) - tail_budget :], tail_budget)
    return head + omission_marker(len(text) - len(head) - len(tail)) + tail


def _fit(data: bytes, budget: int, *, from_start: bool) -> tuple[str, int]:
    def piece(n: int) -> bytes:
        if from_start:
            return trim_utf8_end(data[:n])
        return trim_utf8_start(data[len(data) - n :])

    best_text, best_shown = "", 0
    low, high = 0, len(data)  # binary search on the bytes taken: the cost grows with them
    while low <= high:
        middle = (low + high) // 2
        chosen = piece(middle)
        text = chosen.decode("utf-8", "replace")
        if encoded_size(text) <= budget:
            best_text, best_shown = text, len(chosen)
            low = middle + 1
        else:
            high = middle - 1
    return best_text, best_shown


__all__ = [
    "HEAD_SHARE",
    "cut_middle",
    "cut_middle_encoded",
    "decode_ends",
    "decode_head_within",
    "decode_tail_within",
    "encoded_size",
    "keep_ends",
    "omission_marker",
    "trim_utf8_end",
    "trim_utf8_start",
]
