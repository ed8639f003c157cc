"""What shapes one run (:class:`RunOptions`), apart from the runner that carries it
out (sandbox/runner.py), so that the command line can build and check a run's options,
as it does to send one to the sessions daemon, without importing the runner's layers."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from hermes_sandbox.environments import BackendSettings, get_settings_class
from hermes_sandbox.environments.settings import api_place
from hermes_sandbox.errors import RunError
from hermes_sandbox.output import MAX_SPILL_BYTES, MAX_STDERR_BYTES, MAX_STDOUT_BYTES
from hermes_sandbox.rpc import DEFAULT_MAX_FRAME_SIZE
from hermes_sandbox.spill import DEFAULT_SPILL_RETENTION

if TYPE_CHECKING:
    from hermes_sandbox.gate import Budget


@dataclass(frozen=True, slots=True)
class RunOptions:
    """Everything that shapes one run. Defaults match Hermes's execute_code.

    ``backend`` is a backend's name (its settings then come from ``backend_options``,
    a mapping of its fields) or its settings object, e.g. ``DockerSettings(image=...)``
    (``backend_options`` then changes fields of it).
    """

    backend: str | BackendSettings = "local"
    tools: Sequence[str] | None = None
    timeout: float = 300.0
    max_tool_calls: int = 50
    cwd: str | None = None
    env: Mapping[str, str] | None = None
    task_id: str | None = None
    python: str | None = None
    max_stdout_bytes: int = MAX_STDOUT_BYTES
    max_stderr_bytes: int = MAX_STDERR_BYTES
    max_spill_bytes: int = MAX_SPILL_BYTES
    spill_dir: str | None = None
    spill_retention: float = DEFAULT_SPILL_RETENTION  # seconds; older spill files are swept
    kill_grace: float = 2.0
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    workspace_root: str | None = None
    transport: str = "auto"  # "auto", "unix", "relay" or "files" (sandbox/transports.py)
    # The script as a program: the host file the code was read from (its name, and on a
    # backend that shares this host the file itself, run in place), sys.argv[1:], and
    # the bytes its stdin reads (None: nothing, /dev/null).
    script_path: str | None = None
    argv: Sequence[str] = ()
    stdin: bytes | None = None
    # Fields of the backend's settings (image, limits, mounts... for docker), as plain data.
    backend_options: Mapping[str, Any] = field(default_factory=dict, compare=False)
    # Shared across runs on purpose: a parent's budget (delegation), a session's approvals.
    # The run's calls are charged to ``budget`` too, and it ends by the budget's deadline.
    budget: Budget | None = field(default=None, compare=False)
    approval: Any = field(default=None, compare=False)  # tools.approval.ApprovalPolicy

    @property
    def backend_name(self) -> str:
        """The name of the backend the run uses."""
        if isinstance(self.backend, BackendSettings):
            return self.backend.backend
        return self.backend

    def backend_settings(self) -> BackendSettings:
        """The run's backend settings, built once: the settings object given, or the
        named backend's defaults, with ``backend_options`` over them. Raises
        SettingError naming a bad value, BackendNotAvailable for an unknown name."""
        layers = [(self.backend_options, api_place("backend_options"))]
        if isinstance(self.backend, BackendSettings):
            return self.backend.updated(layers) if self.backend_options else self.backend
        return get_settings_class(self.backend).build(layers)

    def validate(self) -> RunOptions:
        if not isinstance(self.backend, str | BackendSettings):
            raise RunError(
                "backend must be a backend's name or its settings, such as "
                f"DockerSettings(image=...); got {type(self.backend).__name__} {self.backend!r}"
            )
        if not self.timeout > 0:
            raise RunError(f"timeout must be a positive number of seconds, got {self.timeout}")
        if self.max_tool_calls < 0:
            raise RunError(f"max_tool_calls must be >= 0, got {self.max_tool_calls}")
        if not self.spill_retention > 0:
            raise RunError(
                f"spill_retention must be a positive number of seconds, got {self.spill_retention}"
            )
        checked = self
        if self.cwd is not None and self.backend_name == "local":
            cwd = os.path.abspath(os.path.expanduser(self.cwd))
            if not os.path.isdir(cwd):
                raise RunError(f"working directory does not exist or is not a directory: {cwd}")
            checked = replace(checked, cwd=cwd)
        if self.workspace_root is not None:
            root = os.path.abspath(os.path.expanduser(self.workspace_root))
            checked = replace(checked, workspace_root=root)
        if self.script_path is not None:
            checked = replace(checked, script_path=os.path.abspath(self.script_path))
        if isinstance(self.argv, str) or not all(isinstance(a, str) for a in self.argv):
            raise RunError(f"argv must be a list of strings, got {self.argv!r}")
        if self.stdin is not None and not isinstance(self.stdin, bytes):
            raise RunError(f"stdin must be bytes or None, got {type(self.stdin).__name__}")
        return checked


__all__ = ["RunOptions"]
