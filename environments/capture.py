"""Bounded capture of a process's output: keep a head and a tail, count the rest.

A runaway writer costs the host at most ``limit`` bytes (plus one chunk) of memory,
however much it writes.
"""

from __future__ import annotations

from hermes_sandbox.truncation import HEAD_SHARE, decode_ends


class HeadTailBuffer:
    """Keep the first ``head_limit`` and the last ``tail_limit`` bytes fed to it."""

    __slots__ = ("_head", "_tail", "head_limit", "tail_limit", "total")

    def __init__(self, limit: int, head_fraction: float = HEAD_SHARE) -> None:
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

    def text(self) -> str:
        """What was kept, decoded: all of it, or head and tail around the omission marker."""
        if not self.truncated:
            return self.getvalue().decode("utf-8", "replace")
        return decode_ends(self.head(), self.omitted, self.tail())
