"""Starting the baselines' host and client processes."""

from __future__ import annotations

import json
import os
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
