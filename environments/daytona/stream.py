"""The daytona backend's exec stream: a session command under the codec
(stubs/_daytona_codec.py), its text lines turned back into a byte stream both ways."""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import logging
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from hermes_sandbox.environments.base import ExecStream
from hermes_sandbox.environments.errors import EnvironmentFailure

if TYPE_CHECKING:
    from hermes_sandbox.environments.daytona.environment import DaytonaEnvironment

log = logging.getLogger(__name__)

_STDERR_TAIL = 8192
_OUTPUT_BUFFER = 64  # decoded output chunks held for a reader that is behind
_INPUT_CHUNK = 96 * 1024  # bytes of stdin per "d" line (128 KiB of base64)
_INPUT_REQUEST = 512 * 1024  # characters of input lines sent in one request
_MAX_LOG_LINE = 1 << 20  # a longer line is not the codec's: the stream is garbled


def _message(exc: BaseException) -> str:
    """What an SDK error says, for messages."""
    return str(getattr(exc, "message", None) or exc) or type(exc).__name__


# -- the exec stream -------------------------------------------------------------------


class _Garbled(Exception):
    """The command's log held something the codec cannot have written."""

    def __init__(self, stream: DaytonaExecStream, what: str) -> None:
        super().__init__(what)
        stream._failure = f"the command's output stream is garbled: {what}"


class DaytonaExecStream(ExecStream):
    """A session command under the codec: its stdin and stdout as one byte stream.

    Output arrives through the SDK's log follower (a task of this stream) as the
    codec's text lines; input goes out as lines through ``send_session_command_input``,
    one request at a time (two requests at once could interleave in the FIFO).
    """

    def __init__(
        self,
        owner: DaytonaEnvironment,
        process: Any,
        session_id: str,
        command_id: str,
        header: str,
        *,
        stdin: bool,
    ) -> None:
        self._owner = owner
        self._process = process
        self.session_id = session_id
        self.command_id = command_id
        self._header: str | None = header
        self._stdin = stdin
        self._lock = anyio.Lock()
        self._send_data, self._receive_data = anyio.create_memory_object_stream[bytes](
            _OUTPUT_BUFFER
        )
        self._leftover = b""
        self._partial = ""
        self._done = anyio.Event()
        self._exit_code: int | None = None
        self._failure: str | None = None
        self._input_gone = False
        self._eof_sent = False
        self._closed = False
        self._tasks: list[asyncio.Task[None]] = []
        self.stderr_tail = b""

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._follow()), loop.create_task(self._keep_alive())]

    # -- output --------------------------------------------------------------------------

    async def _follow(self) -> None:
        try:
            await self._process.get_session_command_logs_async(
                self.session_id, self.command_id, self._on_stdout, self._on_stderr
            )
            await self._line(self._partial)  # the log copier ends every line it copies
            if self._exit_code is None:
                await self._exit_from_daemon()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # DaytonaError (the SDK wraps what a callback raised too)
            if self._failure is None:
                self._failure = await self._owner._describe_loss(
                    f"lost the command's output stream: {_message(exc)}", exc
                )
        finally:
            self._send_data.close()
            self._done.set()

    async def _exit_from_daemon(self) -> None:
        """The log ended without the codec's exit line (it never ran, or was killed):
        ask the daemon for the command's exit code."""
        try:
            command = await self._process.get_session_command(self.session_id, self.command_id)
        except Exception as exc:
            self._failure = await self._owner._describe_loss(
                f"the command's output ended early: {_message(exc)}", exc
            )
            return
        code = getattr(command, "exit_code", None)
        if code is None:
            self._failure = "the command's output ended before the command did"
        else:
            self._exit_code = int(code)

    async def _on_stdout(self, text: str) -> None:
        self._partial += text
        if "\n" not in self._partial:
            if len(self._partial) > _MAX_LOG_LINE:
                raise _Garbled(self, f"a line of more than {_MAX_LOG_LINE} characters")
            return
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            await self._line(line)

    async def _on_stderr(self, text: str) -> None:
        # Only the codec itself (or the shell, when it cannot start it) writes here.
        self.stderr_tail = (self.stderr_tail + text.encode("utf-8", "replace"))[-_STDERR_TAIL:]

    async def _line(self, line: str) -> None:
        tag, body = line[:1], line[1:]
        if tag in ("o", "e"):
            try:
                data = binascii.a2b_base64(body)
            except (binascii.Error, ValueError) as exc:
                raise _Garbled(self, f"a bad output line ({exc})") from exc
            if tag == "e":
                self.stderr_tail = (self.stderr_tail + data)[-_STDERR_TAIL:]
                return
            try:
                await self._send_data.send(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # nobody reads any more: keep following for the exit
        elif tag == "x" and body.lstrip("-").isdigit():
            self._exit_code = int(body)
        # Anything else is not the codec's output (an older daemon echoes the input
        # into the log unless told not to): ignored.

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._closed:
            raise anyio.ClosedResourceError
        if not self._leftover:
            await self._flush_header()
            try:
                self._leftover = await self._receive_data.receive()
            except anyio.EndOfStream:
                if self._failure is not None:
                    raise anyio.BrokenResourceError(self._failure) from None
                raise
        chunk, self._leftover = self._leftover[:max_bytes], self._leftover[max_bytes:]
        return chunk

    async def wait(self) -> int:
        """The command's exit code; EnvironmentFailure when it cannot be known (the
        sandbox went away)."""
        await self._flush_header()
        await self._done.wait()
        if self._exit_code is None:
            raise EnvironmentFailure(self._failure or "the command's exit code is not known")
        return self._exit_code

    # -- input ---------------------------------------------------------------------------

    async def _post(self, lines: list[str]) -> None:
        """Send lines to the codec (the header first if not yet sent), in order."""
        async with self._lock:
            if self._header is not None:
                lines = [self._header, *lines]
                self._header = None
            if self._input_gone:
                return
            batch: list[str] = []
            size = 0
            for line in [*lines, None]:
                if line is None or (batch and size + len(line) > _INPUT_REQUEST):
                    if batch:
                        await self._send_text("".join(batch))
                        if self._input_gone:
                            return
                    batch, size = [], 0
                if line is not None:
                    batch.append(line + "\n")
                    size += len(line) + 1

    async def _send_text(self, text: str) -> None:
        sdk = self._owner._sdk
        try:
            await self._process.send_session_command_input(self.session_id, self.command_id, text)
        except sdk.DaytonaGoneError:
            # The command has ended: what it did not read is lost, as with a pipe whose
            # reader exited. Its exit code tells what happened.
            self._input_gone = True
        except (sdk.DaytonaError, OSError) as exc:
            message = await self._owner._describe_loss(
                f"could not send input to the command: {_message(exc)}", exc
            )
            raise anyio.BrokenResourceError(message) from exc

    async def _flush_header(self) -> None:
        if self._header is not None:
            await self._post([])

    async def send(self, item: bytes) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        if not self._stdin or self._eof_sent:
            raise anyio.BrokenResourceError("the command's stdin is closed")
        view = memoryview(item)
        lines = [
            "d" + binascii.b2a_base64(view[i : i + _INPUT_CHUNK], newline=False).decode("ascii")
            for i in range(0, len(view), _INPUT_CHUNK)
        ]
        await self._post(lines)

    async def send_eof(self) -> None:
        if self._eof_sent or self._closed:
            return
        self._eof_sent = True
        await self._post(["c"])

    async def _keep_alive(self) -> None:
        """Tell the codec the host is still there (it kills its command otherwise)."""
        interval = self._owner.ping_interval
        while not self._done.is_set():
            with anyio.move_on_after(interval):
                await self._done.wait()
            if self._done.is_set():
                return
            try:
                await self._post(["p"])
            except anyio.BrokenResourceError:
                return

    # -- closing -------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Stop the command if it still runs (the codec ends its stdin, then kills its
        processes), stop following it, and give back or delete its session."""
        if self._closed:
            return
        self._closed = True
        self._receive_data.close()  # the follower drops what nobody reads any more
        with anyio.CancelScope(shield=True):
            if self._header is not None:
                # Never started (the codec still waits for its header): deleting the
                # session below ends it.
                self._header = None
                self._failure = self._failure or "closed before the command started"
            elif not self._done.is_set():
                with contextlib.suppress(anyio.BrokenResourceError):
                    await self._post(["k"])
                with anyio.move_on_after(2 * self._owner.kill_grace + 5):
                    await self._done.wait()
            for task in self._tasks:
                task.cancel()
            for task in self._tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            self._send_data.close()
            reusable = self._done.is_set() and self._failure is None and self._exit_code is not None
            await self._owner._release_session(self, reusable=reusable)
