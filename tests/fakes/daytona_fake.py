"""A stand-in for the Daytona SDK (daytona 0.226) whose sandboxes are local processes.

Daytona cannot be reached from the test machine, so the tests put
``FakeDaytonaCloud(root).sdk()`` where environments.daytona looks for the SDK
(``environments.daytona._sdk``). Only the *service* objects are fakes: ``AsyncDaytona``,
a sandbox, its ``process`` and its ``fs``, with the signatures of SDK 0.226 (the
conformance test compares them with the installed SDK's). Everything else is the real
SDK: its data classes (``DaytonaConfig``, ``CreateSandboxFrom*Params``, ``Resources``,
``SessionExecuteRequest``, ``ListSandboxesQuery``: constructed for real, so a bad
argument fails as it would), its errors, its result models (``SessionExecuteResponse``,
``Command``, ``FileInfo``) and its log demultiplexer (``_std_demux_loop``, which turns
a command's log into the ``on_stdout``/``on_stderr`` callbacks, decoding UTF-8 with
replacement). Every call to a fake object or a data class is recorded in
:attr:`FakeDaytonaCloud.calls` as (qualified name, args, kwargs).

A fake sandbox's sessions behave as Daytona's daemon describes them (its session
service, apps/daemon/pkg/session in daytonaio/daytona), re-implemented here:

- a session is a ``bash`` reading commands on its stdin; ``execute_session_command``
  writes the command to a file and a wrapper to that shell;
- the command's stdin is a FIFO; for ``run_async`` commands a holder process keeps it
  open, so it never reaches end of input; stdout and stderr go through FIFOs to shell
  loops (``IFS= read -r line``: NUL bytes dropped, a newline added to a last partial
  line) that prefix each line with ``\\x01\\x01\\x01`` or ``\\x02\\x02\\x02`` and append
  it to the command's log; the exit code is written after those loops drained;
- ``send_session_command_input`` appends a newline when missing, writes to the FIFO
  and echoes the input into the log unless ``suppress_input_echo``;
- deleting a session ends its shell's process tree (SIGTERM, then SIGKILL).

Processes of a fake sandbox run on this machine as this user, with ``HOME`` in the
sandbox's directory and :data:`TAG_VAR` in their environment (the relay passes
``HERMES_SANDBOX_*`` variables on to scripts), so :meth:`FakeDaytonaCloud.processes`
finds them, and deleting or stopping a sandbox kills them as the platform would.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import inspect
import os
import shlex
import shutil
import signal
import stat as stat_module
import subprocess
import time
import types
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import daytona as real
import psutil
from daytona._async.filesystem import AsyncFileSystem as RealAsyncFileSystem
from daytona._async.process import AsyncProcess as RealAsyncProcess
from daytona._utils.stream import _std_demux_loop
from daytona.common.process import STDOUT_PREFIX
from daytona_toolbox_api_client_async import Command, FileInfo

TAG_VAR = "HERMES_SANDBOX_FAKE_DAYTONA"

# The SDK classes each fake stands for, and the data classes the SDK namespace records.
REAL_CLASSES: dict[str, Any] = {
    "AsyncDaytona": real.AsyncDaytona,
    "AsyncSandbox": real.AsyncSandbox,
    "AsyncProcess": RealAsyncProcess,
    "AsyncFileSystem": RealAsyncFileSystem,
}
DATA_CLASSES = (
    "DaytonaConfig",
    "CreateSandboxFromImageParams",
    "CreateSandboxFromSnapshotParams",
    "Resources",
    "SessionExecuteRequest",
    "ListSandboxesQuery",
)
for _name in DATA_CLASSES:
    REAL_CLASSES[_name] = getattr(real, _name)

# Log chunks handed to the SDK's demultiplexer are cut at these sizes in turn, so a
# marker or a line split across websocket messages is exercised.
_CHUNK_SIZES = (65536, 1, 7, 4096, 333, 2)


@dataclass(frozen=True)
class Call:
    """One recorded call: ``name`` is "Class.method", or a class name for a constructor."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


def _recorded(owner: str, *, constructor: bool = False) -> Callable[[Any], Any]:
    """Record each call of the method (its self has a ``_cloud``) before running it."""

    def decorate(fn: Any) -> Any:
        name = owner if constructor else f"{owner}.{fn.__name__}"
        if inspect.isasyncgenfunction(fn):

            @functools.wraps(fn)
            async def generator(self: Any, *args: Any, **kwargs: Any) -> Any:
                self._cloud.record(name, args, kwargs)
                async for item in fn(self, *args, **kwargs):
                    yield item

            return generator
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def coroutine(self: Any, *args: Any, **kwargs: Any) -> Any:
                self._cloud.record(name, args, kwargs)
                return await fn(self, *args, **kwargs)

            return coroutine

        @functools.wraps(fn)
        def plain(self: Any, *args: Any, **kwargs: Any) -> Any:
            self._cloud.record(name, args, kwargs)
            return fn(self, *args, **kwargs)

        return plain

    return decorate


def _not_found(what: str) -> real.DaytonaNotFoundError:
    return real.DaytonaNotFoundError(what, status_code=404)


# -- processes ---------------------------------------------------------------------------


def tagged_processes(prefix: str) -> set[int]:
    """Live processes whose TAG_VAR starts with ``prefix``."""
    entry = f"{TAG_VAR}={prefix}".encode()
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                entries = f.read().split(b"\0")
            if (
                any(e.startswith(entry) for e in entries)
                and psutil.Process(int(name)).status() != psutil.STATUS_ZOMBIE
            ):
                found.add(int(name))
        except (OSError, psutil.Error):
            continue
    return found


# Local disk operations of the fake daemon: quick, so called directly from async code.


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def _read_at(path: Path, position: int, size: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(position)
            return f.read(size)
    except OSError:
        return b""


def _unlink(path: str, recursive: bool) -> None:
    if recursive and os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _kill_all(find: Callable[[], set[int]]) -> None:
    for _ in range(400):
        pids = find()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.005)


# -- the service -------------------------------------------------------------------------


class FakeDaytonaCloud:
    """The fake service: its sandboxes, what goes wrong next, and the calls made.

    Knobs a test sets: ``create_error`` (raised by the next ``create`` before it makes
    anything), ``error_after_create`` (raised by the next ``create`` after the sandbox
    was made, as a timeout would), ``create_delay`` (seconds a creation takes after the
    sandbox exists), ``before_create`` (called with the params when a creation begins),
    ``accepted_key`` (the only API key requests are accepted with; None: any),
    ``echo_input_always`` (echo input into the log even when told not to, as daemons
    before ``suppress_input_echo`` did).
    """

    def __init__(self, root: Path) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.calls: list[Call] = []
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.create_error: BaseException | None = None
        self.error_after_create: BaseException | None = None
        self.create_delay = 0.0
        self.before_create: Callable[[Any], None] | None = None
        self.accepted_key: str | None = None
        self.echo_input_always = False

    def record(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.calls.append(Call(name, tuple(args), dict(kwargs)))

    def called(self, name: str) -> list[Call]:
        return [call for call in self.calls if call.name == name]

    def sdk(self) -> types.SimpleNamespace:
        """A module-like namespace with the names environments.daytona uses."""
        namespace = types.SimpleNamespace()
        for name in dir(real):
            if name.startswith("Daytona") and name.endswith("Error"):
                setattr(namespace, name, getattr(real, name))
        namespace.SandboxState = real.SandboxState
        for name in DATA_CLASSES:
            setattr(namespace, name, self._recording_constructor(name))
        namespace.AsyncDaytona = type("AsyncDaytona", (FakeAsyncDaytona,), {"_cloud": self})
        return namespace

    def _recording_constructor(self, name: str) -> Callable[..., Any]:
        cls = getattr(real, name)

        def construct(*args: Any, **kwargs: Any) -> Any:
            self.record(name, args, kwargs)
            return cls(*args, **kwargs)

        return construct

    def live(self) -> list[FakeSandbox]:
        """Sandboxes not destroyed."""
        return [s for s in self.sandboxes.values() if s.state != real.SandboxState.DESTROYED]

    def find(self, id_or_name: str) -> FakeSandbox | None:
        for sandbox in self.live():
            if id_or_name in (sandbox.id, sandbox.name):
                return sandbox
        return None

    def processes(self, sandbox_id: str | None = None) -> set[int]:
        """Live processes of this cloud's sandboxes (or of one)."""
        return tagged_processes(f"{self.id}/{sandbox_id or ''}")

    def destroy(self, sandbox_id: str) -> None:
        """Delete a sandbox as the platform does: everything in it stops at once."""
        sandbox = self.sandboxes[sandbox_id]
        sandbox.state = real.SandboxState.DESTROYED
        sandbox._halt()
        shutil.rmtree(sandbox._dir, ignore_errors=True)

    def stop(self, sandbox_id: str) -> None:
        """Stop a sandbox (its auto-stop interval passed): processes and sessions end."""
        sandbox = self.sandboxes[sandbox_id]
        sandbox.state = real.SandboxState.STOPPED
        sandbox._halt()

    def close(self) -> None:
        """Destroy every sandbox (the end of a test)."""
        for sandbox in self.live():
            self.destroy(sandbox.id)
        _kill_all(self.processes)


# -- the client --------------------------------------------------------------------------


class FakeAsyncDaytona:
    """``daytona.AsyncDaytona`` over a :class:`FakeDaytonaCloud` (bound by subclassing)."""

    _cloud: ClassVar[FakeDaytonaCloud]

    @_recorded("AsyncDaytona", constructor=True)
    def __init__(self, config: Any = None) -> None:
        api_key = (config.api_key if config else None) or os.environ.get("DAYTONA_API_KEY")
        jwt = (config.jwt_token if config else None) or os.environ.get("DAYTONA_JWT_TOKEN")
        if not api_key and not jwt:
            raise real.DaytonaAuthenticationError(  # the SDK's own words
                "Authentication credentials not found. Set DAYTONA_API_KEY, or both "
                "DAYTONA_JWT_TOKEN and DAYTONA_ORGANIZATION_ID. These can also be provided "
                "via DaytonaConfig."
            )
        self._key = api_key or jwt
        self.closed = False

    def _authorize(self) -> None:
        if self.closed:
            raise real.DaytonaError("Session is closed")
        accepted = self._cloud.accepted_key
        if accepted is not None and self._key != accepted:
            raise real.DaytonaAuthenticationError("Invalid API key", status_code=401)

    @_recorded("AsyncDaytona")
    async def create(
        self,
        params: Any = None,
        *,
        timeout: float = 60,
        on_snapshot_create_logs: Any = None,
    ) -> FakeSandbox:
        self._authorize()
        cloud = self._cloud
        if params is None:
            params = real.CreateSandboxFromSnapshotParams(language="python")
        if not isinstance(
            params, real.CreateSandboxFromSnapshotParams | real.CreateSandboxFromImageParams
        ):
            raise real.DaytonaValidationError(f"bad params: {params!r}")
        if cloud.before_create is not None:
            cloud.before_create(params)
        if cloud.create_error is not None:
            error, cloud.create_error = cloud.create_error, None
            raise error
        if params.name and cloud.find(params.name) is not None:
            raise real.DaytonaConflictError(
                f"Failed to create sandbox: Sandbox with name {params.name} already exists",
                status_code=409,
            )
        sandbox = FakeSandbox(cloud, params)
        cloud.sandboxes[sandbox.id] = sandbox
        if cloud.create_delay:
            await asyncio.sleep(cloud.create_delay)
        if cloud.error_after_create is not None:
            error, cloud.error_after_create = cloud.error_after_create, None
            raise error
        return sandbox

    @_recorded("AsyncDaytona")
    async def get(self, sandbox_id_or_name: str, request_timeout: float | None = None) -> Any:
        self._authorize()
        found = self._cloud.find(sandbox_id_or_name)
        if found is None:
            raise _not_found(
                f"Failed to get sandbox: Sandbox with ID or name {sandbox_id_or_name} not found"
            )
        return found

    @_recorded("AsyncDaytona")
    async def list(self, query: Any = None, request_timeout: float | None = None) -> Any:
        self._authorize()
        wanted = dict(query.labels or {}) if query is not None else {}
        for sandbox in self._cloud.live():
            if all(sandbox.labels.get(k) == v for k, v in wanted.items()):
                yield sandbox

    @_recorded("AsyncDaytona")
    async def delete(self, sandbox: Any, timeout: float = 60, wait: bool = False) -> None:
        self._authorize()
        await sandbox.delete(timeout, wait=wait)

    @_recorded("AsyncDaytona")
    async def start(self, sandbox: Any, timeout: float = 60) -> None:
        self._authorize()
        await sandbox.start(timeout)

    @_recorded("AsyncDaytona")
    async def stop(self, sandbox: Any, timeout: float = 60) -> None:
        self._authorize()
        await sandbox.stop(timeout)

    @_recorded("AsyncDaytona")
    async def close(self) -> None:
        self.closed = True


# -- a sandbox ---------------------------------------------------------------------------


class FakeSandbox:
    """``daytona.AsyncSandbox``: its public attributes are fields of the real model."""

    def __init__(self, cloud: FakeDaytonaCloud, params: Any) -> None:
        self._cloud = cloud
        self._params = params
        self.id = uuid.uuid4().hex
        self.name = params.name or self.id
        self.labels = {**(params.labels or {}), "code-toolbox-language": "python"}
        self.user = "daytona"
        self.env = dict(params.env_vars or {})
        self.network_block_all = params.network_block_all
        self.auto_stop_interval = params.auto_stop_interval
        self.auto_delete_interval = 0 if params.ephemeral else params.auto_delete_interval
        self.target = params.target or "us"
        self.snapshot = getattr(params, "snapshot", None)
        resources = getattr(params, "resources", None)
        self.cpu = (resources.cpu if resources else None) or 1
        self.memory = (resources.memory if resources else None) or 1
        self.disk = (resources.disk if resources else None) or 3
        self.state = real.SandboxState.STARTED
        self._dir = cloud.root / self.id
        self._home = self._dir / "home"
        self._workdir = self._dir / "workspace"
        self._home.mkdir(parents=True)
        self._workdir.mkdir()
        self._sessions: dict[str, _Session] = {}
        self._process = FakeAsyncProcess(self)
        self._fs = FakeAsyncFileSystem(self)

    @property
    def process(self) -> FakeAsyncProcess:
        return self._process

    @property
    def fs(self) -> FakeAsyncFileSystem:
        return self._fs

    @property
    def _tag(self) -> str:
        return f"{self._cloud.id}/{self.id}"

    def _exists(self) -> None:
        if self.state == real.SandboxState.DESTROYED:
            raise _not_found(f"Sandbox with ID {self.id} not found")

    def _running(self) -> None:
        self._exists()
        if self.state != real.SandboxState.STARTED:
            raise real.DaytonaError(
                f"Sandbox {self.id} is not running (state: {self.state.value})", status_code=409
            )

    def _halt(self) -> None:
        for session in list(self._sessions.values()):
            session.kill()
        self._sessions.clear()
        _kill_all(lambda: tagged_processes(self._tag))

    def _process_env(self) -> dict[str, str]:
        return {
            **self.env,
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self._home),
            "LANG": "C.UTF-8",
            TAG_VAR: self._tag,
        }

    @_recorded("AsyncSandbox")
    async def start(self, timeout: float | None = 60) -> None:
        self._exists()
        self.state = real.SandboxState.STARTED

    @_recorded("AsyncSandbox")
    async def stop(self, timeout: float | None = 60, force: bool = False) -> None:
        self._exists()
        self._cloud.stop(self.id)

    @_recorded("AsyncSandbox")
    async def delete(self, timeout: float | None = 60, wait: bool = False) -> None:
        self._exists()
        self._cloud.destroy(self.id)

    @_recorded("AsyncSandbox")
    async def wait_for_sandbox_start(self, timeout: float | None = 60) -> None:
        self._exists()
        self.state = real.SandboxState.STARTED

    @_recorded("AsyncSandbox")
    async def get_work_dir(self) -> str:
        self._running()
        return str(self._workdir)

    @_recorded("AsyncSandbox")
    async def get_user_home_dir(self) -> str:
        self._running()
        return str(self._home)

    @_recorded("AsyncSandbox")
    async def refresh_data(self, request_timeout: float | None = None) -> None:
        self._exists()


# -- sessions (the daemon) ---------------------------------------------------------------


@dataclass
class _Command:
    id: str
    text: str
    dir: Path
    suppress_echo: bool

    @property
    def log(self) -> Path:
        return self.dir / "output.log"

    @property
    def script(self) -> Path:
        return self.dir / "cmd.sh"

    @property
    def input(self) -> Path:
        return self.dir / "input.pipe"

    @property
    def exit_file(self) -> Path:
        return self.dir / "exit_code"

    @property
    def exit_code(self) -> int | None:
        try:
            return int(self.exit_file.read_text().strip())
        except (OSError, ValueError):
            return None


class _Session:
    def __init__(self, sandbox: FakeSandbox, session_id: str) -> None:
        self.id = session_id
        self.dir = sandbox._dir / ".daemon" / "sessions" / session_id
        self.dir.mkdir(parents=True)
        self.commands: dict[str, _Command] = {}
        self.shell = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=sandbox._workdir,
            env=sandbox._process_env(),
            start_new_session=True,
        )

    def run(self, command: _Command, run_async: bool) -> None:
        q = shlex.quote
        holder = 'sleep 2147483647 > "$__ip" &' if run_async else ': > "$__ip" &'
        exit_file = q(str(command.exit_file))
        copier = (
            '( while IFS= read -r __l || [ -n "$__l" ]; do '
            'printf \'{prefix}%s\\n\' "$__l"; done < "{pipe}" ) >> "$__log" &'
        )
        wrapper = "\n".join(
            [
                "{",
                f"__log={q(str(command.log))}",
                f"__sp={q(str(command.dir / 'stdout.pipe'))}",
                f"__ep={q(str(command.dir / 'stderr.pipe'))}",
                f"__ip={q(str(command.input))}",
                'rm -f "$__sp" "$__ep" "$__ip" && mkfifo "$__sp" "$__ep" "$__ip" || exit 1',
                copier.format(prefix="\\001\\001\\001", pipe="$__sp"),
                "__r1=$!",
                copier.format(prefix="\\002\\002\\002", pipe="$__ep"),
                "__r2=$!",
                holder,
                "__h=$!",
                f'{{ . {q(str(command.script))}; }} < "$__ip" > "$__sp" 2> "$__ep"',
                "__ec=$?",
                'kill "$__h" 2>/dev/null; wait "$__h" 2>/dev/null',
                'wait "$__r1" "$__r2"',
                f'echo "$__ec" > {exit_file}.new && mv {exit_file}.new {exit_file}',
                'rm -f "$__sp" "$__ep" "$__ip"',
                "}",
                "",
            ]
        )
        assert self.shell.stdin is not None
        try:
            self.shell.stdin.write(wrapper.encode())
            self.shell.stdin.flush()
        except OSError as exc:
            raise real.DaytonaGoneError(
                f"Failed to execute session command: session process has exited ({exc})",
                status_code=410,
            ) from exc

    def kill(self) -> None:
        """End the shell's process tree: SIGTERM, then SIGKILL after a grace."""
        try:
            shell = psutil.Process(self.shell.pid)
            tree = [shell, *shell.children(recursive=True)]
        except psutil.Error:
            tree = []
        for process in tree:
            try:
                process.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(tree, timeout=1.0)
        for process in alive:
            try:
                process.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=1.0)
        if self.shell.stdin is not None:
            try:
                self.shell.stdin.close()
            except OSError:
                pass
        self.shell.wait()


class FakeAsyncProcess:
    """``sandbox.process``: sessions only (what the backend uses)."""

    def __init__(self, sandbox: FakeSandbox) -> None:
        self._sandbox = sandbox
        self._cloud = sandbox._cloud

    def _session(self, session_id: str) -> _Session:
        self._sandbox._running()
        session = self._sandbox._sessions.get(session_id)
        if session is None:
            raise _not_found(f"session {session_id} not found")
        return session

    def _command(self, session_id: str, command_id: str) -> tuple[_Session, _Command]:
        session = self._session(session_id)
        command = session.commands.get(command_id)
        if command is None:
            raise _not_found(f"command {command_id} not found")
        return session, command

    @_recorded("AsyncProcess")
    async def create_session(self, session_id: str, request_timeout: float | None = None) -> None:
        self._sandbox._running()
        if session_id in self._sandbox._sessions:
            raise real.DaytonaConflictError(
                f"Failed to create session: session {session_id} already exists", status_code=409
            )
        self._sandbox._sessions[session_id] = _Session(self._sandbox, session_id)

    @_recorded("AsyncProcess")
    async def execute_session_command(
        self, session_id: str, req: Any, timeout: int | None = None
    ) -> Any:
        session = self._session(session_id)
        if not isinstance(req, real.SessionExecuteRequest):
            raise real.DaytonaValidationError(f"not a SessionExecuteRequest: {req!r}")
        command = _Command(
            id=str(uuid.uuid4()),
            text=req.command.strip(),
            dir=session.dir / str(uuid.uuid4()),
            suppress_echo=bool(req.suppress_input_echo),
        )
        command.dir.mkdir()
        command.script.write_text(command.text)
        command.log.touch()
        session.commands[command.id] = command
        session.run(command, bool(req.run_async))
        if req.run_async:
            return real.SessionExecuteResponse.model_construct(
                cmd_id=command.id, output=None, stdout="", stderr="", exit_code=None
            )
        while command.exit_code is None:
            self._sandbox._running()
            await asyncio.sleep(0.01)
        raw = command.log.read_bytes()
        text = raw.replace(b"\x01\x01\x01", b"").replace(b"\x02\x02\x02", b"").decode()
        return real.SessionExecuteResponse.model_construct(
            cmd_id=command.id, output=text, stdout="", stderr="", exit_code=command.exit_code
        )

    @_recorded("AsyncProcess")
    async def send_session_command_input(
        self, session_id: str, command_id: str, data: str, request_timeout: float | None = None
    ) -> None:
        _, command = self._command(session_id, command_id)
        if not isinstance(data, str):
            raise real.DaytonaValidationError("data must be a string")

        def gone() -> real.DaytonaGoneError:
            return real.DaytonaGoneError(
                "Failed to send session command input: command has already completed with "
                f"exit code {command.exit_code}",
                status_code=410,
            )

        if command.exit_code is not None:
            raise gone()
        if not data.endswith("\n"):
            data += "\n"
        payload = data.encode("utf-8")
        while True:  # the FIFO may not be there, or not opened by the command, yet
            try:
                fd = os.open(command.input, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as exc:
                if exc.errno not in (errno.ENXIO, errno.ENOENT):
                    raise real.DaytonaError(f"failed to open input pipe: {exc}") from exc
            if command.exit_code is not None:
                raise gone()
            self._sandbox._running()
            await asyncio.sleep(0.025)
        try:
            view = memoryview(payload)
            while view:
                try:
                    view = view[os.write(fd, view) :]
                except BlockingIOError:
                    if command.exit_code is not None:
                        raise gone() from None
                    self._sandbox._running()
                    await asyncio.sleep(0.002)
                except BrokenPipeError as exc:
                    raise gone() from exc
        finally:
            os.close(fd)
        if not command.suppress_echo or self._cloud.echo_input_always:
            _append(command.log, STDOUT_PREFIX + payload)

    @_recorded("AsyncProcess")
    async def get_session_command_logs_async(
        self, session_id: str, command_id: str, on_stdout: Any, on_stderr: Any
    ) -> None:
        _, command = self._command(session_id, command_id)
        sandbox = self._sandbox
        position = 0
        turn = 0

        async def receive() -> bytes | None:
            nonlocal position, turn
            while True:
                if sandbox.state != real.SandboxState.STARTED:
                    raise real.DaytonaError("WebSocket closed unexpectedly (close code 1006)")
                finished = command.exit_code is not None  # before reading: nothing is missed
                data = _read_at(command.log, position, _CHUNK_SIZES[turn % len(_CHUNK_SIZES)])
                if data:
                    turn += 1
                    position += len(data)
                    return data
                if finished:
                    return None
                await asyncio.sleep(0.005)

        try:
            await _std_demux_loop(receive, on_stdout, on_stderr)
        except real.DaytonaError:
            raise
        except Exception as exc:  # as the SDK's intercept_errors wraps it
            raise real.DaytonaError(f"Failed to get session command logs: {exc}") from exc

    @_recorded("AsyncProcess")
    async def get_session_command(
        self, session_id: str, command_id: str, request_timeout: float | None = None
    ) -> Command:
        _, command = self._command(session_id, command_id)
        return Command(id=command.id, command=command.text, exit_code=command.exit_code)

    @_recorded("AsyncProcess")
    async def delete_session(self, session_id: str, request_timeout: float | None = None) -> None:
        session = self._session(session_id)
        await asyncio.to_thread(session.kill)
        self._sandbox._sessions.pop(session_id, None)
        shutil.rmtree(session.dir, ignore_errors=True)


# -- files -------------------------------------------------------------------------------


def _file_error(doing: str, exc: OSError) -> real.DaytonaError:
    message = f"{doing}: {exc.strerror}: {exc.filename}"
    if isinstance(exc, FileNotFoundError):
        return real.DaytonaFileNotFoundError(message, status_code=404)
    if isinstance(exc, PermissionError):
        return real.DaytonaFileAccessDeniedError(message, status_code=403)
    return real.DaytonaBadRequestError(message, status_code=400)


class FakeAsyncFileSystem:
    """``sandbox.fs``: the calls the backend makes."""

    def __init__(self, sandbox: FakeSandbox) -> None:
        self._sandbox = sandbox
        self._cloud = sandbox._cloud

    @_recorded("AsyncFileSystem")
    async def list_files(
        self, path: str, depth: int | None = None, request_timeout: float | None = None
    ) -> list[FileInfo]:
        self._sandbox._running()
        try:
            entries = list(os.scandir(path))
        except OSError as exc:
            raise _file_error("Failed to list files", exc) from exc
        infos = []
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            infos.append(
                FileInfo(
                    name=entry.name,
                    path=entry.path,
                    is_dir=entry.is_dir(follow_symlinks=False),
                    size=st.st_size,
                    mode=stat_module.filemode(st.st_mode),
                    permissions=oct(st.st_mode & 0o7777),
                    mod_time=time.ctime(st.st_mtime),
                    owner=str(st.st_uid),
                    group=str(st.st_gid),
                )
            )
        return infos

    @_recorded("AsyncFileSystem")
    async def move_files(
        self, source: str, destination: str, request_timeout: float | None = None
    ) -> None:
        self._sandbox._running()
        try:
            os.rename(source, destination)
        except OSError as exc:
            raise _file_error("Failed to move files", exc) from exc

    @_recorded("AsyncFileSystem")
    async def delete_file(
        self, path: str, recursive: bool = False, request_timeout: float | None = None
    ) -> None:
        self._sandbox._running()
        try:
            _unlink(path, recursive)
        except OSError as exc:
            raise _file_error("Failed to delete file", exc) from exc


FAKE_CLASSES: dict[str, type] = {
    "AsyncDaytona": FakeAsyncDaytona,
    "AsyncSandbox": FakeSandbox,
    "AsyncProcess": FakeAsyncProcess,
    "AsyncFileSystem": FakeAsyncFileSystem,
}

__all__ = [
    "DATA_CLASSES",
    "FAKE_CLASSES",
    "REAL_CLASSES",
    "TAG_VAR",
    "Call",
    "FakeAsyncDaytona",
    "FakeAsyncFileSystem",
    "FakeAsyncProcess",
    "FakeDaytonaCloud",
    "FakeSandbox",
    "tagged_processes",
]
