"""The command line: ``scripts/bench [--quick] [--output FILE] [--markdown FILE]``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench import machine, report, subject, targets
from bench.cases import build_cases
from bench.runner import run_cases
from bench.settings import FULL, QUICK

DEFAULT_OUTPUT = "bench-results.json"
RESULTS_VERSION = 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scripts/bench",
        description=(
            "Measure hermes-sandbox's transports and backends beside the reference "
            "design's RPC shapes, in one run on this machine."
        ),
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny counts: only proves every case still runs"
    )
    parser.add_argument(
        "--output",
        default=DEFAULT_OUTPUT,
        help=f"where to write the figures as JSON (default: {DEFAULT_OUTPUT})",
    )
    parser.add_argument("--markdown", help="also write the tables as Markdown to this file")
    parser.add_argument(
        "--only",
        help="comma-separated case-id prefixes to run, e.g. rtt.unix,rtt.baseline.jsonl,cold",
    )
    parser.add_argument("--list", action="store_true", help="list the case ids and exit")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; exit 0 unless a case crashed (missed targets are findings)."""
    opts = build_parser().parse_args(argv)
    settings = QUICK if opts.quick else FULL
    cases = build_cases(settings)
    if opts.only:
        prefixes = tuple(p.strip() for p in opts.only.split(",") if p.strip())
        cases = [c for c in cases if c.id.startswith(prefixes)]
    if opts.list:
        for case in cases:
            print(f"{case.id:40} {case.label}")
        return 0

    def progress(message: str) -> None:
        if not opts.quiet:
            print(message, file=sys.stderr, flush=True)

    started = time.monotonic()
    about = machine.describe()
    try:
        rows = run_cases(cases, progress)
    finally:
        subject.cleanup()
    about["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    results: dict[str, Any] = {
        "version": RESULTS_VERSION,
        "machine": about,
        "settings": settings.to_dict(),
        "duration_s": round(time.monotonic() - started, 1),
        "rows": [row.to_dict() for row in rows],
        "targets": targets.evaluate(rows),
    }
    with open(opts.output, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    print(report.render_text(results, rows))
    print(f"\nFigures written to {opts.output} ({results['duration_s']} s).")
    if opts.markdown:
        with open(opts.markdown, "w", encoding="utf-8") as f:
            f.write(report.render_markdown(results, rows) + "\n")
    errors = [row for row in rows if row.status == "error"]
    for row in errors:
        print(f"error in {row.id}: {row.reason}", file=sys.stderr)
    return 1 if errors else 0
