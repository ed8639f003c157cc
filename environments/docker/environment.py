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

Commands. Every command runs under a small stdlib launcher (environments/helper.py,
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
import re
import secrets
import shutil
import socket
import ssl
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import anyio
import anyio.abc
import psutil

from hermes_sandbox.environments.base import ExecStream
from hermes_sandbox.environments.docker.settings import (
    DEFAULT_DOCKER_SOCKET,
    IMAGE_VAR,
    SDK_MISSING,
    DockerSettings,
    engine_address,
    probe_unix_socket,
    shown_address,
)
from hermes_sandbox.environments.errors import BackendNotAvailable, EnvironmentFailure
from hermes_sandbox.environments.helper import HelperEnvironment

try:
    import docker
    import docker.errors
    import docker.types
    import requests.exceptions
except ImportError:  # reported by DockerEnvironment.start, so DockerSettings works without it
    docker = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

T = TypeVar("T")

LABEL_MANAGED = "hermes-sandbox.managed"  # "1" on every container this backend creates
LABEL_TASK = "hermes-sandbox.task"
LABEL_CONFIG = "hermes-sandbox.config"  # hash of the settings the container was made with
LABEL_PERSIST = "hermes-sandbox.persist"  # "1": kept by aclose, never reaped
LABEL_SHARED = "hermes-sandbox.shared-dir"  # the host directory mounted at the same path
LABEL_SHARED_MADE = "hermes-sandbox.shared-dir-made"  # "1": made for it, removed with it
LABEL_OWNER_PID = "hermes-sandbox.owner-pid"
LABEL_OWNER_START = "hermes-sandbox.owner-start"  # the owner's start time: pids get reused
LABEL_OWNER_BOOT = "hermes-sandbox.owner-boot-id"
LABEL_OWNER_PIDNS = "hermes-sandbox.owner-pidns"  # pids mean nothing across namespaces

_STDERR_TAIL = 8192


# -- the engine's multiplexed stream ---------------------------------------------------


class _FrameDemux:
    """Split an exec's output stream, as the engine sends it without a TTY.

    Every chunk of output is one frame with an 8-byte header::

        byte 0      stream: 0 stdin, 1 stdout, 2 stderr, 3 an error from the engine
        bytes 1-3   zero
        bytes 4-7   length of the payload, unsigned 32-bit big-endian

    :meth:`feed` takes bytes as they arrive, split anywhere, and returns the payload
    pieces with their stream number; a piece is passed on before its frame is complete.
    """

    __slots__ = ("_header", "_remaining", "_stream")

    def __init__(self) -> None:
        self._header = bytearray()
        self._stream = 0
        self._remaining = 0

    @property
    def mid_frame(self) -> bool:
        return bool(self._header) or self._remaining > 0

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        pieces: list[tuple[int, bytes]] = []
        pos, end = 0, len(data)
        while pos < end:
            if self._remaining == 0:
                take = min(8 - len(self._header), end - pos)
                self._header += data[pos : pos + take]
                pos += take
                if len(self._header) < 8:
                    break
                header = bytes(self._header)
                self._header.clear()
                if header[0] > 3 or header[1:4] != b"\0\0\0":
                    raise ValueError(f"not a multiplexed exec stream (header {header.hex()})")
                self._stream = header[0]
                self._remaining = int.from_bytes(header[4:8], "big")
                continue
            take = min(self._remaining, end - pos)
            pieces.append((self._stream, data[pos : pos + take]))
            pos += take
            self._remaining -= take
        return pieces


class _ThreadedSocketStream(anyio.abc.ByteStream):
    """A blocking socket-like object (a TLS socket, an SSH channel) used from threads:
    for engines reached through something the event loop cannot wait on directly."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        if hasattr(sock, "settimeout"):
            sock.settimeout(None)  # the SDK's request timeout would end an idle stream
        self._closed = False

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._closed:
            raise anyio.ClosedResourceError
        try:
            data = await anyio.to_thread.run_sync(
                self._sock.recv, max_bytes, abandon_on_cancel=True
            )
        except OSError as exc:
            if self._closed:
                raise anyio.ClosedResourceError from exc
            raise anyio.BrokenResourceError(str(exc)) from exc
        if not data:
            raise anyio.EndOfStream
        return bytes(data)

    async def send(self, item: bytes) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        try:
            await anyio.to_thread.run_sync(self._sock.sendall, item)
        except OSError as exc:
            raise anyio.BrokenResourceError(str(exc)) from exc

    async def send_eof(self) -> None:
        try:
            if hasattr(self._sock, "shutdown_write"):  # a paramiko channel
                self._sock.shutdown_write()
            else:
                self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv
        except (OSError, AttributeError, TypeError):
            pass
        self._sock.close()


class DockerExecStream(ExecStream):
    """An exec's stdin and stdout as one byte stream; stderr kept as a short tail.

    Built on the socket the engine hands over after ``POST /exec/{id}/start``
    (a hijacked HTTP connection), so a round trip costs no thread hop.
    """

    def __init__(
        self,
        transport: anyio.abc.ByteStream,
        inspect: Callable[[], Any],
        release: Callable[[], None],
        pending: bytes = b"",
    ) -> None:
        self._transport = transport
        self._inspect = inspect  # async: the exec's inspect data
        self._release = release  # blocking: close what the SDK keeps for the connection
        self._demux = _FrameDemux()
        self._ready: list[bytes] = []
        self._pending = pending  # read by the SDK's HTTP layer past the response headers
        self._eof = False
        self._eof_sent = False
        self._closed = False
        self._exit_code: int | None = None
        self.stderr_tail = b""

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while not self._ready:
            if self._eof:
                raise anyio.EndOfStream
            if self._pending:
                data, self._pending = self._pending, b""
            else:
                try:
                    data = await self._transport.receive()
                except anyio.EndOfStream:
                    self._eof = True
                    if self._demux.mid_frame:
                        raise anyio.BrokenResourceError(
                            "the engine closed the exec stream inside a frame"
                        ) from None
                    raise
            try:
                pieces = self._demux.feed(data)
            except ValueError as exc:
                raise anyio.BrokenResourceError(str(exc)) from exc
            for stream, piece in pieces:
                if stream == 1:
                    self._ready.append(piece)
                elif piece:  # stderr, or an error from the engine
                    self.stderr_tail = (self.stderr_tail + piece)[-_STDERR_TAIL:]
        chunk = self._ready[0]
        if len(chunk) <= max_bytes:
            self._ready.pop(0)
            return chunk
        self._ready[0] = chunk[max_bytes:]
        return chunk[:max_bytes]

    async def send(self, item: bytes) -> None:
        await self._transport.send(item)

    async def send_eof(self) -> None:
        self._eof_sent = True
        await self._transport.send_eof()

    async def wait(self) -> int:
        """Wait for the exec to finish: the engine offers no wait call for an exec, so
        this asks its state with a growing pause (5 ms up to 250 ms)."""
        delay = 0.005
        while self._exit_code is None:
            info = await self._inspect()
            if not info.get("Running") and info.get("ExitCode") is not None:
                self._exit_code = int(info["ExitCode"])
                break
            await anyio.sleep(delay)
            delay = min(delay * 2, 0.25)
        return self._exit_code

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            if not self._eof_sent:
                try:
                    await self._transport.send_eof()
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    pass
            await self._transport.aclose()
            await anyio.to_thread.run_sync(self._release)


# -- owners and the reaper -------------------------------------------------------------


def _read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


@functools.cache
def _host_identity() -> tuple[str, str]:
    """(boot id, pid namespace) of this process; empty where they cannot be read."""
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = ""
    return _read_text("/proc/sys/kernel/random/boot_id"), pidns


def owner_labels(pid: int | None = None) -> dict[str, str]:
    """The owner labels for a container made by process ``pid`` (default: this one)."""
    pid = os.getpid() if pid is None else pid
    boot_id, pidns = _host_identity()
    try:
        started = f"{psutil.Process(pid).create_time():.2f}"
    except psutil.Error:
        started = ""
    return {
        LABEL_OWNER_PID: str(pid),
        LABEL_OWNER_START: started,
        LABEL_OWNER_BOOT: boot_id,
        LABEL_OWNER_PIDNS: pidns,
    }


def _owner_gone(labels: Mapping[str, str]) -> bool:
    """True only when the owner is known to be dead: same boot and pid namespace as
    this process, and its pid absent, a zombie, or now another process."""
    boot_id, pidns = _host_identity()
    if not boot_id or labels.get(LABEL_OWNER_BOOT) != boot_id:
        return False
    if labels.get(LABEL_OWNER_PIDNS, "") != pidns:
        return False
    try:
        pid = int(labels.get(LABEL_OWNER_PID, ""))
    except ValueError:
        return False
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return True
        started = labels.get(LABEL_OWNER_START, "")
        return bool(started) and abs(process.create_time() - float(started)) > 1.0
    except psutil.NoSuchProcess:
        return True
    except (psutil.Error, ValueError):
        return False


SHARED_DIR_PREFIX = "hermes-sandbox-shared-"
_SHARED_ENGINE_FILE = "engine"  # beside "s": the engine whose container mounts it
_SHARED_DIR_GRACE = 120.0  # seconds: a directory younger than this may be mid-creation


def _make_shared_dir(user: str | None, engine: str) -> str:
    """A fresh host directory for one container's shared directory: ``<private>/s``,
    where ``<private>`` is 0700 (no other host user can reach in) and ``s`` is what is
    mounted, writable by the container's user (0700 for root, else 1777: the
    container's user may have any uid). ``<private>/engine`` names the engine, so the
    reaper of another engine leaves it alone."""
    private = tempfile.mkdtemp(prefix=SHARED_DIR_PREFIX)
    with open(os.path.join(private, _SHARED_ENGINE_FILE), "w") as f:
        f.write(engine)
    inner = os.path.join(private, "s")
    os.mkdir(inner)
    os.chmod(inner, 0o1777 if user else 0o700)
    return inner


def _sweep_shared_dirs(in_use: set[str], engine: str) -> list[str]:
    """Remove shared directories made for this engine's containers that no container
    uses any more (one removed by hand, or by something other than this runtime)."""
    removed = []
    parent = tempfile.gettempdir()
    now = time.time()
    for entry in os.scandir(parent):
        if not entry.name.startswith(SHARED_DIR_PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            with open(os.path.join(entry.path, _SHARED_ENGINE_FILE)) as f:
                owner = f.read()
            if owner != engine or os.path.join(entry.path, "s") in in_use:
                continue
            if now - entry.stat(follow_symlinks=False).st_mtime < _SHARED_DIR_GRACE:
                continue
        except OSError:
            continue  # not one of ours, or another user's
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed


def _remove_shared_dir(labels: Mapping[str, str]) -> None:
    """Remove the shared directory made for a container (not a caller's own)."""
    path = labels.get(LABEL_SHARED)
    if path and labels.get(LABEL_SHARED_MADE) == "1":
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def _reap(client: Any, engine: str) -> list[str]:
    """Remove this runtime's containers whose owner died on this host, and shared
    directories of this engine that no container uses; blocking. One listing of the
    engine's containers serves both."""
    boot_id, _ = _host_identity()
    if not boot_id:
        return []
    removed = []
    in_use = set()
    for entry in client.api.containers(all=True, filters={"label": f"{LABEL_MANAGED}=1"}):
        labels = entry.get("Labels") or {}
        if labels.get(LABEL_PERSIST) == "1" or not _owner_gone(labels):  # (same boot only)
            in_use.add(labels.get(LABEL_SHARED, ""))
            continue
        try:
            client.api.remove_container(entry["Id"], force=True, v=True)
        except docker.errors.APIError as exc:  # gone already, or being removed by another
            log.debug("not reaping %s: %s", entry["Id"][:12], _engine_message(exc))
            in_use.add(labels.get(LABEL_SHARED, ""))
            continue
        _remove_shared_dir(labels)
        names = entry.get("Names") or [entry["Id"][:12]]
        removed.append(names[0].lstrip("/"))
    if removed:
        log.info("removed containers left by dead owners: %s", ", ".join(removed))
    for path in _sweep_shared_dirs(in_use, engine):
        log.info("removed a shared directory no container uses: %s", path)
    return removed


async def reap_orphaned_containers(docker_host: str | None = None) -> list[str]:
    """Remove containers of this runtime whose owner process died on this host
    (same boot, same pid namespace, pid gone), unless they are persistent.

    Returns the names removed. Raises BackendNotAvailable when no engine answers,
    EnvironmentFailure when the engine refuses.
    """
    host = docker_host if docker_host is not None else (os.environ.get("DOCKER_HOST") or None)
    client = await _connect(host)
    try:
        return await _call(f"reaping at {shown_address(host)}", _reap, client, engine_address(host))
    finally:
        await anyio.to_thread.run_sync(client.close)


# -- talking to the engine -------------------------------------------------------------


def _require_sdk() -> None:
    if docker is None:
        raise BackendNotAvailable(SDK_MISSING)


def _short_id(image_id: str) -> str:
    return image_id.split(":", 1)[-1]


def _engine_message(exc: BaseException) -> str:
    explanation = getattr(exc, "explanation", None)
    if isinstance(explanation, bytes):
        explanation = explanation.decode("utf-8", "replace")
    return str(explanation or exc)


async def _call(doing: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking SDK call in a thread; translate what it raises."""
    try:
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))
    except docker.errors.NotFound as exc:
        raise EnvironmentFailure(f"{doing}: not found: {_engine_message(exc)}") from exc
    except docker.errors.APIError as exc:
        raise EnvironmentFailure(f"{doing}: the engine said: {_engine_message(exc)}") from exc
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise EnvironmentFailure(f"{doing}: lost the container engine: {exc}") from exc


async def _connect(host: str | None) -> Any:
    """A client that has had an answer from the engine; BackendNotAvailable otherwise."""
    _require_sdk()
    effective = host or os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_SOCKET

    def connect() -> Any:
        if effective.startswith("unix://"):
            probe_unix_socket(effective[len("unix://") :])
        # from_env also reads DOCKER_TLS_VERIFY and DOCKER_CERT_PATH; asking the
        # engine's API version (version=None) is the first request, so it either
        # answers here or this raises.
        environment = dict(os.environ)
        if host:
            environment["DOCKER_HOST"] = host
        return docker.from_env(environment=environment)

    try:
        return await anyio.to_thread.run_sync(connect)
    except (
        OSError,
        docker.errors.DockerException,
        requests.exceptions.RequestException,
    ) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else None
        raise BackendNotAvailable(
            f"no container engine answers at {shown_address(host)}: "
            f"{reason or _engine_message(exc)}. "
            "Start Docker, or run scripts/podman-service (podman serving the Docker API) and "
            "export the DOCKER_HOST it prints; or set DockerSettings.docker_host."
        ) from exc


def _exec_socket_stream(raw: Any) -> tuple[Any, bytes]:
    """The connection under an exec's response, and what the SDK's HTTP layer already
    read from it past the headers (it reads through a buffer)."""
    sock = getattr(raw, "_sock", raw)  # socket.SocketIO over a plain socket, or the socket
    pending = b""
    response = getattr(raw, "_response", None)
    buffered = getattr(getattr(getattr(response, "raw", None), "_fp", None), "fp", None)
    if buffered is not None and hasattr(sock, "setblocking"):
        timeout = sock.gettimeout()
        sock.setblocking(False)
        try:
            pending = buffered.read1(1 << 20) or b""
        except OSError:
            pending = b""
        finally:
            sock.settimeout(timeout)
    return sock, pending


# Containers this process uses, with how many open environments share each: a
# container is removed when its last user in this process closes.
_SHARED: dict[str, int] = {}
_SHARED_LOCK = threading.Lock()


def _slug(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "-", text).strip("-.")[:40] or "task"


class DockerEnvironment(HelperEnvironment):
    """A container of the task's own (see the module docstring).

    ``config`` says which image and how locked down; ``env`` holds variables every
    command and process gets (added to the image's own; nothing of the host's leaks
    in otherwise); ``kill_grace`` is how long a command gets between SIGTERM and
    SIGKILL; ``python`` overrides ``config.python``.

    Exec streams run on the event loop over the engine's socket; over TLS or SSH they
    use threads, and setting ``threaded_io`` forces that everywhere (for tests).
    """

    name: ClassVar[str] = "docker"
    settings_class: ClassVar[type[DockerSettings]] = DockerSettings
    where: ClassVar[str] = "in the container"

    def __init__(
        self,
        config: DockerSettings | None = None,
        *,
        env: Mapping[str, str] | None = None,
        kill_grace: float = 2.0,
        python: str | None = None,
    ) -> None:
        self.config = config or DockerSettings()
        self.task_id = self.config.task_id or uuid.uuid4().hex
        self._env = dict(env or {})
        self.kill_grace = kill_grace
        self._python = python or self.config.python
        self._client: Any = None
        self.container_id: str | None = None
        self.container_name: str | None = None
        self.reused = False  # start() attached to a container that was already running
        self._labels: dict[str, str] = {}  # the container's own labels
        self._closed = False
        self.threaded_io = False  # use threads for exec sockets even where not needed

    @property
    def default_cwd(self) -> str:
        return self.config.workdir

    @property
    def shared_directory(self) -> str | None:
        return self._labels.get(LABEL_SHARED) or None

    def _engine_is_local(self) -> bool:
        return engine_address(self.config.docker_host).startswith("unix://")

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, reap orphans, then reuse or create the task's container.

        Raises BackendNotAvailable (no SDK, no engine, no image) or EnvironmentFailure.
        """
        if self._closed:
            raise EnvironmentFailure("this docker environment was closed; make a new one")
        if self.container_id is not None:
            return
        _require_sdk()
        host = self.config.docker_host
        self._client = await _connect(host)
        try:
            try:
                await anyio.to_thread.run_sync(
                    _reap, self._client, engine_address(self.config.docker_host)
                )
            except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
                log.warning("could not reap orphaned containers: %s", _engine_message(exc))
            image_id = await self._image_id()
            await self._attach(image_id)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._client.close)
            self._client = None
            raise

    async def _image_id(self) -> str:
        image = self.config.image
        try:
            found = await anyio.to_thread.run_sync(self._client.images.get, image)
        except docker.errors.ImageNotFound as exc:
            raise BackendNotAvailable(
                f"the image {image!r} is not in the container engine at "
                f"{shown_address(self.config.docker_host)}: pull it (docker pull {image}), or "
                "build hermes-sandbox-python:bookworm with scripts/podman-service, or choose "
                f"another image with DockerSettings(image=...) or ${IMAGE_VAR}"
            ) from exc
        except docker.errors.APIError as exc:
            raise EnvironmentFailure(
                f"looking up the image {image!r}: the engine said: {_engine_message(exc)}"
            ) from exc
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise EnvironmentFailure(f"looking up the image {image!r}: {exc}") from exc
        return str(found.id)

    async def _attach(self, image_id: str) -> None:
        config = self.config
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

        def create_and_start() -> Any:
            container = client.containers.create(
                config.image, ["sleep", "infinity"], name=name, labels=labels, **options
            )
            try:
                container.start()
            except BaseException:  # a container that never ran is no use to anyone
                try:
                    container.remove(force=True, v=True)
                except docker.errors.APIError:
                    pass
                raise
            return container

        try:
            container = await _call(f"starting a container from {config.image!r}", create_and_start)
        except BaseException:
            _remove_shared_dir(labels)
            raise
        self._labels = labels
        self.container_id = str(container.id)
        self.container_name = name
        with _SHARED_LOCK:
            _SHARED[self.container_id] = 1

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
        config = self.config
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

    async def aclose(self) -> None:
        """Remove the container (unless persistent, or still used by another
        environment of this process) and disconnect. Idempotent; not cancellable."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
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
                        return
                    await anyio.to_thread.run_sync(_remove_shared_dir, self._labels)
            finally:
                await anyio.to_thread.run_sync(client.close)

    def _release_share(self, container_id: str) -> bool:
        """Drop this environment's use of the container; True if it should go now."""
        with _SHARED_LOCK:
            users = _SHARED.get(container_id, 1) - 1
            if users > 0:
                _SHARED[container_id] = users
                return False
            _SHARED.pop(container_id, None)
        return not self.config.persist

    def _require_started(self) -> str:
        if self.container_id is None:
            state = "closed" if self._closed else "not started"
            raise EnvironmentFailure(f"the docker environment is {state}")
        return self.container_id

    # -- processes -------------------------------------------------------------------------

    async def open_exec_stream(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> DockerExecStream:
        """Start ``argv`` in the container with stdin and stdout as one stream.

        A ``cwd`` that does not exist, or an ``argv[0]`` not found, is reported the way
        the engine reports it: exit code 126/127 from :meth:`DockerExecStream.wait` and
        the engine's message in ``stderr_tail``.
        """
        return await self._open_exec(list(argv), env=env, cwd=cwd, stdin=True)

    async def _open_exec(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | None,
        stdin: bool,
    ) -> DockerExecStream:
        container_id = self._require_started()
        client = self._client
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
                user=self.config.user or "",
            )["Id"]
            return exec_id, client.api.exec_start(exec_id, socket=True)

        exec_id, raw = await _call(f"starting {argv[0]!r} in the container", begin)
        sock, pending = _exec_socket_stream(raw)
        transport: anyio.abc.ByteStream
        plain = isinstance(sock, socket.socket) and not isinstance(sock, ssl.SSLSocket)
        if plain and not self.threaded_io and hasattr(anyio.abc.SocketStream, "from_socket"):
            transport = await anyio.abc.SocketStream.from_socket(sock)
        else:
            transport = _ThreadedSocketStream(sock)

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
