"""The table the benchmark prints, as aligned text for a terminal or as Markdown."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.cases import SECTIONS
from bench.runner import Row

Cell = str


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[Cell] | tuple[str, str]] = field(default_factory=list)
    note: str = ""

    def add(self, cells: list[Cell]) -> None:
        self.rows.append(cells)

    def add_span(self, label: str, text: str) -> None:
        self.rows.append((label, text))

    def text(self) -> str:
        widths = [len(h) for h in self.headers]
        for row in self.rows:
            if isinstance(row, list):
                widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
            else:
                widths[0] = max(widths[0], len(row[0]))

        def line(cells: Sequence[str]) -> str:
            first = cells[0].ljust(widths[0])
            rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
            return "  ".join([first, *rest]).rstrip()

        out = [self.title + (f"   ({self.note})" if self.note else ""), line(self.headers)]
        out.append("  ".join("-" * w for w in widths))
        for row in self.rows:
            if isinstance(row, list):
                out.append(line(row))
            else:
                out.append(f"{row[0].ljust(widths[0])}  {row[1]}")
        return "\n".join(out)

    def markdown(self) -> str:
        out = [f"**{self.title}**" + (f" ({self.note})" if self.note else ""), ""]
        out.append("| " + " | ".join(self.headers) + " |")
        out.append("| " + " | ".join(["---"] + ["---:"] * (len(self.headers) - 1)) + " |")
        # Rows without figures are listed under the table, grouped by their reason.
        reasons: dict[str, list[str]] = {}
        for row in self.rows:
            if isinstance(row, list):
                out.append("| " + " | ".join(row) + " |")
            else:
                reasons.setdefault(row[1], []).append(row[0])
        if reasons:
            out.append("")
            for reason, labels in reasons.items():
                out.append(f"- {'; '.join(labels)}: {reason}")
        return "\n".join(out)


def _num(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, int) or (isinstance(value, float) and abs(value) >= 1000):
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def _unavailable(row: Row) -> str:
    return f"{row.status}: {row.reason}"


def _rtt_table(rows: Sequence[Row], callers: Sequence[int], note: str) -> Table:
    headers = ["case"]
    for c in callers:
        suffix = f" ({c}c)"
        headers += [f"p50 us{suffix}", f"p99 us{suffix}", f"calls/s{suffix}"]
    table = Table(SECTIONS["rtt"], headers, note=note)
    groups: dict[str, dict[int, Row]] = {}
    for row in rows:
        groups.setdefault(row.label, {})[row.params.get("callers", 1)] = row
    for label, by_callers in groups.items():
        present = list(by_callers.values())
        if all(r.status != "ok" for r in present):
            table.add_span(label, _unavailable(present[0]))
            continue
        cells = [label]
        for c in callers:
            found = by_callers.get(c)
            if found is None or found.figures is None:
                cells += ["-", "-", "-"]
            else:
                f = found.figures
                cells += [_num(f["p50_us"]), _num(f["p99_us"]), _num(f["calls_per_s"])]
        table.add(cells)
    return table


def _simple_table(
    section: str,
    rows: Sequence[Row],
    headers: list[str],
    cells: Callable[[dict[str, Any]], list[str]],
    note: str = "",
) -> Table:
    table = Table(SECTIONS[section], ["case", *headers], note=note)
    for row in rows:
        if row.status == "ok" and row.figures is not None:
            table.add([row.label, *cells(row.figures)])
        else:
            table.add_span(row.label, _unavailable(row))
    return table


def _paired_cells(subject: str, baseline: str) -> Callable[[dict[str, Any]], list[str]]:
    """The cells of a row of ``_paired`` figures (bench/cases.py); a floor row, which has
    no baseline of its own, fills the subject's columns with its own figures."""

    def cells(f: dict[str, Any]) -> list[str]:
        if f"{baseline}_p50_ms" not in f:  # a floor: its own start only
            return [_num(f["p50_ms"], 2), _num(f["p90_ms"], 2), "-", "-", "-", _num(f["runs"])]
        return [
            _num(f[f"{subject}_p50_ms"], 2),
            _num(f[f"{subject}_p90_ms"], 2),
            _num(f[f"{baseline}_p50_ms"], 2),
            _num(f[f"{baseline}_p90_ms"], 2),
            _num(f["ratio"], 2) + "x",
            _num(f["runs"]),
        ]

    return cells


def tables(rows: Sequence[Row], settings: dict[str, Any]) -> list[Table]:
    by_section: dict[str, list[Row]] = {}
    for row in rows:
        by_section.setdefault(row.section, []).append(row)
    out = []
    if "rtt" in by_section:
        polling = ", ".join(
            f"{calls} with {callers}c"
            for callers, calls in settings["polling_calls_per_round"].items()
        )
        note = (
            f"{settings['rtt_rounds']} round(s) of {settings['socket_calls_per_round']:,} calls "
            f"over sockets and {polling} calls by file polling, the cases taking turns; "
            "p50/p99 over every call, calls/s the median round"
        )
        out.append(_rtt_table(by_section["rtt"], settings["callers"], note))
    if "cold" in by_section:
        out.append(
            _simple_table(
                "cold",
                by_section["cold"],
                ["p50 ms", "p90 ms", "bare p50 ms", "bare p90 ms", "ratio", "runs"],
                _paired_cells("api", "bare"),
                note=(
                    "bare: the same interpreter's `-c print(1)` through subprocess.run; "
                    "the floors have no bare run of their own"
                ),
            )
        )
    if "memory" in by_section:
        out.append(
            _simple_table(
                "memory",
                by_section["memory"],
                ["RSS before MB", "peak MB", "growth MB", "result JSON bytes", "s", "MB/s"],
                lambda f: [
                    _num(f["rss_before_mb"]),
                    _num(f["rss_peak_mb"]),
                    _num(f["rss_growth_mb"]),
                    _num(f["result_json_bytes"]),
                    _num(f["seconds"], 2),
                    _num(f["mb_per_s"]),
                ],
            )
        )
    if "concurrent" in by_section:
        out.append(
            _simple_table(
                "concurrent",
                by_section["concurrent"],
                ["wall p50 s", "per-run p50 s", "correct"],
                lambda f: [
                    _num(f["wall_p50_s"], 3),
                    _num(f["run_p50_s"], 3),
                    f"{f['correct']}/{f['runs']}" + ("" if f["all_correct"] else " WRONG"),
                ],
                note=f"{settings['concurrent_rounds']} round(s); wall time of all runs together",
            )
        )
    if "payload" in by_section:
        out.append(
            _simple_table(
                "payload",
                by_section["payload"],
                ["p50 ms", "p99 ms", "MB/s at p50", "calls"],
                lambda f: [
                    _num(f["p50_ms"], 2),
                    _num(f["p99_ms"], 2),
                    _num(f["mb_per_s"]),
                    _num(f["calls"]),
                ],
                note="tool result {'data': 'x' * size}, parsed by the caller",
            )
        )
    if "warm" in by_section:
        out.append(
            _simple_table(
                "warm",
                by_section["warm"],
                [
                    "warm p50 ms",
                    "warm p90 ms",
                    "one-shot p50 ms",
                    "one-shot p90 ms",
                    "ratio",
                    "runs",
                ],
                _paired_cells("warm", "one_shot"),
                note="ratio: warm p50 / one-shot p50, the two interleaved",
            )
        )
    if "cell" in by_section:
        out.append(
            _simple_table(
                "cell",
                by_section["cell"],
                [
                    "cell p50 ms",
                    "cell p90 ms",
                    "warm p50 ms",
                    "warm p90 ms",
                    "ratio",
                    "runs",
                    "start p50 ms",
                ],
                lambda f: [*_paired_cells("cell", "warm")(f), _num(f["start_p50_ms"], 2)],
                note="ratio: cell p50 / warm-session run p50, the two interleaved; start: the "
                "first cell, which starts the interpreter in the running environment",
            )
        )
    if "many" in by_section:
        out.append(
            _simple_table(
                "many",
                by_section["many"],
                ["wall p50 s", "calls/s", "correct", "RSS MB by round", "fds", "threads"],
                lambda f: [
                    _num(f["wall_p50_s"], 3),
                    _num(f["calls_per_s"]),
                    f"{f['correct']}/{f['runs']}" + ("" if f["all_correct"] else " WRONG"),
                    " ".join(f"{x:.0f}" for x in f["rss_mb"]),
                    " ".join(str(x) for x in f["fds"]),
                    " ".join(str(x) for x in f["threads"]),
                ],
                note=(
                    f"{settings['many_rounds']} round(s), the transports taking turns; "
                    "host RSS, open fds and threads after each round"
                ),
            )
        )
    return out


def _over_passes(results: dict[str, Any]) -> str:
    """The title of the targets over several passes; empty for a single pass."""
    if "passes" not in results:
        return ""
    return (
        f"over {len(results['passes'])} passes (met or missed by the median; "
        "range: lowest to highest pass)"
    )


def target_lines(targets: Sequence[dict[str, Any]], over: str = "") -> list[str]:
    marks = {"met": "[met]   ", "missed": "[MISSED]", "not available": "[n/a]   "}
    out = ["Targets" + (f" {over}" if over else "")]
    for t in targets:
        out.append(f"  {marks[t['status']]} {t['description']}")
        if "shown" in t:
            out.append(f"           {t['shown']}   target: {t['target']}")
        if "reason" in t:  # over several passes, a target can have both
            out.append(f"           {t['reason']}")
    return out


def target_markdown(targets: Sequence[dict[str, Any]], over: str = "") -> str:
    figure = "figure" if not over else "median, range, passes met"
    out = [f"| target | {figure} | limit | result |", "| --- | --- | --- | --- |"]
    for t in targets:
        shown = "; ".join(t[key] for key in ("shown", "reason") if key in t)
        out.append(f"| {t['description']} | {shown} | {t['target']} | {t['status']} |")
    return "\n".join(out)


def machine_line(machine: dict[str, Any]) -> str:
    return (
        f"{machine['date']}  {machine['nproc']} CPUs ({machine['cpu_model']}), "
        f"{machine['memory_gb']} GB, Python {machine['python']}, {machine['platform']}, "
        f"commit {machine['commit']}, load average at start {machine['loadavg_start']}"
    )


def _last_pass_note(results: dict[str, Any]) -> list[str]:
    if "passes" not in results:
        return []
    count = len(results["passes"])
    return [f"{count} passes: the tables show the last; the targets are over all {count}."]


def render_text(results: dict[str, Any], rows: Sequence[Row]) -> str:
    parts = [f"hermes-sandbox benchmark ({results['settings']['mode']} mode)"]
    parts.append(machine_line(results["machine"]))
    if results["settings"]["mode"] == "quick":
        parts.append("Quick mode: counts too small for the figures to mean anything.")
    parts += _last_pass_note(results)
    for table in tables(rows, results["settings"]):
        parts.append("")
        parts.append(table.text())
    parts.append("")
    parts += target_lines(results["targets"], _over_passes(results))
    return "\n".join(parts)


def render_markdown(results: dict[str, Any], rows: Sequence[Row]) -> str:
    parts = [f"Machine: {machine_line(results['machine'])}. Mode: {results['settings']['mode']}."]
    parts += _last_pass_note(results)
    for table in tables(rows, results["settings"]):
        parts += ["", table.markdown()]
    over = _over_passes(results)
    parts += ["", "**Targets**" + (f" {over}" if over else ""), ""]
    parts.append(target_markdown(results["targets"], over))
    return "\n".join(parts)
