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


__all__ = [
    "HEAD_SHARE",
    "cut_middle",
    "decode_ends",
    "keep_ends",
    "omission_marker",
    "trim_utf8_end",
    "trim_utf8_start",
]
