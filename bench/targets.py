"""The issue's targets, each checked against the rows of the same run.

A target compares two figures (ours against a baseline measured beside it, or against
our own local Unix socket) or one figure against a fixed limit. A missed target is a
finding to report, not a failure of the benchmark; a target whose rows could not run
says "not available" and why.

Over several passes of the same cases (``scripts/bench --repeat N``), :func:`summarize`
takes each target's value in every pass: the median decides met or missed, beside the
range and the count of passes in which the target was met.
"""

from __future__ import annotations

import operator
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.cases import BACKENDS
from bench.runner import Row

_OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt}


@dataclass(frozen=True)
class Figure:
    row: str
    name: str
    unit: str = ""
    digits: int = 1

    def text(self, value: float) -> str:
        digits = self.digits if value < 1e4 else 0
        return f"{value:,.{digits}f}{self.unit}"


@dataclass(frozen=True)
class Target:
    """``value op limit``, where value is ``figure / versus`` (or ``figure`` alone)."""

    id: str
    description: str
    figure: Figure
    op: str
    limit: float
    versus: Figure | None = None

    def evaluate(self, rows: Mapping[str, Row]) -> dict[str, Any]:
        result: dict[str, Any] = {
            "id": self.id,
            "description": self.description,
            "target": f"{'ratio ' if self.versus else ''}{self.op} {self.limit:g}"
            + ("x" if self.versus else self.figure.unit),
        }
        needed = [self.figure] + ([self.versus] if self.versus else [])
        values = []
        for figure in needed:
            row = rows.get(figure.row)
            if row is None or row.status != "ok" or row.figures is None:
                why = row.reason if row is not None else "no such row"
                state = row.status if row is not None else "missing"
                result["status"] = "not available"
                result["reason"] = f"{figure.row}: {state}: {why}"
                return result
            values.append(float(row.figures[figure.name]))
        if self.versus:
            value = values[0] / values[1]
            shown = f"{self.figure.text(values[0])} vs {self.versus.text(values[1])}: "
        else:
            value = values[0]
            shown = ""
        result["value"] = round(value, 3)
        result["figures"] = [round(v, 3) for v in values]
        result["shown"] = shown + self.value_text(value)
        result["status"] = "met" if self.meets(value) else "missed"
        return result

    def meets(self, value: float) -> bool:
        """Whether ``value`` (a ratio, or the figure alone) is within the limit."""
        return bool(_OPS[self.op](value, self.limit))

    def value_text(self, value: float) -> str:
        return f"{value:.2f}x" if self.versus else self.figure.text(value)

    def summarize(self, results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """This target over several passes, from what :meth:`evaluate` said in each.

        The status is the median's, over the passes in which the target could be
        evaluated; ``met_in`` of ``ran_in`` counts the passes that met it, and ``values``
        holds each pass's value (None where it was not available). A target not available
        in every pass is "not available", with the last pass's reason.

        Raises ValueError if ``results`` is empty or holds another target's result.
        """
        if not results:
            raise ValueError(f"{self.id}: no passes to summarize")
        strangers = {r["id"] for r in results} - {self.id}
        if strangers:
            raise ValueError(f"{self.id}: results of other targets: {sorted(strangers)}")
        passes = len(results)
        values = [r.get("value") if r["status"] != "not available" else None for r in results]
        ran = [float(v) for v in values if v is not None]
        summary: dict[str, Any] = {
            "id": self.id,
            "description": self.description,
            "target": results[-1]["target"],
            "passes": passes,
            "ran_in": len(ran),
            "met_in": sum(1 for r in results if r["status"] == "met"),
            "values": values,
        }
        missing = [r for r in results if r["status"] == "not available"]
        if missing:
            summary["reason"] = (
                f"not available in {len(missing)} of {passes} passes: {missing[-1]['reason']}"
            )
        if not ran:
            summary["status"] = "not available"
            return summary
        middle = statistics.median(ran)
        summary["value"] = round(middle, 3)
        summary["min"] = min(ran)
        summary["max"] = max(ran)
        summary["status"] = "met" if self.meets(middle) else "missed"
        summary["shown"] = (
            f"median {self.value_text(middle)}, range {self.value_text(min(ran))}"
            f" to {self.value_text(max(ran))}, met in {summary['met_in']} of {len(ran)} passes"
        )
        return summary


UNIX_LOCAL_P50 = Figure("rtt.unix.local.c1", "p50_us", " us")
UNIX_PLAIN_P50 = Figure("rtt.unix.local.plain.c1", "p50_us", " us")


def build_targets() -> list[Target]:
    targets = [
        Target(
            "unix-1-vs-jsonl",
            "Unix socket, 1 caller: p50 no slower than the JSON-lines baseline",
            UNIX_LOCAL_P50,
            "<=",
            1.0,
            Figure("rtt.baseline.jsonl.c1", "p50_us", " us"),
        ),
        Target(
            "unix-1-vs-floor",
            "Unix socket, 1 caller: p50 within 2x of the raw floor",
            UNIX_LOCAL_P50,
            "<=",
            2.0,
            Figure("rtt.baseline.floor.c1", "p50_us", " us"),
        ),
        Target(
            "unix-8-vs-jsonl",
            "Unix socket, 8 callers: at least 2x the calls/s of the JSON-lines baseline",
            Figure("rtt.unix.local.c8", "calls_per_s", " calls/s", 0),
            ">=",
            2.0,
            Figure("rtt.baseline.jsonl.c8", "calls_per_s", " calls/s", 0),
        ),
        # Issue #12 target 1: the same three, for a tool registered the plain way.
        Target(
            "unix-plain-1-vs-jsonl",
            "Unix socket, plain sync tool, 1 caller: p50 no slower than the JSON-lines baseline",
            UNIX_PLAIN_P50,
            "<=",
            1.0,
            Figure("rtt.baseline.jsonl.c1", "p50_us", " us"),
        ),
        Target(
            "unix-plain-1-vs-floor",
            "Unix socket, plain sync tool, 1 caller: p50 within 2x of the raw floor",
            UNIX_PLAIN_P50,
            "<=",
            2.0,
            Figure("rtt.baseline.floor.c1", "p50_us", " us"),
        ),
        Target(
            "unix-plain-8-vs-jsonl",
            "Unix socket, plain sync tool, 8 callers: at least 2x the JSON-lines calls/s",
            Figure("rtt.unix.local.plain.c8", "calls_per_s", " calls/s", 0),
            ">=",
            2.0,
            Figure("rtt.baseline.jsonl.c8", "calls_per_s", " calls/s", 0),
        ),
        Target(
            "unix-100k-vs-jsonl",
            "Unix socket, 100 KB results: at least 2x the JSON-lines calls/s",
            Figure("rtt.unix.local.100k.c1", "calls_per_s", " calls/s", 0),
            ">=",
            2.0,
            Figure("rtt.baseline.jsonl.100k.c1", "calls_per_s", " calls/s", 0),
        ),
    ]
    for b in BACKENDS:
        targets.append(
            Target(
                f"files-{b.name}-vs-polling",
                f"Files on {b.name}: p50 at least 10x lower than the polling baseline",
                Figure("rtt.baseline.polling.c1", "p50_us", " us"),
                ">=",
                10.0,
                Figure(f"rtt.files.{b.name}.c1", "p50_us", " us"),
            )
        )
    for b in BACKENDS:
        targets.append(
            Target(
                f"relay-{b.name}-vs-unix",
                f"Stream relay on {b.name}: p50 within 2x of the local Unix socket",
                Figure(f"rtt.relay.{b.name}.c1", "p50_us", " us"),
                "<=",
                2.0,
                UNIX_LOCAL_P50,
            )
        )
    for name, stream in (("docker", "docker exec"), ("ssh", "a pooled ssh channel")):
        targets.append(
            Target(
                f"relay-{name}-vs-stream",
                f"Stream relay on {name}: p50 within 1.5x of a raw echo over {stream}",
                Figure(f"rtt.relay.{name}.c1", "p50_us", " us"),
                "<=",
                1.5,
                Figure(f"rtt.floor.{name}.c1", "p50_us", " us"),
            )
        )
    targets += [
        Target(
            "unix-docker-vs-unix",
            "Unix socket bind-mounted into a container: p50 within 2x of the local one",
            Figure("rtt.unix.docker.c1", "p50_us", " us"),
            "<=",
            2.0,
            UNIX_LOCAL_P50,
        ),
        Target(
            "cell-local",
            "Persistent interpreter, local: one cell's round trip (print(1)) at most 5 ms",
            Figure("cell.local", "cell_p50_ms", " ms", digits=2),
            "<=",
            5.0,
        ),
        Target(
            "memory-local",
            "Memory: host RSS grows by less than 64 MB while the script prints 1 GB",
            Figure("memory.local", "rss_growth_mb", " MB"),
            "<",
            64.0,
        ),
    ]
    beside_bare = (
        ("cold-local-vs-bare", "cold.local", "Cold run, local backend"),
        ("cli-local-vs-bare", "cold.cli.local", "hermes-sandbox run print(1)"),
    )
    for target_id, row, what in beside_bare:
        targets.append(
            Target(
                target_id,
                f"{what}: at most 1.5x the bare interpreter timed beside it",
                Figure(row, "api_p50_ms", " ms"),
                "<=",
                1.5,
                Figure(row, "bare_p50_ms", " ms"),
            )
        )
    floors = (
        ("docker", "One-shot docker run", "a bare docker run --rm IMAGE python3 -c 1", 1.2),
        ("ssh", "Run over ssh", "a bare python3 -c 1 on a pooled connection", 1.5),
    )
    for name, what, floor, limit in floors:
        targets.append(
            Target(
                f"cold-{name}-vs-floor",
                f"{what}: at most {limit:g}x {floor}",
                Figure(f"cold.{name}", "api_p50_ms", " ms"),
                "<=",
                limit,
                Figure(f"cold.floor.{name}", "p50_ms", " ms"),
            )
        )
    targets.append(
        Target(
            "warm-docker-vs-floor",
            "A run in a warm docker container: at most 1.5x a bare exec of python3 -c 1 there",
            Figure("warm.docker", "p50_ms", " ms"),
            "<=",
            1.5,
            Figure("warm.floor.docker", "p50_ms", " ms"),
        )
    )
    # Many runs at once (issue #12, target 4). Flat: the host's counts after the last
    # round against those after round 2 (the first warms imports and thread pools).
    many_files = "many.files.local"
    targets += [
        Target(
            "many-files-vs-unix",
            "Many runs at once over files: wall time within 1.5x of the Unix socket's",
            Figure(many_files, "wall_p50_s", " s", digits=2),
            "<=",
            1.5,
            Figure("many.unix.local", "wall_p50_s", " s", digits=2),
        ),
        Target(
            "many-flat",
            "Many runs at once: host RSS grows less than 32 MB from round 2 to the last",
            Figure(many_files, "rss_growth_mb", " MB"),
            "<",
            32.0,
        ),
        Target(
            "many-flat-fds",
            "Many runs at once: no more open fds after the last round than after round 2",
            Figure(many_files, "fd_growth", " fds", digits=0),
            "<=",
            0.0,
        ),
    ]
    return targets


def evaluate(rows: Sequence[Row]) -> list[dict[str, Any]]:
    by_id = {row.id: row for row in rows}
    return [target.evaluate(by_id) for target in build_targets()]


def summarize(passes: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Each target over several passes: ``passes`` holds one :func:`evaluate` list per
    pass; the summaries come in the targets' order (see :meth:`Target.summarize`).

    Raises ValueError if a target is in some passes only, or is no target of ours.
    """
    by_target: dict[str, list[Mapping[str, Any]]] = {}
    for results in passes:
        for result in results:
            by_target.setdefault(result["id"], []).append(result)
    known = build_targets()
    unknown = set(by_target) - {t.id for t in known}
    if unknown:
        raise ValueError(f"no such targets: {sorted(unknown)}")
    partial = sorted(i for i, results in by_target.items() if len(results) != len(passes))
    if partial:
        raise ValueError(f"targets not in every one of the {len(passes)} passes: {partial}")
    return [t.summarize(by_target[t.id]) for t in known if t.id in by_target]
