"""The local backend: run on this machine, as this user, in a new session.

Scripts start behind the run's isolation (environments/isolation.py): under bubblewrap
where it works, with the host's network only when asked for. Every process this
environment starts carries a marker variable in its environment, so that
:meth:`LocalEnvironment.aclose` finds and kills all of them, even daemons that left the
session and were reparented. A process's own :meth:`LocalProcess.kill` takes its
descendants and every process still in its session.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import secrets
import shutil
import signal
import stat as stat_module
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, ClassVar, Self

import anyio
import anyio.abc
import psutil

from hermes_sandbox.environments.base import (
    DEFAULT_MAX_COMMAND_OUTPUT,
    TIMEOUT_EXIT_CODE,
    CommandResult,
    Environment,
    ExecStream,
    FileKind,
    FileStat,
    Runtime,
    SandboxProcess,
)
from hermes_sandbox.environments.capture import HeadTailBuffer
from hermes_sandbox.environments.errors import EnvironmentFailure
from hermes_sandbox.environments.isolation import (
    ISOLATION_MODES,
    Isolation,
    choose_isolation,
    describe_isolation,
)
from hermes_sandbox.environments.settings import BackendSettings
from hermes_sandbox.errors import SandboxError
from hermes_sandbox.threads import kill_limiter, tool_limiter

log = logging.getLogger(__name__)

MARKER_VAR = "HERMES_SANDBOX_ENV"
_DRAIN_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class LocalSettings(BackendSettings):
    """Settings of the local backend: this machine, as this user."""

    backend: ClassVar[str] = "local"
    without_image: ClassVar[str] = "it runs on this machine as it is"
    network_setting: ClassVar[tuple[str, Any] | None] = ("network", True)
    isolation_field: ClassVar[str | None] = "isolation"

    python: str | None = None  # the interpreter scripts run with; None: this process's
    # auto, bwrap or none (environments/isolation.py); None: $HERMES_SANDBOX_ISOLATION,
    # else auto.
    isolation: str | None = None
    network: bool = False  # the host's network under bwrap (without it, there is no other)

    def check(self) -> None:
        if self.python is not None:
            if not self.python:
                raise ValueError("python must be a command name or a path, not empty")
            object.__setattr__(self, "python", os.path.expanduser(self.python))
        if self.isolation is not None and self.isolation not in ISOLATION_MODES:
            raise ValueError(
                f"isolation must be one of {', '.join(ISOLATION_MODES)}, got {self.isolation!r}"
            )

    def availability(self) -> str | None:
        try:
            choose_isolation(self)
        except SandboxError as exc:  # bwrap asked for and not working, a bad variable
            return str(exc)
        return None

    def details(self) -> dict[str, str]:
        return {"isolation": describe_isolation(self)}


class LocalEnvironment(Environment, Runtime):
    """This machine. ``env`` is the environment every command and process starts from
    (default: a copy of this process's); ``python`` the interpreter for scripts (default:
    the settings', else this process's)."""

    name = "local"
    settings_class = LocalSettings
    shares_host = True

    def __init__(
        self,
        settings: LocalSettings | None = None,
        *,
        env: Mapping[str, str] | None = None,
        python: str | None = None,
        kill_grace: float = 2.0,
    ) -> None:
        self.settings = settings if settings is not None else LocalSettings()
        self.marker = secrets.token_hex(12)
        self._env = dict(os.environ if env is None else env)
        self._env[MARKER_VAR] = self.marker
        self._marker_entry = f"{MARKER_VAR}={self.marker}".encode()
        self._python = python or self.settings.python or sys.executable
        self.kill_grace = kill_grace
        self._closed = False
        self.isolation: Isolation | None = None  # chosen by start()
        self._stages: list[str] = []  # what make_private_dir made: the runs' to write

    @classmethod
    def for_run(
        cls,
        settings: Any,
        *,
        env: Mapping[str, str],
        kill_grace: float,
        task_id: str | None,
        python: str | None,
    ) -> Self:
        return cls(cls.settings_for(settings), env=env, python=python, kill_grace=kill_grace)

    @property
    def python(self) -> str:
        return self._python

    @property
    def default_cwd(self) -> str:
        return os.getcwd()

    @property
    def home(self) -> str | None:
        return os.path.expanduser("~")

    @property
    def shared_directory(self) -> str | None:
        return tempfile.gettempdir()  # this machine: every path is the host's

    async def start(self) -> Self:
        """Nothing to make: this machine is ready once the isolation is chosen; returns
        this environment, which runs things too. Raises EnvironmentFailure once closed,
        BackendNotAvailable when bwrap is asked for and does not work here."""
        if self._closed:
            raise EnvironmentFailure("this local environment was closed; make a new one")
        await self._chosen_isolation()
        return self

    async def _chosen_isolation(self) -> Isolation:
        if self.isolation is None:
            chosen = await anyio.to_thread.run_sync(choose_isolation, self.settings)
            log.info("local isolation: %s", chosen.describe())
            self.isolation = chosen
        return self.isolation

    async def _contained(self, argv: Sequence[str], cwd: str | None) -> list[str]:
        """``argv`` behind the run's isolation: the one place a script's launch is
        contained (environments/isolation.py)."""
        isolation = await self._chosen_isolation()
        if isolation.mode == "none":
            return list(argv)
        prefix = await anyio.to_thread.run_sync(
            functools.partial(
                isolation.prefix,
                cwd=os.getcwd() if cwd is None else cwd,
                writable=list(self._stages),
                python=self._python,
                network=self.settings.network,
            )
        )
        return [*prefix, *argv]

    @property
    def alive(self) -> bool:
        return not self._closed

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        marker = self._marker_entry
        with anyio.CancelScope(shield=True):  # a cancelled caller must not leave strays
            await anyio.to_thread.run_sync(
                kill_processes,
                lambda: _pids_with_environ(marker),
                self.kill_grace,
                limiter=kill_limiter(),
            )

    def _child_env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        merged = dict(self._env if env is None else env)
        merged[MARKER_VAR] = self.marker
        return merged

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin_path: str | None = None,
    ) -> LocalProcess:
        # A local file: opening it does not wait.
        stdin = open(stdin_path, "rb") if stdin_path else None  # noqa: SIM115, ASYNC230
        try:
            process = await anyio.open_process(
                await self._contained(argv, cwd),
                stdin=stdin if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=self._child_env(env),
                start_new_session=True,
            )
        finally:
            if stdin is not None:
                stdin.close()  # the child has its own copy
        return LocalProcess(process, self._marker_entry)

    async def open_exec_stream(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> LocalExecStream:
        merged = self._child_env(None)
        if env:
            merged.update(env)
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 - owned by the stream
        try:
            process = await anyio.open_process(
                await self._contained(argv, cwd),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                cwd=cwd,
                env=merged,
                start_new_session=True,
            )
        except BaseException:
            stderr.close()
            raise
        return LocalExecStream(process, stderr)

    async def execute(
        self,
        command: str,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        max_output_bytes: int = DEFAULT_MAX_COMMAND_OUTPUT,
    ) -> CommandResult:
        process = await anyio.open_process(
            ["/bin/sh", "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=self._child_env(None),
            start_new_session=True,
        )
        handle = LocalProcess(process, self._marker_entry)
        output = HeadTailBuffer(max_output_bytes)

        async def pump() -> None:
            async for chunk in handle.stdout:
                output.feed(chunk)

        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(pump)
                with anyio.move_on_after(timeout) as scope:
                    await process.wait()
                # The command is done (or out of time): what it left in the background
                # goes too, then the pipe gets a moment to deliver the rest.
                with anyio.CancelScope(shield=True):
                    await handle.kill(self.kill_grace)
                tasks.cancel_scope.deadline = anyio.current_time() + _DRAIN_SECONDS
        finally:
            with anyio.CancelScope(shield=True):
                await handle.aclose()
        timed_out = scope.cancelled_caught
        text = output.text()
        if timed_out:
            return CommandResult(text, TIMEOUT_EXIT_CODE, timed_out=True)
        code = process.returncode
        return CommandResult(text, 128 - code if code is not None and code < 0 else code or 0)

    async def stat(self, path: str) -> FileStat:
        def _stat() -> FileStat:
            try:
                real = os.path.realpath(path)
            except RecursionError:  # a symlink chain deeper than Python's stack
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path) from None
            st = os.stat(real)
            return FileStat(real, _kind(st.st_mode), st.st_size)

        return await anyio.to_thread.run_sync(_stat, limiter=tool_limiter())

    async def read_bytes(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """Read a regular file (a pipe, socket or device is refused with OSError)."""

        def _read() -> bytes:
            with os.fdopen(_open_regular(path, os.O_RDONLY), "rb") as f:
                return f.read() if max_bytes is None else f.read(max_bytes)

        return await anyio.to_thread.run_sync(_read, limiter=tool_limiter())

    async def write_bytes(
        self, path: str, data: bytes, *, make_parents: bool = True, mode: int | None = None
    ) -> None:
        def _write() -> None:
            if make_parents:
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
            with os.fdopen(_open_regular(path, flags), "wb") as f:
                f.write(data)
            if mode is not None:
                os.chmod(path, mode)

        await anyio.to_thread.run_sync(_write, limiter=tool_limiter())

    async def make_private_dir(self, prefix: str, *, parent: str | None = None) -> str:
        made = tempfile.mkdtemp(prefix=prefix, dir=parent)  # mkdtemp makes it 0700
        self._stages.append(made)
        return made

    async def remove_tree(self, path: str) -> None:
        def remove() -> list[str]:
            shutil.rmtree(path, ignore_errors=True)
            return [stage for stage in self._stages if os.path.isdir(stage)]

        # The run's own cleanup, not a tool's: on the kill's threads, which tools never hold.
        self._stages = await anyio.to_thread.run_sync(remove, limiter=kill_limiter())


class LocalProcess(SandboxProcess):
    def __init__(self, process: anyio.abc.Process, marker: bytes) -> None:
        self._process = process
        self._marker = marker
        assert process.stdout is not None
        self.stdout = process.stdout
        self.stderr = process.stderr or _EmptyStream()
        self.pid = process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    async def wait(self) -> int:
        return await self._process.wait()

    async def kill(self, grace: float = 2.0) -> None:
        pid = self.pid

        def members() -> set[int]:
            found = _pids_in_session(pid)
            try:
                root = psutil.Process(pid)
                found.update(child.pid for child in root.children(recursive=True))
                found.add(pid)
            except psutil.Error:
                pass
            if self._process.returncode is not None:
                # The root has been reaped, so its pid (and session id) may already
                # belong to someone else: only take processes that carry our marker.
                found &= _pids_with_environ(self._marker, among=found)
            return found

        await anyio.to_thread.run_sync(kill_processes, members, grace, limiter=kill_limiter())
        if self._process.returncode is None:
            with anyio.move_on_after(5):
                await self._process.wait()

    async def aclose(self) -> None:
        if self._process.returncode is None:
            await self.kill(0)
        await self._process.aclose()


class LocalExecStream(ExecStream):
    """A local process's stdin and stdout as one stream; stderr goes to a temp file."""

    _STDERR_TAIL = 8192

    def __init__(self, process: anyio.abc.Process, stderr: BinaryIO) -> None:
        assert process.stdin is not None and process.stdout is not None
        self._process = process
        self._stdin = process.stdin
        self._stdout = process.stdout
        self._stderr = stderr
        self._final_tail: bytes | None = None  # kept when the file is closed

    @property
    def stderr_tail(self) -> bytes:  # type: ignore[override]
        if self._final_tail is not None:
            return self._final_tail
        try:
            size = self._stderr.seek(0, os.SEEK_END)
            self._stderr.seek(max(0, size - self._STDERR_TAIL))
            return self._stderr.read()
        except (OSError, ValueError):
            return b""

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return await self._stdout.receive(max_bytes)

    async def send(self, item: bytes) -> None:
        await self._stdin.send(item)

    async def send_eof(self) -> None:
        await self._stdin.aclose()

    async def wait(self) -> int:
        return await self._process.wait()

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._stdin.aclose()
            with anyio.move_on_after(5):
                await self._process.wait()
            if self._process.returncode is None:
                self._process.kill()
            await self._process.aclose()
            if self._final_tail is None:
                self._final_tail = self.stderr_tail
                self._stderr.close()


class _EmptyStream(anyio.abc.ByteReceiveStream):
    async def receive(self, max_bytes: int = 65536) -> bytes:
        raise anyio.EndOfStream

    async def aclose(self) -> None:
        return None


def _kind(mode: int) -> FileKind:
    if stat_module.S_ISREG(mode):
        return "file"
    if stat_module.S_ISDIR(mode):
        return "directory"
    if stat_module.S_ISCHR(mode):
        return "char_device"
    if stat_module.S_ISBLK(mode):
        return "block_device"
    if stat_module.S_ISFIFO(mode):
        return "fifo"
    if stat_module.S_ISSOCK(mode):
        return "socket"
    return "other"


def _open_regular(path: str, flags: int) -> int:
    """Open ``path`` without ever blocking in open(), and only if it is a regular file.

    A named pipe blocks a plain open() until its other end is opened, which may be never:
    the file tools check a path's kind first, but a script can swap a file for a pipe
    between that check and this open. O_NONBLOCK makes the open return at once (or fail
    with ENXIO for a pipe with no reader, opened for writing); the descriptor is then
    checked with fstat and made blocking again for the read or write itself. Raises
    OSError, with a strerror that says what the path is, for anything but a regular file.
    """
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise OSError(
                errno.ENXIO, _NOT_REGULAR.format("a named pipe or a device"), path
            ) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat_module.S_ISREG(mode) and not stat_module.S_ISDIR(mode):
            what = _SPECIAL_NAMES.get(_kind(mode), "not a regular file")
            raise OSError(errno.EINVAL, _NOT_REGULAR.format(what), path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


_NOT_REGULAR = "it is {}; the file tools read and write regular files only"
_SPECIAL_NAMES = {
    "fifo": "a named pipe",
    "socket": "a socket",
    "char_device": "a character device",
    "block_device": "a block device",
}


# -- finding and killing processes ---------------------------------------------------
# Blocking helpers: called through anyio.to_thread.


def _all_pids() -> Iterable[int]:
    if os.path.isdir("/proc"):
        return (int(name) for name in os.listdir("/proc") if name.isdigit())
    return psutil.pids()


def _pids_in_session(sid: int) -> set[int]:
    found = set()
    me = os.getpid()
    for pid in _all_pids():
        if pid == me:
            continue
        try:
            if os.getsid(pid) == sid:
                found.add(pid)
        except OSError:
            continue
    return found


def _pids_with_environ(marker: bytes, among: Iterable[int] | None = None) -> set[int]:
    """Processes (of all, or ``among``) whose environment holds ``marker`` (``NAME=value``)."""
    found = set()
    me = os.getpid()
    use_proc = os.path.isdir("/proc")
    for pid in _all_pids() if among is None else among:
        if pid == me:
            continue
        try:
            if use_proc:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    entries = f.read().split(b"\0")
            else:
                entries = [f"{k}={v}".encode() for k, v in psutil.Process(pid).environ().items()]
        except (OSError, psutil.Error):
            continue
        if marker in entries:
            found.add(pid)
    return found


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False


def _signal(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _freeze(collect: Callable[[], set[int]], frozen: set[int]) -> set[int]:
    """SIGSTOP what ``collect`` finds until it finds nothing new, so nothing can fork
    away between finding and killing."""
    for _ in range(20):
        new = {pid for pid in collect() if pid not in frozen}
        if not new:
            break
        _signal(new, signal.SIGSTOP)
        frozen |= new
    return frozen


def kill_processes(collect: Callable[[], set[int]], grace: float) -> None:
    """Terminate every process ``collect`` finds, and what they start meanwhile.

    SIGTERM first (with SIGCONT, so stopped processes can act on it), SIGKILL after
    ``grace`` seconds for what is left. Zombies count as gone: nothing here reaps,
    so a child of ours keeps its exit status for its parent.
    """
    targets = _freeze(collect, set())
    if not targets:
        return
    if grace > 0:
        _signal(targets, signal.SIGTERM)
        _signal(targets, signal.SIGCONT)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(pid) for pid in targets):
            time.sleep(0.01)
    targets = _freeze(collect, {pid for pid in targets if _alive(pid)})
    _signal(targets, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(pid) for pid in targets):
        time.sleep(0.005)
