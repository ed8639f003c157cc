"""The ssh backend's exec stream: a session channel read without a thread per read
(paramiko's transport thread pokes a pipe the event loop waits on)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import anyio

from hermes_sandbox.environments.base import ExecStream

try:
    import paramiko
except ImportError:  # reported by SSHEnvironment.start
    paramiko = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

_STDERR_TAIL = 8192
_DIRECT_SEND_LIMIT = 16384  # below one SSH packet: written without a thread hop


# -- exec streams ------------------------------------------------------------------------


class _Wakeup:
    """A pipe the event loop waits on, made readable when paramiko's transport thread
    puts data (or end of data) into a channel's buffers.

    It stands in for the threading.Event those buffers take (``set``/``clear``). Edge
    semantics: :meth:`set` writes one byte unless one is pending, :meth:`drain` takes it,
    ``clear`` does nothing; a reader drains, then checks the buffers, then waits, so no
    wakeup is lost. Unlike the pipe of ``Channel.fileno``, closing it is under a lock,
    so a late ``set`` from the transport thread never writes to a reused descriptor.
    """

    def __init__(self) -> None:
        self.fd, self._write_fd = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._write_fd, False)
        self._lock = threading.Lock()
        self._pending = False
        self._closed = False

    def set(self) -> None:
        with self._lock:
            if self._pending or self._closed:
                return
            self._pending = True
            try:
                os.write(self._write_fd, b"!")
            except BlockingIOError:  # cannot happen with one byte pending; harmless
                pass

    def clear(self) -> None:
        return None

    def drain(self) -> None:
        with self._lock:
            if self._pending and not self._closed:
                self._pending = False
                try:
                    os.read(self.fd, 64)
                except BlockingIOError:
                    pass

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self.fd)
                os.close(self._write_fd)


class SSHExecStream(ExecStream):
    """A remote command's stdin and stdout as one stream over an SSH session channel;
    its stderr kept as a short tail. See the module docstring for how it waits."""

    def __init__(self, channel: Any, login: str, release: Any) -> None:
        self._channel = channel
        self._login = login
        self._release = release  # blocking: gives the channel's slot back to the pool
        self._wakeup = _Wakeup()
        channel.in_buffer.set_event(self._wakeup)
        channel.in_stderr_buffer.set_event(self._wakeup)
        self._send_lock = anyio.Lock()
        self._closed = False
        self._lost_noted = False
        self._stderr = b""
        self._loop: asyncio.AbstractEventLoop | None = None  # read_in_loop's, while reading
        self._on_data: Callable[[bytes], None] | None = None
        self._on_end: Callable[[Exception | None], None] | None = None
        self._paused = False

    def then_release(self, after: Callable[[], None]) -> None:
        """Call ``after`` (blocking, from a worker thread) once the stream is closed and
        its channel given back to the pool."""
        release = self._release

        def release_then() -> None:
            try:
                release()
            finally:
                after()

        self._release = release_then

    # -- read from the loop's reader callback (asyncio) ---------------------------------

    def read_in_loop(
        self, on_data: Callable[[bytes], None], on_end: Callable[[Exception | None], None]
    ) -> bool:
        """From now on have the event loop call ``on_data(bytes)`` from its reader
        callback (on the wake-up pipe) as the channel's stdout arrives, with no task
        woken in between, and ``on_end(None)`` at its end (``on_end(exc)`` when the
        connection was lost); :meth:`receive` must not be used any more. False, and
        nothing done, where the loop has no reader callbacks (trio)."""
        if self._closed:
            return False
        try:
            loop = asyncio.get_running_loop()
            loop.add_reader(self._wakeup.fd, self._readable)
        except (RuntimeError, NotImplementedError):
            return False
        self._loop, self._on_data, self._on_end = loop, on_data, on_end
        loop.call_soon(self._readable)  # what the buffers hold already
        return True

    def pause_reading(self) -> None:
        if self._loop is not None and not self._paused:
            self._paused = True
            self._loop.remove_reader(self._wakeup.fd)

    def resume_reading(self) -> None:
        if self._loop is not None and self._paused:
            self._paused = False
            self._loop.add_reader(self._wakeup.fd, self._readable)
            self._loop.call_soon(self._readable)  # the wake-up may be drained already

    def stop_reading(self) -> None:
        """End :meth:`read_in_loop`: no callback is called after this."""
        if self._loop is not None:
            if not self._paused:  # the pipe is still open: aclose stops first
                self._loop.remove_reader(self._wakeup.fd)
            self._loop = self._on_data = self._on_end = None

    def _readable(self) -> None:
        channel = self._channel
        if self._closed or self._paused or self._on_data is None:
            return
        self._wakeup.drain()
        self._drain_stderr()
        while channel.recv_ready():
            data: bytes = channel.recv(65536)
            if not data:
                break
            self._on_data(data)
            if self._paused or self._on_data is None:
                return  # the rest when resumed
        if channel.recv_ready() or not (channel.eof_received or channel.closed):
            return
        on_end = self._on_end
        assert on_end is not None
        lost = not channel.eof_received and self._connection_lost()
        self.stop_reading()
        on_end(
            anyio.BrokenResourceError(f"the SSH connection to {self._login} was lost")
            if lost
            else None
        )

    @property
    def stderr_tail(self) -> bytes:  # type: ignore[override]
        self._drain_stderr()
        return self._stderr

    def _drain_stderr(self) -> None:
        channel = self._channel
        while channel.recv_stderr_ready():
            self._stderr = (self._stderr + channel.recv_stderr(65536))[-_STDERR_TAIL:]

    def _connection_lost(self) -> bool:
        """True (and noted in the stderr tail) if the SSH connection went away."""
        transport = self._channel.get_transport()
        if transport is not None and transport.is_active():
            return False
        if not self._lost_noted:
            self._lost_noted = True
            note = f"\n[hermes-sandbox: the SSH connection to {self._login} was lost]\n"
            self._stderr = (self._stderr + note.encode())[-_STDERR_TAIL:]
        return True

    async def receive(self, max_bytes: int = 65536) -> bytes:
        channel = self._channel
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            self._wakeup.drain()
            self._drain_stderr()
            if channel.recv_ready():
                data: bytes = channel.recv(max_bytes)
                if data:
                    return data
            if channel.eof_received or channel.closed:
                if channel.recv_ready():
                    continue
                if not channel.eof_received and self._connection_lost():
                    raise anyio.BrokenResourceError(f"the SSH connection to {self._login} was lost")
                raise anyio.EndOfStream
            try:
                await anyio.wait_readable(self._wakeup.fd)
            except anyio.ClosedResourceError:
                raise anyio.ClosedResourceError from None

    def send_nowait(self, data: bytes) -> int:
        """Send a small ``data`` now if the peer's window has room (paramiko then
        writes the packet in this thread, without waiting for the peer)."""
        channel = self._channel
        if self._closed or self._send_lock.locked() or len(data) > _DIRECT_SEND_LIMIT:
            return 0
        try:
            if not channel.send_ready() or channel.closed:
                return 0
            return int(channel.send(data))
        except (OSError, EOFError, paramiko.SSHException):
            return 0  # send reports it

    async def send(self, item: bytes) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        channel = self._channel
        view = memoryview(item)
        async with self._send_lock:
            try:
                if len(view) <= _DIRECT_SEND_LIMIT and channel.send_ready():
                    # Room in the window: this sends without waiting for the peer.
                    view = view[channel.send(item) :]
                    if not view and not channel.closed:
                        return
                if view:
                    await anyio.to_thread.run_sync(
                        channel.sendall, bytes(view), abandon_on_cancel=True
                    )
            except (OSError, EOFError, paramiko.SSHException) as exc:
                if self._closed:
                    raise anyio.ClosedResourceError from exc
                self._connection_lost()
                raise anyio.BrokenResourceError(
                    f"writing to a command on {self._login} failed: {exc}"
                ) from exc
            if channel.closed:
                raise anyio.BrokenResourceError(f"the command on {self._login} went away")

    async def send_eof(self) -> None:
        if self._closed:
            return
        try:
            await anyio.to_thread.run_sync(self._channel.shutdown_write)
        except (OSError, EOFError, paramiko.SSHException):
            pass

    async def wait(self) -> int:
        """The command's exit status; 255 (as ssh reports it) when there is none: the
        connection was lost, or the command was killed by a signal."""
        channel = self._channel
        if not channel.status_event.is_set():
            await anyio.to_thread.run_sync(channel.status_event.wait, abandon_on_cancel=True)
        status = channel.exit_status
        if status is None or status < 0:
            self._connection_lost()
            return 255
        return int(status)

    async def wait_reaped(self) -> None:
        status = self._channel.status_event
        if not status.is_set():
            await anyio.to_thread.run_sync(status.wait, abandon_on_cancel=True)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            self._drain_stderr()
            on_end = self._on_end
            self.stop_reading()
            anyio.notify_closing(self._wakeup.fd)
            if on_end is not None:
                on_end(None)  # as receive's ClosedResourceError ends a reader
            self._wakeup.close()
            await anyio.to_thread.run_sync(self._close_and_release)

    def _close_and_release(self) -> None:
        """Close the channel and give its slot back (blocking: one thread hop for both)."""
        try:
            self._channel.close()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            log.debug("closing an ssh channel: %s", exc)
        self._release()


__all__ = ["SSHExecStream"]
