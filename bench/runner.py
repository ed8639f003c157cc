"""Running the cases: probe each, interleave the rounds, pool them into rows.

Within a section the cases take turns, round by round, in an order rotated every
round, so that our side and the baselines see the same machine: on a noisy machine
the ratios between them are what holds, not the absolute times.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.cases import SECTIONS, Case, Sample
from bench.subject import NotAvailable, ScriptKilled

KILLED_RETRIES = 2

Progress = Callable[[str], None]


@dataclass
class Row:
    id: str
    section: str
    label: str
    kind: str
    params: dict[str, Any]
    status: str  # "ok", "not available" or "error"
    figures: dict[str, Any] | None = None
    reason: str | None = None
    seconds: float = 0.0
    retries: int = 0

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "section": self.section,
            "label": self.label,
            "kind": self.kind,
            "params": self.params,
            "status": self.status,
        }
        if self.figures is not None:
            data["figures"] = self.figures
        if self.reason is not None:
            data["reason"] = self.reason
        data["seconds"] = round(self.seconds, 2)
        if self.retries:
            data["retries"] = self.retries
        return data


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_cases(cases: Sequence[Case], progress: Progress = _stderr) -> list[Row]:
    """Measure every case; return one row per case, in the cases' order."""
    rows: dict[str, Row] = {}
    for section, title in SECTIONS.items():
        in_section = [c for c in cases if c.section == section]
        if not in_section:
            continue
        progress(f"== {title}")
        runnable: list[Case] = []
        for case in in_section:
            reason = case.probe()
            if reason:
                rows[case.id] = _row(case, "not available", reason=reason)
            else:
                runnable.append(case)
        samples: dict[str, list[Sample]] = {c.id: [] for c in runnable}
        spent: dict[str, float] = {c.id: 0.0 for c in runnable}
        retries: dict[str, int] = {c.id: 0 for c in runnable}
        most_rounds = max((c.rounds for c in runnable), default=0)
        for round_index in range(most_rounds):
            shift = round_index % len(runnable)
            for case in runnable[shift:] + runnable[:shift]:
                if case.id in rows or round_index >= case.rounds:
                    continue
                progress(f"   {case.id}  round {round_index + 1}/{case.rounds}")
                started = time.perf_counter()
                try:
                    samples[case.id].append(_measure(case, retries))
                except NotAvailable as exc:
                    rows[case.id] = _row(case, "not available", reason=str(exc))
                except Exception as exc:
                    progress(traceback.format_exc())
                    rows[case.id] = _row(case, "error", reason=_reason(exc))
                spent[case.id] += time.perf_counter() - started
        for case in runnable:
            if case.id not in rows:
                try:
                    figures = case.summarize(samples[case.id])
                except Exception as exc:
                    progress(traceback.format_exc())
                    rows[case.id] = _row(case, "error", reason=_reason(exc))
                else:
                    rows[case.id] = _row(case, "ok", figures=figures)
            rows[case.id].seconds = spent[case.id]
            rows[case.id].retries = retries[case.id]
    return [rows[c.id] for c in cases]


def _measure(case: Case, retries: dict[str, int]) -> Sample:
    for attempt in range(KILLED_RETRIES + 1):
        try:
            return case.measure()
        except ScriptKilled:
            if attempt == KILLED_RETRIES:
                raise
            retries[case.id] += 1
    raise AssertionError("unreachable")


def _reason(exc: BaseException) -> str:
    """What went wrong, for a row's ``reason``: an exception group names the distinct
    errors inside it (a run's failures under load were otherwise only "unhandled errors
    in a TaskGroup (9 sub-exceptions)", and -q prints no traceback)."""
    said = f"{type(exc).__name__}: {exc}"
    if not isinstance(exc, BaseExceptionGroup):
        return said
    leaves: list[str] = []
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop(0)
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        elif (leaf := f"{type(current).__name__}: {current}") not in leaves:
            leaves.append(leaf)
    more = f"; and {len(leaves) - 3} more" if len(leaves) > 3 else ""
    return f"{said}: {'; '.join(leaves[:3])}{more}"


def _row(
    case: Case,
    status: str,
    *,
    figures: dict[str, Any] | None = None,
    reason: str | None = None,
) -> Row:
    return Row(
        id=case.id,
        section=case.section,
        label=case.label,
        kind=case.kind,
        params=dict(case.params),
        status=status,
        figures=figures,
        reason=reason,
    )
