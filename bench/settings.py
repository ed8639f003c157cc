"""How much each measurement runs: the full benchmark, and the quick smoke mode.

Full mode aims at stable medians within about five minutes on a 2-core machine; quick
mode only proves, in a few seconds, that every case still runs end to end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.workload import MiB


@dataclass(frozen=True)
class Settings:
    mode: str
    rounds: int  # round-trip rounds; subject and baselines alternate within each
    socket_calls: int  # timed calls per round over a socket, per case
    socket_warmup: int
    polling_calls: dict[int, int]  # by callers: each call costs 50-250 ms
    cold_runs: int  # pairs of (API run, bare interpreter), interleaved, per round
    cold_rounds: int  # rounds of cold_runs: the floors' rounds take turns with ours
    memory_bytes: int
    concurrent_runs: tuple[int, ...]
    concurrent_calls: int
    concurrent_rounds: int
    payload_sizes: tuple[int, ...]
    payload_calls: dict[int, int] = field(default_factory=dict)  # by size
    payload_rounds: int = 1
    callers: tuple[int, ...] = (1, 8)
    # Many runs at once (issue #12, target 4): runs x threads per run x calls per thread.
    many_runs: int = 32
    many_threads: int = 10
    many_calls: int = 50
    many_rounds: int = 5

    def to_dict(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "rtt_rounds": self.rounds,
            "socket_calls_per_round": self.socket_calls,
            "socket_warmup_calls": self.socket_warmup,
            "polling_calls_per_round": {str(k): v for k, v in self.polling_calls.items()},
            "cold_runs_per_round": self.cold_runs,
            "cold_rounds": self.cold_rounds,
            "memory_printed_bytes": self.memory_bytes,
            "concurrent_runs": list(self.concurrent_runs),
            "concurrent_calls_per_run": self.concurrent_calls,
            "concurrent_rounds": self.concurrent_rounds,
            "payload_sizes": list(self.payload_sizes),
            "payload_calls_per_round": {str(k): v for k, v in self.payload_calls.items()},
            "payload_rounds": self.payload_rounds,
            "callers": list(self.callers),
            "many_runs": self.many_runs,
            "many_threads_per_run": self.many_threads,
            "many_calls_per_thread": self.many_calls,
            "many_rounds": self.many_rounds,
        }


FULL = Settings(
    mode="full",
    rounds=7,
    socket_calls=2000,
    socket_warmup=200,
    polling_calls={1: 8, 8: 16},
    cold_runs=5,
    cold_rounds=4,
    memory_bytes=1 << 30,
    concurrent_runs=(8, 32),
    concurrent_calls=20,
    concurrent_rounds=3,
    payload_sizes=(MiB, 10 * MiB),
    payload_calls={MiB: 20, 10 * MiB: 5},
    payload_rounds=3,
)

QUICK = Settings(
    mode="quick",
    rounds=1,
    socket_calls=100,
    socket_warmup=10,
    polling_calls={1: 2, 8: 8},
    cold_runs=2,
    cold_rounds=1,
    memory_bytes=16 * MiB,
    concurrent_runs=(8, 32),
    concurrent_calls=20,
    concurrent_rounds=1,
    payload_sizes=(MiB, 10 * MiB),
    payload_calls={MiB: 2, 10 * MiB: 1},
    payload_rounds=1,
    many_runs=8,
    many_threads=2,
    many_calls=5,
    many_rounds=2,
)
