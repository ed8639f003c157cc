"""The seam to add a backend: an environment reached through an exec stream.

:class:`ExecStreamEnvironment` is an :class:`~environments.base.Environment` that needs
a backend to do three things: make its sandbox (:meth:`~ExecStreamEnvironment._start`),
remove it (:meth:`~ExecStreamEnvironment._stop`), and start a command inside it with
stdin and stdout as one byte stream (:meth:`~ExecStreamEnvironment._open_exec`: a docker
exec, an ssh channel, a cloud SDK's exec). The rest of the Environment contract is
built here on that stream: a shell command under a timeout, killing what it left
behind (everything below the helper, a child subreaper, inside the sandbox), reading and
writing files and scratch directories all run the stdlib helper program
stubs/_exec_helper.py with the sandbox's own Python; scripts run under the stream
relay (sandbox/transports.py). The lifecycle (start once, close once, "not started" and
"closed" errors) is here too.

docs/backends.md, "Adding a backend", shows a whole backend.
"""

from __future__ import annotations

import abc
import dataclasses
import errno as errno_module
import logging
import posixpath
import secrets
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Self, cast

import anyio

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
from hermes_sandbox.environments.errors import BackendError, EnvironmentFailure, SpawnNotAvailable
from hermes_sandbox.environments.settings import BackendSettings
from hermes_sandbox.stubs import program_source

log = logging.getLogger(__name__)

HELPER_ERROR = "HERMES-SANDBOX-ERROR "
_DRAIN_SECONDS = 1.0

# The program every exec-stream backend runs in its sandbox for commands and files.
HELPER_PROGRAM = "_exec_helper.py"
# The relay's exec runs only the part that writes a stage and starts the relay: less to
# compile there (a third of the helper).
RELAY_LAUNCH_SOURCE = program_source("_stage_files.py")
# A relay started ahead of its run (the ssh backend's standby): the launch, with the
# process-tree code it needs before it has loaded the relay (forbid_tracing).
STANDBY_SOURCE = "\n".join((program_source("_proctree.py"), RELAY_LAUNCH_SOURCE))
HELPER_SOURCE = "\n".join(
    (program_source("_proctree.py"), RELAY_LAUNCH_SOURCE, program_source(HELPER_PROGRAM))
)
# The helper's interpreter flags: isolated (no PYTHON* variables, no user site, and not
# the working directory on the import path: it may be a script's, anyone's to fill) and
# no site (the helper and the relay use the standard library only): a faster start.
HELPER_FLAGS = ("-I", "-S")


def bundle_files(files: Mapping[str, bytes], mode: int = 0o600) -> bytes:
    """Files as the helper's ``stage`` and ``put`` read them: per file a line ``NAME
    MODE SIZE`` (the name hex-encoded, the mode octal), then its bytes."""
    check_stage_names(files)
    out = bytearray()
    for name, data in files.items():
        hexed = name.encode("utf-8", "surrogateescape").hex()
        out += f"{hexed} {mode:o} {len(data)}\n".encode() + data
    return bytes(out)


def unhex(text: str) -> str:
    return bytes.fromhex(text).decode("utf-8", "surrogateescape")


def helper_failure_text(stderr: bytes) -> str:
    """What a stream's stderr says, the helper's failure lines made readable."""
    lines = []
    for line in stderr.decode("utf-8", "replace").strip().splitlines():
        if line.startswith(HELPER_ERROR):
            name, message, filename = (unhex(f) for f in line[len(HELPER_ERROR) :].split("\t"))
            line = f"{message}: {filename} ({name})" if filename else f"{message} ({name})"
        lines.append(line)
    return "\n".join(lines)


def raise_helper_failure(
    stderr: bytes, code: int, python: str, doing: str, where: str = "in the sandbox"
) -> None:
    """Turn what the helper (or the backend) reported on the exec's stderr into an
    exception. A command's own output, stderr included, never comes this way: the
    helper sends it to stdout, so only the helper, Python and the backend write here."""
    text = stderr.decode("utf-8", "replace").strip()
    for line in text.splitlines():
        if line.startswith(HELPER_ERROR):
            name, message, filename = (unhex(f) for f in line[len(HELPER_ERROR) :].split("\t"))
            number = getattr(errno_module, name, None) or errno_module.EIO
            if not filename:
                raise OSError(number, message)
            raise OSError(number, message, filename)
    if code == 0 or (not text and doing == "run a command"):
        return  # a command's exit code is its own
    hint = f" (is {python!r} installed there?)" if code in (126, 127) else ""
    raise EnvironmentFailure(f"could not {doing} {where}: exit code {code}{hint}: {text[-2000:]}")


class ExecStreamEnvironment(Environment, Runtime):
    """An environment driven through exec streams (see the module docstring).

    A backend sets ``name`` and ``settings_class`` (its :class:`BackendSettings`, with
    a ``python`` field) and implements :meth:`_start`, :meth:`_stop` and
    :meth:`_open_exec`. ``where`` names the place in messages ("in the container", "on
    the remote host"); ``scratch_parent`` is where :meth:`make_private_dir` makes its
    directories. The constructor takes the settings (None: their defaults), ``env``
    (variables every command and script gets, added to the sandbox's own), the
    ``kill_grace`` between SIGTERM and SIGKILL, and ``python`` (overriding the
    settings').
    """

    where: ClassVar[str] = "in the sandbox"
    can_spawn: ClassVar[bool] = False
    scratch_parent: str = "/tmp"

    def __init__(
        self,
        settings: Any = None,
        *,
        env: Mapping[str, str] | None = None,
        kill_grace: float = 2.0,
        python: str | None = None,
    ) -> None:
        self.settings = self.settings_for(settings)
        self._env = dict(env or {})
        self.kill_grace = kill_grace
        self._python: str = python or self.settings.python
        self._home: str | None = None
        self._made: list[str] = []  # private directories made here and not removed
        self._started = False
        self._closed = False
        self._setup()

    # -- what a backend writes -------------------------------------------------------------

    def _setup(self) -> None:
        """Set the backend's own state from ``self.settings``, at construction (no I/O:
        that is :meth:`_start`'s); raise ValueError for settings it cannot use."""

    @abc.abstractmethod
    async def _start(self) -> None:
        """Make (or find) the sandbox and connect to it. Execs may be opened from here
        on (to probe it, make a directory). If it fails, undo what it did and raise
        BackendNotAvailable (no SDK, credentials, engine) or EnvironmentFailure."""

    @abc.abstractmethod
    async def _stop(self) -> None:
        """Remove what :meth:`_start` made (unless kept on purpose) and disconnect.
        Called once, shielded from cancellation, also when start was never called or
        failed; never raises for what is already gone."""

    @abc.abstractmethod
    async def _open_exec(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | None,
        stdin: bool,
    ) -> ExecStream:
        """Start ``argv`` in the sandbox: stdin (if asked) and stdout as the stream,
        stderr kept in its ``stderr_tail``; ``env`` adds to the sandbox's variables."""

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
        chosen = cls.settings_for(settings)
        if task_id is not None and getattr(chosen, "task_id", task_id) is None:
            chosen = dataclasses.replace(chosen, task_id=task_id)
        return cls(chosen, env=env, kill_grace=kill_grace, python=python)  # type: ignore[call-arg]

    # -- the lifecycle -----------------------------------------------------------------

    async def start(self) -> Self:
        """Make the sandbox ready and return this environment, which runs things there
        too; a second call does nothing more. Raises BackendNotAvailable or
        EnvironmentFailure (and after :meth:`aclose`, always)."""
        if self._closed:
            raise EnvironmentFailure(f"this {self.name} environment was closed; make a new one")
        if self._started:
            return self
        self._started = True  # _start may open execs already
        try:
            await self._start()
        except BaseException:
            self._started = False
            raise
        return self

    async def aclose(self) -> None:
        """Stop the sandbox and remove what it made. Idempotent; not cancellable."""
        if self._closed:
            return
        self._closed = True
        self._started = False
        with anyio.CancelScope(shield=True):
            await self._stop()

    @property
    def alive(self) -> bool:
        """Whether the environment is started and not closed."""
        return self._started

    def _require_started(self) -> None:
        """Raise EnvironmentFailure unless started (and not closed)."""
        if not self._started:
            state = "closed" if self._closed else "not started"
            raise EnvironmentFailure(f"the {self.name} environment is {state}")

    @property
    def python(self) -> str:
        """The sandbox's interpreter: the run's, else the settings' ``python``."""
        return self._python

    @property
    def home(self) -> str | None:
        """The sandbox user's home, learnt by :meth:`make_private_dir` (None before)."""
        return self._home

    async def open_exec_stream(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stage: str | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> ExecStream:
        # ``stage`` is the relay's to remove: it does when its input ends.
        argv, bundle = self._put_first(argv, stage, files)
        stream = await self._open_exec(argv, env=env, cwd=cwd, stdin=True)
        if bundle:
            await self._send_bundle(stream, bundle)
        return stream

    def fresh_stage_path(self, prefix: str) -> str | None:
        """Where the user's home is known already (learnt at start), a new stage's path
        in the scratch directory for :meth:`open_relay` to make; else None (the stage is
        made by :meth:`make_stage`, which learns the home)."""
        if self._home is None:
            return None
        # Named as make_private_dir names: 48 random bits; made exclusively (a name taken
        # fails the run, never shares a directory).
        return posixpath.join(self.scratch_parent, prefix + secrets.token_hex(6))

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
        """The ``relay`` of stubs/_stage_files.py: one exec, one Python (with
        :data:`HELPER_FLAGS`), that makes the stage if asked, writes ``files`` and runs
        the relay. ``env`` is not needed: the stage goes on the relay's import path."""
        bundle = bundle_files(files or {})
        argv = [
            self.python,
            *HELPER_FLAGS,
            "-c",
            RELAY_LAUNCH_SOURCE,
            "relay",
            stage,
            str(len(bundle)),
            "1" if make_stage else "0",
            *args,
        ]
        stream = await self.open_exec_stream(argv, cwd=cwd)
        if bundle:
            await self._send_bundle(stream, bundle)
        return stream

    def _put_first(
        self, argv: Sequence[str], stage: str | None, files: Mapping[str, bytes] | None
    ) -> tuple[list[str], bytes]:
        """``argv`` run by the helper's ``put``, which first writes ``files`` into
        ``stage`` from the start of its stdin (the bundle to send); as is without files."""
        if not files:
            return list(argv), b""
        if stage is None:
            raise ValueError("files to write before a program need its stage")
        bundle = bundle_files(files)
        put = [self.python, *HELPER_FLAGS, "-c", HELPER_SOURCE, "put", stage, str(len(bundle))]
        return [*put, *argv], bundle

    async def _send_bundle(self, stream: ExecStream, bundle: bytes) -> None:
        try:
            await stream.send(bundle)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await stream.aclose()
            raise

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None = None,
        stage: str | None = None,
        stdin_path: str | None = None,
    ) -> SandboxProcess:
        raise SpawnNotAvailable(
            f"the {self.name} backend starts scripts through the relay; use open_exec_stream"
        )

    async def execute(
        self,
        command: str,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        max_output_bytes: int = DEFAULT_MAX_COMMAND_OUTPUT,
    ) -> CommandResult:
        """Run ``command`` with /bin/sh in the sandbox, output combined and capped.

        On timeout every process the command started is killed inside the sandbox
        (SIGTERM, then SIGKILL after ``kill_grace``) and the exit code is 124.
        Raises FileNotFoundError (and other OSErrors) for a bad ``cwd``,
        EnvironmentFailure if the helper cannot run (no Python there).
        """
        token = secrets.token_hex(12)
        argv = [
            self.python,
            *HELPER_FLAGS,
            "-c",
            HELPER_SOURCE,
            "run",
            token,
            str(self.kill_grace),
            cwd or "",
            command,
        ]
        output = HeadTailBuffer(max_output_bytes)
        stream = await self._open_exec(argv, env=None, cwd=None, stdin=False)
        deadline = anyio.move_on_after(timeout)
        finished = False
        exit_code = 0
        try:
            with deadline:
                async for chunk in stream:
                    output.feed(chunk)
                finished = True
            if deadline.cancelled_caught:
                with anyio.CancelScope(shield=True):
                    await self._kill_command(token)
                    with anyio.move_on_after(_DRAIN_SECONDS):
                        async for chunk in stream:  # what was written before the kill
                            output.feed(chunk)
            else:
                exit_code = await stream.wait()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise EnvironmentFailure(
                f"the exec stream broke while running a command {self.where}: {exc}"
            ) from exc
        finally:
            with anyio.CancelScope(shield=True):
                if not finished and not deadline.cancelled_caught:
                    await self._kill_command(token)  # the caller was cancelled
                await stream.aclose()
        text = output.text()
        if deadline.cancelled_caught:
            return CommandResult(text, TIMEOUT_EXIT_CODE, timed_out=True)
        raise_helper_failure(
            stream.stderr_tail, exit_code, self.python, "run a command", self.where
        )
        return CommandResult(text, exit_code)

    async def _kill_command(self, token: str) -> None:
        """Kill, inside the sandbox, the command's helper and everything below it."""
        try:
            await self._helper("killrun", token, str(self.kill_grace))
        except (BackendError, OSError) as exc:
            log.warning("could not kill a command's processes: %s", exc)

    async def kill_process_tree(self, pid: int, grace: float = 0.0) -> None:
        """Kill ``pid`` in the sandbox and everything below it (the helper's
        ``killtree``); a sandbox that is gone has nothing left to kill."""
        if not self._started:
            return
        try:
            await self._helper("killtree", str(pid), str(grace))
        except (BackendError, OSError) as exc:
            log.warning("could not kill process %d %s: %s", pid, self.where, exc)

    async def _helper(self, verb: str, *args: str, data: bytes | None = None) -> bytes:
        """Run the helper in the sandbox; return its stdout, raise what it reports."""
        argv = [self.python, *HELPER_FLAGS, "-c", HELPER_SOURCE, verb, *args]
        stream = await self._open_exec(argv, env=None, cwd=None, stdin=data is not None)
        out = bytearray()
        try:
            if data is not None:
                await stream.send(data)
                await stream.send_eof()
            async for chunk in stream:
                out += chunk
            code = await stream.wait()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise EnvironmentFailure(
                f"the exec stream broke during {verb} {self.where}: {exc}"
            ) from exc
        finally:
            with anyio.CancelScope(shield=True):
                await stream.aclose()
        raise_helper_failure(stream.stderr_tail, code, self.python, verb, self.where)
        return bytes(out)

    # -- files -----------------------------------------------------------------------------

    async def stat(self, path: str) -> FileStat:
        kind, size, real = (await self._helper("stat", path)).decode().split("\t")
        return FileStat(unhex(real), cast(FileKind, kind), int(size))

    async def read_bytes(self, path: str, *, max_bytes: int | None = None) -> bytes:
        return await self._helper("read", path, str(-1 if max_bytes is None else max_bytes))

    async def write_bytes(
        self, path: str, data: bytes, *, make_parents: bool = True, mode: int | None = None
    ) -> None:
        mode_text = "" if mode is None else f"{mode:o}"
        await self._helper("write", path, "1" if make_parents else "0", mode_text, data=data)

    async def make_private_dir(self, prefix: str, *, parent: str | None = None) -> str:
        answer = await self._helper("mkdtemp", prefix, parent or self.scratch_parent)
        return self._made_dir(answer)

    async def make_stage(
        self,
        prefix: str,
        files: Mapping[str, bytes],
        *,
        parent: str | None = None,
        mode: int = 0o600,
    ) -> str:
        """The directory and its files in one exec: the helper's ``stage``."""
        answer = await self._helper(
            "stage", prefix, parent or self.scratch_parent, data=bundle_files(files, mode)
        )
        return self._made_dir(answer)

    def _made_dir(self, answer: bytes) -> str:
        """The directory the helper made (``mkdtemp``, ``stage``); learns the home."""
        made, home = answer.decode().split("\t")
        self._home = unhex(home) or None
        self._made.append(unhex(made))
        return unhex(made)

    def _private_dirs(self) -> Sequence[str]:
        return self._made

    def _forget(self, path: str) -> None:
        """``path`` is removed: no longer this runtime's to orphan."""
        self._made = [made for made in self._made if made != path]

    async def remove_tree(self, path: str) -> None:
        self._forget(path)
        await self._helper("rmtree", path)


__all__ = [
    "HELPER_ERROR",
    "HELPER_FLAGS",
    "HELPER_PROGRAM",
    "HELPER_SOURCE",
    "ExecStreamEnvironment",
    "helper_failure_text",
    "raise_helper_failure",
    "unhex",
]
