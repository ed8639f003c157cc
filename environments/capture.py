"""Bounded capture of a process's output: keep a head and a tail, count the rest.

A runaway writer costs the host at most ``limit`` bytes (plus one chunk) of memory,
however much it writes.
"""

from __future__ import annotations


class HeadTailBuffer:
    """Keep the first ``head_limit`` and the last ``tail_limit`` bytes fed to it."""

    __slots__ = ("_head", "_tail", "head_limit", "tail_limit", "total")

    def __init__(self, limit: int, head_fraction: float = 0.4) -> None:
        if limit < 0:
            raise ValueError("limit must be >= 0")
        self.head_limit = int(limit * head_fraction)
        self.tail_limit = limit - self.head_limit
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    @property
    def limit(self) -> int:
        return self.head_limit + self.tail_limit

    @property
    def truncated(self) -> bool:
        return self.total > self.limit

    @property
    def omitted(self) -> int:
        return max(0, self.total - self.limit)

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_limit - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if not data or not self.tail_limit:
            return
        tail = self._tail
        tail += data
        if len(tail) > 2 * self.tail_limit:  # trim rarely: amortised O(1) per byte
            del tail[: len(tail) - self.tail_limit]

    def head(self) -> bytes:
        return bytes(self._head)

    def tail(self) -> bytes:
        return bytes(self._tail[-self.tail_limit :]) if self.tail_limit else b""

    def getvalue(self) -> bytes:
        """Everything, when nothing was dropped; else head and tail joined."""
        return self.head() + self.tail()


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
