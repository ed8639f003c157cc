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

So every command runs under a small stdlib *codec*, stubs/_daytona_codec.py (run as
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
that dies leaves nothing running. On this :class:`~environments.exec_stream.ExecStreamEnvironment`
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
)
from hermes_sandbox.environments.daytona.settings import NO_CREDENTIALS, DaytonaSettings
from hermes_sandbox.environments.daytona.stream import DaytonaExecStream, _message
from hermes_sandbox.environments.errors import BackendError, BackendNotAvailable, EnvironmentFailure
from hermes_sandbox.environments.exec_stream import ExecStreamEnvironment
from hermes_sandbox.stubs import program_source

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

# The codec (stubs/_daytona_codec.py): see the module docstring.
CODEC_PROGRAM = "_daytona_codec.py"
CODEC_SOURCE = program_source(CODEC_PROGRAM)


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


# -- the environment -------------------------------------------------------------------


class DaytonaEnvironment(ExecStreamEnvironment):
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

    settings: DaytonaSettings

    def _setup(self) -> None:
        self.task_id = self.settings.task_id or uuid.uuid4().hex
        self._sdk: Any = None
        self._client: Any = None
        self._sandbox: Any = None
        self._delete_on_close = not self.settings.persist
        self._workdir: str | None = self.settings.workdir
        self._idle_sessions: list[str] = []
        self._streams: set[DaytonaExecStream] = set()
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

    async def _start(self) -> None:
        """Resume or create the sandbox.

        Raises BackendNotAvailable (no SDK, no credentials, no asyncio) or
        EnvironmentFailure (Daytona refused or failed).
        """
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

    async def _stop(self) -> None:
        """Delete the sandbox (unless persistent) and close the client."""
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

    def _running_sandbox(self) -> Any:
        """The sandbox, once started; EnvironmentFailure before and after."""
        self._require_started()
        if self._sandbox is None:
            raise EnvironmentFailure(f"the Daytona sandbox is not running yet {self.where}")
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
        """As :meth:`ExecStreamEnvironment.execute`, starting in :attr:`default_cwd` when no
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
        sandbox = self._running_sandbox()
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
        sandbox = self._running_sandbox()
        found = await self._fs_call(path, sandbox.fs.list_files, path)
        return sorted(str(info.name) for info in found)

    async def rename(self, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst`` (replacing it) inside the sandbox."""
        sandbox = self._running_sandbox()
        await self._fs_call(src, sandbox.fs.move_files, src, dst)

    async def remove(self, path: str) -> None:
        """Remove the file ``path``; FileNotFoundError if it is missing."""
        sandbox = self._running_sandbox()
        await self._fs_call(path, sandbox.fs.delete_file, path)


__all__ = [
    "CODEC_SOURCE",
    "LABEL_MANAGED",
    "LABEL_PERSIST",
    "LABEL_TASK",
    "DaytonaEnvironment",
    "DaytonaExecStream",
]
