"""The ssh backend's exec stream: a session channel read without a thread per read
(paramiko's transport thread pokes a pipe the event loop waits on, or, for a reader
that can be called from any thread, hands it the bytes itself: :class:`ReceiptTransport`)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from typing import Any, ClassVar

import anyio

from hermes_sandbox.environments.base import ExecStream

try:
    import paramiko
    from paramiko.common import MSG_CHANNEL_DATA
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
        # While the transport thread feeds data it will hand over itself
        # (SSHExecStream._on_receipt), a set is only noted here: no pipe write.
        self.deferring = False
        self.deferred = False

    def set(self) -> None:
        if self.deferring:
            self.deferred = True
            return
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


def _feed_channel_data(channel: Any, message: Any) -> None:
    """paramiko's handler of a channel's data (on the transport thread), through the
    channel's receipt hook when its stream has one (:class:`ReceiptTransport`)."""
    hooks: dict[int, Callable[[Callable[[], None]], None]] = channel.transport.receipt_hooks
    hook = hooks.get(channel.chanid)
    if hook is None:
        paramiko.Channel._feed(channel, message)
    else:
        hook(lambda: paramiko.Channel._feed(channel, message))


def _can_hook_channel_data() -> bool:
    """Whether this paramiko has the private handler table and channel feed the hook
    relies on (checked at import: a paramiko without them keeps its own transport, and
    every read goes through the wake-up pipe, as before)."""
    table = getattr(paramiko.Transport, "_channel_handler_table", None)
    return (
        isinstance(table, dict)
        and MSG_CHANNEL_DATA in table
        and callable(getattr(paramiko.Channel, "_feed", None))
    )


if paramiko is not None and _can_hook_channel_data():

    class ReceiptTransport(paramiko.Transport):
        """paramiko's transport, letting a channel's stream act on its data on the
        transport thread as the data arrives (:meth:`SSHExecStream.read_in_loop`):
        a relayed call is then answered without waking the event loop's thread, the
        hop that a pipe and a loop pass cost (docs/benchmarks.md, "The ssh relay
        (session 13)")."""

        _channel_handler_table: ClassVar[dict[int, Callable[[Any, Any], None]]] = {
            **paramiko.Transport._channel_handler_table,
            MSG_CHANNEL_DATA: _feed_channel_data,
        }

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # channel id -> hook(feed): the hook feeds the data, then may read it
            self.receipt_hooks: dict[int, Callable[[Callable[[], None]], None]] = {}

else:  # reported by SSHEnvironment.start
    ReceiptTransport = None  # type: ignore[assignment,misc]


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
        # Held while the channel's stdout is read and handed to on_data, on the loop's
        # thread or on the transport thread: one reader at a time, in order.
        self._read_lock = threading.Lock()
        self._loop_thread: int | None = None
        self._send_lock = anyio.Lock()
        self._closed = False
        self._lost_noted = False
        self._stderr = b""
        self._loop: asyncio.AbstractEventLoop | None = None  # read_in_loop's, while reading
        self._on_data: Callable[[bytes], None] | None = None
        self._on_end: Callable[[Exception | None], None] | None = None
        self._paused = False
        self._reader_added = False  # the loop watches the wake-up pipe

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

    # -- read from the loop's reader callback (asyncio), or on the transport thread ----

    def read_in_loop(
        self, on_data: Callable[[bytes], None], on_end: Callable[[Exception | None], None]
    ) -> bool:
        """From now on have ``on_data(bytes)`` called as the channel's stdout arrives,
        with no task woken in between, and ``on_end(None)`` at its end (``on_end(exc)``
        when the connection was lost); :meth:`receive` must not be used any more. False,
        and nothing done, where the loop has no reader callbacks (trio).

        ``on_data`` is called on paramiko's transport thread, right after that thread
        received the bytes, when the connection is a :class:`ReceiptTransport` and is
        not exchanging keys; otherwise from the event loop's reader callback (on the
        wake-up pipe). Never two calls at once, always in order. It may call
        :meth:`pause_reading` and :meth:`stop_reading` (from either thread); ``on_end``
        is called on the loop's thread only."""
        if self._closed:
            return False
        try:
            loop = asyncio.get_running_loop()
            loop.add_reader(self._wakeup.fd, self._readable)
        except (RuntimeError, NotImplementedError):
            return False
        self._loop, self._on_data, self._on_end = loop, on_data, on_end
        self._loop_thread = threading.get_ident()
        self._reader_added = True
        hooks = getattr(self._channel.get_transport(), "receipt_hooks", None)
        if hooks is not None:
            hooks[self._channel.chanid] = self._on_receipt
        loop.call_soon(self._readable)  # what the buffers hold already
        return True

    def pause_reading(self) -> None:
        """Stop calling ``on_data`` until :meth:`resume_reading` (from any thread)."""
        if self._loop is not None and not self._paused:
            self._paused = True
            self._sync_reader_soon()

    def resume_reading(self) -> None:
        """Call from the loop's thread."""
        if self._loop is not None and self._paused:
            self._paused = False
            self._sync_reader()
            self._loop.call_soon(self._readable)  # the wake-up may be drained already

    def stop_reading(self) -> None:
        """End :meth:`read_in_loop`: no callback is called after this (from any
        thread; on the loop's thread, the pipe is no longer watched when it returns)."""
        if self._loop is not None:
            hooks = getattr(self._channel.get_transport(), "receipt_hooks", None)
            if hooks is not None:
                hooks.pop(self._channel.chanid, None)
            self._on_data = self._on_end = None
            self._sync_reader_soon()

    def _sync_reader_soon(self) -> None:
        loop = self._loop
        if loop is None:
            return
        if threading.get_ident() == self._loop_thread:
            self._sync_reader()
        else:
            try:
                loop.call_soon_threadsafe(self._sync_reader)
            except RuntimeError:  # the loop is closed: nothing watches the pipe
                pass

    def _sync_reader(self) -> None:
        """Have the loop watch the wake-up pipe exactly while reading and not paused
        (on the loop's thread: add_reader and remove_reader are not thread-safe)."""
        loop = self._loop
        if loop is None:
            return
        wanted = self._on_data is not None and not self._paused and not self._closed
        if wanted != self._reader_added:
            self._reader_added = wanted
            if wanted:
                loop.add_reader(self._wakeup.fd, self._readable)
            else:
                loop.remove_reader(self._wakeup.fd)
        if self._on_data is None and not self._reader_added:
            self._loop = None

    def _on_receipt(self, feed: Callable[[], None]) -> None:
        """On paramiko's transport thread: ``feed`` buffers a data packet of the
        channel; then hand the bytes to ``on_data`` here, rather than poke the loop.
        Falls back to the pipe while keys are exchanged (on_data may send, and a send
        waits for the exchange this thread runs), while paused, or while the loop's
        thread is reading."""
        wakeup = self._wakeup
        if (
            self._on_data is None
            or self._paused
            or not self._channel.get_transport().clear_to_send.is_set()
        ):
            feed()
            return
        wakeup.deferring = True
        try:
            feed()
        finally:
            wakeup.deferring = False
        if not wakeup.deferred:
            return
        wakeup.deferred = False
        if self._read_lock.acquire(blocking=False):
            try:
                if self._on_data is not None and not self._paused and not self._closed:
                    self._read_stdout()
                    return
            except Exception:  # never into paramiko's loop: it would end the connection
                log.exception("reading an ssh channel on its transport thread")
            finally:
                self._read_lock.release()
        wakeup.set()

    def _read_stdout(self) -> None:
        """Hand what the channel's stdout holds to on_data (under _read_lock)."""
        channel = self._channel
        while channel.recv_ready():
            data: bytes = channel.recv(65536)
            if not data:
                break
            on_data = self._on_data
            if on_data is None:
                return
            on_data(data)
            if self._paused or self._on_data is None:
                return  # the rest when resumed

    def _readable(self) -> None:
        channel = self._channel
        if self._closed or self._paused or self._on_data is None:
            return
        self._wakeup.drain()
        self._drain_stderr()
        with self._read_lock:
            self._read_stdout()
        if self._paused or self._on_data is None:
            return
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
            with self._read_lock:  # no on_data on the transport thread after this
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
