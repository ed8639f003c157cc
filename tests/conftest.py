"""Shared fixtures for the end-to-end tests: real scripts in real processes, no mocks.

- ``run``: run a script with :func:`sandbox.execute_code`, a short timeout and a private
  spill directory by default.
- ``no_leftover_processes`` (automatic): after each test, fail it if any process started
  by the test still carries the local backend's marker variable, then kill them so the
  next test starts clean. Other suites may run sandboxes on this machine at the same
  time, so a test tags its own: it sets ``TAG_VAR`` to a fresh value in os.environ, a
  name the scrubber lets through, and only marked processes with that tag count.
- ``gone``, ``assert_gone``, ``wait_for_pids`` and ``sandbox_processes``: by-pid checks
  of the processes a script started.
"""

from __future__ import annotations

import os
import signal
import textwrap
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psutil
import pytest

from environments.local import MARKER_VAR
from sandbox import ExecutionResult, execute_code

DEFAULT_TIMEOUT = 20.0
TAG_VAR = "XDG_HERMES_TEST_TAG"  # XDG_ passes the scrubber's allowlist
# Processes that were SIGKILLed are gone within microseconds; this only absorbs the
# kernel's bookkeeping, it cannot hide a process that really stayed behind.
LEFTOVER_GRACE = 1.0


def marked_processes(tag: str | None = None) -> set[int]:
    """Live processes whose environment carries the local backend's marker and this
    test's tag (default: the one in os.environ)."""
    prefix = MARKER_VAR.encode() + b"="
    tag_entry = f"{TAG_VAR}={tag or os.environ.get(TAG_VAR, '')}".encode()
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                entries = f.read().split(b"\0")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if tag_entry not in entries or not any(e.startswith(prefix) for e in entries):
            continue
        if not is_gone(int(name)):
            found.add(int(name))
    return found


def is_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent, or a zombie waiting to be reaped)."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return True


@pytest.fixture(autouse=True)
def no_leftover_processes(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Tag this test's sandboxes; afterwards fail on, and kill, any still alive."""
    tag = uuid.uuid4().hex
    monkeypatch.setenv(TAG_VAR, tag)
    yield
    deadline = time.monotonic() + LEFTOVER_GRACE
    leftovers = marked_processes(tag)
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.05)
        leftovers = marked_processes(tag)
    if not leftovers:
        return
    described = []
    for pid in sorted(leftovers):
        try:
            described.append(f"{pid} {psutil.Process(pid).cmdline()}")
        except psutil.Error:
            described.append(str(pid))
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    pytest.fail("sandbox processes left alive after the test: " + "; ".join(described))


@pytest.fixture(params=["unix", "relay"])
def transport(request: pytest.FixtureRequest) -> str:
    """Each transport the local backend supports: tests that use ``run`` run over all."""
    return str(request.param)


@pytest.fixture
def run(tmp_path: Path, transport: str) -> Callable[..., ExecutionResult]:
    """``run(code, **options)``: dedent ``code`` and run it with execute_code.

    Defaults: ``timeout=DEFAULT_TIMEOUT``, ``spill_dir`` under ``tmp_path`` and the
    ``transport`` of the test's parameter; any execute_code keyword (tools, env, cwd,
    max_tool_calls, RunOptions fields) may be given.
    """

    def _run(code: str, **options: Any) -> ExecutionResult:
        options.setdefault("timeout", DEFAULT_TIMEOUT)
        options.setdefault("spill_dir", str(tmp_path / "spill"))
        options.setdefault("transport", transport)
        return execute_code(textwrap.dedent(code), **options)

    return _run


@pytest.fixture
def sandbox_processes() -> Callable[[], set[int]]:
    """``sandbox_processes()``: see :func:`marked_processes`."""
    return marked_processes


@pytest.fixture
def gone() -> Callable[[int], bool]:
    """``gone(pid)``: see :func:`is_gone`."""
    return is_gone


@pytest.fixture
def assert_gone() -> Callable[..., None]:
    """``assert_gone(pids, what)``: fail naming every pid still running, after killing
    them, so that one bug is reported once and later tests start clean."""

    def _assert_gone(pids: Iterable[int], what: str = "the run") -> None:
        pids = list(pids)
        survivors = [pid for pid in pids if not is_gone(pid)]
        for pid in survivors:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        assert not survivors, f"pids {survivors} of {pids} survived {what}"

    return _assert_gone


@pytest.fixture
def wait_for_pids() -> Callable[..., list[int]]:
    """``wait_for_pids(path, count, timeout=10)``: the pids a script wrote to ``path``
    (whitespace-separated), once ``count`` of them are there; fails on timeout."""

    def _wait(path: Path, count: int, timeout: float = 10.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                pids = [int(p) for p in Path(path).read_text().split()]
            except (FileNotFoundError, ValueError):
                pids = []
            if len(pids) >= count:
                return pids
            time.sleep(0.02)
        pytest.fail(f"the script did not write {count} pids to {path} within {timeout}s")

    return _wait
