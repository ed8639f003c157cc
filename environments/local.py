"""The local backend: run on this machine, as this user.

Scripts start behind the run's isolation (environments/isolation.py): under bubblewrap
where it works, with the host's network only when asked for. What a launch starts ends
with it, and with this host process:

- behind bubblewrap (:func:`open_local`, ``sandboxed``), by the sandbox's own pid
  namespace: when the launched program exits, the kernel ends everything else in it,
  and bubblewrap's ``--die-with-parent`` ends the sandbox when this process dies;
- otherwise (no isolation, and the terminal tool's commands, which run on this
  machine), under the supervisor (stubs/_supervisor.py, :func:`launch_argv`): a
  child subreaper that ends everything the launch started when it exits or when this
  host process dies (its lifeline pipe ends).

Every private directory this environment makes (a run's stage, a session's workspace)
is told to this process's keeper (environments/keeper.py), which removes it, and kills
any sandbox still running in it, if this process dies before removing it. Killing is by
/proc ancestry below the launch (:meth:`LocalEnvironment.kill_process_tree`), never by
an environment variable or a session, which a script can leave.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import logging
import os
import select
import shutil
import stat as stat_module
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import Any, BinaryIO, Self

import anyio
import anyio.abc

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
    check_stage_names,
)
from hermes_sandbox.environments.capture import HeadTailBuffer
from hermes_sandbox.environments.errors import EnvironmentFailure
from hermes_sandbox.environments.isolation import (
    Isolation,
    choose_isolation,
    forget_bwrap_probe,
)
from hermes_sandbox.environments.keeper import keeper
from hermes_sandbox.environments.local_settings import LocalSettings
from hermes_sandbox.stubs import _proctree
from hermes_sandbox.threads import kill_limiter, tool_limiter

log = logging.getLogger(__name__)

_DRAIN_SECONDS = 1.0
# How long a launch's own process (the supervisor, or bubblewrap) gets to end by itself
# after its tree was killed or its input closed, before it is killed with its tree.
_LAUNCH_EXIT_SECONDS = 2.0
# Run by path: beside _proctree, which it imports (importlib.resources would bring
# zipfile to every run for a path the package's files already give).
# Where make_memory_dir puts its directories: the tmpfs every Linux system mounts.
MEMORY_PARENT = "/dev/shm"
# bubblewrap can fail to set a sandbox up for a reason of the moment: a mount of the
# host's that changes while it copies the mount table (containers/bubblewrap#650; seen
# here beside a container engine starting and removing containers). A launch behind it
# is then made again (:class:`_Gate` tells that the command never started), this many
# times in all; past them the last failure is the run's, as before.
_SETUP_ATTEMPTS = 3
# How long a launch watches bubblewrap's set-up before it stops looking: a set-up that
# hangs (an unreachable automount) is then the run's timeout's, as any hang is.
_SETUP_SECONDS = 10.0
SUPERVISOR_PATH = os.path.join(os.path.dirname(_proctree.__file__), "_supervisor.py")


def launch_argv(argv: Sequence[str], *, lifeline: int) -> list[str]:
    """The command line of a supervised local launch: ``argv`` under the supervisor.

    ``lifeline`` is the read end of a pipe whose write end only this process holds.
    """
    # -S: no site (the stdlib is all it needs), so it starts without reading the .pth
    # files of the host's site-packages: a third of its start-up.
    supervisor = [sys.executable, "-E", "-S", SUPERVISOR_PATH]
    supervisor += ["--lifeline", str(lifeline), "--parent", str(os.getpid())]
    return [*supervisor, "--", *argv]


def kill_tree_blocking(root: int, grace: float, *, include_root: bool) -> None:
    """Kill every process below ``root`` (and ``root``, if asked): SIGTERM, ``grace``
    seconds, then SIGKILL until none is left. Blocking: call it through a thread."""
    _proctree.kill_tree(root, grace, include_root=include_root)


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
        self._env = dict(os.environ if env is None else env)
        self._python = python or self.settings.python or sys.executable
        self.kill_grace = kill_grace
        self._closed = False
        self.isolation: Isolation | None = None  # chosen by start()
        self._stages: list[str] = []  # what make_private_dir made: the runs' to write
        self._live: set[_Launch] = set()  # launches that may still run

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

    @functools.cached_property
    def runs_this_python(self) -> bool:
        found = shutil.which(self._python)
        return found is not None and os.path.realpath(found) == os.path.realpath(sys.executable)

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

    async def _contained(self, argv: Sequence[str], cwd: str | None) -> list[str] | None:
        """``argv`` behind the run's isolation, None for none: the one place a script's
        launch is contained (environments/isolation.py)."""
        isolation = await self._chosen_isolation()
        if isolation.mode == "none":
            return None
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

    def _bwrap_watch(self) -> _BwrapWatch | None:
        """A watch for a launch that bwrap failed to start, when launches go behind it."""
        isolation = self.isolation
        if isolation is None or isolation.mode != "bwrap":
            return None
        return _BwrapWatch(isolation)

    @property
    def alive(self) -> bool:
        return not self._closed

    async def aclose(self) -> None:
        """Kill whatever this environment started that still runs. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):  # a cancelled caller must not leave strays
            for handle in list(self._live):
                await handle.kill(0)

    async def kill_process_tree(self, pid: int, grace: float = 0.0) -> None:
        """Kill ``pid`` and every process below it (SIGTERM, ``grace``, SIGKILL)."""
        await anyio.to_thread.run_sync(
            lambda: kill_tree_blocking(pid, grace, include_root=True), limiter=kill_limiter()
        )

    async def _open(
        self,
        argv: Sequence[str],
        *,
        stdin: Any,
        stdout: Any,
        stderr: Any,
        cwd: str | None,
        env: Mapping[str, str],
        contain: bool = True,
    ) -> _Launch:
        """Start ``argv``: behind the isolation in a sandbox of its own if ``contain``
        and there is one, else under the supervisor."""
        contained = await self._contained(argv, cwd) if contain else None
        handle = await open_local(
            argv if contained is None else contained,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            cwd=cwd,
            env=env,
            sandboxed=contained is not None,
        )
        handle.track(self._live)
        return handle

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stage: str | None = None,
        stdin_path: str | None = None,
    ) -> LocalProcess:
        # A local file: opening it does not wait.
        stdin = open(stdin_path, "rb") if stdin_path else None  # noqa: SIM115, ASYNC230
        try:
            handle = await self._open(
                argv,
                stdin=stdin if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=dict(self._env if env is None else env),
            )
        finally:
            if stdin is not None:
                stdin.close()  # the child has its own copy
        return LocalProcess(handle, self._bwrap_watch())

    async def open_exec_stream(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stage: str | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> LocalExecStream:
        if files:
            if stage is None:
                raise ValueError("files to write before a program need its stage")
            for name, data in files.items():
                await self.write_bytes(os.path.join(stage, name), data, mode=0o600)
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 - owned by the stream
        try:
            handle = await self._open(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                cwd=cwd,
                env={**self._env, **(env or {})},
            )
        except BaseException:
            stderr.close()
            raise
        return LocalExecStream(handle, stderr, self._bwrap_watch())

    async def execute(
        self,
        command: str,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        max_output_bytes: int = DEFAULT_MAX_COMMAND_OUTPUT,
    ) -> CommandResult:
        handle = LocalProcess(
            await self._open(
                ["/bin/sh", "-c", command],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=dict(self._env),
                contain=False,  # a tool's command: this machine's, as the tool is
            )
        )
        output = HeadTailBuffer(max_output_bytes)

        async def pump() -> None:
            async for chunk in handle.stdout:
                output.feed(chunk)

        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(pump)
                with anyio.move_on_after(timeout) as scope:
                    code = await handle.wait()
                # Out of time: the command and all it started go (a finished command's
                # leftovers are already gone: its supervisor ended them), then the pipe
                # gets a moment to deliver the rest.
                if scope.cancelled_caught:
                    with anyio.CancelScope(shield=True):
                        await handle.kill(self.kill_grace)
                tasks.cancel_scope.deadline = anyio.current_time() + _DRAIN_SECONDS
        finally:
            with anyio.CancelScope(shield=True):
                await handle.aclose()
        text = output.text()
        if scope.cancelled_caught:
            return CommandResult(text, TIMEOUT_EXIT_CODE, timed_out=True)
        return CommandResult(text, 128 - code if code < 0 else code)

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
            _write_file(path, data, mode)

        await anyio.to_thread.run_sync(_write, limiter=tool_limiter())

    async def make_private_dir(self, prefix: str, *, parent: str | None = None) -> str:
        made = tempfile.mkdtemp(prefix=prefix, dir=parent)  # mkdtemp makes it 0700
        keeper().keep(made)  # removed if this process dies first
        self._stages.append(made)
        return made

    async def make_memory_dir(self, prefix: str, *, room: int) -> str | None:
        """In /dev/shm when it is a directory this process may write, with ``room``
        free (a container's is often 64 MB: then None, and the caller stays on disk).
        Bound into a bwrap-contained script like every directory made here."""
        try:
            free = os.statvfs(MEMORY_PARENT)
        except OSError:
            return None
        if free.f_bavail * free.f_frsize < room or not os.access(MEMORY_PARENT, os.W_OK | os.X_OK):
            return None
        try:
            return await self.make_private_dir(prefix, parent=MEMORY_PARENT)
        except OSError as exc:
            log.debug("no directory in %s (%s); staying on disk", MEMORY_PARENT, exc)
            return None

    async def make_stage(
        self,
        prefix: str,
        files: Mapping[str, bytes],
        *,
        parent: str | None = None,
        mode: int = 0o600,
    ) -> str:
        """As the base class makes it, in one trip to a thread, not one a file (a cold
        run's stage is three files)."""
        check_stage_names(files)

        def make() -> str:
            path = tempfile.mkdtemp(prefix=prefix, dir=parent)
            keeper().keep(path)
            try:
                for name, data in files.items():
                    _write_file(os.path.join(path, name), data, mode)
            except BaseException:
                shutil.rmtree(path, ignore_errors=True)
                keeper().release(path)
                raise
            return path

        made = await anyio.to_thread.run_sync(make, limiter=tool_limiter())
        self._stages.append(made)
        return made

    async def remove_tree(self, path: str) -> None:
        def remove() -> list[str]:
            shutil.rmtree(path, ignore_errors=True)
            left = [stage for stage in self._stages if os.path.isdir(stage)]
            for gone in set(self._stages).difference(left):
                keeper().release(gone)
            return left

        # The run's own cleanup, not a tool's: on the kill's threads, which tools never hold.
        self._stages = await anyio.to_thread.run_sync(remove, limiter=kill_limiter())


async def open_local(
    argv: Sequence[str],
    *,
    stdin: Any,
    stdout: Any,
    stderr: Any,
    cwd: str | None,
    env: Mapping[str, str],
    sandboxed: bool = False,
) -> _Launch:
    """Start ``argv`` on this machine: every local launch goes through here. Under the
    supervisor (:func:`launch_argv`), unless ``sandboxed``: ``argv`` is then a command
    line behind bubblewrap (its own pid namespace, ``--die-with-parent``), which ends
    what the script started when the script exits, and ends with this process; a launch
    whose sandbox bubblewrap could not set up is made again (:data:`_SETUP_ATTEMPTS`),
    which never runs a command twice: it is made again only if the command never
    started. Raises OSError (a ``cwd`` that does not exist)."""
    start = functools.partial(
        anyio.open_process,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        cwd=cwd,
        env=env,
        start_new_session=True,  # a terminal's Ctrl-C goes to the runner only
    )
    if not sandboxed:
        lifeline, keep = os.pipe()  # both ends close-on-exec; the child gets one by number
        try:
            process = await start(launch_argv(argv, lifeline=lifeline), pass_fds=(lifeline,))
        except BaseException:
            os.close(keep)
            raise
        finally:
            os.close(lifeline)
        return _Launch(process, keep)
    for attempt in range(1, _SETUP_ATTEMPTS + 1):
        with _Gate() as gate:
            process = await start(gate.argv(argv), pass_fds=(gate.read_end,))
            gate.given()
            try:
                if attempt == _SETUP_ATTEMPTS or await gate.passed():
                    return _Launch(process, None)
                said = await _setup_failure(process, stderr)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await _Launch(process, None).kill(0)
                raise
        log.warning("bwrap could not set the sandbox up (%s); launching again", said)
    raise AssertionError("unreachable")  # the last attempt returns


class _Gate:
    """What tells a launch that bubblewrap has set its sandbox up: a pipe of one slot
    holding one packet (``O_DIRECT``), whose read end bubblewrap gets as ``--block-fd``
    and reads once every mount is made, just before it starts the command. The write
    end, kept here, turns writable when the packet is read (the command starts), and
    reports an error, still full, when every read end has closed unread (bubblewrap
    ended in its set-up: the command never started)."""

    def __init__(self) -> None:
        self.read_end, self._write_end = os.pipe2(os.O_CLOEXEC | os.O_DIRECT)
        try:
            fcntl.fcntl(self._write_end, fcntl.F_SETPIPE_SZ, 1)  # one page: a single slot
            os.write(self._write_end, b"\0")  # the one packet: the pipe is full
        except BaseException:
            self.close()
            raise

    def argv(self, argv: Sequence[str]) -> list[str]:
        """bubblewrap's command line ``argv`` with the gate given to it."""
        return [argv[0], "--block-fd", str(self.read_end), *argv[1:]]

    def given(self) -> None:
        """bubblewrap has its copy of the read end: this process's goes."""
        if self.read_end >= 0:
            os.close(self.read_end)
            self.read_end = -1

    async def passed(self) -> bool:
        """Whether bubblewrap got through its set-up; True as well when that is not
        known within :data:`_SETUP_SECONDS`."""
        poller = select.poll()
        poller.register(self._write_end, select.POLLOUT)
        with anyio.move_on_after(_SETUP_SECONDS):
            while True:
                for _fd, events in poller.poll(0):
                    if events & select.POLLOUT:
                        return True
                    if events & (select.POLLERR | select.POLLHUP):
                        return False
                await anyio.wait_writable(self._write_end)
        return True

    def close(self) -> None:
        self.given()
        if self._write_end >= 0:
            os.close(self._write_end)
            self._write_end = -1

    def __enter__(self) -> _Gate:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


async def _setup_failure(process: anyio.abc.Process, stderr: Any) -> str:
    """What bubblewrap said when it failed to set a sandbox up, taken out of the launch's
    output (the command never ran: nothing in it is the script's); the process closed."""
    said = b""
    with anyio.CancelScope(shield=True):
        with anyio.move_on_after(_LAUNCH_EXIT_SECONDS):
            await process.wait()
        stream = {subprocess.PIPE: process.stderr, subprocess.STDOUT: process.stdout}.get(stderr)
        if stream is not None:
            with anyio.move_on_after(_LAUNCH_EXIT_SECONDS):
                with suppress(anyio.EndOfStream, anyio.ClosedResourceError):
                    while len(said) < 4096:
                        said += await stream.receive()
        elif hasattr(stderr, "seek"):  # a file of the launch's own: emptied for the next
            stderr.seek(0)
            said = stderr.read(4096)
            stderr.seek(0)
            stderr.truncate()
        await _Launch(process, None).kill(0)
        await process.aclose()
    return said.decode("utf-8", "replace").strip() or f"exit status {process.returncode}"


class _Launch:
    """A process this environment started, under the supervisor or behind bubblewrap:
    the process, the write end of the supervisor's lifeline (None for a sandbox), and
    the kill of its tree."""

    def __init__(self, process: anyio.abc.Process, lifeline: int | None) -> None:
        self.process = process
        self.pid = process.pid
        self._lifeline = lifeline
        self._live: set[_Launch] = set()

    def track(self, live: set[_Launch]) -> None:
        """Be in ``live`` (an environment's launches to kill at its close) while running."""
        self._live = live
        live.add(self)

    async def kill(self, grace: float) -> None:
        """Kill everything below the launched process, the supervisor or bubblewrap
        (SIGTERM, ``grace``, SIGKILL); then it exits by itself, or is killed too (a
        script may have stopped the supervisor)."""
        process = self.process
        if process.returncode is None:
            # Below it first, so that the script's own exit status is kept.
            await anyio.to_thread.run_sync(
                lambda: kill_tree_blocking(self.pid, grace, include_root=False),
                limiter=kill_limiter(),
            )
        with anyio.move_on_after(_LAUNCH_EXIT_SECONDS):
            await process.wait()
        if process.returncode is None:
            await anyio.to_thread.run_sync(
                lambda: kill_tree_blocking(self.pid, 0, include_root=True),
                limiter=kill_limiter(),
            )
            with anyio.move_on_after(5):
                await process.wait()
        self.release()

    def release(self) -> None:
        """Close the lifeline (once the launched process is gone, nothing is left to end)."""
        if self.process.returncode is not None:
            self._live.discard(self)
            if self._lifeline is not None:
                os.close(self._lifeline)
                self._lifeline = None


class _BwrapWatch:
    """Whether bwrap failed to start a launch: it exits 1 with ``bwrap: `` at the start
    of stderr (before anything the script could write). Then the probe's answer, which
    may come from a stale cache, is dropped (:func:`forget_bwrap_probe`), so the next
    run probes again; the run itself has failed loudly, never run unsandboxed. A script
    that imitates the failure only costs the next run a probe."""

    _MARK = b"bwrap: "

    def __init__(self, isolation: Isolation) -> None:
        self._isolation = isolation
        self._head = b""
        self._code: int | None = None
        self._done = False

    def saw(self, data: bytes) -> None:
        if len(self._head) < len(self._MARK):
            self._head += data[: len(self._MARK) - len(self._head)]
            self._check()

    def exited(self, code: int) -> None:
        self._code = code
        self._check()

    def _check(self) -> None:
        if self._done or self._code != 1 or not self._head.startswith(self._MARK):
            return
        self._done = True
        dropped = forget_bwrap_probe(self._isolation.probe)
        log.warning(
            "bwrap failed to start a script%s",
            "; its cached probe result was dropped" if dropped else "",
        )


class _WatchedStream(anyio.abc.ByteReceiveStream):
    """A stream whose first bytes are shown to a :class:`_BwrapWatch`."""

    def __init__(self, inner: anyio.abc.ByteReceiveStream, watch: _BwrapWatch) -> None:
        self._inner = inner
        self._watch = watch

    async def receive(self, max_bytes: int = 65536) -> bytes:
        data = await self._inner.receive(max_bytes)
        self._watch.saw(data)
        return data

    async def aclose(self) -> None:
        await self._inner.aclose()


class LocalProcess(SandboxProcess):
    def __init__(self, handle: _Launch, bwrap: _BwrapWatch | None = None) -> None:
        self._handle = handle
        self._process = handle.process
        assert self._process.stdout is not None
        self.stdout = self._process.stdout
        stderr = self._process.stderr
        if stderr is not None and bwrap is not None:
            stderr = _WatchedStream(stderr, bwrap)
        self.stderr = stderr or _EmptyStream()
        self.pid = handle.pid
        self._bwrap = bwrap

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    async def wait(self) -> int:
        code = await self._process.wait()
        self._handle.release()
        if self._bwrap is not None:
            self._bwrap.exited(code)
        return code

    async def kill(self, grace: float = 2.0) -> None:
        await self._handle.kill(grace)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._handle.kill(0)
            await self._process.aclose()


class LocalExecStream(ExecStream):
    """A local process's stdin and stdout as one stream; stderr goes to a temp file."""

    _STDERR_TAIL = 8192

    def __init__(self, handle: _Launch, stderr: BinaryIO, bwrap: _BwrapWatch | None = None) -> None:
        process = handle.process
        assert process.stdin is not None and process.stdout is not None
        self._bwrap = bwrap
        self._handle = handle
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
        code = await self._process.wait()
        self._handle.release()
        self._watch_bwrap(code)
        return code

    def _watch_bwrap(self, code: int) -> None:
        if self._bwrap is not None and self._final_tail is None:
            try:
                self._stderr.seek(0)
                self._bwrap.saw(self._stderr.read(16))
            except (OSError, ValueError):
                return
            self._bwrap.exited(code)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._stdin.aclose()  # the process's end of input: it should exit
            with anyio.move_on_after(_LAUNCH_EXIT_SECONDS):
                await self._process.wait()
            await self._handle.kill(0)
            await self._process.aclose()
            if self._final_tail is None:
                if self._process.returncode is not None:
                    self._watch_bwrap(self._process.returncode)
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


def _write_file(path: str, data: bytes, mode: int | None) -> None:
    with os.fdopen(_open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as f:
        f.write(data)
    if mode is not None:
        os.chmod(path, mode)


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
