"""The Apptainer/Singularity backend: one long-lived instance per task, driven through
the ``apptainer`` command line (or ``singularity`` where only that is installed).

Targeted CLI. The flags used here were checked against Apptainer 1.4 (the
``apptainer-instance-start(1)``, ``apptainer-exec(1)``, ``apptainer-instance-list(1)``
and ``apptainer-instance-stop(1)`` man pages of apptainer 1.4.x, the user guide's
"Environment and Metadata" and "Network virtualization" chapters, the flag
definitions in ``cmd/internal/cli/action_flags.go`` and ``cgroups.go`` of
apptainer/apptainer, and its CHANGELOG). They need Apptainer 1.1 or later (the cgroup
limit flags and ``--no-eval`` arrived in 1.1.0), or SingularityCE 3.10 or later:

- ``instance start [--containall] [--no-home] [--writable-tmpfs | --overlay PATH]
  [--bind SRC:DST:ro|rw]... [--net --network none] [--memory SIZE] [--cpus N]
  [--pids-limit N] IMAGE NAME``. ``--net --network none`` gives a network namespace
  with loopback only; ``none`` is the one network type unprivileged users may ask for.
  ``--memory``, ``--cpus`` and ``--pids-limit`` are cgroup limits: they need cgroups v2
  with systemd delegation for a non-root user (or root), so they are off by default.
- ``instance list --json PATTERN`` prints ``{"instances": [{"instance": NAME, "pid":
  PID, "img": IMAGE, ...}]}``.
- ``exec --cleanenv --no-eval --pwd DIR instance://NAME ARGV...`` runs a command in
  the instance's namespaces with stdin and stdout attached.
- ``instance stop NAME`` stops the instance; with ``--containall`` (which implies a PID
  namespace) everything still running in it goes with it.

Lifecycle. :meth:`SingularityEnvironment.start` finds the executable on PATH, lists
this runtime's instances (names start with ``hermes-``) and stops those whose owner
died on this host, then reuses or starts the task's instance. A persistent instance
is named ``hermes-<task>-<settings hash>`` and found again by that name by any later
run with the same settings. Any other instance's name adds its owner (boot and PID
namespace, pid and start time of the process that started it) and a random suffix:
it is shared only by environments of the same process for the same task and stopped
when the last of them closes; the reaper takes it if the owner dies first.

Commands and files go through :class:`~environments.exec_stream.ExecStreamEnvironment`: each is
an ``apptainer exec`` into the instance running the stdlib helper with the image's
Python; :meth:`SingularityEnvironment._open_exec` is a local subprocess whose stdin and
stdout are the stream (:class:`~environments.local.LocalExecStream`).

Environment variables. Every exec runs with ``--cleanenv``, so nothing of the host's
environment leaks in. The variables a command should see travel as
``APPTAINERENV_NAME=value`` (``SINGULARITYENV_`` when the executable is
``singularity``) in the environment of the ``apptainer`` process, never as ``--env`` on
its command line: another user can read a process's command line in /proc, not its
environment. ``--no-eval`` keeps Apptainer from shell-evaluating the values inside (a
``$`` in a value stays a ``$``).

Shared directory. With ``shared_dir`` set, each instance gets a private (0700) host
directory under it, bind-mounted read-write at the same path inside; it is the
environment's :attr:`shared_directory`, where the runtime stages runs to serve tool
calls over a Unix socket or files there instead of through the relay.

Tested against a stand-in (tests/fakes/apptainer) that records its arguments and runs
commands on this machine: no Apptainer is installed where the tests run.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import stat as stat_module
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import anyio
import anyio.abc
import psutil

from hermes_sandbox.environments.errors import BackendNotAvailable, EnvironmentFailure
from hermes_sandbox.environments.exec_stream import ExecStreamEnvironment
from hermes_sandbox.environments.local import LocalExecStream, open_local
from hermes_sandbox.environments.settings import DEFAULT_PYTHON_IMAGE
from hermes_sandbox.environments.singularity.settings import (
    IMAGE_VAR,
    SingularitySettings,
    find_executable,
)

log = logging.getLogger(__name__)

NAME_PREFIX = "hermes-"
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_INSTANCE_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
# A non-persistent instance's name ends with its owner and a random suffix.
_OWNED_RE = re.compile(r"-(?P<host>[0-9a-f]{6})p(?P<pid>\d+)s(?P<start>\d+)-[0-9a-f]{6}$")
_DRAIN_SECONDS = 1.0
_LIST_TIMEOUT = 60.0
_STOP_TIMEOUT = 60.0


# -- owners ------------------------------------------------------------------------------


def _read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


@functools.cache
def _host_key() -> str:
    """Six hex digits naming this boot and PID namespace: pids mean nothing elsewhere."""
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = ""
    boot_id = _read_text("/proc/sys/kernel/random/boot_id")
    return hashlib.sha256(f"{boot_id}/{pidns}".encode()).hexdigest()[:6]


def _start_time(pid: int) -> int | None:
    try:
        return round(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def owner_token(pid: int | None = None) -> str:
    """The owner part of a non-persistent instance's name, for process ``pid``."""
    pid = os.getpid() if pid is None else pid
    return f"{_host_key()}p{pid}s{_start_time(pid) or 0}"


def _owner_gone(name: str) -> bool:
    """True only when ``name`` is a non-persistent instance whose owner is known dead:
    started on this boot in this PID namespace, and its pid gone, a zombie, or now
    another process."""
    match = _OWNED_RE.search(name)
    if match is None or match["host"] != _host_key():
        return False
    pid, started = int(match["pid"]), int(match["start"])
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return True
        return abs(round(process.create_time()) - started) > 1
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def _slug(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "-", text).strip("-.")[:32] or "task"


# -- the executable ----------------------------------------------------------------------


def _env_prefix(executable: str) -> str:
    """How the executable takes variables for the container: SingularityCE only reads
    SINGULARITYENV_, Apptainer prefers APPTAINERENV_ (and still reads the other)."""
    return (
        "SINGULARITYENV_"
        if os.path.basename(executable).startswith("singularity")
        else "APPTAINERENV_"
    )


def _last_lines(data: bytes, limit: int = 2000) -> str:
    return data.decode("utf-8", "replace").strip()[-limit:]


@dataclass(frozen=True, slots=True)
class _CommandResult:
    code: int
    stdout: bytes
    stderr: bytes


# Instances this process uses, with how many open environments share each; and the
# non-persistent instance this process runs for each task key.
_SHARED: dict[str, int] = {}
_TASK_INSTANCES: dict[str, str] = {}
_SHARED_LOCK = threading.Lock()


class SingularityEnvironment(ExecStreamEnvironment):
    """An Apptainer instance of the task's own (see the module docstring).

    ``settings`` say which image and how contained; ``env`` holds variables every
    command and process gets (nothing of the host's environment leaks in otherwise);
    ``kill_grace`` is how long a command gets between SIGTERM and SIGKILL; ``python``
    overrides ``settings.python``.
    """

    name: ClassVar[str] = "singularity"
    settings_class: ClassVar[type[SingularitySettings]] = SingularitySettings
    where: ClassVar[str] = "in the Apptainer instance"

    settings: SingularitySettings

    def _setup(self) -> None:
        self.task_id = self.settings.task_id or uuid.uuid4().hex
        bad = [key for key in self._env if not _ENV_NAME_RE.match(key)]
        if bad:
            raise ValueError(f"environment variable names must be identifiers, got {bad}")
        self.executable: str | None = None
        self.instance_name: str | None = None
        self.reused = False  # start() attached to an instance that was already running
        self._shared_path: str | None = None

    @property
    def default_cwd(self) -> str:
        return self.settings.workdir

    @property
    def shared_directory(self) -> str | None:
        return self._shared_path if self.instance_name is not None else None

    @property
    def task_key(self) -> str:
        """The name of the task's persistent instance, and the start of every name of
        its other instances: task and settings."""
        return f"{NAME_PREFIX}{_slug(self.task_id)}-{self.settings.settings_hash()}"

    # -- running the command line ------------------------------------------------------

    def _cli_env(self, container_env: Mapping[str, str] | None) -> dict[str, str]:
        """The apptainer process's own environment: this process's, less any variables
        meant for containers, plus ``container_env`` in the form the executable reads."""
        assert self.executable is not None
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("APPTAINERENV_", "SINGULARITYENV_"))
        }
        if container_env:
            prefix = _env_prefix(self.executable)
            for key, value in container_env.items():
                env[prefix + key] = value
        return env

    async def _cli(self, args: Sequence[str], *, doing: str, timeout: float) -> _CommandResult:
        """Run ``apptainer ARGS`` to completion (killed after ``timeout`` seconds or
        when cancelled); raise EnvironmentFailure if it cannot be run or times out."""
        assert self.executable is not None
        argv = [self.executable, *args]
        log.debug("running %s", argv)
        try:
            process = await anyio.open_process(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._cli_env(None),
                start_new_session=True,
            )
        except OSError as exc:
            raise EnvironmentFailure(f"{doing}: cannot run {self.executable}: {exc}") from exc
        out, err = bytearray(), bytearray()

        async def drain(stream: anyio.abc.ByteReceiveStream | None, sink: bytearray) -> None:
            if stream is None:
                return
            async for chunk in stream:
                sink += chunk

        try:
            with anyio.fail_after(timeout):
                async with anyio.create_task_group() as pumps:
                    pumps.start_soon(drain, process.stdout, out)
                    pumps.start_soon(drain, process.stderr, err)
                    await process.wait()
                    # Whatever it left holding the pipes must not hold us.
                    pumps.cancel_scope.deadline = anyio.current_time() + _DRAIN_SECONDS
        except TimeoutError:
            raise EnvironmentFailure(
                f"{doing}: `{' '.join(argv[:3])} ...` did not finish within {timeout:g}s"
            ) from None
        finally:
            with anyio.CancelScope(shield=True):
                if process.returncode is None:
                    try:
                        os.killpg(process.pid, signal.SIGKILL)
                    except OSError:
                        pass
                    await process.wait()
                await process.aclose()
        assert process.returncode is not None
        return _CommandResult(process.returncode, bytes(out), bytes(err))

    async def _list_instances(self, pattern: str) -> dict[str, Mapping[str, Any]]:
        """The running instances whose name matches the glob ``pattern``, by name."""
        result = await self._cli(
            ["instance", "list", "--json", pattern],
            doing="listing the Apptainer instances",
            timeout=_LIST_TIMEOUT,
        )
        if result.code != 0:
            raise EnvironmentFailure(
                f"`{self.executable} instance list` failed (exit code {result.code}): "
                f"{_last_lines(result.stderr)}"
            )
        try:
            listing = json.loads(result.stdout or b"{}")
            entries = listing.get("instances") or []
            return {str(entry["instance"]): entry for entry in entries}
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise EnvironmentFailure(
                f"`{self.executable} instance list --json` printed something unexpected "
                f"({exc}): {_last_lines(result.stdout, 500)}"
            ) from exc

    async def _stop_instance(self, name: str) -> bool:
        """Stop an instance; log (never raise) a failure. True if it is gone."""
        try:
            result = await self._cli(
                ["instance", "stop", name],
                doing=f"stopping the instance {name}",
                timeout=_STOP_TIMEOUT,
            )
        except EnvironmentFailure as exc:
            log.warning("could not stop Apptainer instance %s: %s", name, exc)
            return False
        if result.code != 0:
            log.warning(
                "could not stop Apptainer instance %s (exit code %d): %s",
                name,
                result.code,
                _last_lines(result.stderr),
            )
            return False
        return True

    # -- lifecycle -----------------------------------------------------------------------

    def _shared_path_for(self, name: str) -> str | None:
        if self.settings.shared_dir is None:
            return None
        digest = hashlib.sha256(name.encode()).hexdigest()[:12]
        return os.path.join(self.settings.shared_dir, f"hs-{digest}")

    async def _start(self) -> None:
        """Find the executable, reap orphans, then reuse or start the task's instance.

        Raises BackendNotAvailable (no apptainer or singularity, an image it cannot
        open) or EnvironmentFailure.
        """
        self.executable = await anyio.to_thread.run_sync(find_executable, self.settings.executable)
        running = await self._list_instances(f"{NAME_PREFIX}*")
        await self._reap(running)
        key = self.task_key
        if self.settings.persist:
            name = key
        else:
            with _SHARED_LOCK:
                mine = _TASK_INSTANCES.get(key) if self.settings.task_id is not None else None
            if mine is None or mine not in running:
                mine = f"{key}-{owner_token()}-{secrets.token_hex(3)}"
            name = mine
        with _SHARED_LOCK:
            if name in running:
                _SHARED[name] = _SHARED.get(name, 0) + 1
                self.reused = True
        if self.reused:
            self.instance_name = name
            self._shared_path = self._shared_path_for(name)
            if self._shared_path is not None:
                await anyio.to_thread.run_sync(_make_shared_dir, self._shared_path)
            return
        await self._start_instance(name)

    async def _start_instance(self, name: str) -> None:
        config = self.settings
        shared = self._shared_path_for(name)
        try:
            if shared is not None:
                await anyio.to_thread.run_sync(_make_shared_dir, shared)
            args = ["instance", "start", *self._start_options(shared), config.image, name]
            result = await self._cli(
                args, doing=f"starting an instance of {config.image}", timeout=config.start_timeout
            )
            if result.code != 0:
                raise self._start_failure(result)
            self.instance_name = name
            self._shared_path = shared
            with _SHARED_LOCK:
                _SHARED[name] = 1
                if config.task_id is not None and not config.persist:
                    _TASK_INSTANCES[self.task_key] = name
            if config.workdir != "/tmp":
                await self._make_workdir()
        except BaseException:
            # A cancelled or failed start may still have left a running instance.
            with anyio.CancelScope(shield=True):
                running = {}
                try:
                    running = await self._list_instances(name)
                except EnvironmentFailure as exc:
                    log.warning("could not check for a half-started instance: %s", exc)
                if name in running:
                    await self._stop_instance(name)
                self._forget(name)
                self.instance_name = None
                self._shared_path = None
                if shared is not None and not config.persist:
                    await anyio.to_thread.run_sync(_remove_shared_dir, shared)
            raise

    def _start_options(self, shared: str | None) -> list[str]:
        config = self.settings
        options: list[str] = []
        if config.containall:
            options.append("--containall")
        if config.no_home:
            options.append("--no-home")
        if config.overlay is not None:
            options += ["--overlay", config.overlay]
        elif config.writable_tmpfs:
            options.append("--writable-tmpfs")
        for bind in config.binds:
            options += ["--bind", bind.spec()]
        if shared is not None:
            options += ["--bind", f"{shared}:{shared}:rw"]
        if not config.network:
            options += ["--net", "--network", "none"]
        if config.memory is not None:
            options += ["--memory", str(config.memory)]
        if config.cpus is not None:
            options += ["--cpus", str(config.cpus)]
        if config.pids_limit is not None:
            options += ["--pids-limit", str(config.pids_limit)]
        return options

    def _start_failure(self, result: _CommandResult) -> Exception:
        image = self.settings.image
        said = _last_lines(result.stderr) or _last_lines(result.stdout)
        if "could not open image" in said:
            return BackendNotAvailable(
                f"{os.path.basename(self.executable or 'apptainer')} cannot open the image "
                f"{image!r}: {said}. Build or pull it first (apptainer pull image.sif "
                f"docker://{DEFAULT_PYTHON_IMAGE}), or set the backend's `image` to a SIF file "
                f"or a docker:// URI (or export ${IMAGE_VAR})"
            )
        return EnvironmentFailure(
            f"`{os.path.basename(self.executable or 'apptainer')} instance start` failed for "
            f"{image!r} (exit code {result.code}): {said}"
        )

    async def _make_workdir(self) -> None:
        stream = await self._open_exec(
            ["mkdir", "-p", self.settings.workdir], env=None, cwd="/", stdin=False
        )
        try:
            async for _ in stream:
                pass
            code = await stream.wait()
        finally:
            with anyio.CancelScope(shield=True):
                await stream.aclose()
        if code != 0:
            raise EnvironmentFailure(
                f"could not make the working directory {self.settings.workdir!r} "
                f"{self.where} (exit code {code}): {_last_lines(stream.stderr_tail)}"
            )

    async def _reap(self, running: Mapping[str, Any]) -> list[str]:
        """Stop this runtime's instances whose owner died on this host."""
        with _SHARED_LOCK:
            ours = set(_SHARED)
        reaped = []
        for name in running:
            if name in ours or not _owner_gone(name):
                continue
            if await self._stop_instance(name):
                reaped.append(name)
                shared = self._shared_path_for(name)
                if shared is not None:
                    await anyio.to_thread.run_sync(_remove_shared_dir, shared)
        if reaped:
            log.info("stopped Apptainer instances left by dead owners: %s", ", ".join(reaped))
        return reaped

    def _forget(self, name: str) -> bool:
        """Drop this environment's use of the instance; True if it should stop now."""
        with _SHARED_LOCK:
            users = _SHARED.get(name, 1) - 1
            if users > 0:
                _SHARED[name] = users
                return False
            _SHARED.pop(name, None)
            if _TASK_INSTANCES.get(self.task_key) == name:
                del _TASK_INSTANCES[self.task_key]
        return not self.settings.persist

    async def _stop(self) -> None:
        """Stop the instance (unless persistent, or still used by another environment
        of this process) and remove its shared directory."""
        name, self.instance_name = self.instance_name, None
        shared, self._shared_path = self._shared_path, None
        if name is None or not self._forget(name):
            return
        # Not raised when it fails: aclose runs in finally blocks. The reaper takes
        # the instance once this process is gone.
        await self._stop_instance(name)
        if shared is not None:
            await anyio.to_thread.run_sync(_remove_shared_dir, shared)

    # -- processes -------------------------------------------------------------------------

    async def _open_exec(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | None,
        stdin: bool,
    ) -> LocalExecStream:
        """``apptainer exec --cleanenv --no-eval --pwd CWD instance://NAME ARGV`` as a local
        process: its stdin and stdout are the stream, its stderr the stream's tail."""
        self._require_started()
        name = self.instance_name
        if name is None:
            raise EnvironmentFailure("the singularity instance is not running yet")
        merged = {**self._env, **(env or {})}
        bad = [key for key in merged if not _ENV_NAME_RE.match(key)]
        if bad:
            raise EnvironmentFailure(f"environment variable names must be identifiers: {bad}")
        assert self.executable is not None
        command = [
            self.executable,
            "exec",
            "--cleanenv",
            "--no-eval",
            "--pwd",
            cwd or self.settings.workdir,
            f"instance://{name}",
            *argv,
        ]
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 - owned by the stream
        try:
            # Under the supervisor, like every local launch: what the command leaves on
            # this machine dies with it, or with this host process.
            handle = await open_local(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                cwd=None,
                env=self._cli_env(merged),
            )
        except OSError as exc:
            stderr.close()
            raise EnvironmentFailure(f"cannot run {self.executable}: {exc}") from exc
        except BaseException:
            stderr.close()
            raise
        stream = LocalExecStream(handle, stderr)
        if not stdin:
            await stream.send_eof()
        return stream


# -- the shared directory (blocking helpers, called through anyio.to_thread) -----------


def _make_shared_dir(path: str) -> None:
    """Make ``path`` a private directory of this user, or check that it is one."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        st = os.lstat(path)
        if not stat_module.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            raise EnvironmentFailure(
                f"the shared directory {path} exists and is not a directory of this user; "
                "remove it or choose another shared_dir"
            ) from None
        os.chmod(path, 0o700)
    except OSError as exc:
        raise EnvironmentFailure(f"cannot make the shared directory {path}: {exc}") from exc


def _remove_shared_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


__all__ = [
    "SingularityEnvironment",
    "find_executable",
    "owner_token",
]
