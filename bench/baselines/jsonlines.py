"""Baseline (a): the reference's local RPC shape, rebuilt from its description.

One JSON object per line over one Unix-socket connection. A request is
``{"tool", "args", "token"}`` with no id; the reply line is the tool's JSON text. The
host serves its one connection one request at a time, and the client holds a lock
around each call, so calls from several threads are serialized.

The host checks the token in constant time, the allowlist and a call budget, as the
reference does, and calls the tool inline; both sides read lines with a buffered
reader, so the baseline is no slower than its shape requires.

    python -m bench.baselines.jsonlines host SOCKET          (token in BENCH_RPC_TOKEN)
    python -m bench.baselines.jsonlines client SOCKET --calls N [--callers K] ...
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
from typing import Any

from bench.baselines._process import parse_roles, run_host_and_client
from bench.timing import time_calls
from bench.workload import HOST_TOOLS, call_spec

MODULE = "bench.baselines.jsonlines"
BUDGET = 10**9


def _answer(line: bytes, token: bytes, state: dict[str, int]) -> str:
    try:
        request = json.loads(line)
        tool, args, given = request["tool"], request.get("args") or {}, request.get("token", "")
    except (ValueError, KeyError, TypeError):
        return json.dumps({"error": "Invalid RPC request"})
    if not token or not hmac.compare_digest(str(given).encode(), token):
        return json.dumps({"error": "Unauthorized RPC request"})
    if tool not in HOST_TOOLS:
        return json.dumps({"error": f"Tool '{tool}' is not allowed. Allowed: echo, blob"})
    if state["calls"] >= BUDGET:
        return json.dumps({"error": f"Tool call limit reached ({BUDGET})"})
    state["calls"] += 1
    try:
        return HOST_TOOLS[tool](args)
    except Exception as exc:
        return json.dumps({"error": f"Tool execution failed: {type(exc).__name__}: {exc}"})


def serve(path: str) -> None:
    """Listen on ``path``, print "ready", serve one connection until it closes."""
    token = os.environ.get("BENCH_RPC_TOKEN", "").encode()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(1)
    print("ready", flush=True)
    conn, _ = listener.accept()
    listener.close()
    state = {"calls": 0}
    with conn, conn.makefile("rb") as reader:
        while True:
            line = reader.readline()
            if not line:
                return
            conn.sendall(_answer(line, token, state).encode() + b"\n")


class LockedClient:
    """The reference stub's shape: one connection, one call at a time under a lock."""

    def __init__(self, path: str, token: str) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(path)
        self._reader = self._sock.makefile("rb")
        self._token = token
        self._lock = threading.Lock()

    def call(self, tool: str, args: dict[str, Any]) -> Any:
        line = json.dumps({"tool": tool, "args": args, "token": self._token}).encode() + b"\n"
        with self._lock:
            self._sock.sendall(line)
            reply = self._reader.readline()
        if not reply:
            raise ConnectionError("the host closed the connection")
        return json.loads(reply)

    def close(self) -> None:
        self._reader.close()
        self._sock.close()


def _client_main(opts: argparse.Namespace) -> None:
    client = LockedClient(opts.socket, os.environ.get("BENCH_RPC_TOKEN", ""))
    args, expected = call_spec(opts.tool, opts.size)

    def call(_i: int) -> None:
        reply = client.call(opts.tool, args)
        got = len(reply["data"]) if opts.tool == "blob" else reply
        if got != expected:
            raise AssertionError(f"wrong answer: {str(reply)[:200]}")

    figures = time_calls(call, opts.calls, opts.callers, opts.warmup)
    client.close()
    json.dump(figures, sys.stdout)


def run(
    calls: int,
    callers: int = 1,
    warmup: int = 0,
    *,
    tool: str = "echo",
    size: int = 0,
    timeout: float = 120.0,
) -> dict[str, Any]:
    """Start a host and a timing client; return the client's figures."""
    workdir = tempfile.mkdtemp(prefix="bench-jsonl-")
    path = os.path.join(workdir, "rpc.sock")
    try:
        return run_host_and_client(
            MODULE,
            path,
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
    opts = parse_roles(MODULE, "socket", argv)
    if opts.role == "host":
        serve(opts.socket)
    else:
        _client_main(opts)


if __name__ == "__main__":
    main()
