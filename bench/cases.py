"""The table of measurable cases: every row the benchmark reports, found by id.

A row is a :class:`Case`: an id, a label, how to measure one round of it, how to pool
its rounds into figures, and a probe that says why it cannot run here (or ``None``).
Transports and backends are entries in two small tables; the round-trip, payload and
run rows are their product, so a transport or backend that lands becomes measurable
by filling in its entry:

- a transport is the ``execute_code`` options that select it; until ``RunOptions``
  has those options its rows say "not available" with the reason;
- a backend is looked up in :data:`environments.BACKENDS`, so its rows run as soon as
  it is registered there (plus any options it needs, e.g. an image or a host).

Nothing is faked: a case that cannot run reports why.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from bench import stats, subject
from bench.baselines import floor, jsonlines, polling, streams
from bench.settings import Settings
from bench.workload import MiB
from hermes_sandbox import RunOptions
from hermes_sandbox.environments import BackendNotAvailable, get_environment_class

Sample = dict[str, Any]
Probe = Callable[[], "str | None"]

SECTIONS = {
    "rtt": "1. Tool-call round trip, echo tool (16-byte payload)",
    "cold": "3. Cold run (print(1) unless the row says) through the Python API, warm host",
    "memory": "4. Host memory while a script prints to stdout",
    "concurrent": "5. Concurrent runs, each making 20 tool calls",
    "payload": "6. Large tool results, round trip",
    "warm": "7. print(1) in a warm Session, a one-shot run beside it as the baseline",
    "cell": "8. print(1) as a cell of a persistent interpreter, a warm Session run beside it",
    "many": "9. Many runs at once, threads calling a plain echo tool in each",
}


@dataclass(frozen=True)
class Transport:
    """How a script's calls reach the host, selected by ``run_options``."""

    name: str
    label: str
    run_options: Mapping[str, Any] = field(default_factory=dict)

    def probe(self) -> str | None:
        fields = {f.name for f in dataclasses.fields(RunOptions)}
        missing = [key for key in self.run_options if key not in fields]
        if missing:
            return (
                f"the {self.label} transport is not built yet "
                f"(RunOptions has no {missing[0]!r} option)"
            )
        return None


@dataclass(frozen=True)
class Backend:
    """Where the script runs; ``run_options`` adds what the backend needs to start."""

    name: str
    run_options: Mapping[str, Any] = field(default_factory=dict)

    def probe(self) -> str | None:
        try:
            get_environment_class(self.name)
        except BackendNotAvailable as exc:
            return str(exc).split(";")[0]
        return None

    def options(self) -> dict[str, Any]:
        return {"backend": self.name, **self.run_options}


TRANSPORTS = (
    Transport("unix", "Unix socket", {"transport": "unix"}),
    Transport("relay", "stream relay", {"transport": "relay"}),
    Transport("files", "files", {"transport": "files"}),
)


def _ssh_test_server() -> dict[str, Any]:
    """The ssh backend's options for the server ``eval "$(scripts/sshd-service)"``
    describes in HERMES_TEST_SSH_*; empty when those are not set."""
    names = {"host": "HOST", "port": "PORT", "user": "USER", "key_file": "KEY"}
    found = {key: os.environ.get(f"HERMES_TEST_SSH_{name}") for key, name in names.items()}
    if not all(found.values()):
        return {}
    options: dict[str, Any] = {**found, "port": int(found["port"] or 22)}
    if os.environ.get("HERMES_TEST_SSH_KNOWN_HOSTS"):
        options["known_hosts"] = os.environ["HERMES_TEST_SSH_KNOWN_HOSTS"]
    return {"backend_options": options}


@dataclass(frozen=True)
class SSHBackend(Backend):
    def probe(self) -> str | None:
        if not self.run_options:
            return 'no SSH server configured: eval "$(scripts/sshd-service)" first'
        return super().probe()


# Backends that can run on these machines (Docker through podman, SSH to a local sshd);
# modal and daytona need their services, which cannot be reached from here.
BACKENDS = (Backend("local"), Backend("docker"), SSHBackend("ssh", _ssh_test_server()))


def _backend(name: str) -> Backend:
    return next(b for b in BACKENDS if b.name == name)


def _ssh_options(backend: Backend) -> dict[str, Any]:
    return dict(backend.run_options.get("backend_options", {}))


def _first_reason(*probes: Probe) -> str | None:
    for probe in probes:
        reason = probe()
        if reason:
            return reason
    return None


def _no_reason() -> str | None:
    return None


@dataclass(frozen=True)
class Case:
    """One row: ``measure`` runs one round, ``summarize`` pools the rounds into figures,
    ``probe`` returns why the row cannot run here, or None."""

    id: str
    section: str
    label: str
    measure: Callable[[], Sample]  # one round; raises subject.NotAvailable
    summarize: Callable[[list[Sample]], dict[str, Any]]
    rounds: int = 1
    probe: Probe = _no_reason
    params: Mapping[str, Any] = field(default_factory=dict)
    kind: str = "subject"  # or "baseline"


def _paired(samples: list[Sample], subject: str, baseline: str) -> dict[str, Any]:
    """p50, p90 and count of ``<subject>_ms`` and ``<baseline>_ms`` timed in turns, and
    the ratio of their medians."""
    ours = [x for s in samples for x in s[f"{subject}_ms"]]
    theirs = [x for s in samples for x in s[f"{baseline}_ms"]]
    ours_p50, theirs_p50 = stats.median(ours), stats.median(theirs)
    return {
        f"{subject}_p50_ms": round(ours_p50, 2),
        f"{subject}_p90_ms": round(stats.percentile(ours, 90), 2),
        f"{baseline}_p50_ms": round(theirs_p50, 2),
        f"{baseline}_p90_ms": round(stats.percentile(theirs, 90), 2),
        "ratio": round(ours_p50 / theirs_p50, 3),
        "runs": len(ours),
    }


def _summarize_cold(samples: list[Sample]) -> dict[str, Any]:
    return {**_paired(samples, "api", "bare"), "bare_argv": samples[0]["bare_argv"]}


def _summarize_warm(samples: list[Sample]) -> dict[str, Any]:
    return _paired(samples, "warm", "one_shot")


def _summarize_cell(samples: list[Sample]) -> dict[str, Any]:
    starts = [x for s in samples for x in s["start_ms"]]
    return {**_paired(samples, "cell", "warm"), "start_p50_ms": round(stats.median(starts), 2)}


def _summarize_times(samples: list[Sample]) -> dict[str, Any]:
    times = [x for s in samples for x in s["ms"]]
    return {
        "p50_ms": round(stats.median(times), 2),
        "p90_ms": round(stats.percentile(times, 90), 2),
        "runs": len(times),
    }


def _summarize_floor_start(samples: list[Sample]) -> dict[str, Any]:
    return {**_summarize_times(samples), "argv": samples[0]["argv"]}


def _summarize_concurrent(samples: list[Sample]) -> dict[str, Any]:
    walls = [s["wall_s"] for s in samples]
    runs = [x for s in samples for x in s["run_s"]]
    total = sum(len(s["run_s"]) for s in samples)
    correct = sum(s["correct"] for s in samples)
    return {
        "wall_p50_s": round(stats.median(walls), 3),
        "wall_s": [round(w, 3) for w in walls],
        "run_p50_s": round(stats.median(runs), 3),
        "correct": correct,
        "runs": total,
        "all_correct": correct == total,
        "wrong_examples": [w for s in samples for w in s["wrong"]][:3],
    }


# Host counts compared from this round on (the first round warms imports and pools).
MANY_STEADY_ROUND = 2


def _summarize_many(samples: list[Sample]) -> dict[str, Any]:
    walls = [s["wall_s"] for s in samples]
    correct = sum(s["correct"] for s in samples)
    runs = sum(s["runs"] for s in samples)
    steady = samples[min(MANY_STEADY_ROUND, len(samples)) - 1]
    last = samples[-1]
    return {
        "wall_p50_s": round(stats.median(walls), 3),
        "wall_s": [round(w, 3) for w in walls],
        "calls_per_s": round(samples[0]["calls"] / stats.median(walls)),
        "correct": correct,
        "runs": runs,
        "all_correct": correct == runs,
        "wrong_examples": [w for s in samples for w in s["wrong"]][:3],
        "rss_mb": [round(s["rss_mb"], 1) for s in samples],
        "fds": [s["fds"] for s in samples],
        "threads": [s["threads"] for s in samples],
        "rss_growth_mb": round(last["rss_mb"] - steady["rss_mb"], 1),
        "fd_growth": last["fds"] - steady["fds"],
        "thread_growth": last["threads"] - steady["threads"],
    }


def _summarize_payload(size: int) -> Callable[[list[Sample]], dict[str, Any]]:
    def summarize(samples: list[Sample]) -> dict[str, Any]:
        figures = stats.summarize_rtt(samples)
        p50_ms = figures["p50_us"] / 1000
        return {
            "size_bytes": size,
            "p50_ms": round(p50_ms, 2),
            "p99_ms": round(figures["p99_us"] / 1000, 2),
            "mb_per_s": round(size / 1e6 / (p50_ms / 1000)) if p50_ms else None,
            "calls": figures["calls"],
            "rounds": figures["rounds"],
        }

    return summarize


def _only_round(samples: list[Sample]) -> dict[str, Any]:
    return samples[0]


def _size_name(size: int) -> str:
    return f"{size // MiB}MiB"


def build_cases(settings: Settings) -> list[Case]:
    """Every row of the benchmark, in the order the report shows them."""
    s = settings
    cases: list[Case] = []
    subjects = [(t, b) for t in TRANSPORTS for b in BACKENDS]

    # 1. Round trips: each transport on each backend, then the baselines.
    for callers in s.callers:
        for t, b in subjects:
            options = {**b.options(), **t.run_options}
            cases.append(
                Case(
                    id=f"rtt.{t.name}.{b.name}.c{callers}",
                    section="rtt",
                    label=f"{t.label} / {b.name}",
                    measure=partial(
                        subject.run_rtt, options, s.socket_calls, callers, s.socket_warmup
                    ),
                    summarize=stats.summarize_rtt,
                    rounds=s.rounds,
                    probe=partial(_first_reason, b.probe, t.probe),
                    params={"transport": t.name, "backend": b.name, "callers": callers},
                )
            )
        cases.append(
            Case(
                id=f"rtt.baseline.jsonl.c{callers}",
                section="rtt",
                label="baseline: JSON lines, locked client",
                measure=partial(jsonlines.run, s.socket_calls, callers, s.socket_warmup),
                summarize=stats.summarize_rtt,
                rounds=s.rounds,
                params={"baseline": "jsonl", "callers": callers},
                kind="baseline",
            )
        )
        cases.append(
            Case(
                id=f"rtt.baseline.polling.c{callers}",
                section="rtt",
                label="baseline: file polling, 50-250 ms / 100 ms",
                measure=partial(polling.run, s.polling_calls[callers], callers, 0),
                summarize=stats.summarize_rtt,
                rounds=s.rounds,
                params={"baseline": "polling", "callers": callers},
                kind="baseline",
            )
        )
    # Issue #12 target 1: the echo registered the plain way (no inline) over the Unix
    # socket, and 100 KB results, ours and the JSON-lines baseline's, as calls/s.
    local_unix = {**_backend("local").options(), "transport": "unix"}
    for callers in s.callers:
        cases.append(
            Case(
                id=f"rtt.unix.local.plain.c{callers}",
                section="rtt",
                label="Unix socket / local, plain sync tool",
                measure=partial(
                    subject.run_rtt,
                    local_unix,
                    s.socket_calls,
                    callers,
                    s.socket_warmup,
                    tool="pecho",
                ),
                summarize=stats.summarize_rtt,
                rounds=s.rounds,
                params={"transport": "unix", "backend": "local", "callers": callers},
            )
        )
    big = 100 * 1024
    cases.append(
        Case(
            id="rtt.unix.local.100k.c1",
            section="rtt",
            label="Unix socket / local, 100 KB results",
            measure=partial(
                subject.run_rtt, local_unix, s.socket_calls // 4, 1, 5, tool="blob", size=big
            ),
            summarize=stats.summarize_rtt,
            rounds=s.rounds,
            params={"transport": "unix", "backend": "local", "callers": 1, "size": big},
        )
    )
    cases.append(
        Case(
            id="rtt.baseline.jsonl.100k.c1",
            section="rtt",
            label="baseline: JSON lines, 100 KB results",
            measure=partial(jsonlines.run, s.socket_calls // 4, 1, 5, tool="blob", size=big),
            summarize=stats.summarize_rtt,
            rounds=s.rounds,
            params={"baseline": "jsonl", "callers": 1, "size": big},
            kind="baseline",
        )
    )
    cases.append(
        Case(
            id="rtt.baseline.floor.c1",
            section="rtt",
            label="floor: 32-byte socketpair ping-pong",
            measure=partial(floor.run, s.socket_calls, s.socket_warmup),
            summarize=stats.summarize_rtt,
            rounds=s.rounds,
            params={"baseline": "floor", "callers": 1},
            kind="baseline",
        )
    )
    # The raw exec streams the docker and ssh relays ride on, beside the relay rows.
    docker, ssh = _backend("docker"), _backend("ssh")
    stream_floors = (
        (docker, "cat over docker exec", partial(streams.docker_exec_echo)),
        (ssh, "cat on a pooled ssh channel", partial(streams.ssh_channel_echo, _ssh_options(ssh))),
    )
    for b, over, echo in stream_floors:
        cases.append(
            Case(
                id=f"rtt.floor.{b.name}.c1",
                section="rtt",
                label=f"floor: 64-byte echo, {over}",
                measure=partial(echo, s.socket_calls, s.socket_warmup),
                summarize=stats.summarize_rtt,
                rounds=s.rounds,
                probe=b.probe,
                params={"baseline": f"{b.name}-stream", "backend": b.name, "callers": 1},
                kind="baseline",
            )
        )

    # 3. Cold runs, the bare interpreter timed beside each; 7. warm runs in a Session,
    # a one-shot run timed beside each (local only: on docker each one-shot run starts a
    # container, seconds apiece, which the quick run in the tests cannot afford; run
    # subject.run_warm by hand for the other backends). The floors of the remote
    # backends' starts, and the command line's, take turns with the cold rows round by round.
    local = [b for b in BACKENDS if b.name == "local"]
    # A persistent interpreter: its round trip and its start (docker: in a running container).
    cell = [b for b in BACKENDS if b.name in ("local", "docker")]
    # cold.local.call: what a script that uses a tool pays over print(1), hermes_tools'
    # import and one call (no target: the issue's is print(1)'s; docs/benchmarks.md, "A
    # script's import of hermes_tools (session 15)").
    one_call = partial(subject.run_cold, call=True)
    paired = [
        ("cold", "", "print(1)", subject.run_cold, _summarize_cold, BACKENDS),
        ("cold", ".call", "import hermes_tools, one echo call", one_call, _summarize_cold, local),
        ("warm", "", "print(1)", subject.run_warm, _summarize_warm, local),
        ("cell", "", "print(1)", subject.run_cell, _summarize_cell, cell),
    ]
    for section, suffix, what, measure, summarize, backends in paired:
        for b in backends:
            cases.append(
                Case(
                    id=f"{section}.{b.name}{suffix}",
                    section=section,
                    label=f"{what} / {b.name}",
                    measure=partial(measure, b.options(), s.cold_runs),
                    summarize=summarize,
                    rounds=s.cold_rounds,
                    probe=b.probe,
                    params={"backend": b.name},
                )
            )
    # The command line, a new process each time: a run in it, and a run it sends to a
    # warm named session.
    command_lines = (
        ("local", "hermes-sandbox run print(1) / local", subject.run_cli_cold, {}),
        (
            "session",
            "hermes-sandbox run --session print(1), warm session / local",
            subject.run_cli_session,
            {"session": True},
        ),
    )
    for name, label, measure, extra in command_lines:
        cases.append(
            Case(
                id=f"cold.cli.{name}",
                section="cold",
                label=label,
                measure=partial(measure, s.cold_runs),
                summarize=_summarize_cold,
                rounds=s.cold_rounds,
                params={"backend": "local", "command_line": True, **extra},
            )
        )
    start_floors = (
        (docker, "docker run --rm IMAGE python3 -c 1", partial(streams.docker_run)),
        (
            ssh,
            "python3 -c 1 on a pooled ssh connection",
            partial(streams.ssh_exec, _ssh_options(ssh)),
        ),
    )
    for b, what, start in start_floors:
        cases.append(
            Case(
                id=f"cold.floor.{b.name}",
                section="cold",
                label=f"floor: {what}",
                measure=partial(start, s.cold_runs),
                summarize=_summarize_floor_start,
                rounds=s.cold_rounds,
                probe=b.probe,
                params={"baseline": f"{b.name}-start", "backend": b.name},
                kind="baseline",
            )
        )

    # A run in a warm docker container (a Session), and its floor: a bare exec of
    # python3 -c 1 in such a container through the engine; the rounds take turns.
    warm_docker = (
        ("warm.docker", "print(1) in a warm Session / docker", subject.run_session, "subject"),
        (
            "warm.floor.docker",
            "floor: docker exec CONTAINER python3 -c 1",
            streams.docker_exec,
            "baseline",
        ),
    )
    for case_id, label, measure, kind in warm_docker:
        cases.append(
            Case(
                id=case_id,
                section="warm",
                label=label,
                measure=partial(measure, docker.options(), s.cold_runs),
                summarize=_summarize_times,
                rounds=s.cold_rounds,
                probe=docker.probe,
                params={"backend": "docker"},
                kind=kind,
            )
        )

    # 4. Memory.
    for b in BACKENDS:
        cases.append(
            Case(
                id=f"memory.{b.name}",
                section="memory",
                label=f"print {s.memory_bytes / MiB:g} MiB / {b.name}",
                measure=partial(subject.run_memory, b.options(), s.memory_bytes),
                summarize=_only_round,
                probe=b.probe,
                params={"backend": b.name, "printed_bytes": s.memory_bytes},
            )
        )

    # 5. Concurrent runs.
    for b in BACKENDS:
        for n in s.concurrent_runs:
            cases.append(
                Case(
                    id=f"concurrent.{b.name}.n{n}",
                    section="concurrent",
                    label=f"{n} runs x {s.concurrent_calls} calls / {b.name}",
                    measure=partial(subject.run_concurrent, b.options(), n, s.concurrent_calls),
                    summarize=_summarize_concurrent,
                    rounds=s.concurrent_rounds,
                    probe=b.probe,
                    params={"backend": b.name, "runs": n, "calls": s.concurrent_calls},
                )
            )

    # 9. Many runs at once, on the socket and on files (issue #12, target 4).
    for t in (t for t in TRANSPORTS if t.name in ("unix", "files")):
        b = _backend("local")
        cases.append(
            Case(
                id=f"many.{t.name}.{b.name}",
                section="many",
                label=(
                    f"{s.many_runs} runs x {s.many_threads} threads x {s.many_calls} calls"
                    f" / {t.label} / {b.name}"
                ),
                measure=partial(
                    subject.run_many,
                    {**b.options(), **t.run_options},
                    s.many_runs,
                    s.many_threads,
                    s.many_calls,
                ),
                summarize=_summarize_many,
                rounds=s.many_rounds,
                probe=partial(_first_reason, b.probe, t.probe),
                params={
                    "transport": t.name,
                    "backend": b.name,
                    "runs": s.many_runs,
                    "threads": s.many_threads,
                    "calls_per_thread": s.many_calls,
                },
            )
        )

    # 6. Large payloads: each transport on each backend, and the JSON-lines baseline.
    for size in s.payload_sizes:
        calls = s.payload_calls[size]
        for t, b in subjects:
            options = {**b.options(), **t.run_options}
            cases.append(
                Case(
                    id=f"payload.{t.name}.{b.name}.{_size_name(size)}",
                    section="payload",
                    label=f"{_size_name(size)} / {t.label} / {b.name}",
                    measure=partial(subject.run_rtt, options, calls, 1, 1, tool="blob", size=size),
                    summarize=_summarize_payload(size),
                    rounds=s.payload_rounds,
                    probe=partial(_first_reason, b.probe, t.probe),
                    params={"transport": t.name, "backend": b.name, "size": size},
                )
            )
        cases.append(
            Case(
                id=f"payload.baseline.jsonl.{_size_name(size)}",
                section="payload",
                label=f"{_size_name(size)} / baseline: JSON lines",
                measure=partial(jsonlines.run, calls, 1, 1, tool="blob", size=size),
                summarize=_summarize_payload(size),
                rounds=s.payload_rounds,
                params={"baseline": "jsonl", "size": size},
                kind="baseline",
            )
        )
    return cases
