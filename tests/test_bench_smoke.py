"""The benchmark's quick mode runs end to end and reports every row, so it cannot rot.

The figures of a quick run mean nothing; what is checked is that every case either
produced figures or said why it is not available, and that the command exits 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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


# A hang guard, not a timing: the quick run takes 60-90 s alone, and much longer on a
# loaded machine.
@pytest.mark.timeout(420)
def test_quick_benchmark_reports_every_row(tmp_path: Path) -> None:
    listed = subprocess.run(
        [sys.executable, str(BENCH), "--list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    case_ids = [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]
    assert set(REQUIRED_ROWS) <= set(case_ids)

    output = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--quiet", "--output", str(output)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=360,
        check=False,
    )
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
    sys.path.insert(0, str(REPO))
    try:
        from bench.runner import _reason
    finally:
        sys.path.remove(str(REPO))
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
