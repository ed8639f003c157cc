"""The docker backend's settings: which image, and how locked down its container is."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hermes_sandbox.environments.settings import DEFAULT_PYTHON_IMAGE, BackendSettings
from hermes_sandbox.errors import SettingError

SDK_MISSING = "the docker backend needs the docker SDK: pip install 'hermes-sandbox[docker]'"
FALLBACK_IMAGE = DEFAULT_PYTHON_IMAGE
DEFAULT_DOCKER_SOCKET = "unix:///var/run/docker.sock"  # where the SDK looks without DOCKER_HOST
IMAGE_VAR = "HERMES_SANDBOX_DOCKER_IMAGE"  # overrides FALLBACK_IMAGE as the default image
LABEL_PREFIX = "hermes-sandbox."

_MEMORY_RE = re.compile(r"^\d+(\.\d+)?[bkmgBKMG]?$")


@dataclass(frozen=True, slots=True)
class Mount:
    """A host path bind-mounted into the container (read-only unless said otherwise)."""

    source: str
    target: str
    read_only: bool = True

    @classmethod
    def parse(cls, value: str | Mapping[str, Any] | Mount) -> Mount:
        """``"SRC:DST[:ro|rw]"``, a mapping with the field names, or a Mount."""
        if isinstance(value, Mount):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - {"source", "target", "read_only"}
            if unknown:
                raise ValueError(f"unknown mount key(s): {', '.join(sorted(unknown))}")
            return cls(
                str(value["source"]), str(value["target"]), bool(value.get("read_only", True))
            )
        if not isinstance(value, str):
            raise ValueError(f"a mount is SOURCE:TARGET[:ro|rw], got {value!r}")
        parts = value.split(":")
        if len(parts) == 2:
            return cls(parts[0], parts[1])
        if len(parts) == 3 and parts[2] in ("ro", "rw"):
            return cls(parts[0], parts[1], parts[2] == "ro")
        raise ValueError(f"a mount is SOURCE:TARGET[:ro|rw], got {value!r}")


def _default_image() -> str:
    return os.environ.get(IMAGE_VAR) or FALLBACK_IMAGE


def _default_docker_host() -> str | None:
    return os.environ.get("DOCKER_HOST") or None


def engine_address(host: str | None) -> str:
    """The engine's address: ``host``, else $DOCKER_HOST, else the default socket."""
    return host or os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_SOCKET


def shown_address(host: str | None) -> str:
    """The engine's address as messages show it."""
    unset = f"{DEFAULT_DOCKER_SOCKET} (DOCKER_HOST is not set)"
    return host or os.environ.get("DOCKER_HOST") or unset


def probe_unix_socket(path: str) -> None:
    """Connect once and hang up; raise OSError if nothing listens. (The SDK's own
    attempt leaks its socket when the connection fails.)"""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(10)
        probe.connect(path)


@dataclass(frozen=True, slots=True)
class DockerSettings(BackendSettings):
    """Settings of the docker backend: a container of the task's own.

    Sizes are the engine's notation (``"512m"``, ``"1g"``); ``None`` lifts a limit.
    ``mounts`` entries are ``HOST:CONTAINER[:ro|rw]`` (read-only by default).
    """

    backend: ClassVar[str] = "docker"
    image_field: ClassVar[str | None] = "image"
    network_setting: ClassVar[tuple[str, Any] | None] = ("network", True)

    image: str = field(default_factory=_default_image)
    task_id: str | None = None  # containers are per task; None: a fresh one, never shared
    user: str | None = None  # container user ("name", "uid" or "uid:gid"); None: the image's
    memory: str | None = "1g"
    cpus: float | None = 1.0
    pids_limit: int | None = 256
    network: bool = False  # False: network mode "none" (loopback only)
    read_only_root: bool = True
    tmp_size: str = "256m"  # the tmpfs at /tmp
    workdir: str = "/workspace"  # a tmpfs (unless a mount lands there); commands start here
    workdir_size: str = "512m"
    mounts: tuple[Mount, ...] = ()
    # A host directory bind-mounted read-write at the same path inside, where runs
    # are staged so that tool calls take a Unix socket (or files) there instead of
    # the relay. "auto": a private directory made for the container (and removed with
    # it) when the engine runs on this host (reached over a unix:// socket); a path:
    # that directory, the caller's; None (or "none"): none, every run uses the relay.
    shared_dir: str | None = "auto"
    labels: Mapping[str, str] = field(default_factory=dict)
    persist: bool = False  # keep the container after aclose (and never reap it)
    docker_host: str | None = field(default_factory=_default_docker_host)
    python: str = "python3"  # the image's interpreter; commands and file operations need it

    def check(self) -> None:
        mounts = self.mounts
        if isinstance(mounts, str | Mapping | Mount):
            mounts = (mounts,)  # type: ignore[assignment]
        if not isinstance(mounts, list | tuple):
            raise SettingError(f"expected a list of mounts, got {mounts!r}", field="mounts")
        try:
            object.__setattr__(self, "mounts", tuple(Mount.parse(m) for m in mounts))
        except (ValueError, KeyError) as exc:
            raise SettingError(str(exc), field="mounts") from None
        if not isinstance(self.labels, Mapping):
            raise SettingError(f"expected a mapping, got {self.labels!r}", field="labels")
        object.__setattr__(self, "labels", {str(k): str(v) for k, v in self.labels.items()})
        if not self.image:
            raise SettingError("must name an image", field="image")
        for name in ("memory", "tmp_size", "workdir_size"):
            value = getattr(self, name)
            if value is not None and not _MEMORY_RE.match(str(value)):
                raise SettingError(f"must be a size like '512m' or '1g', got {value!r}", field=name)
        if self.cpus is not None and not self.cpus > 0:
            raise SettingError(f"must be > 0, got {self.cpus}", field="cpus")
        if self.pids_limit is not None and self.pids_limit < 1:
            raise SettingError(f"must be >= 1, got {self.pids_limit}", field="pids_limit")
        if self.shared_dir in ("", "none"):
            object.__setattr__(self, "shared_dir", None)
        shared = None if self.shared_dir in (None, "auto") else self.shared_dir
        for name, path in (("workdir", self.workdir), ("shared_dir", shared)):
            if path is not None and not path.startswith("/"):
                raise SettingError(
                    f"paths inside the container must be absolute, got {path!r}", field=name
                )
        for mount in self.mounts:
            if not mount.target.startswith("/"):
                raise SettingError(
                    f"paths inside the container must be absolute, got {mount.target!r}",
                    field="mounts",
                )
        reserved = [key for key in self.labels if key.startswith(LABEL_PREFIX)]
        if reserved:
            raise SettingError(
                f"labels starting with {LABEL_PREFIX!r} are reserved: {reserved}", field="labels"
            )

    def availability(self) -> str | None:
        if importlib.util.find_spec("docker") is None:
            return SDK_MISSING
        host = engine_address(self.docker_host)
        if host.startswith("unix://"):
            try:
                probe_unix_socket(host[len("unix://") :])
            except OSError as exc:
                return (
                    f"no container engine answers at {shown_address(self.docker_host)} "
                    f"({exc.strerror or exc}): start Docker, or run scripts/podman-service"
                )
        return None

    def creation_hash(self, image_id: str) -> str:
        """What the container was made from: a reused container must match it."""
        settings = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("task_id", "docker_host", "python", "image")
        }
        settings["mounts"] = [dataclasses.astuple(m) for m in self.mounts]
        settings["image_id"] = image_id.split(":", 1)[-1]
        text = json.dumps(settings, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:24]


__all__ = ["FALLBACK_IMAGE", "IMAGE_VAR", "DockerSettings", "Mount"]
