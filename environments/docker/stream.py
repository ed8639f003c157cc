"""The docker backend's exec stream: an exec's stdin and stdout over the socket the
engine hands over, its output demultiplexed from the engine's 8-byte frame headers."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

from hermes_sandbox.environments.base import ExecStream

_STDERR_TAIL = 8192
_RECEIVE_CHUNK = 65536


# -- the engine's multiplexed stream ---------------------------------------------------


class _FrameDemux:
    """Split an exec's output stream, as the engine sends it without a TTY.

    Every chunk of output is one frame with an 8-byte header::

        byte 0      stream: 0 stdin, 1 stdout, 2 stderr, 3 an error from the engine
        bytes 1-3   zero
        bytes 4-7   length of the payload, unsigned 32-bit big-endian

    :meth:`feed` takes bytes as they arrive, split anywhere, and returns the payload
    pieces with their stream number; a piece is passed on before its frame is complete.
    """

    __slots__ = ("_header", "_remaining", "_stream")

    def __init__(self) -> None:
        self._header = bytearray()
        self._stream = 0
        self._remaining = 0

    @property
    def mid_frame(self) -> bool:
        return bool(self._header) or self._remaining > 0

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        pieces: list[tuple[int, bytes]] = []
        pos, end = 0, len(data)
        while pos < end:
            if self._remaining == 0:
                take = min(8 - len(self._header), end - pos)
                self._header += data[pos : pos + take]
                pos += take
                if len(self._header) < 8:
                    break
                header = bytes(self._header)
                self._header.clear()
                if header[0] > 3 or header[1:4] != b"\0\0\0":
                    raise ValueError(f"not a multiplexed exec stream (header {header.hex()})")
                self._stream = header[0]
                self._remaining = int.from_bytes(header[4:8], "big")
                continue
            take = min(self._remaining, end - pos)
            pieces.append((self._stream, data[pos : pos + take]))
            pos += take
            self._remaining -= take
        return pieces


class ThreadedSocketStream(anyio.abc.ByteStream):
    """A blocking socket-like object (a TLS socket, an SSH channel) used from threads:
    for engines reached through something the event loop cannot wait on directly."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        if hasattr(sock, "settimeout"):
            sock.settimeout(None)  # the SDK's request timeout would end an idle stream
        self._closed = False

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._closed:
            raise anyio.ClosedResourceError
        try:
            data = await anyio.to_thread.run_sync(
                self._sock.recv, max_bytes, abandon_on_cancel=True
            )
        except OSError as exc:
            if self._closed:
                raise anyio.ClosedResourceError from exc
            raise anyio.BrokenResourceError(str(exc)) from exc
        if not data:
            raise anyio.EndOfStream
        return bytes(data)

    async def send(self, item: bytes) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        try:
            await anyio.to_thread.run_sync(self._sock.sendall, item)
        except OSError as exc:
            raise anyio.BrokenResourceError(str(exc)) from exc

    async def send_eof(self) -> None:
        try:
            if hasattr(self._sock, "shutdown_write"):  # a paramiko channel
                self._sock.shutdown_write()
            else:
                self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv
        except (OSError, AttributeError, TypeError):
            pass
        self._sock.close()


class NonBlockingSocketStream(anyio.abc.ByteStream):
    """A plain socket (the engine's hijacked connection) read and written non-blocking
    from the event loop: a read tries the socket first and waits for readability only
    when it has nothing, and :meth:`send_nowait` writes in the caller's own step, so a
    relayed call costs one wake-up and one system call each way."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None  # read_in_loop's, while reading
        self._on_data: Callable[[bytes], None] | None = None
        self._on_end: Callable[[Exception | None], None] | None = None

    # -- read from the loop's reader callback (asyncio) ---------------------------------

    def read_in_loop(
        self, on_data: Callable[[bytes], None], on_end: Callable[[Exception | None], None]
    ) -> bool:
        """From now on have the event loop call ``on_data(bytes)`` from its reader
        callback as bytes arrive, with no task woken in between, and ``on_end(None)``
        at the end of the stream (``on_end(exc)`` when it broke); :meth:`receive` must
        not be used any more. False, and nothing done, where the loop has no reader
        callbacks (trio)."""
        try:
            loop = asyncio.get_running_loop()
            loop.add_reader(self._sock.fileno(), self._readable)
        except (RuntimeError, NotImplementedError):
            return False
        self._loop, self._on_data, self._on_end = loop, on_data, on_end
        return True

    def pause_reading(self) -> None:
        if self._loop is not None and not self._closed:
            self._loop.remove_reader(self._sock.fileno())

    def resume_reading(self) -> None:
        if self._loop is not None and not self._closed:
            self._loop.add_reader(self._sock.fileno(), self._readable)

    def stop_reading(self) -> None:
        """End :meth:`read_in_loop`: no callback is called after this."""
        self.pause_reading()
        self._loop = self._on_data = self._on_end = None

    def _readable(self) -> None:
        assert self._on_data is not None and self._on_end is not None
        on_end = self._on_end
        try:
            data = self._sock.recv(_RECEIVE_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.stop_reading()
            on_end(anyio.BrokenResourceError(str(exc)))
            return
        if not data:
            self.stop_reading()
            on_end(None)
            return
        self._on_data(data)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        waited = False
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                data = self._sock.recv(max_bytes)
            except (BlockingIOError, InterruptedError):
                await anyio.wait_readable(self._sock)  # ClosedResourceError on aclose
                waited = True
                continue
            except OSError as exc:
                raise anyio.BrokenResourceError(str(exc)) from exc
            if not data:
                raise anyio.EndOfStream
            if not waited:
                await anyio.lowlevel.checkpoint()  # data always there must not starve others
            return data

    def send_nowait(self, data: bytes) -> int:
        if self._closed:
            return 0
        try:
            return self._sock.send(data)
        except OSError:  # full (BlockingIOError), or broken: send reports it
            return 0

    async def send(self, item: bytes) -> None:
        view = memoryview(item)
        waited = False
        while view:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                view = view[self._sock.send(view) :]
            except (BlockingIOError, InterruptedError):
                await anyio.wait_writable(self._sock)
                waited = True
            except OSError as exc:
                raise anyio.BrokenResourceError(str(exc)) from exc
        if not waited:
            await anyio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    async def aclose(self) -> None:
        if self._closed:
            return
        on_end = self._on_end
        self.stop_reading()
        self._closed = True
        anyio.notify_closing(self._sock)  # wakes a task waiting on it
        if on_end is not None:
            on_end(None)  # as receive's ClosedResourceError ends a reader
        self._sock.close()


class DockerExecStream(ExecStream):
    """An exec's stdin and stdout as one byte stream; stderr kept as a short tail.

    Built on the socket the engine hands over after ``POST /exec/{id}/start``
    (a hijacked HTTP connection), so a round trip costs no thread hop.
    """

    def __init__(
        self,
        transport: anyio.abc.ByteStream,
        inspect: Callable[[], Any],
        release: Callable[[], None],
        pending: bytes = b"",
    ) -> None:
        self._transport = transport
        self._inspect = inspect  # async: the exec's inspect data
        self._release = release  # blocking: close what the SDK keeps for the connection
        self._demux = _FrameDemux()
        self._ready: list[bytes] = []
        self._pending = pending  # read by the SDK's HTTP layer past the response headers
        self._eof = False
        self._eof_sent = False
        self._closed = False
        self._exit_code: int | None = None
        self.stderr_tail = b""

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while not self._ready:
            if self._eof:
                raise anyio.EndOfStream
            if self._pending:
                data, self._pending = self._pending, b""
            else:
                try:
                    data = await self._transport.receive()
                except anyio.EndOfStream:
                    self._eof = True
                    if self._demux.mid_frame:
                        raise anyio.BrokenResourceError(
                            "the engine closed the exec stream inside a frame"
                        ) from None
                    raise
            try:
                pieces = self._demux.feed(data)
            except ValueError as exc:
                raise anyio.BrokenResourceError(str(exc)) from exc
            for stream, piece in pieces:
                if stream == 1:
                    self._ready.append(piece)
                elif piece:  # stderr, or an error from the engine
                    self.stderr_tail = (self.stderr_tail + piece)[-_STDERR_TAIL:]
        chunk = self._ready[0]
        if len(chunk) <= max_bytes:
            self._ready.pop(0)
            return chunk
        self._ready[0] = chunk[max_bytes:]
        return chunk[:max_bytes]

    def read_in_loop(
        self, on_data: Callable[[bytes], None], on_end: Callable[[Exception | None], None]
    ) -> bool:
        """The exec's stdout given to ``on_data`` from the event loop's reader callback
        (see :meth:`NonBlockingSocketStream.read_in_loop`); False where the transport
        cannot (it then stays read by :meth:`receive`)."""
        transport = self._transport
        if not isinstance(transport, NonBlockingSocketStream) or self._eof:
            return False

        def data(chunk: bytes) -> None:
            try:
                pieces = self._demux.feed(chunk)
            except ValueError as exc:
                transport.stop_reading()
                self._eof = True
                on_end(anyio.BrokenResourceError(str(exc)))
                return
            for stream, piece in pieces:
                if stream == 1:
                    on_data(piece)
                elif piece:  # stderr, or an error from the engine
                    self.stderr_tail = (self.stderr_tail + piece)[-_STDERR_TAIL:]

        def end(exc: Exception | None) -> None:
            self._eof = True
            if exc is None and self._demux.mid_frame:
                exc = anyio.BrokenResourceError("the engine closed the exec stream inside a frame")
            on_end(exc)

        if not transport.read_in_loop(data, end):
            return False
        ready, self._ready = self._ready, []
        for chunk in ready:
            on_data(chunk)
        if self._pending:
            pending, self._pending = self._pending, b""
            data(pending)
        return True

    def pause_reading(self) -> None:
        if isinstance(self._transport, NonBlockingSocketStream):
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if isinstance(self._transport, NonBlockingSocketStream):
            self._transport.resume_reading()

    def stop_reading(self) -> None:
        if isinstance(self._transport, NonBlockingSocketStream):
            self._transport.stop_reading()

    async def send(self, item: bytes) -> None:
        await self._transport.send(item)

    def send_nowait(self, data: bytes) -> int:
        send_nowait = getattr(self._transport, "send_nowait", None)
        return 0 if send_nowait is None else int(send_nowait(data))

    async def send_eof(self) -> None:
        self._eof_sent = True
        await self._transport.send_eof()

    async def wait(self) -> int:
        """Wait for the exec to finish: the engine offers no wait call for an exec, so
        this asks its state with a growing pause (5 ms up to 250 ms)."""
        delay = 0.005
        while self._exit_code is None:
            info = await self._inspect()
            if not info.get("Running") and info.get("ExitCode") is not None:
                self._exit_code = int(info["ExitCode"])
                break
            await anyio.sleep(delay)
            delay = min(delay * 2, 0.25)
        return self._exit_code

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            if not self._eof_sent:
                try:
                    await self._transport.send_eof()
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    pass
            await self._transport.aclose()
            await anyio.to_thread.run_sync(self._release)


__all__ = ["DockerExecStream", "NonBlockingSocketStream", "ThreadedSocketStream"]
