"""The Modal backend: scripts run in a Modal Sandbox, driven through the ``modal`` SDK.

Lifecycle. :meth:`ModalEnvironment.start` looks up (or creates) the Modal App named by
:attr:`ModalSettings.app_name`, then resumes the running sandbox called
:attr:`ModalSettings.sandbox_name` (``Sandbox.from_name``) when one is named and exists,
or creates one from a registry image with the configured CPU, memory, lifetime and,
by default, no network. :meth:`ModalEnvironment.aclose` terminates it unless it is
persistent. A sandbox whose owner died without closing it ends by itself when its
lifetime (``timeout``, and ``idle_timeout`` if set) runs out: that is the reaper.

Commands and files. Everything runs through ``Sandbox.exec``: the environment is a
:class:`~environments.exec_stream.ExecStreamEnvironment`, so a shell command under a timeout,
killing what it left, and every file operation run the stdlib helper program with the
sandbox's Python over an exec's stdin and stdout (:class:`ModalExecStream`), and
scripts run under the stream relay. Modal has no call to kill one exec, so every exec
carries a fresh ``HERMES_SANDBOX_EXEC`` marker; an exec that has not exited when its
stream is closed is killed by that marker inside the sandbox. Only plain variables go
through the exec's ``env``; nothing is sent as a Modal Secret (the RPC token travels
inside the relay stream, never in an environment or on a command line).

The SDK. ``modal`` is imported on first use (:func:`_modal`), so this module imports
without it; all SDK access goes through the module object held in :data:`_sdk`, which
tests replace with a fake. The async ``.aio`` forms are used throughout: their I/O runs
on the SDK's own event loop thread, none per stream, and they need the caller to run
on asyncio (anyio's default backend). Errors of the SDK are translated here, at the
boundary, into :mod:`environments.errors` types: missing SDK or credentials and an
unreachable or refusing service are :class:`BackendNotAvailable`; a failure while
creating or using the sandbox is :class:`EnvironmentFailure`, and a sandbox that stopped
while in use is :class:`SandboxGone` (its reason also kept in
:attr:`ModalEnvironment.lost`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import shlex
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import anyio

from hermes_sandbox.environments.base import (
    DEFAULT_MAX_COMMAND_OUTPUT,
    CommandResult,
)
from hermes_sandbox.environments.errors import BackendError, BackendNotAvailable, EnvironmentFailure
from hermes_sandbox.environments.exec_stream import HELPER_SOURCE, ExecStreamEnvironment
from hermes_sandbox.environments.modal.settings import ModalSettings
from hermes_sandbox.environments.modal.stream import ModalExecStream

log = logging.getLogger(__name__)

T = TypeVar("T")

SDK_MISSING = "the modal backend needs the modal SDK: pip install 'hermes-sandbox[modal]'"
CREDENTIALS_ADVICE = (
    "set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET (a token from https://modal.com/settings/tokens), "
    "or run `modal token new` to store one in {path} (another file: MODAL_CONFIG_PATH; "
    "another profile in it: MODAL_PROFILE)"
)
EXEC_MARK = "HERMES_SANDBOX_EXEC"  # the helper's kill verb finds an exec's processes by it

# The SDK module once imported (see _modal); tests put a stand-in with the same names here.
_sdk: Any = None

_STDERR_TAIL = 8192
_STDIN_CHUNK = 1 << 20  # below the SDK's 16 MiB limit on what one drain may carry
_STDERR_JOIN_SECONDS = 2.0  # after an exec exits: for the rest of its stderr to arrive
_EOF_SECONDS = 10.0
_EXIT_SECONDS = 2.0  # for an exec's exit status once its output ended
_POLL_SECONDS = 15.0
_TERMINATE_SECONDS = 60.0


def _modal() -> Any:
    """The modal SDK (imported on first use); BackendNotAvailable if it is missing."""
    global _sdk
    if _sdk is None:
        try:
            import modal
        except ImportError as exc:
            raise BackendNotAvailable(SDK_MISSING) from exc
        _sdk = modal
    return _sdk


# -- errors ------------------------------------------------------------------------------


class SandboxGone(EnvironmentFailure):
    """The Modal sandbox stopped while in use: terminated from outside, or its lifetime
    ran out. Nothing of it is left to clean up."""


@dataclass(frozen=True, slots=True)
class _SdkErrors:
    """The SDK's exception classes this backend tells apart, taken once per start."""

    base: type[BaseException]
    credentials: tuple[type[BaseException], ...]
    unreachable: type[BaseException]
    not_found: type[BaseException]
    exists: type[BaseException]
    gone: tuple[type[BaseException], ...]

    @classmethod
    def of(cls, sdk: Any) -> _SdkErrors:
        errors = sdk.exception
        return cls(
            base=errors.Error,
            credentials=(errors.AuthError, errors.PermissionDeniedError),
            unreachable=errors.ConnectionError,
            not_found=errors.NotFoundError,
            exists=errors.AlreadyExistsError,
            gone=(errors.SandboxTerminatedError, errors.SandboxTimeoutError),
        )

    @property
    def foreign(self) -> tuple[type[BaseException], ...]:
        """Everything an SDK call may raise that is not a bug of ours."""
        return (self.base, OSError)

    def translate(self, doing: str, exc: BaseException, *, path: str) -> BackendError:
        """The environment error for an SDK error met while ``doing``."""
        text = str(exc) or type(exc).__name__
        if isinstance(exc, self.credentials):
            return BackendNotAvailable(
                f"{doing}: Modal refused the credentials: {text}. "
                + CREDENTIALS_ADVICE.format(path=path)
            )
        if isinstance(exc, self.unreachable):
            return BackendNotAvailable(
                f"{doing}: could not reach Modal: {text}. Check this host's network and "
                "proxy settings (Modal is reached over HTTPS at api.modal.com)."
            )
        if isinstance(exc, self.gone):
            return SandboxGone(f"{doing}: the sandbox is no longer running: {text}")
        if isinstance(exc, self.not_found):
            return EnvironmentFailure(f"{doing}: not found: {text}")
        return EnvironmentFailure(f"{doing}: Modal said: {type(exc).__name__}: {text}")


def _credentials_problem(sdk: Any) -> str | None:
    """Why the SDK will not authenticate, checked without a network call; None if it has
    credentials (the SDK reads them from the environment and the config file)."""
    settings = sdk.config.config
    path = str(getattr(sdk.config, "user_config_path", "~/.modal.toml"))
    token_id = settings.get("token_id")
    token_secret = settings.get("token_secret")
    if token_id and token_secret:
        return None
    oauth = ("oauth_refresh_token", "oauth_client_id", "oauth_client_secret", "oauth_jwt_key")
    if any(settings.get(key) for key in oauth):
        return None  # an OAuth setup; the SDK says itself what is incomplete in it
    advice = CREDENTIALS_ADVICE.format(path=path)
    if token_id or token_secret:
        missing = "MODAL_TOKEN_SECRET" if token_id else "MODAL_TOKEN_ID"
        return f"the modal backend has half a Modal token: {missing} is missing; {advice}"
    return f"the modal backend needs Modal credentials and found none: {advice}"


def _require_asyncio() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise BackendNotAvailable(
            "the modal backend runs on asyncio (the modal SDK's async calls need it): run "
            "hermes-sandbox under asyncio, anyio's default backend, not trio"
        ) from None


# -- the environment -------------------------------------------------------------------

# Sandboxes this process uses, with how many open environments share each: a
# non-persistent sandbox is terminated when its last user in this process closes.
_SHARED: dict[str, int] = {}
_SHARED_LOCK = threading.Lock()


class ModalEnvironment(ExecStreamEnvironment):
    """A Modal Sandbox (see the module docstring).

    ``settings`` say which app, image and limits; ``env`` holds variables every command
    and script gets (added to the image's own; nothing of the host's goes in
    otherwise); ``kill_grace`` is how long a command gets between SIGTERM and SIGKILL;
    ``python`` overrides ``settings.python``.
    """

    name: ClassVar[str] = "modal"
    settings_class: ClassVar[type[ModalSettings]] = ModalSettings
    where: ClassVar[str] = "in the Modal sandbox"

    settings: ModalSettings

    def _setup(self) -> None:
        self._sdk: Any = None
        self._errors: _SdkErrors | None = None
        self._sandbox: Any = None
        self.sandbox_id: str | None = None
        self.resumed = False  # start() attached to a running sandbox found by its name
        self._lost: str | None = None
        self._workdir_ready = False  # then commands and execs start in config.workdir

    @property
    def default_cwd(self) -> str:
        return self.settings.workdir

    @property
    def lost(self) -> str | None:
        """Why the sandbox stopped while in use (terminated from outside, or its lifetime
        ran out), or None while it runs (or was stopped by :meth:`aclose`)."""
        return self._lost

    # -- lifecycle -----------------------------------------------------------------------

    async def _start(self) -> None:
        """Resume the named sandbox or create one; make the working directory.

        Raises BackendNotAvailable (no SDK, no credentials, not on asyncio, Modal
        unreachable or refusing the credentials) or EnvironmentFailure (Modal could not
        create or run the sandbox, the image has no Python). A sandbox made for a start
        that then fails is terminated before the error is raised.
        """
        sdk = _modal()
        _require_asyncio()
        problem = _credentials_problem(sdk)
        if problem is not None:
            raise BackendNotAvailable(problem)
        self._sdk = sdk
        self._errors = _SdkErrors.of(sdk)
        config = self.settings
        app = await self._call(
            f"looking up the Modal app {config.app_name!r}",
            sdk.App.lookup.aio,
            config.app_name,
            create_if_missing=True,
            environment_name=config.modal_environment,
        )
        sandbox = await self._find_named() if config.sandbox_name else None
        if sandbox is None:
            sandbox = await self._create(app)
        else:
            self.resumed = True
        self._sandbox = sandbox
        self.sandbox_id = str(sandbox.object_id)
        with _SHARED_LOCK:
            _SHARED[self.sandbox_id] = _SHARED.get(self.sandbox_id, 0) + 1
        try:
            await self._make_workdir()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.aclose()
            raise

    async def _find_named(self) -> Any:
        """The running sandbox of the configured name, or None."""
        config, errors = self.settings, self._require_errors()
        try:
            return await self._sdk.Sandbox.from_name.aio(
                config.app_name, config.sandbox_name, environment_name=config.modal_environment
            )
        except errors.not_found:
            return None
        except errors.foreign as exc:
            raise self._translate(
                f"looking for the sandbox {config.sandbox_name!r} in the app {config.app_name!r}",
                exc,
            ) from exc

    async def _create(self, app: Any) -> Any:
        config, errors = self.settings, self._require_errors()
        doing = f"creating a Modal sandbox from the image {config.image!r}"
        try:
            image = self._sdk.Image.from_registry(config.image)
        except errors.foreign as exc:
            raise self._translate(doing, exc) from exc
        options: dict[str, Any] = {
            "app": app,
            "image": image,
            "timeout": config.timeout,
            "block_network": config.block_network,
        }
        optional = {
            "name": config.sandbox_name,
            "idle_timeout": config.idle_timeout,
            "cpu": config.cpu,
            "memory": config.memory,
            "region": config.region,
            "cloud": config.cloud,
        }
        options.update({key: value for key, value in optional.items() if value is not None})
        try:
            return await self._sdk.Sandbox.create.aio(**options)
        except errors.exists as exc:
            # Made under that name by someone else since we looked: use theirs.
            found = await self._find_named()
            if found is None:
                raise self._translate(doing, exc) from exc
            self.resumed = True
            return found
        except errors.foreign as exc:
            raise self._translate(doing, exc) from exc

    async def _make_workdir(self) -> None:
        """Make the working directory; the first exec also shows the image has Python."""
        workdir = self.settings.workdir
        result = await self.execute(f"mkdir -p -- {shlex.quote(workdir)}", timeout=120)
        if result.exit_code != 0:
            raise EnvironmentFailure(
                f"could not make the working directory {workdir} {self.where}: "
                f"exit code {result.exit_code}: {result.output.strip()[-2000:]}"
            )
        self._workdir_ready = True

    async def _stop(self) -> None:
        """Terminate the sandbox (unless persistent, or still used by another environment
        of this process) and let go of it. Never raises."""
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is None:
            return
        foreign = self._require_errors().foreign
        if self._release_share():
            try:
                with anyio.move_on_after(_TERMINATE_SECONDS) as waited:
                    await sandbox.terminate.aio(wait=True)
                if waited.cancelled_caught:
                    log.warning(
                        "Modal has not confirmed that sandbox %s ended after %.0f s; it "
                        "ends at the latest when its timeout of %d s runs out",
                        self.sandbox_id,
                        _TERMINATE_SECONDS,
                        self.settings.timeout,
                    )
            except foreign as exc:
                # Not raised: aclose runs in finally blocks. The sandbox's own
                # lifetime ends it if this did not.
                log.warning("could not terminate sandbox %s: %s", self.sandbox_id, exc)
        try:
            await sandbox.detach.aio()
        except foreign as exc:
            log.debug("detaching from sandbox %s: %s", self.sandbox_id, exc)

    def _release_share(self) -> bool:
        """Drop this environment's use of the sandbox; True if it should be terminated."""
        assert self.sandbox_id is not None
        with _SHARED_LOCK:
            users = _SHARED.get(self.sandbox_id, 1) - 1
            if users > 0:
                _SHARED[self.sandbox_id] = users
                return False
            _SHARED.pop(self.sandbox_id, None)
        return not self.settings.persist

    # -- the SDK boundary ------------------------------------------------------------------

    def _require_errors(self) -> _SdkErrors:
        if self._errors is None:
            raise EnvironmentFailure("the modal environment is not started")
        return self._errors

    def _require_started(self) -> None:
        """As the base's, but a sandbox that went away mid-run is SandboxGone."""
        if not self.alive and self._lost is not None:
            raise SandboxGone(self._lost)
        super()._require_started()

    def _translate(self, doing: str, exc: BaseException) -> BackendError:
        path = str(getattr(self._sdk.config, "user_config_path", "~/.modal.toml"))
        return self._require_errors().translate(doing, exc, path=path)

    async def _call(self, doing: str, fn: Callable[..., Awaitable[T]], *args: Any, **kw: Any) -> T:
        """Await an SDK call; translate what it raises."""
        try:
            return await fn(*args, **kw)
        except self._require_errors().foreign as exc:
            raise self._translate(doing, exc) from exc

    async def _gone_reason(self) -> str | None:
        """Why the sandbox is no longer running, asking Modal; None if it runs (or if
        Modal cannot say)."""
        if self._lost is not None:
            return self._lost
        sandbox = self._sandbox
        if sandbox is None:
            return None
        code: int | None = None
        with anyio.move_on_after(_POLL_SECONDS):
            try:
                code = await sandbox.poll.aio()
            except self._require_errors().foreign as exc:
                log.debug("polling sandbox %s: %s", self.sandbox_id, exc)
        if code is None:
            return None
        settings = self.settings
        self._lost = (
            f"the Modal sandbox {self.sandbox_id} stopped while in use (exit code {code}): "
            f"it was terminated from outside, or its lifetime (timeout={settings.timeout}s"
            + (f", idle_timeout={settings.idle_timeout}s" if settings.idle_timeout else "")
            + ") ran out"
        )
        return self._lost

    async def _explained(self, exc: EnvironmentFailure) -> EnvironmentFailure:
        """``exc``, or a SandboxGone saying why if the sandbox has stopped."""
        if isinstance(exc, SandboxGone):
            if self._lost is None:
                self._lost = str(exc)
            return exc
        reason = await self._gone_reason()
        return exc if reason is None else SandboxGone(reason)

    # -- processes -------------------------------------------------------------------------

    async def _open_exec(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | None,
        stdin: bool,
        reap: bool = True,
        diagnose: bool = False,
    ) -> ModalExecStream:
        self._require_started()
        sandbox = self._sandbox
        if sandbox is None:
            raise EnvironmentFailure(f"the Modal sandbox is not running yet {self.where}")
        errors = self._require_errors()
        token = secrets.token_hex(12)
        merged = {**self._env, **(env or {}), EXEC_MARK: token}
        workdir = cwd or (self.settings.workdir if self._workdir_ready else None)
        try:
            process = await sandbox.exec.aio(*argv, workdir=workdir, env=merged, text=False)
        except errors.foreign as exc:
            failure = self._translate(f"starting {argv[0]!r} {self.where}", exc)
            if isinstance(failure, EnvironmentFailure):
                failure = await self._explained(failure)
            raise failure from exc

        async def kill_leftovers() -> None:
            await self._kill_exec(token)

        return ModalExecStream(
            process,
            foreign=errors.foreign,
            close_stdin=not stdin,
            exit_grace=self.kill_grace + 3.0,
            reap=kill_leftovers if reap else None,
            diagnose=self._gone_reason if diagnose else None,
        )

    async def open_exec_stream(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stage: str | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> ModalExecStream:
        """Start ``argv`` in the sandbox, stdin and stdout as the stream (the relay's
        channel), after writing ``files`` into ``stage`` in the same exec. If its output
        ends because the sandbox stopped, the stream's stderr_tail says so."""
        argv, bundle = self._put_first(argv, stage, files)
        stream = await self._open_exec(list(argv), env=env, cwd=cwd, stdin=True, diagnose=True)
        if bundle:
            await self._send_bundle(stream, bundle)
        return stream

    async def _kill_exec(self, token: str) -> None:
        """Kill, inside the sandbox, an exec that did not end when its stream closed
        (Modal cannot kill one exec), with all it started."""
        argv = [self.python, "-c", HELPER_SOURCE, "kill", token, str(self.kill_grace)]
        try:
            stream = await self._open_exec(argv, env=None, cwd=None, stdin=False, reap=False)
            try:
                async for _ in stream:
                    pass
                await stream.wait()
            finally:
                await stream.aclose()
        except (BackendError, OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            log.warning("could not kill an exec's processes %s: %s", self.where, exc)

    async def execute(
        self,
        command: str,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        max_output_bytes: int = DEFAULT_MAX_COMMAND_OUTPUT,
    ) -> CommandResult:
        """Run ``command`` with /bin/sh in the sandbox (see ExecStreamEnvironment.execute).

        Raises SandboxGone if the sandbox stopped, also while the command ran.
        """
        try:
            result = await super().execute(
                command, timeout=timeout, cwd=cwd, max_output_bytes=max_output_bytes
            )
        except EnvironmentFailure as exc:
            raise await self._explained(exc) from exc
        if result.exit_code == 137 and not result.timed_out:  # SIGKILL: was it the sandbox?
            reason = await self._gone_reason()
            if reason is not None:
                raise SandboxGone(reason)
        return result

    async def _helper(self, verb: str, *args: str, data: bytes | None = None) -> bytes:
        try:
            return await super()._helper(verb, *args, data=data)
        except EnvironmentFailure as exc:
            raise await self._explained(exc) from exc

    async def remove_tree(self, path: str) -> None:
        """Remove a directory tree; nothing to do if the whole sandbox is gone."""
        try:
            await super().remove_tree(path)
        except SandboxGone as exc:
            log.info("not removing %s: %s", path, exc)


__all__ = [
    "SDK_MISSING",
    "ModalEnvironment",
    "ModalExecStream",
    "SandboxGone",
]
