"""The singularity backend's settings: which image, and how contained its instance is."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, ClassVar

from hermes_sandbox.environments.settings import BackendSettings
from hermes_sandbox.errors import BackendNotAvailable, SettingError

IMAGE_VAR = "HERMES_SANDBOX_APPTAINER_IMAGE"  # the default for SingularitySettings.image
EXECUTABLES = ("apptainer", "singularity")  # looked for on PATH in this order
INSTALL_HINT = (
    "install Apptainer (https://apptainer.org/docs/admin/main/installation.html, e.g. "
    "the apptainer package of your distribution) or SingularityCE, or set the backend's "
    "`executable` setting to its path"
)
# Longest shared_dir that still leaves room for a Unix socket in a run's stage
# directory inside it (sun_path holds 107 bytes: "/hs-" + 12, "/hermes-sandbox-" + 12,
# "/rpc.sock").
MAX_SHARED_DIR_LENGTH = 50
_MEMORY_RE = re.compile(r"^\d+(\.\d+)?\s*([kmgtpKMGTP]([iI]?[bB])?|[bB])?$")  # go-units RAMInBytes


@dataclass(frozen=True, slots=True)
class Bind:
    """A host path bind-mounted into the instance (read-only unless said otherwise,
    like the docker backend's mounts; Apptainer's own default would be read-write)."""

    source: str
    target: str
    read_only: bool = True

    @classmethod
    def parse(cls, value: str | Mapping[str, Any] | Bind) -> Bind:
        """``"SRC:DST[:ro|rw]"``, a mapping with the field names, or a Bind."""
        if isinstance(value, Bind):
            bind = value
        elif isinstance(value, Mapping):
            unknown = set(value) - {"source", "target", "read_only"}
            if unknown:
                raise ValueError(f"unknown bind key(s): {', '.join(sorted(unknown))}")
            bind = cls(
                str(value["source"]), str(value["target"]), bool(value.get("read_only", True))
            )
        elif isinstance(value, str):
            parts = value.split(":")
            if len(parts) == 2:
                bind = cls(parts[0], parts[1])
            elif len(parts) == 3 and parts[2] in ("ro", "rw"):
                bind = cls(parts[0], parts[1], parts[2] == "ro")
            else:
                raise ValueError(f"a bind is SOURCE:TARGET[:ro|rw], got {value!r}")
        else:
            raise ValueError(f"a bind is a 'SOURCE:TARGET[:ro|rw]' string, got {value!r}")
        for path in (bind.source, bind.target):
            if not path.startswith("/"):
                raise ValueError(f"bind paths must be absolute, got {path!r} in {value!r}")
            if "," in path or ":" in path:  # apptainer splits --bind on both
                raise ValueError(f"bind paths cannot contain ',' or ':', got {path!r}")
        return bind

    def spec(self) -> str:
        """The ``--bind`` argument."""
        return f"{self.source}:{self.target}:{'ro' if self.read_only else 'rw'}"


def _default_image() -> str:
    return os.environ.get(IMAGE_VAR, "")


@dataclass(frozen=True, slots=True)
class SingularitySettings(BackendSettings):
    """Settings of the singularity backend: an Apptainer instance of the task's own.

    Sizes are Apptainer's notation (``"512m"``, ``"1g"``); ``None`` lifts a limit. The
    cgroup limits (``memory``, ``cpus``, ``pids_limit``) need cgroups v2 delegated to
    the user (or root); Apptainer refuses to start the instance otherwise.
    """

    backend: ClassVar[str] = "singularity"
    image_field: ClassVar[str | None] = "image"
    network_setting: ClassVar[tuple[str, Any] | None] = ("network", True)

    image: str = field(default_factory=_default_image)  # a SIF path or a docker:// URI
    executable: str | None = None  # None: apptainer, else singularity, found on PATH
    task_id: str | None = None  # instances are per task; None: a fresh one, never shared
    persist: bool = False  # keep the instance after aclose, for later runs of the task
    binds: tuple[Bind, ...] = ()
    writable_tmpfs: bool = True  # a throw-away writable layer over the image
    overlay: str | None = None  # a persistent overlay (image or directory) instead
    containall: bool = True  # own PID, IPC and mount namespaces, contained /tmp and $HOME
    no_home: bool = True  # do not mount the user's home directory
    network: bool = False  # False: --net --network none (loopback only)
    memory: str | None = None  # --memory, a cgroup limit
    cpus: float | None = None  # --cpus, a cgroup limit
    pids_limit: int | None = None  # --pids-limit, a cgroup limit
    # A host directory under which each instance gets a private directory, bind-mounted
    # read-write at the same path inside: the runtime then serves calls over a Unix
    # socket there. None: no shared directory (tool calls go through the relay).
    shared_dir: str | None = None
    workdir: str = "/tmp"  # where commands start inside the instance (made if missing)
    python: str = "python3"  # the image's interpreter; commands and file operations need it
    start_timeout: float = 600.0  # seconds for `instance start` (a docker:// image is pulled)

    def check(self) -> None:
        binds = self.binds
        if isinstance(binds, (str, Mapping, Bind)):
            binds = (binds,)  # type: ignore[assignment]
        if not isinstance(binds, list | tuple):
            raise SettingError(f"expected a list of binds, got {binds!r}", field="binds")
        try:
            object.__setattr__(self, "binds", tuple(Bind.parse(b) for b in binds))
        except (ValueError, KeyError) as exc:
            raise SettingError(str(exc), field="binds") from None
        if not self.image:
            raise SettingError(
                "the singularity backend needs an image that apptainer can run: set image "
                f"to a SIF file or a docker:// URI (or export ${IMAGE_VAR})",
                field="image",
            )
        if self.memory is not None and not _MEMORY_RE.match(str(self.memory)):
            raise SettingError(
                f"must be a size like '512m' or '1g', got {self.memory!r}", field="memory"
            )
        if self.cpus is not None and not Decimal(str(self.cpus)) >= Decimal("0.01"):
            raise SettingError(f"must be at least 0.01, got {self.cpus}", field="cpus")
        if self.pids_limit is not None and self.pids_limit < 1:
            raise SettingError(f"must be >= 1, got {self.pids_limit}", field="pids_limit")
        if not self.start_timeout > 0:
            raise SettingError(
                f"must be > 0 seconds, got {self.start_timeout}", field="start_timeout"
            )
        for name in ("workdir", "shared_dir", "overlay"):
            value = getattr(self, name)
            if value is not None and not str(value).startswith("/"):
                raise SettingError(f"must be an absolute path, got {value!r}", field=name)
        if self.shared_dir is not None:
            if len(self.shared_dir) > MAX_SHARED_DIR_LENGTH:
                raise SettingError(
                    f"{self.shared_dir!r} is longer than {MAX_SHARED_DIR_LENGTH} "
                    "characters: a Unix socket path inside it would not fit; choose a "
                    "shorter directory such as /tmp",
                    field="shared_dir",
                )
            if "," in self.shared_dir or ":" in self.shared_dir:
                raise SettingError(
                    f"cannot contain ',' or ':', got {self.shared_dir!r}", field="shared_dir"
                )
        if self.executable is not None and not self.executable:
            raise SettingError("must be a command name or a path, not empty", field="executable")

    def availability(self) -> str | None:
        try:
            find_executable(self.executable)
        except BackendNotAvailable as exc:
            return str(exc)
        return None

    def settings_hash(self) -> str:
        """What an instance is started from: a reused instance must match it."""
        settings = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name in _INSTANCE_SETTINGS
        }
        settings["binds"] = [dataclasses.astuple(b) for b in self.binds]
        text = json.dumps(settings, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:8]


# The settings that shape the instance itself (the rest only shape each exec).
_INSTANCE_SETTINGS = frozenset(
    {
        "image",
        "persist",
        "binds",
        "writable_tmpfs",
        "overlay",
        "containall",
        "no_home",
        "network",
        "memory",
        "cpus",
        "pids_limit",
        "shared_dir",
    }
)


def find_executable(configured: str | None) -> str:
    """The apptainer (or singularity) executable to run; BackendNotAvailable if none."""
    if configured is not None:
        found = shutil.which(configured)
        if found is None:
            raise BackendNotAvailable(
                f"the singularity backend's executable {configured!r} was not found or is "
                f"not executable (PATH={os.environ.get('PATH', '')}); {INSTALL_HINT}"
            )
        return found
    for name in EXECUTABLES:
        found = shutil.which(name)
        if found is not None:
            return found
    raise BackendNotAvailable(
        "the singularity backend needs the apptainer or singularity command, and neither "
        f"is on PATH ({os.environ.get('PATH', '')}); {INSTALL_HINT}"
    )


def _availability(settings: Mapping[str, Any]) -> str | None:
    try:
        find_executable(settings.get("executable"))
    except BackendNotAvailable as exc:
        return str(exc)
    return None


__all__ = ["IMAGE_VAR", "Bind", "SingularitySettings", "find_executable"]
