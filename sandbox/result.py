"""The result of one execution, shaped like Hermes's execute_code result."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["success", "error", "timeout", "interrupted"]

TIMEOUT_EXIT_CODE = 124
INTERRUPTED_EXIT_CODE = 130


@dataclass(slots=True)
class ExecutionResult:
    status: Status
    output: str
    exit_code: int | None
    tool_calls_made: int
    duration_seconds: float
    error: str | None = None
    stdout_truncated: bool = False
    stdout_bytes_captured: int = 0
    stdout_bytes_total: int = 0
    stdout_bytes_omitted: int = 0
    warning: str | None = None
    stdout_spill_path: str | None = None
    hint: str | None = None
    # A persistent session's run only (None otherwise): whether it began in a new
    # interpreter (no globals from earlier runs), and whether the interpreter ended in
    # it (a timeout, sys.exit...), taking its globals: the next run starts a new one.
    interpreter_started: bool | None = None
    state_lost: bool | None = None

    @property
    def ok(self) -> bool:
        return self.status == "success"

    def add_warning(self, note: str, *, first: bool = False) -> None:
        """Add ``note`` to :attr:`warning`: after what it says, or before with ``first``
        (a note about what happened before the run, such as a sandbox made anew)."""
        if not self.warning:
            self.warning = note
        elif first:
            self.warning = f"{note} {self.warning}"
        else:
            self.warning = f"{self.warning} {note}"

    def to_dict(self) -> dict[str, Any]:
        """The result as Hermes's execute_code returns it (keys in its order); optional
        keys appear only when set."""
        result: dict[str, Any] = {
            "status": self.status,
            "output": self.output,
            "exit_code": self.exit_code,
            "tool_calls_made": self.tool_calls_made,
            "duration_seconds": self.duration_seconds,
        }
        if self.error is not None:
            result["error"] = self.error
        if self.hint is not None:
            result["hint"] = self.hint
        result["stdout_truncated"] = self.stdout_truncated
        result["stdout_bytes_captured"] = self.stdout_bytes_captured
        result["stdout_bytes_total"] = self.stdout_bytes_total
        result["stdout_bytes_omitted"] = self.stdout_bytes_omitted
        if self.warning is not None:
            result["warning"] = self.warning
        if self.stdout_spill_path is not None:
            result["stdout_spill_path"] = self.stdout_spill_path
        if self.interpreter_started is not None:
            result["interpreter_started"] = self.interpreter_started
        if self.state_lost is not None:
            result["state_lost"] = self.state_lost
        return result

    def to_json(self, **kwargs: Any) -> str:
        kwargs.setdefault("ensure_ascii", False)
        return json.dumps(self.to_dict(), **kwargs)
