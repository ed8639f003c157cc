"""The keeper (environments/keeper.py, stubs/_keeper.py): what the local backend made is
removed, and a sandbox still running in it killed, when the host process dies.

Each test runs a host of its own (a Python child that uses the keeper as the local
backend does), SIGKILLs it, and looks: which directories are left, which processes run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from conftest import bwrap_problem, is_gone, require

from hermes_sandbox.environments.keeper import keeper

GONE_WITHIN = 10.0  # seconds; the keeper acts at once, this is room for a loaded machine

HOST = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from hermes_sandbox.environments.keeper import keeper
    kept, released, sandboxed = sys.argv[1], sys.argv[2], sys.argv[3:]
    for path in kept.split(":") + released.split(":"):
        keeper().keep(path)
    for path in released.split(":"):
        keeper().release(path)
    pids = []
    for path in sandboxed:
        # No --die-with-parent: a sandbox whose host died before bubblewrap set it.
        sandbox = subprocess.Popen(
            ["bwrap", "--unshare-pid", "--ro-bind", "/", "/", "--dev", "/dev",
             "--proc", "/proc", "--bind", path, path, "--", "sleep", "600"],
            start_new_session=True,
        )
        pids.append(sandbox.pid)
    print(keeper().pid, *pids, flush=True)
    time.sleep(600)
    """
)


def start_host(
    kept: list[Path], released: list[Path], sandboxed: list[Path]
) -> tuple[subprocess.Popen[str], list[int]]:
    host = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOST,
            ":".join(map(str, kept)),
            ":".join(map(str, released)),
            *map(str, sandboxed),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert host.stdout is not None
    return host, [int(word) for word in host.stdout.readline().split()]


def made(tmp_path: Path, *names: str) -> list[Path]:
    paths = []
    for name in names:
        path = tmp_path.resolve() / name  # as bubblewrap's command line names it
        (path / "inside").mkdir(parents=True)
        (path / "inside" / "file").write_text("x")
        paths.append(path)
    return paths


def wait_until(condition: object, timeout: float = GONE_WITHIN) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.05)
    return bool(condition())  # type: ignore[operator]


def kill(host: subprocess.Popen[str]) -> None:
    host.send_signal(signal.SIGKILL)
    host.wait(10)
    assert host.stdout is not None
    host.stdout.close()


def test_a_killed_host_leaves_no_kept_directory_and_no_keeper(tmp_path: Path) -> None:
    kept = made(tmp_path, "stage", "workspace")
    (released,) = made(tmp_path, "released")
    host, (keeper_pid,) = start_host(kept, [released], [])
    assert all(path.is_dir() for path in kept)
    kill(host)
    assert wait_until(lambda: not any(path.exists() for path in kept)), "left behind"
    assert wait_until(lambda: is_gone(keeper_pid)), "the keeper outlived its host"
    assert released.is_dir(), "a released directory is not the keeper's to remove"


def test_a_sandbox_whose_host_died_before_die_with_parent_is_killed(tmp_path: Path) -> None:
    """bubblewrap's --die-with-parent comes too late for a host that dies between its
    fork and bubblewrap's prctl: the keeper finds such a sandbox by the kept directory
    on its command line and kills it with everything in it."""
    require(bwrap_problem(), "the keeper's sandbox test needs a bubblewrap that works here")
    (stage,) = made(tmp_path, "stage")
    host, (_, sandbox) = start_host([stage], [], [stage])
    assert wait_until(
        lambda: any(p.name() == "sleep" for p in psutil.Process(sandbox).children(True))
    )
    inside = [p.pid for p in psutil.Process(sandbox).children(recursive=True)]
    kill(host)
    assert wait_until(lambda: all(is_gone(pid) for pid in [sandbox, *inside])), (
        "the sandbox outlived its host"
    )
    assert wait_until(lambda: not stage.exists())


def test_a_keeper_that_died_is_started_again_and_told_everything(tmp_path: Path) -> None:
    program = textwrap.dedent(
        """
        import os, signal, sys, time
        from hermes_sandbox.environments.keeper import keeper
        first, second = sys.argv[1:]
        keeper().keep(first)
        dead = keeper().pid
        os.kill(dead, signal.SIGKILL)
        while os.waitpid(dead, os.WNOHANG) == (0, 0):
            time.sleep(0.01)
        keeper().keep(second)  # the write fails: a new keeper, told of both
        print(dead, keeper().pid, flush=True)
        time.sleep(600)
        """
    )
    first, second = made(tmp_path, "first", "second")
    host = subprocess.Popen(
        [sys.executable, "-c", program, str(first), str(second)], stdout=subprocess.PIPE, text=True
    )
    assert host.stdout is not None
    dead, again = (int(word) for word in host.stdout.readline().split())
    assert dead != again
    kill(host)
    assert wait_until(lambda: not first.exists() and not second.exists()), "left behind"
    assert wait_until(lambda: is_gone(again))


def test_a_forked_child_does_not_keep_the_keeper_waiting(tmp_path: Path) -> None:
    """A child the host forks (multiprocessing's fork, say) outlives it: the keeper must
    still see the host's end, so the child holds no copy of the keeper's pipe."""
    program = textwrap.dedent(
        """
        import os, sys, time
        from hermes_sandbox.environments.keeper import keeper
        keeper().keep(sys.argv[1])
        child = os.fork()
        if child == 0:
            time.sleep(600)
            os._exit(0)
        print(child, flush=True)
        time.sleep(600)
        """
    )
    (stage,) = made(tmp_path, "stage")
    host = subprocess.Popen(
        [sys.executable, "-c", program, str(stage)], stdout=subprocess.PIPE, text=True
    )
    assert host.stdout is not None
    child = int(host.stdout.readline())
    try:
        kill(host)
        assert wait_until(lambda: not stage.exists()), "the forked child kept the keeper waiting"
    finally:
        os.kill(child, signal.SIGKILL)


def test_the_keeper_carries_nothing_of_the_host(tmp_path: Path) -> None:
    """An empty environment (a secret in the host's is not in the keeper's), its own
    session, the root as its directory, and no descriptor but its input pipe."""
    (stage,) = made(tmp_path, "stage")
    keeper().keep(str(stage))
    try:
        process = psutil.Process(keeper().pid)
        assert process.environ() == {}
        assert os.getsid(process.pid) == process.pid
        assert process.cwd() == "/"

        def fds() -> list[int]:  # once started: its start-up opens and closes files
            return sorted(int(name) for name in os.listdir(f"/proc/{process.pid}/fd"))

        assert wait_until(lambda: fds() == [0, 1, 2]), fds()
        assert os.readlink(f"/proc/{process.pid}/fd/1") == "/dev/null"
    finally:
        keeper().release(str(stage))
    assert stage.is_dir()


def test_a_forked_child_keeps_its_own_directories_without_warnings(tmp_path: Path) -> None:
    """A forked child that makes a directory of its own starts a keeper of its own, and
    its parent's keeper, inherited unwaited, is never collected there (a ResourceWarning
    under -W error)."""
    program = textwrap.dedent(
        """
        import gc, os, sys
        from hermes_sandbox.environments.keeper import keeper
        parent_dir, child_dir = sys.argv[1:]
        keeper().keep(parent_dir)
        parents = keeper().pid
        child = os.fork()
        if child == 0:
            keeper().keep(child_dir)
            gc.collect()
            print("child", keeper().pid != parents, flush=True)
            os._exit(0)
        os.waitpid(child, 0)
        print("parent", keeper().pid == parents, flush=True)
        """
    )
    parent_dir, child_dir = made(tmp_path, "parent", "child")
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", program, str(parent_dir), str(child_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split("\n")[:2]) == ["child True", "parent True"]
    assert "Warning" not in done.stderr, done.stderr
    # Each host gone, each keeper removed what it kept.
    assert wait_until(lambda: not parent_dir.exists() and not child_dir.exists())


def test_a_local_stage_that_cannot_be_written_is_removed_and_released(tmp_path: Path) -> None:
    """LocalEnvironment.make_stage makes the directory and writes its files in one
    step: a file that cannot be written leaves no directory, and none kept."""
    import anyio

    tmp_path = tmp_path.resolve()
    from hermes_sandbox.environments.local import LocalEnvironment

    async def attempt() -> None:
        environment = LocalEnvironment()
        with pytest.raises(TypeError):
            await environment.make_stage("stage-", {"ok": b"1", "bad": None}, parent=str(tmp_path))  # type: ignore[dict-item]
        made = await environment.make_stage("stage-", {"ok": b"1"}, parent=str(tmp_path))
        assert (Path(made) / "ok").read_bytes() == b"1"
        assert made in keeper()._kept  # tmp_path is resolved: made is its own real path
        await environment.remove_tree(made)
        assert made not in keeper()._kept

    anyio.run(attempt)
    assert list(tmp_path.iterdir()) == []
    assert not [path for path in keeper()._kept if path.startswith(str(tmp_path.resolve()))]
