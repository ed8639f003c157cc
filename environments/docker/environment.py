"""The Docker backend: one long-lived, locked-down container per task, driven through
the Docker Engine API with the docker SDK (any engine that serves that API: Docker,
or podman's ``podman system service``).

Lifecycle. :meth:`DockerEnvironment.start` finds the task's container again by its
labels and reuses it when it runs the same image with the same settings (a hash of
them is a label), else creates one running ``sleep infinity`` under an init process.
By default it is isolated: every capability dropped, ``no-new-privileges``, a pids,
memory and CPU limit, no network, a read-only root with tmpfs at ``/tmp`` and at the
working directory. Labels also name the owner (pid, start time, boot id and pid
namespace of the process that created it): :func:`reap_orphaned_containers` removes
containers whose owner died on this host without cleaning up, and every start runs
it. :meth:`DockerEnvironment.aclose` removes the container unless it is persistent.

Commands. Every command runs under a small stdlib launcher (stubs/_exec_helper.py,
run by the image's Python) that starts it in a new session with a fresh marker variable in
its environment. The processes of a command are found by that marker inside the
container, so a timeout kills them there, not just the exec client on the host (the
reference's weakness); what a finished command leaves in the background is killed
too, as on the local backend.

Files. ``docker cp`` (the archive API) cannot be used: on Docker it reads and writes
the layer *under* a tmpfs mount, so a file put into ``/tmp`` silently vanishes
(moby/moby#22020), and with a read-only root it is refused. File operations run the
same helper through an exec instead, as the container's user, with data through
stdin and stdout: errors are the real errno of the operation inside.

Everything blocking goes through ``anyio.to_thread``; docker and requests errors are
translated to :mod:`environments.errors` at this boundary and never leak.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any, ClassVar

import anyio
import anyio.abc

from hermes_sandbox.environments.docker.engine import (  # noqa: F401 - also for tests
    _SHARED,
    _SHARED_LOCK,
    LABEL_CONFIG,
    LABEL_MANAGED,
    LABEL_OWNER_BOOT,
    LABEL_OWNER_PID,
    LABEL_OWNER_PIDNS,
    LABEL_OWNER_START,
    LABEL_PERSIST,
    LABEL_SHARED,
    LABEL_SHARED_MADE,
    LABEL_TASK,
    SHARED_DIR_PREFIX,
    _call,
    _connect,
    _engine_message,
    _exec_socket_stream,
    _made_shared_dir,
    _make_shared_dir,
    _reap,
    _remove_shared_dir,
    _require_sdk,
    _short_id,
    _slug,
    owner_labels,
    reap_orphaned_containers,
)
from hermes_sandbox.environments.docker.settings import (
    IMAGE_VAR,
    DockerSettings,
    engine_address,
    shown_address,
)
from hermes_sandbox.environments.docker.stream import (
    DockerExecStream,
    NonBlockingSocketStream,
    ThreadedSocketStream,
)
from hermes_sandbox.environments.errors import BackendNotAvailable, EnvironmentFailure
from hermes_sandbox.environments.exec_stream import ExecStreamEnvironment
from hermes_sandbox.environments.settings import PROGRESS_LOGGER
from hermes_sandbox.threads import kill_limiter

try:
    import docker
    import docker.errors
    import docker.types
    import docker.utils
    import requests.exceptions
except ImportError:  # reported by DockerEnvironment.start, so DockerSettings works without it
    docker = None  # type: ignore[assignment]

log = logging.getLogger(__name__)
progress = logging.getLogger(PROGRESS_LOGGER)
PULL_REPORT_SECONDS = 5.0  # how often a pull's download progress is reported

# The options of _create_options that belong to the container's process, not to its
# host config (the low-level create takes them apart).
_PROCESS_OPTIONS = ("working_dir", "user")

JANITOR_PATH = str(resources.files(__package__).joinpath("janitor.py"))


def _janitor_env() -> dict[str, str]:
    """What the janitor's docker client reads (the engine's TLS settings, ~/.docker),
    and nothing else of this process's environment."""
    keep = ("HOME", "PATH", "SSL_CERT_FILE", "SSL_CERT_DIR")
    return {k: v for k, v in os.environ.items() if k.startswith("DOCKER_") or k in keep}


class DockerEnvironment(ExecStreamEnvironment):
    """A container of the task's own (see the module docstring).

    ``settings`` say which image and how locked down; ``env`` holds variables every
    command and process gets (added to the image's own; nothing of the host's leaks
    in otherwise); ``kill_grace`` is how long a command gets between SIGTERM and
    SIGKILL; ``python`` overrides ``settings.python``.

    Exec streams run on the event loop over the engine's socket; over TLS or SSH they
    use threads, and setting ``threaded_io`` forces that everywhere (for tests).
    """

    name: ClassVar[str] = "docker"
    settings_class: ClassVar[type[DockerSettings]] = DockerSettings
    where: ClassVar[str] = "in the container"

    settings: DockerSettings

    def _setup(self) -> None:
        self.task_id = self.settings.task_id or uuid.uuid4().hex
        self._client: Any = None
        self.container_id: str | None = None
        self.container_name: str | None = None
        self.reused = False  # start() attached to a container that was already running
        self._labels: dict[str, str] = {}  # the container's own labels
        self.threaded_io = False  # use threads for exec sockets even where not needed
        self._janitor: subprocess.Popen[bytes] | None = None

    @property
    def default_cwd(self) -> str:
        return self.settings.workdir

    @property
    def shared_directory(self) -> str | None:
        return self._labels.get(LABEL_SHARED) or None

    @property
    def discards_on_close(self) -> bool:
        """True while closing removes the container (no one else in this process uses
        it, it is not persistent) and a shared directory is only one made for it."""
        if self.container_id is None or self.settings.persist:
            return False
        if self._labels.get(LABEL_SHARED) and not _made_shared_dir(self._labels):
            return False  # the caller's own directory stays
        with _SHARED_LOCK:
            return _SHARED.get(self.container_id, 1) <= 1

    def _engine_is_local(self) -> bool:
        return engine_address(self.settings.docker_host).startswith("unix://")

    # -- lifecycle -----------------------------------------------------------------------

    async def _start(self) -> None:
        """Connect, reap orphans, then reuse or create the task's container.

        Raises BackendNotAvailable (no SDK, no engine, no image) or EnvironmentFailure.
        """
        _require_sdk()
        host = self.settings.docker_host
        self._client = await _connect(host)
        try:
            try:
                await anyio.to_thread.run_sync(
                    _reap, self._client, engine_address(self.settings.docker_host)
                )
            except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
                log.warning("could not reap orphaned containers: %s", _engine_message(exc))
            image_id = await self._image_id()
            await self._attach(image_id)
        except BaseException:
            self._client = None  # the process's shared client: not closed
            raise

    async def _image_id(self) -> str:
        image = self.settings.image
        try:
            try:
                found = await anyio.to_thread.run_sync(self._client.images.get, image)
            except docker.errors.ImageNotFound:
                await self._pull(image)
                found = await anyio.to_thread.run_sync(self._client.images.get, image)
        except docker.errors.ImageNotFound as exc:
            raise BackendNotAvailable(
                f"the image {image!r} is not in the container engine at "
                f"{shown_address(self.settings.docker_host)} and pulling it did not make it "
                "so: build hermes-sandbox-python:bookworm with scripts/podman-service, or "
                f"choose another image with DockerSettings(image=...) or ${IMAGE_VAR}"
            ) from exc
        except docker.errors.APIError as exc:
            raise EnvironmentFailure(
                f"looking up the image {image!r}: the engine said: {_engine_message(exc)}"
            ) from exc
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise EnvironmentFailure(f"looking up the image {image!r}: {exc}") from exc
        return str(found.id)

    async def _pull(self, image: str) -> None:
        """Pull a missing image, reporting its progress on the progress logger. Raises
        BackendNotAvailable when the engine cannot (no registry reachable, no such
        image): the message says how to get it another way."""
        progress.info("the image %s is not here: pulling it", image)
        repository, tag = docker.utils.parse_repository_tag(image)

        def pull() -> None:
            reported: float | None = None  # when download progress was last reported
            for event in self._client.api.pull(repository, tag=tag, stream=True, decode=True):
                if "error" in event:
                    raise docker.errors.APIError(str(event["error"]))
                status, layer = event.get("status", ""), event.get("id")
                if status in ("Downloading", "Extracting") and event.get("progress"):
                    now = time.monotonic()
                    if reported is not None and now - reported < PULL_REPORT_SECONDS:
                        continue
                    reported = now
                    status = f"{status} {event['progress']}"
                progress.info("pull %s: %s%s", image, f"{layer}: " if layer else "", status)

        try:
            await anyio.to_thread.run_sync(pull)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise BackendNotAvailable(
                f"the image {image!r} is not in the container engine at "
                f"{shown_address(self.settings.docker_host)}, and pulling it failed: "
                f"{_engine_message(exc)}. "
                "Pull or build it where a registry can be reached (docker pull "
                f"{image}; scripts/podman-service builds hermes-sandbox-python:bookworm), or "
                f"choose another image with DockerSettings(image=...) or ${IMAGE_VAR}"
            ) from exc
        progress.info("pulled the image %s", image)

    async def _attach(self, image_id: str) -> None:
        config = self.settings
        config_hash = config.creation_hash(image_id)
        if config.task_id is not None:
            filters = {
                "label": [
                    f"{LABEL_MANAGED}=1",
                    f"{LABEL_TASK}={config.task_id}",
                    f"{LABEL_CONFIG}={config_hash}",
                ]
            }
            found = await _call(
                "looking for the task's container",
                self._client.api.containers,
                all=True,
                filters=filters,
            )
            for entry in found:
                if self._claim(entry, image_id):
                    self.container_id = entry["Id"]
                    self.container_name = (entry.get("Names") or [""])[0].lstrip("/")
                    self._labels = dict(entry.get("Labels") or {})
                    self.reused = True
                    return
        labels = {
            **config.labels,
            LABEL_MANAGED: "1",
            LABEL_TASK: self.task_id,
            LABEL_CONFIG: config_hash,
            **owner_labels(),
        }
        if config.persist:
            labels[LABEL_PERSIST] = "1"
        if config.shared_dir == "auto":
            if self._engine_is_local():
                labels[LABEL_SHARED] = _make_shared_dir(
                    config.user, engine_address(config.docker_host)
                )
                labels[LABEL_SHARED_MADE] = "1"
        elif config.shared_dir:
            labels[LABEL_SHARED] = config.shared_dir
        name = f"hermes-sandbox-{_slug(self.task_id)}-{secrets.token_hex(3)}"
        client, options = self._client, self._create_options(labels.get(LABEL_SHARED))

        def create_and_start() -> str:
            # The low-level calls: the high-level create inspects what it made.
            process = {k: options.pop(k) for k in _PROCESS_OPTIONS if k in options}
            created = client.api.create_container(
                config.image,
                ["sleep", "infinity"],
                name=name,
                labels=labels,
                host_config=client.api.create_host_config(**options),
                **process,
            )
            container_id = str(created["Id"])
            try:
                client.api.start(container_id)
            except BaseException:  # a container that never ran is no use to anyone
                try:
                    client.api.remove_container(container_id, force=True, v=True)
                except docker.errors.APIError:
                    pass
                raise
            return container_id

        try:
            container_id = await _call(
                f"starting a container from {config.image!r}", create_and_start
            )
        except BaseException:
            _remove_shared_dir(labels)
            raise
        self._labels = labels
        self.container_id = container_id
        self.container_name = name
        with _SHARED_LOCK:
            _SHARED[self.container_id] = 1
        if not config.persist:
            self._start_janitor()

    def _start_janitor(self) -> None:
        """A host process that removes the container and its shared directory if this
        process dies first (environments/docker/janitor.py)."""
        assert self.container_id is not None
        argv = [sys.executable, "-E", "-s", JANITOR_PATH]
        argv += [engine_address(self.settings.docker_host), self.container_id]
        argv += [_made_shared_dir(self._labels) or ""]
        try:
            self._janitor = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                env=_janitor_env(),
            )
        except OSError as exc:  # the reaper of a later run takes what is left
            log.warning("could not start the container's janitor: %s", exc)

    async def _dismiss_janitor(self, done: bool) -> None:
        """End the janitor: ``done`` (the container is gone) or not (it retries)."""
        janitor, self._janitor = self._janitor, None
        if janitor is None or janitor.stdin is None:
            return
        try:
            if done:
                janitor.stdin.write(b"done")
            janitor.stdin.close()
        except OSError:
            pass
        await anyio.to_thread.run_sync(janitor.wait, limiter=kill_limiter())

    def _claim(self, entry: Mapping[str, Any], image_id: str) -> bool:
        """Whether a container found for the task may be used: it runs our image, and
        it is persistent or already in use by this process (another live process would
        remove it under us when it closes)."""
        if entry.get("State") != "running":
            return False
        if entry.get("ImageID") and _short_id(entry["ImageID"]) != _short_id(image_id):
            return False
        labels = entry.get("Labels") or {}
        with _SHARED_LOCK:
            if entry["Id"] in _SHARED:
                _SHARED[entry["Id"]] += 1
                return True
            if labels.get(LABEL_PERSIST) == "1":
                _SHARED[entry["Id"]] = 1
                return True
        return False

    def _create_options(self, shared_dir: str | None) -> dict[str, Any]:
        config = self.settings
        tmpfs = {"/tmp": f"rw,size={config.tmp_size},mode=1777"}
        targets = {m.target for m in config.mounts}
        if shared_dir:
            targets.add(shared_dir)
        if config.workdir not in targets and config.workdir != "/tmp":
            mode = "1777" if config.user else "755"
            tmpfs[config.workdir] = f"rw,size={config.workdir_size},mode={mode}"
        mounts = [
            docker.types.Mount(m.target, m.source, type="bind", read_only=m.read_only)
            for m in config.mounts
        ]
        if shared_dir:
            mounts.append(docker.types.Mount(shared_dir, shared_dir, type="bind", read_only=False))
        options: dict[str, Any] = {
            "init": True,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "read_only": config.read_only_root,
            "tmpfs": tmpfs,
            "mounts": mounts,
            "working_dir": config.workdir,
        }
        if not config.network:
            options["network_mode"] = "none"
        if config.user:
            options["user"] = config.user
        if config.pids_limit is not None:
            options["pids_limit"] = config.pids_limit
        if config.memory is not None:
            options["mem_limit"] = config.memory
            options["memswap_limit"] = config.memory  # no swap on top
        if config.cpus is not None:
            options["nano_cpus"] = int(config.cpus * 1e9)
        return options

    async def _stop(self) -> None:
        """Remove the container (unless persistent, or still used by another
        environment of this process) and disconnect."""
        client, self._client = self._client, None
        container_id, self.container_id = self.container_id, None
        if client is None:
            return
        try:
            if container_id is not None and self._release_share(container_id):
                try:
                    await anyio.to_thread.run_sync(
                        functools.partial(
                            client.api.remove_container, container_id, force=True, v=True
                        )
                    )
                except docker.errors.NotFound:
                    pass  # removed already (it died, or someone removed it)
                except (
                    docker.errors.DockerException,
                    requests.exceptions.RequestException,
                ) as exc:
                    # Not raised: aclose runs in finally blocks. The reaper takes the
                    # container (and its shared directory) once this process is gone.
                    log.warning(
                        "could not remove container %s: %s", container_id, _engine_message(exc)
                    )
                    await self._dismiss_janitor(done=False)  # it tries again, alone
                    return
                await anyio.to_thread.run_sync(_remove_shared_dir, self._labels)
        finally:
            await self._dismiss_janitor(done=True)

    def _release_share(self, container_id: str) -> bool:
        """Drop this environment's use of the container; True if it should go now."""
        with _SHARED_LOCK:
            users = _SHARED.get(container_id, 1) - 1
            if users > 0:
                _SHARED[container_id] = users
                return False
            _SHARED.pop(container_id, None)
        return not self.settings.persist

    # -- processes -------------------------------------------------------------------------

    async def open_exec_stream(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stage: str | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> DockerExecStream:
        """Start ``argv`` in the container with stdin and stdout as one stream (after
        writing ``files`` into ``stage`` in the same exec).

        A ``cwd`` that does not exist, or an ``argv[0]`` not found, is reported the way
        the engine reports it: exit code 126/127 from :meth:`DockerExecStream.wait` and
        the engine's message in ``stderr_tail``.
        """
        stream = await super().open_exec_stream(argv, env=env, cwd=cwd, stage=stage, files=files)
        assert isinstance(stream, DockerExecStream)
        return stream

    async def _open_exec(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | None,
        stdin: bool,
    ) -> DockerExecStream:
        self._require_started()
        container_id, client = self.container_id, self._client
        merged = {**self._env, **(env or {})}

        def begin() -> tuple[str, Any]:
            exec_id = client.api.exec_create(
                container_id,
                argv,
                stdin=stdin,
                stdout=True,
                stderr=True,
                tty=False,
                environment=[f"{k}={v}" for k, v in merged.items()],
                workdir=cwd,
                user=self.settings.user or "",
            )["Id"]
            return exec_id, client.api.exec_start(exec_id, socket=True)

        exec_id, raw = await _call(f"starting {argv[0]!r} in the container", begin)
        sock, pending = _exec_socket_stream(raw)
        transport: anyio.abc.ByteStream
        plain = isinstance(sock, socket.socket) and not isinstance(sock, ssl.SSLSocket)
        if plain and not self.threaded_io:
            transport = NonBlockingSocketStream(sock)
        else:
            transport = ThreadedSocketStream(sock)

        def release() -> None:
            # The response first: closing it closes its buffered reader, which must
            # still find the socket's file object open.
            for thing in (getattr(raw, "_response", None), raw):
                if thing is not None and hasattr(thing, "close"):
                    try:
                        thing.close()
                    except (OSError, ValueError):
                        pass

        async def inspect() -> Any:
            return await _call("asking about an exec", client.api.exec_inspect, exec_id)

        return DockerExecStream(transport, inspect, release, pending)


__all__ = [
    "DockerEnvironment",
    "DockerExecStream",
    "owner_labels",
    "reap_orphaned_containers",
]
