"""Baseline (c): the floor, a raw 32-byte ping-pong over a Unix socket pair.

Two processes share a ``socketpair``: one echoes every 32 bytes it reads, the other
times sending 32 bytes and reading them back. Nothing any RPC over a local socket does
can be faster than this.

    python -m bench.baselines.floor echo FD
    python -m bench.baselines.floor ping FD --calls N [--warmup W]
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
from typing import Any

from bench.baselines._process import REPO_ROOT, child_env, module_argv, stop
from bench.timing import time_calls

MODULE = "bench.baselines.floor"
MESSAGE_SIZE = 32


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = sock.recv(size)
    while len(data) < size:
        more = sock.recv(size - len(data))
        if not more:
            raise EOFError("the other side closed the socket")
        data += more
    return data


def echo(fd: int) -> None:
    with socket.socket(fileno=fd) as sock:
        while True:
            data = sock.recv(MESSAGE_SIZE)
            if not data:
                return
            if len(data) < MESSAGE_SIZE:
                data += _recv_exactly(sock, MESSAGE_SIZE - len(data))
            sock.sendall(data)


def ping(fd: int, calls: int, warmup: int) -> dict[str, Any]:
    message = b"p" * MESSAGE_SIZE
    with socket.socket(fileno=fd) as sock:

        def call(_i: int) -> None:
            sock.sendall(message)
            if _recv_exactly(sock, MESSAGE_SIZE) != message:
                raise AssertionError("the echo changed the message")

        return time_calls(call, calls, 1, warmup)


def run(calls: int, warmup: int = 0, *, timeout: float = 120.0) -> dict[str, Any]:
    """Start an echo process and a timing process on a socket pair; return the figures."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    env = child_env()
    with mine, theirs:
        echoer = subprocess.Popen(
            module_argv(MODULE, "echo", theirs.fileno()),
            env=env,
            cwd=REPO_ROOT,
            pass_fds=[theirs.fileno()],
        )
        try:
            argv = module_argv(MODULE, "ping", mine.fileno(), "--calls", calls)
            argv += ["--warmup", str(warmup)]
            done = subprocess.run(
                argv,
                env=env,
                cwd=REPO_ROOT,
                pass_fds=[mine.fileno()],
                capture_output=True,
                timeout=timeout,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError("floor ping failed: " + done.stderr.decode(errors="replace"))
            figures: dict[str, Any] = json.loads(done.stdout)
            return figures
        finally:
            mine.close()
            theirs.close()
            stop(echoer)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=MODULE)
    sub = parser.add_subparsers(dest="role", required=True)
    sub.add_parser("echo").add_argument("fd", type=int)
    pinger = sub.add_parser("ping")
    pinger.add_argument("fd", type=int)
    pinger.add_argument("--calls", type=int, required=True)
    pinger.add_argument("--warmup", type=int, default=0)
    opts = parser.parse_args(argv)
    if opts.role == "echo":
        echo(opts.fd)
    else:
        json.dump(ping(opts.fd, opts.calls, opts.warmup), sys.stdout)


if __name__ == "__main__":
    main()
