"""Capturing a script's stdout and stderr within fixed memory.

stdout keeps its head (40%) and tail (60%) up to the cap; once the cap is passed the
full text is also written to a spill file, itself capped, whose path rides in the
result so the agent can page through it instead of re-running the script.
"""

from __future__ import annotations

import os
import tempfile
from typing import BinaryIO

from hermes_sandbox.environments.capture import HeadTailBuffer
from hermes_sandbox.spill import SPILL_PREFIX, SPILL_SUFFIX

MAX_STDOUT_BYTES = 50_000
MAX_STDERR_BYTES = 10_000
MAX_SPILL_BYTES = 5_000_000


def default_spill_dir() -> str:
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

    def feed(self, data: bytes) -> None:
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
        self._close_spill()

    @property
    def truncated(self) -> bool:
        return self.buffer.truncated

    def text(self) -> str:
        """The kept text: whole, or head + marker + tail, decoded with replacement."""
        return self.buffer.text()
