"""Streaming a script's output to a callback as it prints, beside the capped capture.

:class:`StreamedOutput` sits where a :class:`~hermes_sandbox.output.CappedOutput` is fed:
every chunk still goes to the capped sink (the result is capped exactly as without
streaming), and is also cut into lines for the caller's callback. How much the callback
sees is bounded too; docs/sessions.md describes the bounds.
"""

from __future__ import annotations

import codecs
import inspect
import logging
from collections.abc import Awaitable, Callable

from hermes_sandbox.output import MAX_SPILL_BYTES, CappedOutput

log = logging.getLogger(__name__)

# A callback is called with one line (its newline kept) or, for a line longer than
# this many characters, with pieces of it this long.
MAX_PIECE_CHARS = 64 * 1024
# Of one stream, the callback sees at most this many characters (as much as the spill
# file keeps of stdout); then one notice, then nothing more. The result is unaffected.
MAX_STREAMED_CHARS = MAX_SPILL_BYTES

OutputCallback = Callable[[str], "Awaitable[None] | None"]


def streaming_notice(limit: int) -> str:
    """What the callback gets, once, when a stream passes ``limit`` characters."""
    return f"\n[... not streamed past {limit:,} characters; the result keeps the rest ...]\n"


class StreamedOutput:
    """Feeds ``sink`` and hands the same output to ``callback`` in lines.

    The text is decoded as UTF-8 with replacement, incrementally (a character split
    across chunks is not broken), and is neither redacted nor stripped of terminal
    escapes: it is what the script printed. A callback may be a plain function or a
    coroutine function; one that raises is logged and not called again for this run.
    """

    def __init__(
        self,
        sink: CappedOutput,
        callback: OutputCallback,
        *,
        piece_chars: int = MAX_PIECE_CHARS,
        limit: int = MAX_STREAMED_CHARS,
    ) -> None:
        self.sink = sink
        self._callback: OutputCallback | None = callback
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending = ""
        self._piece_chars = piece_chars
        self._limit = limit
        self.streamed = 0  # characters handed to the callback

    async def feed(self, data: bytes) -> None:
        self.sink.feed(data)
        if self._callback is None:
            return
        text = self._pending + self._decoder.decode(data)
        pieces: list[str] = []
        start = 0
        while True:
            end = text.find("\n", start)
            if end < 0:
                break
            pieces.extend(self._split(text[start : end + 1]))
            start = end + 1
        rest = text[start:]
        while len(rest) >= self._piece_chars:
            pieces.append(rest[: self._piece_chars])
            rest = rest[self._piece_chars :]
        self._pending = rest
        for piece in pieces:
            await self._deliver(piece)

    async def flush(self) -> None:
        """Hand over what is left: the last line when it had no newline."""
        if self._callback is None:
            return
        text = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        for piece in self._split(text):
            await self._deliver(piece)

    def _split(self, line: str) -> list[str]:
        size = self._piece_chars
        return [line[i : i + size] for i in range(0, len(line), size)]

    async def _deliver(self, piece: str) -> None:
        callback = self._callback
        if callback is None or not piece:
            return
        room = self._limit - self.streamed
        if room <= 0:
            return
        if len(piece) > room:
            piece = piece[:room] + streaming_notice(self._limit)
        self.streamed += len(piece)
        try:
            outcome = callback(piece)
            if inspect.isawaitable(outcome):
                await outcome
        except Exception:
            log.exception("an output callback raised; it gets no more output from this run")
            self._callback = None
