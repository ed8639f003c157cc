"""Capturing a script's stdout and stderr within fixed memory.

stdout keeps its head (40%) and tail (60%) up to the cap; once the cap is passed the
full text is also written to a spill file, itself capped, whose path rides in the
result so the agent can page through it instead of re-running the script.

The cap holds for the text too, after decoding: a byte that is not UTF-8 becomes U+FFFD
(3 bytes) and a control byte a 6-byte escape in the JSON result, so the kept text is cut
again until its :func:`~hermes_sandbox.truncation.encoded_size` fits the cap, and the
counts say how many bytes it really shows.
"""

from __future__ import annotations

import os
from typing import BinaryIO

from hermes_sandbox.environments.capture import HeadTailBuffer
from hermes_sandbox.spill import SPILL_PREFIX, SPILL_SUFFIX
from hermes_sandbox.truncation import (
    decode_head_within,
    decode_tail_within,
    encoded_size,
    omission_marker,
)

MAX_STDOUT_BYTES = 50_000
MAX_STDERR_BYTES = 10_000
MAX_SPILL_BYTES = 5_000_000


def spill_notice(path: str, *, for_model: bool) -> str:
    """The sentence that says where the full output of a truncated run is: for a model,
    how to page it with its read_file tool; for a person, just where it is."""
    if for_model:
        return (
            f"The full output is in {path}; page it with "
            f'read_file(path="{path}", offset=...) instead of re-running.'
        )
    return f"The full output is in {path}."


def default_spill_dir() -> str:
    import tempfile  # not at import: the command line reads this module's caps only

    return os.path.join(tempfile.gettempdir(), "hermes-sandbox-spill")


class CappedOutput:
    """A bounded view of one output stream; see the module docstring."""

    def __init__(
        self,
        limit: int,
        *,
        spill_limit: int = 0,
        spill_dir: str | None = None,
        spill_name: str = "stdout.txt",
    ) -> None:
        self.buffer = HeadTailBuffer(limit)
        self._early: bytearray | None = bytearray() if spill_limit else None
        self._spill_limit = spill_limit
        self._spill_dir = spill_dir
        self._spill_name = spill_name
        self._spill: BinaryIO | None = None
        self._spilled = 0
        self.spill_path: str | None = None
        self.spill_error: str | None = None
        self._view: tuple[str, int] | None = None

    def feed(self, data: bytes) -> None:
        self._view = None
        self.buffer.feed(data)
        if self._early is None:  # not spilling, or spill already open or failed
            if self._spill is not None:
                self._write_spill(data)
            return
        if self.buffer.total <= self.buffer.limit:
            self._early += data
            return
        early, self._early = self._early, None
        self._open_spill()
        if self._spill is not None:
            self._write_spill(bytes(early) + data)

    def _open_spill(self) -> None:
        import tempfile

        directory = self._spill_dir or default_spill_dir()
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            fd, path = tempfile.mkstemp(prefix=SPILL_PREFIX, suffix=SPILL_SUFFIX, dir=directory)
            self._spill = os.fdopen(fd, "wb")
            self.spill_path = path
        except OSError as exc:
            self.spill_error = f"could not spill the full output: {exc}"

    def _write_spill(self, data: bytes) -> None:
        assert self._spill is not None
        room = self._spill_limit - self._spilled
        if room <= 0:
            return
        chunk = data[:room]
        try:
            self._spill.write(chunk)
        except OSError as exc:
            self.spill_error = f"spill file write failed: {exc}"
            self._close_spill()
            return
        self._spilled += len(chunk)

    def _close_spill(self) -> None:
        if self._spill is not None:
            try:
                if self.buffer.total > self._spilled and self._spilled >= self._spill_limit:
                    more = self.buffer.total - self._spilled
                    cap = self._spill_limit
                    note = f"\n\n[... spill capped at {cap:,} bytes; {more:,} more ...]\n"
                    self._spill.write(note.encode())
                self._spill.close()
            except OSError:
                pass
            self._spill = None

    def close(self) -> None:
        if self._early is not None and self.truncated:
            # Every byte fit the cap, but their text did not: spill them all too.
            early, self._early = self._early, None
            self._open_spill()
            if self._spill is not None:
                self._write_spill(bytes(early))
        self._close_spill()

    def _decoded(self) -> tuple[str, int]:
        """The text kept, cut to the cap after decoding, and how many bytes it shows."""
        if self._view is None:
            buffer = self.buffer
            if buffer.truncated:
                head, tail = buffer.head(), buffer.tail()
            else:
                whole = buffer.getvalue()
                text = whole.decode("utf-8", "replace")
                if encoded_size(text) <= buffer.limit:
                    self._view = (text, len(whole))
                    return self._view
                head, tail = whole[: buffer.head_limit], whole[buffer.head_limit :]
            head_text, head_shown = decode_head_within(head, buffer.head_limit)
            tail_text, tail_shown = decode_tail_within(tail, buffer.tail_limit)
            shown = head_shown + tail_shown
            marker = omission_marker(buffer.total - shown, "bytes")
            self._view = (head_text + marker + tail_text, shown)
        return self._view

    @property
    def truncated(self) -> bool:
        """Whether the text leaves out some of the stream (by bytes, or after decoding)."""
        return self.shown_bytes < self.buffer.total

    @property
    def shown_bytes(self) -> int:
        """How many of the stream's bytes the text shows."""
        return self._decoded()[1]

    def text(self) -> str:
        """The kept text: whole, or head + marker + tail, decoded with replacement and
        cut so that its encoded size is at most the cap (plus the marker)."""
        return self._decoded()[0]
