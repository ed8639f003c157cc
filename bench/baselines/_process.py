"""Starting the baselines' host and client processes."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = str(Path(__file__).resolve().parents[2])


def module_argv(module: str, *args: object) -> list[str]:
    """``python -m module args...``; run it with ``cwd=REPO_ROOT``, since ``-m`` puts the
    working directory first on the path, where a stray ``bench`` would shadow ours."""
    return [sys.executable, "-m", module, *(str(a) for a in args)]


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with the repository first on PYTHONPATH, so the
    children import this same ``bench`` package."""
    env = dict(os.environ)
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = REPO_ROOT + (os.pathsep + existing if existing else "")
    env.update(extra)
    return env


def run_client(argv: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run a timing client to completion and return the JSON it printed.

    Raises RuntimeError with the client's stderr if it failed.
    """
    done = subprocess.run(
        argv, env=env, cwd=REPO_ROOT, capture_output=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{argv[2]} client exited with {done.returncode}: "
            + done.stderr.decode(errors="replace")[-2000:]
        )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def stop(process: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    """End a host process we started, by its own handle."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_host_and_client(
    module: str,
    where: str,
    *,
    calls: int,
    callers: int,
    warmup: int,
    tool: str,
    size: int,
    timeout: float,
) -> dict[str, Any]:
    """Start ``module``'s host on ``where`` (a socket path or a directory), wait for its
    "ready" line, run its timing client against it and return the client's figures."""
    env = child_env(BENCH_RPC_TOKEN=secrets.token_urlsafe(32))
    host = subprocess.Popen(
        module_argv(module, "host", where), env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE
    )
    try:
        assert host.stdout is not None
        if host.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"the {module} host did not start")
        argv = module_argv(module, "client", where, "--calls", calls, "--callers", callers)
        argv += ["--warmup", str(warmup), "--tool", tool, "--size", str(size)]
        return run_client(argv, env, timeout)
    finally:
        stop(host)
        if host.stdout is not None:
            host.stdout.close()


def parse_roles(module: str, where: str, argv: list[str] | None) -> argparse.Namespace:
    """The command line of a baseline module: ``host WHERE`` or ``client WHERE ...``."""
    parser = argparse.ArgumentParser(prog=module)
    sub = parser.add_subparsers(dest="role", required=True)
    sub.add_parser("host").add_argument(where)
    client = sub.add_parser("client")
    client.add_argument(where)
    client.add_argument("--calls", type=int, required=True)
    client.add_argument("--callers", type=int, default=1)
    client.add_argument("--warmup", type=int, default=0)
    client.add_argument("--tool", default="echo")
    client.add_argument("--size", type=int, default=0)
    return parser.parse_args(argv)
