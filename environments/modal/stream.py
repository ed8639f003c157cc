"""The modal backend's exec stream: a ``Sandbox.exec`` process's stdin and stdout as
one byte stream, its stderr kept as a tail, and what it left killed when it closes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from hermes_sandbox.environments.base import ExecStream

log = logging.getLogger(__name__)

_STDERR_TAIL = 8192
_STDIN_CHUNK = 1 << 20  # below the SDK's 16 MiB limit on what one drain may carry
_STDERR_JOIN_SECONDS = 2.0  # after an exec exits: for the rest of its stderr to arrive
_EOF_SECONDS = 10.0
_EXIT_SECONDS = 2.0  # for an exec's exit status once its output ended

# -- the exec stream ---------------------------------------------------------------------


class ModalExecStream(ExecStream):
    """A ``Sandbox.exec`` process's stdin and stdout as one byte stream.

    stdout is read through the SDK's reader as bytes; stdin is written and drained in
    chunks; stderr is read all along by a background task (on the event loop, as the
    SDK's I/O is) and its last few KiB kept in :attr:`stderr_tail`, complete once
    :meth:`wait` returns. With ``close_stdin`` the process gets end of input at once.
    Closing the stream ends stdin, waits ``exit_grace`` seconds for the process to exit
    and otherwise calls ``reap`` to kill it inside the sandbox.

    With ``diagnose``, a stream whose output ends with the process killed (or its exit
    unknown) asks it why; a reason (the sandbox stopped) is added to :attr:`stderr_tail`
    before the end is reported, so whoever explains the end (the relay) can say it.
    """

    def __init__(
        self,
        process: Any,
        *,
        foreign: tuple[type[BaseException], ...],
        close_stdin: bool,
        exit_grace: float,
        reap: Callable[[], Awaitable[None]] | None,
        diagnose: Callable[[], Awaitable[str | None]] | None = None,
    ) -> None:
        self._process = process
        self._stdin = process.stdin
        self._foreign = foreign
        # What writing to stdin raises once it is closed, and closing a reader in use.
        self._write_errors: tuple[type[BaseException], ...] = (*foreign, ValueError, BufferError)
        self._close_errors: tuple[type[BaseException], ...] = (*foreign, RuntimeError)
        self._reader: Any = None
        self._buffer = b""
        self._eof = False
        self._eof_sent = close_stdin
        self._closed = False
        self._returncode: int | None = None
        self._exit_grace = exit_grace
        self._reap = reap
        self._diagnose = diagnose
        self._send_lock = anyio.Lock()
        self._background_done = anyio.Event()
        self.stderr_tail = b""
        # A plain asyncio task: the stream outlives the call that opened it, so it has
        # no task group to live in, and the SDK needs asyncio anyway.
        self._background = asyncio.get_running_loop().create_task(self._read_stderr(close_stdin))

    async def _read_stderr(self, close_stdin: bool) -> None:
        try:
            if close_stdin:
                try:
                    self._stdin.write_eof()
                    await self._stdin.drain.aio()
                except self._write_errors as exc:
                    log.debug("could not close an exec's stdin: %s", exc)
            try:
                async for chunk in self._process.stderr:
                    data = chunk.encode() if isinstance(chunk, str) else bytes(chunk)
                    self.stderr_tail = (self.stderr_tail + data)[-_STDERR_TAIL:]
            except self._foreign as exc:  # diagnostics only: not a reason to fail
                log.debug("an exec's stderr broke: %s", exc)
        finally:
            self._background_done.set()

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._closed:
            raise anyio.ClosedResourceError
        while not self._buffer:
            if self._eof:
                raise anyio.EndOfStream
            if self._reader is None:
                self._reader = aiter(self._process.stdout)
            try:
                chunk = await anext(self._reader)
            except StopAsyncIteration:
                self._eof = True
                self._reader = None
                await self._explain_end()
                raise anyio.EndOfStream from None
            except self._foreign as exc:
                self._reader = None
                await self._explain_end()
                raise anyio.BrokenResourceError(f"the exec's output broke: {exc}") from exc
            except BaseException:
                # Cancelled mid-read: that iterator is finished, and the SDK's reader
                # resumes at its offset in a new one.
                self._reader = None
                raise
            self._buffer = chunk.encode() if isinstance(chunk, str) else bytes(chunk)
        data, self._buffer = self._buffer[:max_bytes], self._buffer[max_bytes:]
        return data

    async def _explain_end(self) -> None:
        """The output ended: if the process was killed or its exit is unknown, ask
        ``diagnose`` why and keep the answer in stderr_tail."""
        if self._diagnose is None:
            return
        code: int | None = None
        with anyio.move_on_after(_EXIT_SECONDS):
            try:
                code = self._returncode = int(await self._process.wait.aio())
            except self._foreign:
                pass
        if code is not None and 0 <= code < 128:
            return  # it exited by itself
        reason = await self._diagnose()
        if reason:
            self.stderr_tail = (self.stderr_tail + f"\n{reason}".encode())[-_STDERR_TAIL:]

    async def send(self, item: bytes) -> None:
        if self._closed or self._eof_sent:
            raise anyio.ClosedResourceError
        async with self._send_lock:
            try:
                for start in range(0, len(item), _STDIN_CHUNK):
                    self._stdin.write(item[start : start + _STDIN_CHUNK])
                    await self._stdin.drain.aio()
            except self._write_errors as exc:
                raise anyio.BrokenResourceError(f"the exec's input broke: {exc}") from exc

    async def send_eof(self) -> None:
        if self._eof_sent:
            return
        self._eof_sent = True
        async with self._send_lock:
            try:
                self._stdin.write_eof()
                await self._stdin.drain.aio()
            except self._write_errors as exc:
                raise anyio.BrokenResourceError(f"the exec's input broke: {exc}") from exc

    async def wait(self) -> int:
        """The exec's exit code (128+N for signal N), once its stderr is read."""
        if self._returncode is None:
            try:
                self._returncode = int(await self._process.wait.aio())
            except self._foreign as exc:
                raise anyio.BrokenResourceError(f"waiting for the exec failed: {exc}") from exc
        with anyio.move_on_after(_STDERR_JOIN_SECONDS):
            await self._background_done.wait()
        return self._returncode

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            if not self._eof_sent:
                self._eof_sent = True
                with anyio.move_on_after(_EOF_SECONDS):
                    try:
                        async with self._send_lock:
                            self._stdin.write_eof()
                            await self._stdin.drain.aio()
                    except self._write_errors:
                        pass
            if self._returncode is None:
                with anyio.move_on_after(self._exit_grace):
                    try:
                        self._returncode = int(await self._process.wait.aio())
                    except self._foreign:
                        pass
                if self._returncode is None and self._reap is not None:
                    await self._reap()
            if not self._background.done():
                self._background.cancel()
                await asyncio.wait([self._background], timeout=1.0)
            reader, self._reader = self._reader, None
            if reader is not None:
                try:
                    await reader.aclose()
                except self._close_errors:
                    pass
