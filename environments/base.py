"""The seam every backend implements: where code runs.

An :class:`Environment` is the lifecycle of one place to run things (this machine, a
container, a remote host): built from its settings, started, closed. Started, it hands
back a :class:`Runtime`, which can

- run a shell command to completion (:meth:`Runtime.execute`),
- read, write and inspect files (:meth:`stat`, :meth:`read_bytes`, :meth:`write_bytes`),
- make and remove private scratch directories,
- start a process whose stdout and stderr are byte streams (:meth:`spawn`); the
  returned :class:`SandboxProcess` can be waited on and killed with all it started.

Paths are paths *inside* the environment. Nothing here knows about tools, frames or
scripts: sandbox/ decides what to run, rpc/ carries the calls.
"""

from __future__ import annotations

import abc
import errno
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Literal, Self

import anyio
import anyio.abc

from hermes_sandbox.environments.settings import BackendSettings, api_place
from hermes_sandbox.errors import SettingError
from hermes_sandbox.stubs import RELAY_MODULE

# What Environment.execute keeps of a command's output, and the exit code of a command
# killed for its timeout (as coreutils' timeout reports it).
DEFAULT_MAX_COMMAND_OUTPUT = 1_000_000
TIMEOUT_EXIT_CODE = 124

FileKind = Literal["file", "directory", "char_device", "block_device", "fifo", "socket", "other"]


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What a finished command left: its combined output and exit code."""

    output: str
    exit_code: int
    timed_out: bool = False


@dataclass(frozen=True, slots=True)
class FileStat:
    path: str  # the resolved path, symlinks followed
    kind: FileKind
    size: int


class SandboxProcess(abc.ABC):
    """A process started by :meth:`Environment.spawn`.

    ``stdout`` and ``stderr`` yield the process's output as it comes; they end when
    every writer has closed them.
    """

    stdout: anyio.abc.ByteReceiveStream
    stderr: anyio.abc.ByteReceiveStream

    @abc.abstractmethod
    async def wait(self) -> int:
        """Wait for the process itself to exit; return its exit code (negative: signal)."""

    @abc.abstractmethod
    async def kill(self, grace: float = 2.0) -> None:
        """Stop the process and every process it started, wherever they went.

        Sends a polite termination signal first and a forceful one to whatever is still
        alive after ``grace`` seconds. Returns when they are all gone. Safe to call
        after the process has exited: it then removes what the process left behind.
        """

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release the streams and handles; kills first if still running."""


class ExecStream(anyio.abc.ByteStream):
    """A process started by :meth:`Environment.open_exec_stream`: its stdin and stdout
    are this one two-way byte stream (what the relay in the sandbox runs over).

    ``receive`` raises ``anyio.EndOfStream`` when the process's stdout ends; ``send_eof``
    closes its stdin. Whatever it writes to stderr is kept (the last few KiB) in
    :attr:`stderr_tail` for diagnostics.
    """

    stderr_tail: bytes = b""

    @abc.abstractmethod
    async def wait(self) -> int:
        """Wait for the process to exit; return its exit code."""

    async def wait_reaped(self) -> None:
        """Once the stream has ended: wait until the process is gone, where the backend
        says so without polling (ssh: the exit status, which sshd sends once it has
        reaped the process; the end of a stream comes as the process closes its
        descriptors, a moment before). Others return at once."""

    def send_nowait(self, data: bytes) -> int:
        """Write what of ``data`` the stream takes now without waiting; return how many
        bytes that was (0 if none, or if this stream cannot). Never raises: an error is
        left for the next :meth:`send` to report. The caller writes the rest with
        :meth:`send`, and never calls this while a :meth:`send` is in progress."""
        return 0


def check_stage_names(files: Mapping[str, bytes]) -> None:
    """Raise OSError(EINVAL) unless every name is a plain file name (no directory)."""
    for name in files:
        if "/" in name or name in ("", ".", ".."):
            raise OSError(errno.EINVAL, "not a file name", name)


class Runtime(abc.ABC):
    """What runs things in a started environment: shell commands, files, scratch
    directories, processes and exec streams. The runner and the tools (through their
    ToolContext) see only this; an :class:`Environment` hands it back from ``start``."""

    name: ClassVar[str]
    # Whether spawn works here; where it does not, the runtime starts scripts through
    # the stream relay over open_exec_stream instead.
    can_spawn: ClassVar[bool] = True

    @property
    def default_cwd(self) -> str:
        """Where scripts and commands start when the caller names no directory."""
        return "/"

    @property
    def home(self) -> str | None:
        """The home directory of the user scripts run as *in this environment* (what
        ``~`` means to a tool called from a script); None while not known."""
        return None

    @property
    def shared_directory(self) -> str | None:
        """A directory that this process (the host) and the environment both see at the
        same path, or None when there is none (a remote host, a container without the
        bind mount). Only known once started. The runtime then stages a run in it and
        can serve tool calls over a Unix socket or files there; otherwise it uses the
        stream relay."""
        return None

    async def make_memory_dir(self, prefix: str, *, room: int) -> str | None:
        """A fresh private directory, as :meth:`make_private_dir` makes, on a filesystem
        in memory (tmpfs) that this process and the environment both see at the same
        path, if there is one with at least ``room`` bytes free now; else None (the
        default: none is known). For short-lived files both sides touch many times, such
        as the files transport's calls. The caller removes it (:meth:`remove_tree`)."""
        return None

    @property
    def discards_on_close(self) -> bool:
        """Whether closing the environment now removes everything made in it, files
        included (a container of its own): what is about to go needs no removing."""
        return False

    @property
    @abc.abstractmethod
    def python(self) -> str:
        """The Python interpreter scripts run with, as a command name or path."""

    @property
    def runs_this_python(self) -> bool:
        """Whether scripts run with this process's own interpreter (so code compiled
        here runs there as it is): known on the local backend; False where not known."""
        return False

    @abc.abstractmethod
    async def execute(
        self, command: str, *, timeout: float | None = None, cwd: str | None = None
    ) -> CommandResult:
        """Run ``command`` with a POSIX shell; return its combined stdout and stderr.

        On timeout the command and all it started are killed and the result has
        ``timed_out`` set and exit code 124.
        """

    @abc.abstractmethod
    async def stat(self, path: str) -> FileStat:
        """Describe ``path`` (symlinks followed); raise FileNotFoundError, PermissionError."""

    @abc.abstractmethod
    async def read_bytes(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """Read a file, at most ``max_bytes`` of it; raise OSError subclasses."""

    @abc.abstractmethod
    async def write_bytes(
        self, path: str, data: bytes, *, make_parents: bool = True, mode: int | None = None
    ) -> None:
        """Write (replace) a file, creating parent directories if asked."""

    @abc.abstractmethod
    async def make_private_dir(self, prefix: str, *, parent: str | None = None) -> str:
        """Create a fresh directory only the environment's user can enter (mode 0700),
        in ``parent`` or the environment's scratch directory."""

    async def make_stage(
        self,
        prefix: str,
        files: Mapping[str, bytes],
        *,
        parent: str | None = None,
        mode: int = 0o600,
    ) -> str:
        """A fresh private directory, as :meth:`make_private_dir` makes, holding
        ``files`` (by name, each with ``mode``); nothing is left if it fails. A backend
        where each operation is a round trip does it in one. Raises OSError (EINVAL
        for a name that is not a plain file name)."""
        check_stage_names(files)
        path = await self.make_private_dir(prefix, parent=parent)
        try:
            for name, data in files.items():
                await self.write_bytes(f"{path}/{name}", data, make_parents=False, mode=mode)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.remove_tree(path)
            raise
        return path

    @abc.abstractmethod
    async def remove_tree(self, path: str) -> None:
        """Remove a directory and everything in it; a missing path is not an error."""

    def orphaned_with(self, stage: str) -> list[str]:
        """What a launch in ``stage`` removes if this host process dies while it runs:
        the stage first, then every other private directory this runtime made and has
        not removed (a session's workspace), which that death orphans too."""
        return [stage, *(made for made in self._private_dirs() if made != stage)]

    def _private_dirs(self) -> Sequence[str]:
        """The private directories this runtime made and has not removed, where it
        keeps count of them (none here)."""
        return ()

    @abc.abstractmethod
    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None = None,
        stage: str | None = None,
        stdin_path: str | None = None,
    ) -> SandboxProcess:
        """Start ``argv`` with exactly ``env`` as its environment; its stdin reads the
        file ``stdin_path`` (a path here), else is closed (``/dev/null``).

        ``stage`` is the run's directory: an environment that can removes it (and the
        rest of :meth:`orphaned_with`) if this host process dies while the process
        runs.
        """

    @abc.abstractmethod
    async def open_exec_stream(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stage: str | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> ExecStream:
        """Start ``argv`` with its stdin and stdout attached to the returned stream.

        ``env`` adds to (does not replace) the environment's own variables; ``stage`` is
        as for :meth:`spawn`; ``files`` (by name, mode 0600) are written into the
        existing directory ``stage`` first, replacing what had their names (a backend
        where each operation is a round trip does it in the same one; if it fails, the
        stream ends with the reason in its ``stderr_tail``). Closing the stream ends
        the process's stdin and stops the client side; the process itself is expected
        to exit on end of input (the relay does).
        """

    def fresh_stage_path(self, prefix: str) -> str | None:
        """A path for a new stage that :meth:`open_relay` can make itself (``make_stage``)
        in the same exec as it starts the relay: unique, unguessable, in the scratch
        directory; None where it cannot (then :meth:`make_stage` makes the stage)."""
        return None

    async def open_relay(
        self,
        stage: str,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        files: Mapping[str, bytes] | None = None,
        make_stage: bool = False,
    ) -> ExecStream:
        """Start the stream relay staged in ``stage`` (``_hermes_relay.py``) with
        ``args``, after writing ``files`` there, as :meth:`open_exec_stream` does. With
        ``make_stage`` the stage is made first, private and exclusively, at a path from
        :meth:`fresh_stage_path` (only where that gives one)."""
        if make_stage:
            raise ValueError(f"the {self.name} backend cannot make a stage as it starts the relay")
        argv = [self.python, f"{stage}/{RELAY_MODULE}", *args]
        return await self.open_exec_stream(argv, env=env, cwd=cwd, stage=stage, files=files)

    @abc.abstractmethod
    async def kill_process_tree(self, pid: int, grace: float = 0.0) -> None:
        """Kill the process ``pid`` of this environment and every process below it,
        found by parentage (stopped ones too): SIGTERM, ``grace`` seconds, SIGKILL.
        For a process that stopped answering (a relay a script froze with SIGSTOP)."""


class Environment(abc.ABC):
    """The lifecycle of a place where code runs: built for a run from its settings,
    :meth:`start` makes it ready and hands back the :class:`Runtime` that runs things
    there, :attr:`alive` says whether it is, :meth:`aclose` removes what it made.
    ``async with environment as runtime:`` does both. (The built-in backends are one
    object that plays both parts: their ``start`` returns themselves.)"""

    name: ClassVar[str]
    # Whether scripts here see the host's own files and variables (the local backend):
    # the runner then starts from the host's scrubbed environment and working directory.
    shares_host: ClassVar[bool] = False
    # The backend's settings class (environments/settings.py): its options, checks,
    # --image and --network mapping and availability message.
    settings_class: ClassVar[type[BackendSettings]]

    @classmethod
    def settings_for(cls, settings: BackendSettings | Mapping[str, Any] | None) -> Any:
        """``settings`` as this backend's settings object: one given as is, a mapping
        built into one (its place: ``backend_options``), None the defaults. Raises
        SettingError for settings of another backend or values that do not fit."""
        if settings is None:
            return cls.settings_class.build([])
        if isinstance(settings, Mapping):
            return cls.settings_class.build([(settings, api_place("backend_options"))])
        if not isinstance(settings, cls.settings_class):
            raise SettingError(
                f"the {cls.name} backend takes {cls.settings_class.__name__}, "
                f"got {type(settings).__name__}",
                place="backend",
            )
        return settings

    @classmethod
    def for_run(
        cls,
        settings: BackendSettings | Mapping[str, Any] | None,
        *,
        env: Mapping[str, str],
        kill_grace: float,
        task_id: str | None,
        python: str | None,
    ) -> Self:
        """Build the environment for one run from its backend ``settings``, the run's
        variables, kill grace, task id (for backends with per-task sandboxes) and
        interpreter (overriding the settings' ``python``); raise SettingError."""
        raise NotImplementedError

    async def __aenter__(self) -> Any:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @abc.abstractmethod
    async def start(self) -> Runtime:
        """Make the environment ready and return what runs things there; raise
        BackendNotAvailable or EnvironmentFailure."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Stop it and remove everything it started. Idempotent."""

    @property
    @abc.abstractmethod
    def alive(self) -> bool:
        """Whether it is started and not closed (as far as is known without asking)."""
