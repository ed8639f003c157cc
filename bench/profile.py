"""Profile the Unix-socket round trip on both sides with py-spy, and say where time goes.

    python -m bench.profile [--calls 20000] [--callers 1] [--raw FILE]

py-spy samples the host (this benchmark's process, which serves the calls) and, with
``--subprocesses``, the script making the calls. Each sample is put in one category
(the first in :data:`CATEGORIES` that any frame of it matches), so the table reads as
"share of the samples spent in ...". Waiting categories are the process blocked on
the other side; the rest is work. Needs ``pip install py-spy`` and ptrace rights
(root, or CAP_SYS_PTRACE).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.baselines._process import REPO_ROOT, child_env

# (category, substrings of a py-spy frame "function (file:line)"); first match wins.
CATEGORIES: list[tuple[str, list[str]]] = [
    ("waiting: event loop idle in epoll", ["EpollSelector.select"]),
    ("waiting: worker thread idle", ["Queue.get"]),
    ("waiting: script blocked in recv", ["_Connection._fill"]),
    ("waiting: script in sendall (kernel wakes the host)", ["<sendall>"]),
    (
        "dispatch to a worker thread (to_thread, queue, wake-ups)",
        [
            "run_sync_in_worker_thread",
            "Queue.put",
            "WorkerThread",
            "_report_result",
            "call_soon_threadsafe",
            "_write_to_self",
            "_read_from_self",
            "run_sync (anyio/to_thread",
        ],
    ),
    (
        "task spawn per request (TaskGroup.start_soon)",
        ["TaskGroup.start_soon", "TaskGroup._spawn", "TaskHandle.__init__", "task_done"],
    ),
    ("send lock (anyio.Lock)", ["Lock.__aenter__", "Lock.__aexit__", "Lock.acquire (anyio"]),
    (
        "anyio stream receive (recv, add/remove_reader, checkpoint)",
        ["UNIXSocketStream.receive", "_wait_until_readable", "remove_reader", "add_reader"],
    ),
    ("anyio stream send (send, checkpoint)", ["UNIXSocketStream.send", "_send_quietly"]),
    (
        "msgpack and framing",
        ["packb", "unpackb", "decode_body", "encode_frame", "FrameSplitter.feed", "_unpack"],
    ),
    ("JSON (tool result, client parse)", ["json/", "JSONDecoder", "JSONEncoder", "echo_tool"]),
    (
        "request checks (Request, token, gate, budget, registry)",
        ["Envelope", "RequestReader", "ToolGate", "try_spend", "adispatch", "_finish"],
    ),
    ("client bookkeeping (locks, ids, environ)", ["hermes_tools"]),
    ("event loop machinery", ["_run_once", "Handle._run", "TaskHandle._run_coro"]),
]
OTHER = "other (start-up, imports, supervision)"


def _sendall_line() -> str:
    """The frame py-spy shows while the stub is inside sendall: its line in the stub."""
    from hermes_sandbox.stubs import CLIENT_MODULE, program_source

    for number, line in enumerate(program_source("_client.py").splitlines(), 1):
        if "self._sock.sendall(" in line:
            return f"_Connection.call ({CLIENT_MODULE}:{number})"
    return "<no sendall line>"


def categorize(raw: Path) -> dict[str, collections.Counter[str]]:
    """Samples per category, for the host and the script, from py-spy's raw output."""
    sendall = _sendall_line()
    counts: dict[str, collections.Counter[str]] = {
        "host": collections.Counter(),
        "script": collections.Counter(),
    }
    for line in raw.read_text().splitlines():
        stack, _, number = line.rpartition(" ")
        frames = stack.replace(sendall, "<sendall>").split(";")
        side = "script" if len(frames) > 1 and frames[1].startswith("process ") else "host"
        category = next(
            (name for name, keys in CATEGORIES if any(k in f for f in frames for k in keys)),
            OTHER,
        )
        counts[side][category] += int(number)
    return counts


def report(counts: dict[str, collections.Counter[str]]) -> str:
    out = []
    for side in ("host", "script"):
        samples = counts[side]
        total = sum(samples.values()) or 1
        busy = sum(n for c, n in samples.items() if not c.startswith("waiting")) or 1
        out.append(f"{side}: {total} samples      share  of busy")
        for category, n in samples.most_common():
            of_busy = "" if category.startswith("waiting") else f"{n / busy:6.1%}"
            out.append(f"  {category:58} {n / total:6.1%}  {of_busy}")
    return "\n".join(out)


def _target(calls: int, callers: int) -> None:
    from bench import stats, subject

    figures = stats.summarize_rtt([subject.run_rtt({}, calls, callers, 200)])
    print(f"round trip under the profiler: {figures}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--callers", type=int, default=1)
    parser.add_argument("--rate", type=int, default=1000, help="py-spy samples per second")
    parser.add_argument("--raw", help="keep py-spy's raw (collapsed stacks) output here")
    parser.add_argument("--target", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.target:
        _target(opts.calls, opts.callers)
        return 0
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        print("py-spy is not installed: pip install py-spy", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        raw = Path(opts.raw or Path(tmp) / "raw.txt")
        argv_ = [py_spy, "record", "--nonblocking", "--subprocesses", "--threads"]
        argv_ += ["-r", str(opts.rate), "--format", "raw", "-o", str(raw), "--"]
        argv_ += [sys.executable, "-m", "bench.profile", "--target"]
        argv_ += ["--calls", str(opts.calls), "--callers", str(opts.callers)]
        subprocess.run(argv_, env=child_env(), cwd=REPO_ROOT, check=True)
        print(report(categorize(raw)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
