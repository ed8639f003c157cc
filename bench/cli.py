"""The command line: ``scripts/bench [--quick] [--repeat N] [--output FILE] [--markdown FILE]``."""

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


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


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
    parser.add_argument(
        "--repeat",
        type=_positive,
        default=1,
        metavar="N",
        help=(
            "run the selected cases N times, whole passes one after another, and report "
            "each target's median, range and passes met over them (default: 1)"
        ),
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
    passes: list[dict[str, Any]] = []
    try:
        for number in range(1, opts.repeat + 1):
            if opts.repeat > 1:
                progress(f"=== pass {number} of {opts.repeat}")
            pass_started = time.monotonic()
            rows = run_cases(cases, progress)
            passes.append(
                {
                    "duration_s": round(time.monotonic() - pass_started, 1),
                    "rows": rows,
                    "targets": targets.evaluate(rows),
                }
            )
    finally:
        subject.cleanup()
    about["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    last = passes[-1]
    results: dict[str, Any] = {
        "version": RESULTS_VERSION,
        "machine": about,
        "settings": settings.to_dict(),
        "duration_s": round(time.monotonic() - started, 1),
        # With --repeat, the tables and "rows" are the last pass's; "passes" keeps
        # every pass and "targets" summarizes each target over them.
        "rows": [row.to_dict() for row in last["rows"]],
        "targets": last["targets"],
    }
    if opts.repeat > 1:
        results["repeat"] = opts.repeat
        results["passes"] = [{**p, "rows": [row.to_dict() for row in p["rows"]]} for p in passes]
        results["targets"] = targets.summarize([p["targets"] for p in passes])
    with open(opts.output, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    print(report.render_text(results, last["rows"]))
    print(f"\nFigures written to {opts.output} ({results['duration_s']} s).")
    if opts.markdown:
        with open(opts.markdown, "w", encoding="utf-8") as f:
            f.write(report.render_markdown(results, last["rows"]) + "\n")
    errors = [
        (number, row)
        for number, p in enumerate(passes, 1)
        for row in p["rows"]
        if row.status == "error"
    ]
    for number, row in errors:
        where = f" (pass {number} of {opts.repeat})" if opts.repeat > 1 else ""
        print(f"error in {row.id}{where}: {row.reason}", file=sys.stderr)
    return 1 if errors else 0
