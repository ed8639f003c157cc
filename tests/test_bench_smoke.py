"""The benchmark's quick mode runs end to end and reports every row, so it cannot rot.

The figures of a quick run mean nothing; what is checked is that every case either
produced figures or said why it is not available, and that the command exits 0. With
``--repeat``, each target's summary over the passes is checked against the passes' own
values, and the summary function on hand-made results.
"""

from __future__ import annotations

import importlib
import json
import statistics
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "scripts" / "bench"

# The rows, by id. Transports and backends not built yet must still be there,
# as "not available" with a reason.
REQUIRED_ROWS = [
    *(
        f"rtt.{transport}.{backend}.c{callers}"
        for transport in ("unix", "relay", "files")
        for backend in ("local", "docker", "ssh")
        for callers in (1, 8)
    ),
    "rtt.baseline.jsonl.c1",
    "rtt.baseline.jsonl.c8",
    "rtt.baseline.polling.c1",
    "rtt.baseline.polling.c8",
    "rtt.baseline.floor.c1",
    "rtt.floor.docker.c1",
    "rtt.floor.ssh.c1",
    "cold.local",
    "cold.local.call",
    "cold.cli.local",
    "cold.cli.session",
    "cold.floor.docker",
    "cold.floor.ssh",
    "warm.local",
    "cell.local",
    "cell.docker",
    "memory.local",
    "concurrent.local.n8",
    "concurrent.local.n32",
    "many.unix.local",
    "many.files.local",
    *(
        f"payload.{transport}.local.{size}"
        for transport in ("unix", "relay", "files")
        for size in ("1MiB", "10MiB")
    ),
]
# What exists today must really run here, not only be listed.
MUST_RUN = [
    "rtt.unix.local.c1",
    "rtt.unix.local.c8",
    "rtt.baseline.jsonl.c1",
    "rtt.baseline.jsonl.c8",
    "rtt.baseline.polling.c1",
    "rtt.baseline.polling.c8",
    "rtt.baseline.floor.c1",
    "cold.local",
    "cold.local.call",
    "cold.cli.local",
    "cold.cli.session",
    "warm.local",
    "cell.local",
    "memory.local",
    "concurrent.local.n8",
    "concurrent.local.n32",
    "many.unix.local",
    "many.files.local",
    "payload.unix.local.1MiB",
    "payload.unix.local.10MiB",
    "payload.baseline.jsonl.1MiB",
    "payload.baseline.jsonl.10MiB",
]
TARGET_STATES = {"met", "missed", "not available"}


def bench(*args: str, cwd: Path | None = None, timeout: float = 60) -> Any:
    """scripts/bench with ``args`` in a real process: its CompletedProcess (text)."""
    return subprocess.run(
        [sys.executable, str(BENCH), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def bench_module(name: str) -> ModuleType:
    """``bench.<name>``, imported from the repository (the package is not installed)."""
    sys.path.insert(0, str(REPO))
    try:
        return importlib.import_module(f"bench.{name}")
    finally:
        sys.path.remove(str(REPO))


# A hang guard, not a timing: the quick run takes 60-90 s alone, and much longer on a
# loaded machine.
@pytest.mark.timeout(420)
def test_quick_benchmark_reports_every_row(tmp_path: Path) -> None:
    listed = bench("--list")
    assert listed.returncode == 0, listed.stderr
    case_ids = [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]
    assert set(REQUIRED_ROWS) <= set(case_ids)

    output = tmp_path / "results.json"
    done = bench("--quick", "--quiet", "--output", str(output), cwd=tmp_path, timeout=360)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert "Targets" in done.stdout

    results = json.loads(output.read_text())
    assert results["settings"]["mode"] == "quick"
    assert results["machine"]["nproc"] >= 1 and results["machine"]["cpu_model"]
    rows = {row["id"]: row for row in results["rows"]}
    assert list(rows) == case_ids
    for row_id, row in rows.items():
        if row["status"] == "ok":
            assert row["figures"], row_id
        else:
            assert row["status"] == "not available", row
            assert row["reason"], row_id
    for row_id in MUST_RUN:
        assert rows[row_id]["status"] == "ok", rows[row_id]
    assert rows["rtt.unix.local.c1"]["figures"]["p50_us"] > 0
    assert rows["concurrent.local.n32"]["figures"]["all_correct"]
    assert rows["many.files.local"]["figures"]["all_correct"]
    assert rows["many.unix.local"]["figures"]["all_correct"]
    assert rows["memory.local"]["figures"]["result_json_bytes"] > 0

    assert results["targets"]
    for target in results["targets"]:
        assert target["status"] in TARGET_STATES, target
        assert target.get("shown") or target.get("reason"), target


def test_a_row_that_fails_in_a_task_group_says_what_failed_inside_it() -> None:
    """A row's error reason names the errors inside an exception group, once each: a
    failing round under load once said only "unhandled errors in a TaskGroup"."""
    _reason = bench_module("runner")._reason
    full = OSError(24, "Too many open files")
    group = ExceptionGroup(
        "unhandled errors in a TaskGroup",
        [full, ExceptionGroup("inner", [OSError(24, "Too many open files"), KeyError("k")])],
    )
    assert _reason(group) == (
        "ExceptionGroup: unhandled errors in a TaskGroup (2 sub-exceptions): "
        "OSError: [Errno 24] Too many open files; KeyError: 'k'"
    )
    assert _reason(ValueError("plain")) == "ValueError: plain"


# Two cheap rows that feed the target unix-1-vs-jsonl.
REPEAT_ROWS = ["rtt.unix.local.c1", "rtt.baseline.jsonl.c1"]


@pytest.mark.timeout(240)
def test_repeat_runs_whole_passes_and_reports_each_target_over_them(tmp_path: Path) -> None:
    output = tmp_path / "results.json"
    done = bench(
        *("--quick", "--quiet", "--repeat", "2", "--only", ",".join(REPEAT_ROWS)),
        *("--output", str(output), "--markdown", str(tmp_path / "results.md")),
        cwd=tmp_path,
        timeout=200,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    results = json.loads(output.read_text())
    assert results["repeat"] == 2
    passes = results["passes"]
    assert len(passes) == 2
    for one in passes:
        assert [row["id"] for row in one["rows"]] == REPEAT_ROWS
        assert all(row["status"] == "ok" for row in one["rows"]), one["rows"]
    assert results["rows"] == passes[-1]["rows"]

    summaries = {t["id"]: t for t in results["targets"]}
    assert list(summaries) == [t["id"] for t in passes[0]["targets"]]
    for target_id, summary in summaries.items():
        per_pass = [next(t for t in one["targets"] if t["id"] == target_id) for one in passes]
        values = [t.get("value") for t in per_pass]
        assert summary["values"] == values
        ran = [v for v in values if v is not None]
        assert summary["passes"] == 2 and summary["ran_in"] == len(ran)
        assert summary["met_in"] == sum(t["status"] == "met" for t in per_pass)
        if not ran:
            assert summary["status"] == "not available"
            assert summary["reason"].startswith("not available in 2 of 2 passes: ")
            continue
        assert summary["value"] == pytest.approx(statistics.median(ran), abs=1e-3)
        assert (summary["min"], summary["max"]) == (min(ran), max(ran))
    fed = summaries["unix-1-vs-jsonl"]
    assert fed["ran_in"] == 2
    assert fed["status"] == ("met" if fed["value"] <= 1.0 else "missed")
    assert f"met in {fed['met_in']} of 2 passes" in fed["shown"]

    assert "Targets over 2 passes" in done.stdout
    assert f"met in {fed['met_in']} of 2 passes" in done.stdout
    markdown = (tmp_path / "results.md").read_text()
    assert f"met in {fed['met_in']} of 2 passes" in markdown


@pytest.mark.parametrize("count", ["0", "-3", "two"])
def test_repeat_takes_only_a_positive_count(count: str, tmp_path: Path) -> None:
    done = bench("--quick", "--only", "rtt.unix.local.c1", f"--repeat={count}", cwd=tmp_path)
    assert done.returncode == 2, done
    assert "usage: scripts/bench" in done.stderr
    assert "error: argument --repeat: " in done.stderr, done.stderr
    assert not (tmp_path / "bench-results.json").exists()


def _passed(target_id: str, value: float | None, status: str) -> dict[str, Any]:
    """One pass's result for a target, as Target.evaluate shapes it."""
    target = next(t for t in bench_module("targets").build_targets() if t.id == target_id)
    if value is None:
        return {
            "id": target_id,
            "description": target.description,
            "target": "ratio <= 1x",
            "status": "not available",
            "reason": f"rtt.unix.local.c1: not available: pass {status}",
        }
    return {
        "id": target_id,
        "description": target.description,
        "target": "ratio <= 1x",
        "value": value,
        "figures": [value, 1.0],
        "shown": f"{value:.2f}x",
        "status": status,
    }


def test_a_target_over_passes_is_the_median_with_its_range_and_passes_met() -> None:
    targets = bench_module("targets")
    one = "unix-1-vs-jsonl"  # ratio <= 1x
    passes = [
        [_passed(one, 0.9, "met")],
        [_passed(one, 1.3, "missed")],
        [_passed(one, 0.8, "met")],
        [_passed(one, 1.2, "missed")],
    ]
    (summary,) = targets.summarize(passes)
    # The median of an even count is the mean of the middle two: (0.9 + 1.2) / 2.
    assert summary["value"] == pytest.approx(1.05)
    assert summary["status"] == "missed"
    assert (summary["min"], summary["max"]) == (0.8, 1.3)
    assert (summary["passes"], summary["ran_in"], summary["met_in"]) == (4, 4, 2)
    assert summary["values"] == [0.9, 1.3, 0.8, 1.2]
    assert summary["shown"] == "median 1.05x, range 0.80x to 1.30x, met in 2 of 4 passes"
    assert "reason" not in summary


def test_a_target_not_available_in_some_passes_counts_the_others() -> None:
    targets = bench_module("targets")
    one = "unix-1-vs-jsonl"
    passes = [
        [_passed(one, 1.4, "missed")],
        [_passed(one, None, "2")],
        [_passed(one, 0.7, "met")],
    ]
    (summary,) = targets.summarize(passes)
    assert summary["values"] == [1.4, None, 0.7]
    assert (summary["passes"], summary["ran_in"], summary["met_in"]) == (3, 2, 1)
    assert summary["value"] == pytest.approx(1.05)
    assert summary["status"] == "missed"
    assert summary["shown"].endswith("met in 1 of 2 passes")
    assert summary["reason"] == (
        "not available in 1 of 3 passes: rtt.unix.local.c1: not available: pass 2"
    )


def test_a_target_not_available_in_every_pass_is_not_available() -> None:
    targets = bench_module("targets")
    one = "cell-local"  # a figure alone, no ratio
    (summary,) = targets.summarize([[_passed(one, None, "1")], [_passed(one, None, "2")]])
    assert summary["status"] == "not available"
    assert (summary["passes"], summary["ran_in"], summary["met_in"]) == (2, 0, 0)
    assert summary["values"] == [None, None]
    assert "value" not in summary and "shown" not in summary
    assert summary["reason"].startswith("not available in 2 of 2 passes: ")
    assert summary["reason"].endswith("pass 2")
    # Each pass evaluates every target: one missing from a pass is a mistake, not a gap.
    with pytest.raises(ValueError, match="not in every one of the 2 passes"):
        targets.summarize([[_passed(one, None, "1")], []])
