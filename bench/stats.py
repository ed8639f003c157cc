"""Summaries of timings: percentiles, medians and the ratios the targets compare.

These machines are noisy, so every figure the benchmark reports is a median or a
percentile over many samples, never one time.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, by linear interpolation."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def summarize_rtt(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Pool the rounds of one round-trip case into its row's figures.

    Each sample is what :func:`bench.timing.time_calls` returned for one round. p50 and
    p99 are over every call of every round; calls per second is the median of the
    rounds' rates, each the round's calls over its wall time.
    """
    pooled = [ns / 1000.0 for s in samples for ns in s["lat_ns"]]
    rates = [len(s["lat_ns"]) / (s["wall_ns"] / 1e9) for s in samples if s["wall_ns"] > 0]
    per_round_p50 = [percentile([ns / 1000.0 for ns in s["lat_ns"]], 50) for s in samples]
    return {
        "p50_us": round(percentile(pooled, 50), 1),
        "p99_us": round(percentile(pooled, 99), 1),
        "calls_per_s": round(median(rates)),
        "calls": len(pooled),
        "rounds": len(samples),
        "round_p50_us": [round(x, 1) for x in per_round_p50],
    }
