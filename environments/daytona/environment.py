"""The Daytona backend: a Daytona cloud sandbox per run (or a named, persistent one),
driven through the daytona SDK's async client (``daytona.AsyncDaytona``).

Lifecycle. :meth:`DaytonaEnvironment.start` resumes the sandbox named in the settings
(starting it if it was stopped), or with ``persist`` the task's sandbox found by its
labels, or creates one from an image or a snapshot (CPU, memory, disk, no network by
default, the auto-stop interval). A sandbox it creates without ``persist`` is
*ephemeral* (Daytona deletes it as soon as it stops), so one that a crashed host leaves
behind goes after ``auto_stop_interval`` idle minutes; :meth:`aclose` deletes it at
once, also after a failed start, a timeout or a cancellation, and a creation that
failed after Daytona made the sandbox deletes what it made (told apart by a nonce
label from a sandbox someone else made under the name). A sandbox that was there
before the run (resumed by name) is never deleted.

Commands. Daytona offers no binary-clean two-way stream to a process:

- a *session command* (``execute_session_command(..., run_async=True)``) reads its
  stdin from a FIFO that ``send_session_command_input`` writes *text* to (a JSON
  string, a newline appended when missing, never an end of input), and its output
  reaches the host as a log: each stream is copied line by line by a shell loop
  (``read -r`` drops NUL bytes; a newline is added to a last partial line), 3-byte
  markers (``\\x01\\x01\\x01``, ``\\x02\\x02\\x02``) tag stdout and stderr, and the SDK
  decodes it as UTF-8 with replacement before calling back with ``str``;
- a PTY (``create_pty_session``) is two-way bytes but runs an interactive shell
  through a terminal's line discipline (echo, CR/LF translation, control characters)
  and merges stderr into stdout.

So every command runs under a small stdlib *codec*, :data:`CODEC_SOURCE` (run as
``python3 -c CODEC_SOURCE`` as a session command), that turns the session's text
lines into a clean byte stream both ways. Host to codec, one line per item: ``h`` the
header (argv, environment, cwd, whether stdin is wanted, the kill grace, the idle
limit, a marker; never on a command line), ``d<base64>`` bytes for the command's
stdin, ``c`` end of its stdin, ``k`` kill it, ``p`` keep-alive. Codec to host:
``o<base64>`` stdout, ``e<base64>`` stderr, ``x<code>`` the exit, last. Its lines
are short enough (at most 4 KiB) that the log copier writes each in one piece;
anything else in the log (an echo of the input by an older daemon) is ignored. The
codec kills its command's processes (found by the marker ``HERMES_SANDBOX_CODEC`` in
their environment, which the relay passes on to scripts) when told,
when its stdin ends, and when the host has been silent for ``idle_timeout`` seconds
(:class:`DaytonaExecStream` sends a keep-alive every ``ping_interval``), so a host
that dies leaves nothing running. On this :class:`~environments.helper.HelperEnvironment`
``execute``, the file operations and the stream relay then work unchanged.

Each command gets a session of its own (a session's shell runs one command at a
time); sessions are reused once their command has ended. ``list_dir``, ``rename`` and
``remove`` use the SDK's file API directly (for a transport that polls a directory).

The SDK is imported on first use through :data:`_sdk` (tests put a stand-in there),
needs an asyncio event loop, and its errors are translated to
:mod:`environments.errors` (or the OSError a file operation would raise) at this
boundary and never leak.
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import errno
import logging
import re
import secrets
import shlex
import uuid
import warnings
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar, TypeVar

import anyio
import anyio.abc

from hermes_sandbox.environments.base import (
    DEFAULT_MAX_COMMAND_OUTPUT,
    CommandResult,
    ExecStream,
)
from hermes_sandbox.environments.daytona.settings import NO_CREDENTIALS, DaytonaSettings
from hermes_sandbox.environments.errors import BackendError, BackendNotAvailable, EnvironmentFailure
from hermes_sandbox.environments.helper import HelperEnvironment

log = logging.getLogger(__name__)

T = TypeVar("T")

SDK_MISSING = "the daytona backend needs the daytona SDK: pip install 'hermes-sandbox[daytona]'"

LABEL_MANAGED = "hermes-sandbox.managed"  # "1" on every sandbox this backend creates
LABEL_TASK = "hermes-sandbox.task"
LABEL_PERSIST = "hermes-sandbox.persist"  # "1": kept by aclose, resumed by task
LABEL_CREATION = "hermes-sandbox.creation"  # a nonce per creation: what a failed one made

# Sandbox states (SandboxState values) a sandbox is resumed from, or waited for.
_RUNNING = "started"
_RESTARTABLE = frozenset({"stopped", "archived", "paused"})
_COMING_UP = frozenset({"starting", "restoring", "resuming", "creating", "pulling_snapshot"})

_STDERR_TAIL = 8192
_OUTPUT_BUFFER = 64  # decoded output chunks held for a reader that is behind
_INPUT_CHUNK = 96 * 1024  # bytes of stdin per "d" line (128 KiB of base64)
_INPUT_REQUEST = 512 * 1024  # characters of input lines sent in one request
_MAX_LOG_LINE = 1 << 20  # a longer line is not the codec's: the stream is garbled

# The codec: see the module docstring. Python 3.6+, stdlib modules the relay needs anyway.
CODEC_SOURCE = r"""
import binascii, os, selectors, signal, subprocess, sys, time

MARK = "HERMES_SANDBOX_CODEC"
CHUNK = 3000  # raw bytes per output line: with its tag, under 4 KiB


def strings(field):
    if field == "-":
        return []
    raw = binascii.a2b_base64(field)
    return [s.decode("utf-8", "surrogateescape") for s in raw.split(b"\0")]


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def marked(entry):
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            try:
                with open("/proc/%s/environ" % name, "rb") as f:
                    if entry in f.read().split(b"\0"):
                        found.append(int(name))
            except OSError:
                pass
    return [pid for pid in found if alive(pid)]


def signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


class Codec(object):
    def __init__(self):
        self.sel = selectors.DefaultSelector()
        self.inbuf = b""
        self.host_open = True
        self.pending = b""
        self.close_stdin = False
        self.child = None
        self.stdin_fd = None
        self.outputs = {}
        self.code = None
        self.drain_until = None
        self.kill_stage = 0
        self.kill_at = None
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *a: None)
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")

    def emit(self, tag, data=b""):
        if not self.host_open:
            return
        line = tag + (binascii.b2a_base64(data, newline=False) if data else b"") + b"\n"
        view = memoryview(line)
        try:
            while view:
                view = view[os.write(1, view):]
        except OSError:
            self.host_open = False
            self.kill(True)

    def read_header(self):
        self.sel.register(0, selectors.EVENT_READ, "host")
        while b"\n" not in self.inbuf:
            if not self.sel.select(600):
                sys.exit(125)
            chunk = os.read(0, 262144)
            if not chunk:
                sys.exit(125)
            self.inbuf += chunk
        line, _, self.inbuf = self.inbuf.partition(b"\n")
        return line.decode("ascii").split(" ")

    def start(self, fields):
        self.want_stdin = fields[1] == "1"
        self.idle = float(fields[2])
        self.grace = float(fields[3])
        cwd, argv = strings(fields[4]), strings(fields[5])
        env = dict(os.environ)
        for item in strings(fields[6]):
            name, _, value = item.partition("=")
            env[name] = value
        env[MARK] = fields[7]
        self.entry = (MARK + "=" + fields[7]).encode()
        self.last_input = time.monotonic()
        try:
            self.child = subprocess.Popen(
                argv, env=env, cwd=cwd[0] if cwd else None,
                stdin=subprocess.PIPE if self.want_stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            self.emit(b"e", ("cannot run %r: %s\n" % (argv[0], exc)).encode())
            self.emit(b"x127" if isinstance(exc, FileNotFoundError) else b"x126")
            sys.exit(127)
        if self.want_stdin:
            self.stdin_fd = self.child.stdin.fileno()
            os.set_blocking(self.stdin_fd, False)
        for stream, tag in ((self.child.stdout, b"o"), (self.child.stderr, b"e")):
            self.outputs[stream.fileno()] = tag
            self.sel.register(stream.fileno(), selectors.EVENT_READ, tag)
        # The daemon ends a deleted session with SIGTERM: take the command down with it.
        signal.signal(signal.SIGTERM, lambda *a: self.kill(True))
        self.lines()

    def lines(self):
        while b"\n" in self.inbuf:
            line, _, self.inbuf = self.inbuf.partition(b"\n")
            self.last_input = time.monotonic()
            tag = line[:1]
            if tag == b"d":
                if self.stdin_fd is not None and not self.close_stdin:
                    self.pending += binascii.a2b_base64(line[1:])
            elif tag == b"c":
                self.close_stdin = True
            elif tag == b"k":
                self.kill(False)
        self.feed()

    def feed(self):
        if self.stdin_fd is None:
            return
        try:
            while self.pending:
                self.pending = self.pending[os.write(self.stdin_fd, self.pending[:65536]):]
        except BlockingIOError:
            pass
        except OSError:
            self.pending = b""
            self.close_stdin = True
        if self.close_stdin and not self.pending:
            self.drop_stdin()
        elif self.pending:
            self.watch_stdin(True)

    def watch_stdin(self, on):
        registered = self.stdin_fd in self.sel.get_map()
        if on and not registered:
            self.sel.register(self.stdin_fd, selectors.EVENT_WRITE, "stdin")
        elif registered and not on:
            self.sel.unregister(self.stdin_fd)

    def drop_stdin(self):
        if self.stdin_fd is None:
            return
        try:
            self.sel.unregister(self.stdin_fd)
        except KeyError:
            pass
        try:
            self.child.stdin.close()
        except OSError:
            pass
        self.stdin_fd = None
        self.pending = b""

    def kill(self, hurry):
        # End of input first (the relay then stops its script itself), then SIGTERM
        # and SIGKILL to every process carrying the marker.
        if self.kill_stage == 0:
            self.drop_stdin()
            self.kill_stage = 1
            self.kill_at = time.monotonic() + (0 if hurry else self.grace)
        elif hurry and self.kill_stage == 1:
            self.kill_at = time.monotonic()

    def escalate(self):
        if self.kill_stage == 1:
            signal_all(marked(self.entry), signal.SIGTERM)
            signal_all(marked(self.entry), signal.SIGCONT)
            self.kill_stage = 2
            self.kill_at = time.monotonic() + min(self.grace, 2.0)
        elif self.kill_stage == 2:
            self.sweep()
            self.kill_stage = 3
            self.kill_at = None

    def sweep(self):
        for _ in range(200):
            targets = marked(self.entry)
            if not targets:
                return
            signal_all(targets, signal.SIGKILL)
            time.sleep(0.005)

    def timeout(self, now):
        deadlines = [t for t in (self.kill_at, self.drain_until) if t is not None]
        if self.kill_stage == 0:
            deadlines.append(self.last_input + self.idle)
        return max(0.0, min(deadlines) - now) if deadlines else None

    def run(self):
        self.start(self.read_header())
        while True:
            now = time.monotonic()
            if self.code is None and self.child.poll() is not None:
                rc = self.child.returncode
                self.code = 128 - rc if rc < 0 else rc
                self.drain_until = now + 1.0
                self.drop_stdin()
            if self.code is not None and (not self.outputs or now >= self.drain_until):
                break
            if self.kill_stage == 0 and now - self.last_input > self.idle:
                self.kill(False)
            if self.kill_at is not None and now >= self.kill_at:
                self.escalate()
            for key, _ in self.sel.select(self.timeout(time.monotonic())):
                what = key.data
                if what == "wake":
                    try:
                        os.read(self.wake_r, 4096)
                    except OSError:
                        pass
                elif what == "host":
                    chunk = os.read(0, 262144)
                    if chunk:
                        self.inbuf += chunk
                        self.lines()
                    else:  # the daemon's stdin holder is gone: so is the host
                        self.sel.unregister(0)
                        self.kill(False)
                elif what == "stdin":
                    self.watch_stdin(False)
                    self.feed()
                else:
                    data = os.read(key.fd, CHUNK)
                    if data:
                        self.emit(what, data)
                    else:
                        self.sel.unregister(key.fd)
                        del self.outputs[key.fd]
        if self.kill_stage:
            self.sweep()
        self.emit(b"x%d" % self.code)
        sys.exit(min(self.code, 255))


Codec().run()
"""


# -- the SDK seam ----------------------------------------------------------------------

# The daytona module, imported on first use; tests put a stand-in with the same names here.
_sdk: Any = None


def _load_sdk() -> Any:
    global _sdk
    if _sdk is None:
        try:
            import daytona
        except ImportError as exc:
            raise BackendNotAvailable(SDK_MISSING) from exc
        _sdk = daytona
    return _sdk


def _require_asyncio() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise BackendNotAvailable(
            "the daytona backend needs an asyncio event loop (the Daytona SDK is built on "
            "asyncio and aiohttp); run it under asyncio, not trio"
        ) from None


def _message(exc: BaseException) -> str:
    return str(getattr(exc, "message", None) or exc) or type(exc).__name__


def _state(sandbox: Any) -> str:
    state = getattr(sandbox, "state", None)
    return str(getattr(state, "value", state) or "unknown")


def _slug(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_-]+", "-", text).strip("-")[:32] or "task"


def _b64_strings(items: list[str]) -> str:
    if not items:
        return "-"
    raw = b"\0".join(item.encode("utf-8", "surrogateescape") for item in items)
    return binascii.b2a_base64(raw, newline=False).decode("ascii")


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


# -- the environment -------------------------------------------------------------------


class DaytonaEnvironment(HelperEnvironment):
    """A Daytona sandbox (see the module docstring).

    ``settings`` says which sandbox and how it is made; ``env`` holds variables every
    command and process gets (added to the sandbox's own, sent with each command, never
    stored with the sandbox); ``kill_grace`` is how long a command gets between SIGTERM
    and SIGKILL; ``python`` overrides ``settings.python``.
    """

    name: ClassVar[str] = "daytona"
    settings_class: ClassVar[type[DaytonaSettings]] = DaytonaSettings
    where: ClassVar[str] = "in the Daytona sandbox"
    scratch_parent = "/tmp"
    # The codec kills its command when the host has been silent for idle_timeout
    # seconds; every stream says it is alive each ping_interval seconds.
    ping_interval: float = 20.0
    idle_timeout: float = 90.0

    def __init__(
        self,
        settings: DaytonaSettings | None = None,
        *,
        env: Mapping[str, str] | None = None,
        kill_grace: float = 2.0,
        python: str | None = None,
    ) -> None:
        self.settings = settings or DaytonaSettings()
        self.task_id = self.settings.task_id or uuid.uuid4().hex
        self._env = dict(env or {})
        self.kill_grace = kill_grace
        self._python = python or self.settings.python
        self._sdk: Any = None
        self._client: Any = None
        self._sandbox: Any = None
        self._delete_on_close = not self.settings.persist
        self._workdir: str | None = self.settings.workdir
        self._idle_sessions: list[str] = []
        self._streams: set[DaytonaExecStream] = set()
        self._closed = False
        self.sandbox_id: str | None = None
        self.sandbox_name: str | None = None
        self.resumed = False  # start() attached to a sandbox that already existed

    @property
    def default_cwd(self) -> str:
        return self._workdir or "/"

    # -- talking to Daytona --------------------------------------------------------------

    def _failure(self, doing: str, exc: BaseException) -> BackendError:
        sdk = self._sdk
        if sdk is not None and isinstance(exc, sdk.DaytonaAuthenticationError):
            return BackendNotAvailable(
                f"{doing}: Daytona refused the credentials ({_message(exc)}); check "
                "DAYTONA_API_KEY (and DAYTONA_API_URL for a self-hosted Daytona)"
            )
        if sdk is not None and isinstance(exc, sdk.DaytonaNotFoundError) and self._sandbox:
            return EnvironmentFailure(
                f"{doing}: the Daytona sandbox {self.sandbox_name or self.sandbox_id} is gone "
                f"(deleted, or removed after it stopped): {_message(exc)}"
            )
        return EnvironmentFailure(f"{doing}: Daytona said: {_message(exc)}")

    async def _call(self, doing: str, fn: Callable[..., Awaitable[T]], *args: Any, **kw: Any) -> T:
        """Await an SDK call; translate what it raises."""
        try:
            return await fn(*args, **kw)
        except (self._sdk.DaytonaError, OSError) as exc:
            raise self._failure(doing, exc) from exc

    async def _describe_loss(self, what: str, exc: BaseException) -> str:
        """Say why a command's stream broke: the sandbox gone, stopped, or ``what``."""
        client, sandbox = self._client, self._sandbox
        if client is None or sandbox is None:
            return what
        try:
            with anyio.move_on_after(15):
                found = await client.get(sandbox.id)
                state = _state(found)
                if state != _RUNNING:
                    return (
                        f"{what}; the Daytona sandbox {self.sandbox_name or sandbox.id} is "
                        f"{state} (stopped after its auto_stop_interval, or by someone else?)"
                    )
        except self._sdk.DaytonaNotFoundError:
            return f"{what}; the Daytona sandbox {self.sandbox_name or sandbox.id} is gone"
        except (self._sdk.DaytonaError, OSError):
            pass
        return what

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Resume or create the sandbox.

        Raises BackendNotAvailable (no SDK, no credentials, no asyncio) or
        EnvironmentFailure (Daytona refused or failed).
        """
        if self._closed:
            raise EnvironmentFailure("this daytona environment was closed; make a new one")
        if self._sandbox is not None:
            return
        sdk = self._sdk = _load_sdk()
        _require_asyncio()
        try:
            self._client = self._make_client()
        except sdk.DaytonaAuthenticationError as exc:
            raise BackendNotAvailable(f"{NO_CREDENTIALS} ({_message(exc)})") from exc
        except sdk.DaytonaError as exc:
            raise BackendNotAvailable(f"cannot set up the Daytona client: {_message(exc)}") from exc
        try:
            sandbox = await self._find_or_create()
            self._sandbox = sandbox
            self.sandbox_id = str(sandbox.id)
            self.sandbox_name = getattr(sandbox, "name", None) or self.sandbox_id
            if self._workdir is None:
                self._workdir = await self._call("asking the work directory", sandbox.get_work_dir)
            self._home = await self._call("asking the home directory", sandbox.get_user_home_dir)
            if self.settings.workdir is not None:
                command = f"mkdir -p -- {shlex.quote(self.settings.workdir)}"
                made = await super().execute(command)  # from the sandbox's own work dir
                if made.exit_code != 0:
                    raise EnvironmentFailure(
                        f"could not make the workdir {self.settings.workdir!r} "
                        f"{self.where}: {made.output.strip()}"
                    )
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._teardown()
            raise

    def _make_client(self) -> Any:
        """The SDK's client; without settings of ours it reads DAYTONA_* itself."""
        sdk, options = self._sdk, {}
        if self.settings.api_url:
            options["api_url"] = self.settings.api_url
        if self.settings.target:
            options["target"] = self.settings.target
        if not options:
            return sdk.AsyncDaytona()
        with warnings.catch_warnings():
            # AsyncDaytona(config) reads config.server_url, a deprecated field, and so
            # warns about it whatever the config says (daytona 0.226).
            warnings.filterwarnings(
                "ignore", message=".*server_url.*deprecated", category=DeprecationWarning
            )
            return sdk.AsyncDaytona(sdk.DaytonaConfig(**options))

    def _labels(self) -> dict[str, str]:
        labels = {**self.settings.labels, LABEL_MANAGED: "1", LABEL_TASK: self.task_id}
        if self.settings.persist:
            labels[LABEL_PERSIST] = "1"
        return labels

    async def _find_or_create(self) -> Any:
        settings, client, sdk = self.settings, self._client, self._sdk
        if settings.name is not None:
            try:
                found = await client.get(settings.name)
            except sdk.DaytonaNotFoundError:
                found = None
            except (sdk.DaytonaError, OSError) as exc:
                raise self._failure(f"looking up the sandbox {settings.name!r}", exc) from exc
            if found is not None:
                await self._resume(found)
                return found
            return await self._create(settings.name)
        if settings.persist:
            query = sdk.ListSandboxesQuery(
                labels={LABEL_MANAGED: "1", LABEL_TASK: self.task_id, LABEL_PERSIST: "1"}
            )
            try:
                async for candidate in client.list(query):
                    if _state(candidate) in (_RUNNING, *_RESTARTABLE, *_COMING_UP):
                        await self._resume(candidate)
                        return candidate
            except (sdk.DaytonaError, OSError) as exc:
                raise self._failure("looking for the task's sandbox", exc) from exc
        return await self._create(f"hermes-sandbox-{_slug(self.task_id)}-{secrets.token_hex(4)}")

    async def _resume(self, sandbox: Any) -> None:
        name = getattr(sandbox, "name", None) or sandbox.id
        state = _state(sandbox)
        doing = f"starting the Daytona sandbox {name!r} (it was {state})"
        timeout = self.settings.create_timeout
        if state in _RESTARTABLE:
            await self._call(doing, sandbox.start, timeout=timeout)
        elif state in _COMING_UP:
            await self._call(doing, sandbox.wait_for_sandbox_start, timeout=timeout)
        elif state != _RUNNING:
            raise EnvironmentFailure(
                f"the Daytona sandbox {name!r} is {state} and cannot be used; delete it, or "
                "choose another name"
            )
        self.resumed = True
        self._delete_on_close = False  # not ours to delete: it was there before the run

    async def _create(self, name: str) -> Any:
        settings, sdk = self.settings, self._sdk
        nonce = secrets.token_hex(8)
        common: dict[str, Any] = {
            "name": name,
            "language": "python",
            "labels": {**self._labels(), LABEL_CREATION: nonce},
            "network_block_all": settings.network_block_all,
            "auto_stop_interval": settings.auto_stop_interval,
        }
        if settings.target:
            common["target"] = settings.target
        if not settings.persist:
            common["ephemeral"] = True  # deleted when it stops: a leaked one goes by itself
        if settings.image is not None:
            resources = None
            if (settings.cpu, settings.memory, settings.disk) != (None, None, None):
                resources = sdk.Resources(
                    cpu=settings.cpu, memory=settings.memory, disk=settings.disk
                )
            params = sdk.CreateSandboxFromImageParams(
                image=settings.image, resources=resources, **common
            )
            source = f"the image {settings.image!r}"
        else:
            params = sdk.CreateSandboxFromSnapshotParams(snapshot=settings.snapshot, **common)
            source = (
                f"the snapshot {settings.snapshot!r}"
                if settings.snapshot
                else "the default snapshot"
            )
        try:
            return await self._client.create(params, timeout=settings.create_timeout)
        except BaseException as exc:
            # A failed, timed-out or cancelled creation may still have made the sandbox.
            with anyio.CancelScope(shield=True):
                await self._delete_half_made(name, nonce)
            if isinstance(exc, sdk.DaytonaAuthenticationError):
                raise BackendNotAvailable(f"{NO_CREDENTIALS} ({_message(exc)})") from exc
            if isinstance(exc, sdk.DaytonaError | OSError):
                raise EnvironmentFailure(
                    f"Daytona could not create a sandbox from {source}: {_message(exc)}"
                ) from exc
            raise

    async def _delete_half_made(self, name: str, nonce: str) -> None:
        """Delete the sandbox a failed creation made, if it made one (its nonce label
        tells it from a sandbox of the same name that someone else made)."""
        sdk = self._sdk
        with anyio.move_on_after(60):
            try:
                made = await self._client.get(name)
            except (sdk.DaytonaError, OSError):
                return
            if (getattr(made, "labels", None) or {}).get(LABEL_CREATION) != nonce:
                return
            try:
                await self._client.delete(made, timeout=60)
            except (sdk.DaytonaError, OSError) as exc:
                log.warning("could not delete the half-made Daytona sandbox %s: %s", name, exc)

    async def aclose(self) -> None:
        """Delete the sandbox (unless persistent) and close the client. Idempotent;
        not cancellable."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            await self._teardown()

    async def _teardown(self) -> None:
        sdk = self._sdk
        for stream in list(self._streams):
            await stream.aclose()
        client, self._client = self._client, None
        sandbox, self._sandbox = self._sandbox, None
        idle, self._idle_sessions = self._idle_sessions, []
        if client is None:
            return
        try:
            if sandbox is not None and self._delete_on_close:
                try:
                    await client.delete(sandbox, timeout=60)
                except sdk.DaytonaNotFoundError:
                    pass
                except (sdk.DaytonaError, OSError) as exc:
                    # Not raised: aclose runs in finally blocks. The sandbox is ephemeral:
                    # Daytona deletes it once it stops (after auto_stop_interval idle).
                    log.warning(
                        "could not delete the Daytona sandbox %s: %s",
                        self.sandbox_name,
                        _message(exc),
                    )
            elif sandbox is not None:
                for session_id in idle:
                    try:
                        await sandbox.process.delete_session(session_id)
                    except (sdk.DaytonaError, OSError):
                        pass
        finally:
            try:
                await client.close()
            except (sdk.DaytonaError, OSError) as exc:
                log.debug("closing the Daytona client: %s", exc)

    def _require_started(self) -> Any:
        if self._sandbox is None:
            state = "closed" if self._closed else "not started"
            raise EnvironmentFailure(f"the daytona environment is {state}")
        return self._sandbox

    # -- commands ------------------------------------------------------------------------

    async def execute(
        self,
        command: str,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        max_output_bytes: int = DEFAULT_MAX_COMMAND_OUTPUT,
    ) -> CommandResult:
        """As :meth:`HelperEnvironment.execute`, starting in :attr:`default_cwd` when no
        ``cwd`` is given (a session starts in the sandbox's own work directory)."""
        return await super().execute(
            command, timeout=timeout, cwd=cwd or self._workdir, max_output_bytes=max_output_bytes
        )

    async def _take_session(self, sandbox: Any) -> str:
        if self._idle_sessions:
            return self._idle_sessions.pop()
        session_id = f"hermes-{secrets.token_hex(8)}"
        await self._call("opening a session", sandbox.process.create_session, session_id)
        return session_id

    async def _release_session(self, stream: DaytonaExecStream, *, reusable: bool) -> None:
        self._streams.discard(stream)
        sandbox = self._sandbox
        if sandbox is None:
            return
        if reusable and not self._closed:
            self._idle_sessions.append(stream.session_id)
            return
        try:  # the daemon ends the session's processes with it
            with anyio.move_on_after(30):
                await sandbox.process.delete_session(stream.session_id)
        except (self._sdk.DaytonaError, OSError) as exc:
            log.debug("could not delete session %s: %s", stream.session_id, exc)

    def _header(self, argv: list[str], env: Mapping[str, str], cwd: str | None, stdin: bool) -> str:
        fields = [
            "h",
            "1" if stdin else "0",
            repr(float(self.idle_timeout)),
            repr(float(self.kill_grace)),
            _b64_strings([cwd] if cwd else []),
            _b64_strings(argv),
            _b64_strings([f"{name}={value}" for name, value in env.items()]),
            secrets.token_hex(12),
        ]
        return " ".join(fields)

    async def _open_exec(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | None,
        stdin: bool,
    ) -> DaytonaExecStream:
        """Start ``argv`` under the codec as a session command.

        A ``cwd`` that does not exist or an ``argv[0]`` not found are reported as a
        process would: exit code 127 (or 126) from :meth:`DaytonaExecStream.wait` and
        the reason in ``stderr_tail``.
        """
        if not argv:
            raise ValueError("argv must name a program")
        sandbox = self._require_started()
        sdk = self._sdk
        header = self._header(argv, {**self._env, **(env or {})}, cwd, stdin)
        command = f"{shlex.quote(self.python)} -c {shlex.quote(CODEC_SOURCE)}"
        session_id = await self._take_session(sandbox)
        try:
            response = await self._call(
                f"starting {argv[0]!r} {self.where}",
                sandbox.process.execute_session_command,
                session_id,
                sdk.SessionExecuteRequest(
                    command=command, run_async=True, suppress_input_echo=True
                ),
            )
        except BaseException:
            with anyio.CancelScope(shield=True):
                try:
                    await sandbox.process.delete_session(session_id)
                except (sdk.DaytonaError, OSError):
                    pass
            raise
        stream = DaytonaExecStream(
            self, sandbox.process, session_id, str(response.cmd_id), header, stdin=stdin
        )
        self._streams.add(stream)
        stream._start()
        if not stdin:
            try:
                await stream._flush_header()
            except BaseException as exc:
                with anyio.CancelScope(shield=True):
                    await stream.aclose()
                if isinstance(exc, anyio.BrokenResourceError):
                    raise EnvironmentFailure(str(exc)) from exc
                raise
        return stream

    # -- directories through the SDK's file API (for a transport that polls one) ---------

    def _os_error(self, exc: BaseException, path: str) -> BaseException:
        sdk = self._sdk
        if isinstance(exc, sdk.DaytonaNotFoundError):
            return FileNotFoundError(errno.ENOENT, _message(exc), path)
        if isinstance(exc, sdk.DaytonaForbiddenError):
            return PermissionError(errno.EACCES, _message(exc), path)
        return self._failure(f"on {path!r}", exc)

    async def _fs_call(self, path: str, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        try:
            return await fn(*args)
        except (self._sdk.DaytonaError, OSError) as exc:
            raise self._os_error(exc, path) from exc

    async def list_dir(self, path: str) -> list[str]:
        """The names in directory ``path`` (sorted); FileNotFoundError if it is missing."""
        sandbox = self._require_started()
        found = await self._fs_call(path, sandbox.fs.list_files, path)
        return sorted(str(info.name) for info in found)

    async def rename(self, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst`` (replacing it) inside the sandbox."""
        sandbox = self._require_started()
        await self._fs_call(src, sandbox.fs.move_files, src, dst)

    async def remove(self, path: str) -> None:
        """Remove the file ``path``; FileNotFoundError if it is missing."""
        sandbox = self._require_started()
        await self._fs_call(path, sandbox.fs.delete_file, path)


__all__ = [
    "CODEC_SOURCE",
    "LABEL_MANAGED",
    "LABEL_PERSIST",
    "LABEL_TASK",
    "DaytonaEnvironment",
    "DaytonaExecStream",
]
