"""A small, working stand-in for the ``modal`` SDK, for tests that cannot reach Modal.

:class:`FakeModal` offers the names environments/modal.py uses (``App``, ``Image``,
``Sandbox``, ``config``, ``exception``) with the SDK's shapes: functions wrapped the way
synchronicity wraps them (``f.aio(...)`` awaits; the blocking ``f(...)`` is refused, as
the backend must not block its event loop), ``ContainerProcess`` with ``stdout`` and
``stderr`` readers and a ``stdin`` writer (``write``, ``write_eof``, ``drain``).

A sandbox here is a set of real local processes: ``exec`` starts the argv as a
subprocess with real pipes, in a new session, with a marker variable
(:data:`MARK`) naming the sandbox in its environment, so the relay, the helper
program and whole runs work for real against it. ``terminate`` (and
:meth:`FakeModal.vanish`, the sandbox dying under its user, and the sandbox's lifetime
running out) kills every process of the sandbox: those with its marker, their
descendants and everything in their sessions, as a container's end would.

Every call the backend makes is recorded in :attr:`FakeModal.calls` with the
qualified name of the real SDK object (``modal.Sandbox.create.aio``), its arguments,
and whether it is a method; property and attribute reads are recorded too. The
functions implementing them are listed in :data:`FAKE_FUNCTIONS`, with the real
names, so a conformance test can hold both the calls and the fake's own signatures
against the installed SDK.

Exception classes are the installed SDK's own (``modal.exception``) when it is
importable, else look-alikes with the same names.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
import types
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import psutil

MARK = "HERMES_SANDBOX_FAKE_MODAL"  # HERMES_SANDBOX_*: the relay passes it on to scripts
ARG_MAX_BYTES = 2**16  # the SDK refuses longer exec argument lists
MAX_STDIN_BUFFER = 16 * 1024 * 1024  # what one drain may carry through the command router
TERMINATED_EXIT_CODE = 137  # what Modal reports for a terminated sandbox

try:
    import modal.exception as _real_exception

    exception: Any = _real_exception
    from modal.stream_type import StreamType
except ImportError:  # look-alikes, so the fake runs where the SDK is not installed

    class Error(Exception):
        pass

    _names = [
        "AlreadyExistsError",
        "AuthError",
        "ClientClosed",
        "ConflictError",
        "ConnectionError",
        "ExecutionError",
        "ImageBuildError",
        "InvalidError",
        "NotFoundError",
        "PermissionDeniedError",
        "ResourceExhaustedError",
        "SandboxTerminatedError",
        "SandboxTimeoutError",
    ]
    exception = types.SimpleNamespace(Error=Error)
    for _name in _names:
        setattr(exception, _name, type(_name, (Error,), {}))

    import enum

    class StreamType(enum.Enum):  # type: ignore[no-redef]
        DEVNULL = -1
        PIPE = -2
        STDOUT = -3


# -- recording ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One use of the SDK: ``kind`` is "call", "property" or "attribute"."""

    name: str  # the real object's qualified name: modal.Sandbox.exec.aio
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    method: bool = False  # called on an instance: the real signature starts with self
    kind: str = "call"


@dataclass(frozen=True)
class FakeFunction:
    """A fake SDK function and the real object it stands for."""

    name: str  # modal.Sandbox.create (no .aio)
    func: Callable[..., Any]
    method: bool
    aio: bool  # the real one is synchronicity-wrapped: has .aio


FAKE_FUNCTIONS: dict[str, FakeFunction] = {}
FAKE_PROPERTIES: set[str] = set()


class _Synchronized:
    """A method or static function in the shape synchronicity gives the SDK's."""

    def __init__(self, name: str, func: Callable[..., Any], *, method: bool, aio: bool) -> None:
        self.name = name
        self.func = func
        self.method = method
        self.aio = aio
        FAKE_FUNCTIONS[name] = FakeFunction(name, func, method, aio)

    def __get__(self, instance: Any, owner: type) -> Any:
        if self.method and instance is None:
            return self
        return _Bound(self, instance if self.method else owner)


class _Bound:
    def __init__(self, spec: _Synchronized, target: Any) -> None:
        self._spec = spec
        self._target = target

    def _world(self) -> FakeModal:
        world: FakeModal = self._target._world
        return world

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        spec = self._spec
        if spec.aio:
            raise TypeError(
                f"{spec.name}(...) blocks the event loop; the fake accepts only "
                f"await {spec.name}.aio(...)"
            )
        self._world().record(Call(spec.name, args, dict(kwargs), spec.method))
        return spec.func(self._target, *args, **kwargs)

    async def aio(self, *args: Any, **kwargs: Any) -> Any:
        spec = self._spec
        if not spec.aio:
            raise AttributeError(f"{spec.name} has no .aio")
        self._world().record(Call(spec.name + ".aio", args, dict(kwargs), spec.method))
        return await spec.func(self._target, *args, **kwargs)


def synchronized(name: str, *, method: bool = True, aio: bool = True) -> Callable[..., Any]:
    """Declare a fake of the SDK function ``name``; the first parameter of the
    decorated function is the instance (method) or the class (static)."""

    def wrap(func: Callable[..., Any]) -> Any:
        return _Synchronized(name, func, method=method, aio=aio)

    return wrap


def recorded_property(name: str) -> Callable[[Callable[[Any], Any]], property]:
    """A property whose reads are recorded (the real one is a property too)."""
    FAKE_PROPERTIES.add(name)

    def wrap(getter: Callable[[Any], Any]) -> property:
        @functools.wraps(getter)
        def read(self: Any) -> Any:
            self._world.record(Call(name, kind="property"))
            return getter(self)

        return property(read)

    return wrap


class _RecordingNamespace:
    """Attribute reads of ``target`` recorded under ``prefix``."""

    def __init__(self, world: FakeModal, prefix: str, target: Any) -> None:
        self._world = world
        self._prefix = prefix
        self._target = target

    def __getattr__(self, name: str) -> Any:
        self._world.record(Call(f"{self._prefix}.{name}", kind="attribute"))
        return getattr(self._target, name)


# -- processes ---------------------------------------------------------------------------


def _environ_has(pid: int, entry: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return entry in f.read().split(b"\0")
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def processes_marked(value_prefix: str) -> set[int]:
    """Live processes whose :data:`MARK` variable starts with ``value_prefix``."""
    prefix = f"{MARK}={value_prefix}".encode()
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                entries = f.read().split(b"\0")
        except OSError:
            continue
        if any(e.startswith(prefix) for e in entries) and _alive(int(name)):
            found.add(int(name))
    return found


class _Pipe:
    """One end of a real pipe, used without blocking from any event loop."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self.fd = fd
        self.closed = False

    async def read(self, size: int = 65536) -> bytes:
        """The next bytes; b"" at the end, and the pipe is then closed."""
        while True:
            if self.closed:
                return b""
            try:
                data = os.read(self.fd, size)
            except BlockingIOError:
                await anyio.wait_readable(self.fd)
                continue
            except OSError:
                data = b""
            if not data:
                self.close()
            return data

    async def write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self.closed:
                raise BrokenPipeError("stdin is closed")
            try:
                view = view[os.write(self.fd, view) :]
            except BlockingIOError:
                await anyio.wait_writable(self.fd)

    def close(self) -> None:
        """Close the fd: only from the event loop thread that waits on it, or with no
        event loop running (a closed fd never wakes its waiter)."""
        if not self.closed:
            self.closed = True
            try:
                anyio.notify_closing(self.fd)
            except RuntimeError:
                pass  # no event loop here: nothing can be waiting on it
            os.close(self.fd)


class FakeStreamReader:
    """modal.io_streams.StreamReader over a real pipe."""

    def __init__(self, world: FakeModal, pipe: _Pipe, text: bool) -> None:
        self._world = world
        self._pipe = pipe
        self._text = text

    @synchronized("modal.io_streams.StreamReader.__aiter__", aio=False)
    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        while True:
            chunk = await self._pipe.read()
            if not chunk:
                return
            yield chunk.decode("utf-8", "replace") if self._text else chunk


class FakeStreamWriter:
    """modal.io_streams.StreamWriter over a real pipe: buffered until drained."""

    def __init__(self, world: FakeModal, pipe: _Pipe) -> None:
        self._world = world
        self._pipe = pipe
        self._buffer = bytearray()
        self._eof = False

    @synchronized("modal.io_streams.StreamWriter.write", aio=False)
    def write(self, data: bytes | bytearray | memoryview | str) -> None:
        if self._eof:
            raise ValueError("Stdin is closed. Cannot write to it.")
        if isinstance(data, str):
            data = data.encode("utf-8")
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"data argument must be a bytes-like object, not {type(data).__name__}")
        if len(self._buffer) + len(data) > MAX_STDIN_BUFFER:
            raise BufferError("Buffer size exceed limit. Call drain to flush the buffer.")
        self._buffer.extend(data)

    @synchronized("modal.io_streams.StreamWriter.write_eof", aio=False)
    def write_eof(self) -> None:
        self._eof = True

    @synchronized("modal.io_streams.StreamWriter.drain")
    async def drain(self) -> None:
        data = bytes(self._buffer)
        try:
            if data:
                await self._pipe.write_all(data)
        except OSError as exc:  # the process is gone; the service reports it so
            raise exception.Error(f"could not write to the process's stdin: {exc}") from exc
        self._buffer.clear()
        if self._eof:
            self._pipe.close()


class FakeContainerProcess:
    """modal.container_process.ContainerProcess: a real local process."""

    def __init__(self, world: FakeModal, popen: subprocess.Popen[bytes], text: bool) -> None:
        assert popen.stdin and popen.stdout and popen.stderr
        self._world = world
        self.popen = popen
        self._pipes = [_Pipe(os.dup(p.fileno())) for p in (popen.stdin, popen.stdout, popen.stderr)]
        for original in (popen.stdin, popen.stdout, popen.stderr):
            original.close()
        self._stdin = FakeStreamWriter(world, self._pipes[0])
        self._stdout = FakeStreamReader(world, self._pipes[1], text)
        self._stderr = FakeStreamReader(world, self._pipes[2], text)
        self._returncode: int | None = None
        try:
            self._pidfd: int | None = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):
            self._pidfd = None

    @recorded_property("modal.container_process.ContainerProcess.stdout")
    def stdout(self) -> FakeStreamReader:
        return self._stdout

    @recorded_property("modal.container_process.ContainerProcess.stderr")
    def stderr(self) -> FakeStreamReader:
        return self._stderr

    @recorded_property("modal.container_process.ContainerProcess.stdin")
    def stdin(self) -> FakeStreamWriter:
        return self._stdin

    def _reap(self) -> int | None:
        code = self.popen.poll()
        if code is not None and self._returncode is None:
            self._returncode = 128 - code if code < 0 else code  # as Modal reports signals
        return self._returncode

    @synchronized("modal.container_process.ContainerProcess.wait")
    async def wait(self) -> int:
        while self._reap() is None:
            if self._pidfd is not None:
                await anyio.wait_readable(self._pidfd)  # readable once the process ended
            else:
                await anyio.sleep(0.01)
        assert self._returncode is not None
        return self._returncode

    @property
    def running(self) -> bool:
        """Not yet reaped (so its pid is still its own)."""
        return self.popen.poll() is None

    @synchronized("modal.container_process.ContainerProcess.poll")
    async def poll(self) -> int | None:
        return self._reap()

    def release(self) -> None:
        """Close the fake's ends of the pipes and reap the process; with no event loop
        running (at the end of a test)."""
        for pipe in self._pipes:
            pipe.close()
        if self._pidfd is not None:
            try:
                anyio.notify_closing(self._pidfd)
            except RuntimeError:
                pass
            os.close(self._pidfd)
            self._pidfd = None
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


# -- apps, images, sandboxes -----------------------------------------------------------


@dataclass
class FakeApp:
    name: str
    app_id: str
    environment_name: str | None


@dataclass
class FakeImage:
    tag: str
    add_python: str | None = None


class _SandboxState:
    """One sandbox, whatever handles point at it."""

    def __init__(self, world: FakeModal, app: FakeApp, name: str | None, options: dict[str, Any]):
        self.world = world
        self.sandbox_id = f"sb-{uuid.uuid4().hex[:22]}"
        self.app = app
        self.name = name
        self.options = options
        self.marker = f"{world.world_id}/{self.sandbox_id}"
        self.processes: list[FakeContainerProcess] = []
        self.returncode: int | None = None
        self.ended_by: str | None = None  # "terminate", "vanish" or "timeout"
        self.lock = threading.Lock()
        self.timer = threading.Timer(float(options["timeout"]), self.end, args=("timeout",))
        self.timer.daemon = True
        self.timer.start()

    @property
    def running(self) -> bool:
        return self.returncode is None

    def members(self) -> set[int]:
        """Every live process of this sandbox."""
        found = processes_marked(self.marker)
        roots = [p.popen.pid for p in list(self.processes) if p.running] + sorted(found)
        for pid in roots:
            try:
                found.update(c.pid for c in psutil.Process(pid).children(recursive=True))
            except psutil.Error:
                pass
        sessions = set()
        for pid in found:
            try:
                sessions.add(os.getsid(pid))
            except OSError:
                pass
        sessions.discard(os.getsid(0))
        if sessions:
            for proc in psutil.process_iter():
                try:
                    if os.getsid(proc.pid) in sessions:
                        found.add(proc.pid)
                except OSError:
                    pass
        return {pid for pid in found if pid != os.getpid() and _alive(pid)}

    def end(self, how: str) -> None:
        """The sandbox stops: every process in it is killed. Safe from any thread."""
        with self.lock:
            if self.returncode is not None:
                return
            self.returncode = TERMINATED_EXIT_CODE
            self.ended_by = how
            self.timer.cancel()
        self.kill_all()

    def kill_all(self) -> None:
        """Kill every process of the sandbox, however fast they fork."""
        for _ in range(200):
            pids = self.members()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGSTOP)  # freeze first: none may fork away meanwhile
                except OSError:
                    pass
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.005)


class FakeSandbox:
    """A handle to a sandbox, as modal.Sandbox is."""

    _world: FakeModal

    def __init__(self, state: _SandboxState) -> None:
        self._state = state
        self._attached = True

    def _ensure_attached(self) -> None:
        if not self._attached:
            raise exception.ClientClosed("Unable to perform operation on a detached sandbox")

    @synchronized("modal.Sandbox.create", method=False)
    async def create(
        cls: type[FakeSandbox],
        *args: str,
        app: FakeApp | None = None,
        name: str | None = None,
        tags: dict[str, str] | None = None,
        image: FakeImage | None = None,
        env: dict[str, str | None] | None = None,
        timeout: int | None = 300,
        idle_timeout: int | None = None,
        workdir: str | None = None,
        gpu: str | None = None,
        cloud: str | None = None,
        region: str | Sequence[str] | None = None,
        cpu: float | tuple[float, float] | None = None,
        memory: int | tuple[int, int] | None = None,
        block_network: bool = False,
        verbose: bool = False,
    ) -> FakeSandbox:
        world = cls._world
        world.fail_if_asked("modal.Sandbox.create")
        if app is None:
            raise exception.InvalidError("App must be provided")
        if timeout is None:
            raise exception.InvalidError(
                "`timeout=None` is only supported for experimental persistent Sandboxes."
            )
        if name is not None and not re.match(r"^[a-zA-Z0-9._-]{1,64}$", name):
            raise exception.InvalidError(f"Invalid Sandbox name: '{name}'.")
        if workdir is not None and not workdir.startswith("/"):
            raise exception.InvalidError(f"workdir must be an absolute path, got: {workdir}")
        _check_args(args)
        with world.lock:
            if name is not None and world.find(app.name, name) is not None:
                raise exception.AlreadyExistsError(f"Sandbox with name '{name}' already exists")
            state = _SandboxState(
                world,
                app,
                name,
                {
                    "args": args,
                    "image": image,
                    "env": dict(env or {}),
                    "timeout": timeout,
                    "idle_timeout": idle_timeout,
                    "workdir": workdir,
                    "cloud": cloud,
                    "region": region,
                    "cpu": cpu,
                    "memory": memory,
                    "block_network": block_network,
                },
            )
            world.sandboxes[state.sandbox_id] = state
        return cls(state)

    @synchronized("modal.Sandbox.from_name", method=False)
    async def from_name(
        cls: type[FakeSandbox],
        app_name: str,
        name: str,
        *,
        environment_name: str | None = None,
        include_terminated: bool = False,
        client: Any = None,
    ) -> FakeSandbox:
        world = cls._world
        world.fail_if_asked("modal.Sandbox.from_name")
        state = world.find(app_name, name, include_terminated=include_terminated)
        if state is None:
            raise exception.NotFoundError(f"Sandbox with name '{name}' not found")
        return cls(state)

    @synchronized("modal.Sandbox.from_id", method=False)
    async def from_id(cls: type[FakeSandbox], sandbox_id: str, client: Any = None) -> FakeSandbox:
        state = cls._world.sandboxes.get(sandbox_id)
        if state is None:
            raise exception.NotFoundError(f"Sandbox {sandbox_id} not found")
        return cls(state)

    @recorded_property("modal.Sandbox.object_id")
    def object_id(self) -> str:
        return self._state.sandbox_id

    @recorded_property("modal.Sandbox.returncode")
    def returncode(self) -> int | None:
        return self._state.returncode

    @synchronized("modal.Sandbox.exec")
    async def exec(
        self,
        *args: str,
        timeout: int | None = None,
        workdir: str | None = None,
        env: dict[str, str | None] | None = None,
        text: bool = True,
        bufsize: int = -1,
        pty: bool = False,
    ) -> FakeContainerProcess:
        self._ensure_attached()
        state, world = self._state, self._world
        world.fail_if_asked("modal.Sandbox.exec")
        if workdir is not None and not workdir.startswith("/"):
            raise exception.InvalidError(f"workdir must be an absolute path, got: {workdir}")
        _check_args(args)
        if not state.running:
            raise exception.ConflictError("Sandbox already finished")
        environment = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": world.home,
            "LANG": "C.UTF-8",
            **{k: v for k, v in state.options["env"].items() if v is not None},
            **{k: v for k, v in (env or {}).items() if v is not None},
            MARK: state.marker,
        }
        for key, value in environment.items():
            if not isinstance(value, str):
                raise TypeError(f"env value for {key!r} must be a str, got {type(value).__name__}")
        cwd = workdir or state.options["workdir"] or world.home
        argv = list(args)
        try:
            popen = _popen(argv, environment, cwd)
        except OSError as exc:
            # As a container runtime reports it: the exec starts and fails at once.
            message = f"exec failed: {argv[0]}: {exc.strerror or exc}\n"
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            report = f"import sys; sys.stderr.write({message!r}); sys.exit({code})"
            popen = _popen([sys.executable, "-c", report], environment, world.home)
        process = FakeContainerProcess(world, popen, text)
        with state.lock:
            state.processes.append(process)
            ended = not state.running
        if ended:  # the sandbox ended while this started
            state.kill_all()
        return process

    @synchronized("modal.Sandbox.poll")
    async def poll(self) -> int | None:
        self._ensure_attached()
        return self._state.returncode

    @synchronized("modal.Sandbox.wait")
    async def wait(self, raise_on_termination: bool = True) -> None:
        while self._state.running:  # noqa: ASYNC110 (it ends from other threads too)
            await anyio.sleep(0.01)
        if raise_on_termination and self._state.ended_by in ("terminate", "vanish"):
            raise exception.SandboxTerminatedError()
        if self._state.ended_by == "timeout":
            raise exception.SandboxTimeoutError()

    @synchronized("modal.Sandbox.terminate")
    async def terminate(self, *, wait: bool = False) -> int | None:
        self._ensure_attached()
        self._world.fail_if_asked("modal.Sandbox.terminate")
        await anyio.to_thread.run_sync(self._state.end, "terminate")
        return self._state.returncode if wait else None

    @synchronized("modal.Sandbox.detach")
    async def detach(self) -> None:
        self._attached = False


def _check_args(args: Sequence[str]) -> None:
    if not all(isinstance(arg, str) for arg in args):
        raise exception.InvalidError("All entrypoint arguments must be strings")
    total = sum(len(arg) for arg in args)
    if total > ARG_MAX_BYTES:
        raise exception.InvalidError(
            f"Total length of CMD arguments cannot exceed {ARG_MAX_BYTES} bytes (ARG_MAX). "
            f"Got {total} bytes."
        )


def _popen(argv: list[str], env: dict[str, str], cwd: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
        start_new_session=True,
        bufsize=0,
    )


class FakeAppClass:
    _world: FakeModal

    @synchronized("modal.App.lookup", method=False)
    async def lookup(
        cls: type[FakeAppClass],
        name: str,
        *,
        client: Any = None,
        environment_name: str | None = None,
        create_if_missing: bool = False,
    ) -> FakeApp:
        world = cls._world
        world.fail_if_asked("modal.App.lookup")
        with world.lock:
            app = world.apps.get(name)
            if app is None:
                if not create_if_missing:
                    raise exception.NotFoundError(f"App '{name}' not found")
                app = FakeApp(name, f"ap-{uuid.uuid4().hex[:22]}", environment_name)
                world.apps[name] = app
        return app


class FakeImageClass:
    _world: FakeModal

    @synchronized("modal.Image.from_registry", method=False, aio=False)
    def from_registry(
        cls: type[FakeImageClass],
        tag: str,
        secret: Any = None,
        *,
        setup_dockerfile_commands: list[str] = [],  # noqa: B006 (the real signature's)
        force_build: bool = False,
        add_python: str | None = None,
        **kwargs: Any,
    ) -> FakeImage:
        cls._world.fail_if_asked("modal.Image.from_registry")
        return FakeImage(tag, add_python)

    @synchronized("modal.Image.debian_slim", method=False, aio=False)
    def debian_slim(
        cls: type[FakeImageClass], python_version: str | None = None, force_build: bool = False
    ) -> FakeImage:
        return FakeImage(f"debian-slim-python{python_version or ''}")


class FakeConfig:
    """modal.config.Config: settings from :attr:`FakeModal.settings` only."""

    def __init__(self, world: FakeModal) -> None:
        self._world = world

    @synchronized("modal.config.Config.get", aio=False)
    def get(self, key: str, *, profile: str | None = None, use_env: bool = True) -> Any:
        return self._world.settings.get(key)


# -- the module stand-in ---------------------------------------------------------------

_world_ids = itertools.count(1)


class FakeModal:
    """What environments/modal.py uses of the ``modal`` module, backed by local processes.

    ``home`` is the directory a sandbox's processes get as HOME and start in when
    neither the sandbox nor the exec names one. ``settings`` are what the SDK's
    config would read (credentials). ``failures`` maps a qualified name
    (``modal.Sandbox.create``) to an exception the fake then raises for every such call;
    :meth:`fail_once` raises one for the next such call only.
    """

    def __init__(self, home: str) -> None:
        self.world_id = f"fake{os.getpid()}-{next(_world_ids)}-{uuid.uuid4().hex[:8]}"
        self.home = home
        os.makedirs(home, exist_ok=True)
        self.settings: dict[str, Any] = {"token_id": "ak-fake", "token_secret": "as-fake"}
        self.failures: dict[str, BaseException] = {}
        self._failures_once: dict[str, list[BaseException]] = {}
        self.calls: list[Call] = []
        self.apps: dict[str, FakeApp] = {}
        self.sandboxes: dict[str, _SandboxState] = {}
        self.lock = threading.RLock()
        self.App = type("App", (FakeAppClass,), {"_world": self})
        self.Image = type("Image", (FakeImageClass,), {"_world": self})
        self.Sandbox = type("Sandbox", (FakeSandbox,), {"_world": self})
        self.exception = _RecordingNamespace(self, "modal.exception", exception)
        self.config = _RecordingNamespace(
            self,
            "modal.config",
            types.SimpleNamespace(
                config=FakeConfig(self), user_config_path=os.path.join(home, ".modal.toml")
            ),
        )

    def record(self, call: Call) -> None:
        with self.lock:
            self.calls.append(call)

    def fail_once(self, name: str, failure: BaseException) -> None:
        with self.lock:
            self._failures_once.setdefault(name, []).append(failure)

    def fail_if_asked(self, name: str) -> None:
        with self.lock:
            pending = self._failures_once.get(name)
            failure = pending.pop(0) if pending else self.failures.get(name)
        if failure is not None:
            raise failure

    def find(
        self, app_name: str, name: str, *, include_terminated: bool = False
    ) -> _SandboxState | None:
        with self.lock:
            for state in self.sandboxes.values():
                same = state.app.name == app_name and state.name == name
                if same and (state.running or include_terminated):
                    return state
        return None

    def calls_named(self, name: str) -> list[Call]:
        return [call for call in self.calls if call.name == name]

    def vanish(self, sandbox_id: str) -> None:
        """The sandbox dies under its user (terminated from outside). Any thread."""
        self.sandboxes[sandbox_id].end("vanish")

    def live_processes(self) -> set[int]:
        """Every live process of every sandbox of this fake."""
        found = processes_marked(self.world_id + "/")
        for state in self.sandboxes.values():
            found |= {p.popen.pid for p in state.processes if _alive(p.popen.pid)}
        return found

    def shutdown(self) -> None:
        """End every sandbox and release what the fake holds; call with no event loop
        running (the test is over)."""
        for state in list(self.sandboxes.values()):
            state.end("terminate")
            state.kill_all()
            for process in state.processes:
                process.release()


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds passed; its last answer."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def pids_alive(pids: Iterable[int]) -> list[int]:
    return [pid for pid in pids if _alive(pid)]


__all__ = [
    "FAKE_FUNCTIONS",
    "FAKE_PROPERTIES",
    "MARK",
    "Call",
    "FakeFunction",
    "FakeModal",
    "StreamType",
    "exception",
    "pids_alive",
    "processes_marked",
    "wait_until",
]
