"""The docker backend's side of the engine: connecting, translating the SDK's errors,
the labels that name a container's owner, and the reaper of containers (and shared
directories) whose owner died on this host."""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import anyio
import anyio.abc
import psutil

from hermes_sandbox.environments.docker.settings import (
    DEFAULT_DOCKER_SOCKET,
    SDK_MISSING,
    engine_address,
    probe_unix_socket,
    shown_address,
)
from hermes_sandbox.environments.errors import BackendNotAvailable, EnvironmentFailure

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


def _made_shared_dir(labels: Mapping[str, str]) -> str | None:
    """The directory made to share with a container (to remove with it), if any: a
    caller's own shared directory is never removed."""
    path = labels.get(LABEL_SHARED)
    if path and labels.get(LABEL_SHARED_MADE) == "1":
        return os.path.dirname(path)
    return None


def _remove_shared_dir(labels: Mapping[str, str]) -> None:
    """Remove the shared directory made for a container (not a caller's own)."""
    made = _made_shared_dir(labels)
    if made:
        shutil.rmtree(made, ignore_errors=True)


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
    return await _call(f"reaping at {shown_address(host)}", _reap, client, engine_address(host))


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


# One client per engine per process: a new client asks the engine its API version
# first (GET /version), which podman answers in most of a second. Keyed by what
# docker.from_env reads; a forked child makes its own (the pid is in the key).
_CLIENTS: dict[tuple[Any, ...], Any] = {}
_CLIENTS_LOCK = threading.Lock()
_CLIENT_VARS = ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH")


def _client_key(environment: Mapping[str, str]) -> tuple[Any, ...]:
    return (os.getpid(), *(environment.get(name) for name in _CLIENT_VARS))


async def _connect(host: str | None) -> Any:
    """The process's client for the engine at ``host``, which has had an answer from
    the engine; BackendNotAvailable otherwise. Shared: never close it (see
    :func:`_forget_client` for one that broke)."""
    _require_sdk()
    effective = host or os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_SOCKET
    environment = dict(os.environ)
    if host:
        environment["DOCKER_HOST"] = host
    key = _client_key(environment)

    def connect() -> Any:
        if effective.startswith("unix://"):
            probe_unix_socket(effective[len("unix://") :])
        with _CLIENTS_LOCK:
            client = _CLIENTS.get(key)
        if client is not None:
            try:
                client.ping()  # the engine may have gone since
                return client
            except (docker.errors.DockerException, requests.exceptions.RequestException):
                _forget_client(client)
        # from_env also reads DOCKER_TLS_VERIFY and DOCKER_CERT_PATH; asking the
        # engine's API version (version=None) is the first request, so it either
        # answers here or this raises.
        client = docker.from_env(environment=environment)
        with _CLIENTS_LOCK:
            _CLIENTS.setdefault(key, client)
            kept = _CLIENTS[key]
        if kept is not client:  # another thread connected first
            client.close()
        return kept

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


def _forget_client(client: Any) -> None:
    """Drop a shared client that no longer reaches its engine, and close it."""
    with _CLIENTS_LOCK:
        for key, kept in list(_CLIENTS.items()):
            if kept is client:
                del _CLIENTS[key]
    client.close()


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


__all__ = ["owner_labels", "reap_orphaned_containers"]
