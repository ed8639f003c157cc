"""Baseline (b): the reference's file RPC shape, rebuilt from its description.

The client writes ``req_NNNNNN.tmp``, renames it to ``req_NNNNNN`` and polls for
``res_NNNNNN``: first after 50 ms, then backing off x1.2 up to 250 ms between looks.
The host scans the directory every 100 ms, answers each request (reply written to a
temporary name, then renamed) and removes it.

The reference's host does each of those file operations through the backend (a
``docker exec`` or ssh round trip each); here they are local file operations, so this
baseline is a lower bound on the reference's latency. Calls from several threads are
not serialized (each has its own sequence number), which also favours the baseline.

    python -m bench.baselines.polling host DIR          (token in BENCH_RPC_TOKEN)
    python -m bench.baselines.polling client DIR --calls N [--callers K] ...
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

from bench.baselines._process import parse_roles, run_host_and_client
from bench.timing import time_calls
from bench.workload import HOST_TOOLS, call_spec

MODULE = "bench.baselines.polling"
HOST_SCAN_SECONDS = 0.100
CLIENT_FIRST_POLL = 0.050
CLIENT_BACKOFF = 1.2
CLIENT_MAX_POLL = 0.250
CLIENT_GIVE_UP = 300.0


def _write_atomically(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.rename(tmp, path)


def _answer(raw: bytes, token: bytes) -> bytes | None:
    """The reply to one request file, or None to drop it unanswered as the reference does."""
    try:
        request = json.loads(raw)
        tool, args, given = request["tool"], request.get("args") or {}, request.get("token", "")
    except (ValueError, KeyError, TypeError):
        return None
    if not token or not hmac.compare_digest(str(given).encode(), token):
        return None
    if tool not in HOST_TOOLS:
        return json.dumps({"error": f"Tool '{tool}' is not allowed"}).encode()
    try:
        return HOST_TOOLS[tool](args).encode()
    except Exception as exc:
        return json.dumps({"error": f"Tool execution failed: {exc}"}).encode()


def serve(directory: str) -> None:
    """Scan ``directory`` for requests every 100 ms until terminated."""
    token = os.environ.get("BENCH_RPC_TOKEN", "").encode()
    print("ready", flush=True)
    while True:
        for name in sorted(os.listdir(directory)):
            if not name.startswith("req_") or name.endswith(".tmp"):
                continue
            path = os.path.join(directory, name)
            try:
                with open(path, "rb") as f:
                    raw = f.read()
            except FileNotFoundError:
                continue
            reply = _answer(raw, token)
            if reply is not None:
                _write_atomically(os.path.join(directory, "res_" + name[4:]), reply)
            os.unlink(path)
        time.sleep(HOST_SCAN_SECONDS)


class PollingClient:
    def __init__(self, directory: str, token: str) -> None:
        self._dir = directory
        self._token = token
        self._seq = 0
        self._lock = threading.Lock()

    def call(self, tool: str, args: dict[str, Any]) -> Any:
        with self._lock:
            self._seq += 1
            seq = self._seq
        request = json.dumps({"tool": tool, "args": args, "token": self._token}).encode()
        _write_atomically(os.path.join(self._dir, f"req_{seq:06d}"), request)
        reply_path = os.path.join(self._dir, f"res_{seq:06d}")
        delay = CLIENT_FIRST_POLL
        deadline = time.monotonic() + CLIENT_GIVE_UP
        while time.monotonic() < deadline:
            time.sleep(delay)
            try:
                with open(reply_path, "rb") as f:
                    raw = f.read()
            except FileNotFoundError:
                delay = min(delay * CLIENT_BACKOFF, CLIENT_MAX_POLL)
                continue
            os.unlink(reply_path)
            return json.loads(raw)
        raise TimeoutError(f"no reply to request {seq} within {CLIENT_GIVE_UP:g}s")


def _client_main(opts: argparse.Namespace) -> None:
    client = PollingClient(opts.dir, os.environ.get("BENCH_RPC_TOKEN", ""))
    args, expected = call_spec(opts.tool, opts.size)

    def call(_i: int) -> None:
        reply = client.call(opts.tool, args)
        got = len(reply["data"]) if opts.tool == "blob" else reply
        if got != expected:
            raise AssertionError(f"wrong answer: {str(reply)[:200]}")

    json.dump(time_calls(call, opts.calls, opts.callers, opts.warmup), sys.stdout)


def run(
    calls: int,
    callers: int = 1,
    warmup: int = 0,
    *,
    tool: str = "echo",
    size: int = 0,
    timeout: float = 300.0,
) -> dict[str, Any]:
    """Start a scanning host and a polling client; return the client's figures."""
    workdir = tempfile.mkdtemp(prefix="bench-poll-")
    try:
        return run_host_and_client(
            MODULE,
            workdir,
            calls=calls,
            callers=callers,
            warmup=warmup,
            tool=tool,
            size=size,
            timeout=timeout,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    opts = parse_roles(MODULE, "dir", argv)
    if opts.role == "host":
        serve(opts.dir)
    else:
        _client_main(opts)


if __name__ == "__main__":
    main()
