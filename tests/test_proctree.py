"""stubs/_proctree.py: killing a process's whole tree, and the shortcut that skips the
/proc scan when the calling process has no child at all."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import psutil
import pytest

from hermes_sandbox.stubs import _proctree


def test_no_child_means_nothing_to_kill_and_no_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_scan() -> dict[int, int]:
        raise AssertionError("scanned /proc")

    monkeypatch.setattr(_proctree, "_parents", no_scan)
    monkeypatch.setattr(_proctree, "has_children", lambda: False)
    assert _proctree.kill_tree(os.getpid(), 1.0) == 0


def test_an_orphan_kept_by_a_subreaper_is_still_killed() -> None:
    """The script's direct child is gone and reaped, but what it left in the background
    was reparented to the subreaper: the shortcut must not take that for "no child"."""
    program = textwrap.dedent(
        f"""
        import os, subprocess, sys
        sys.path.insert(0, {os.path.dirname(_proctree.__file__)!r})
        from _proctree import become_subreaper, has_children, kill_tree
        assert not has_children()
        assert become_subreaper()
        out = subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"],
                             capture_output=True, text=True).stdout
        assert has_children()  # the orphaned sleep, now ours
        print(out.strip(), kill_tree(os.getpid(), 0), flush=True)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    pid, killed = (int(word) for word in result.stdout.split())
    assert killed == 1
    try:
        status = psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return
    assert status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD), f"sleep {pid} survived"
