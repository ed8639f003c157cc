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

    @property
    def ok(self) -> bool:
        return self.status == "success"

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
        return result

    def to_json(self, **kwargs: Any) -> str:
        kwargs.setdefault("ensure_ascii", False)
        return json.dumps(self.to_dict(), **kwargs)
