"""sandbox/spill.py on a real directory: which files a sweep removes, and which it never
touches (the run-level test is in test_cli_config.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from hermes_sandbox.spill import sweep_spill_dir


def aged(path: Path, seconds: float) -> Path:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)
    return path


def test_sweep_removes_only_old_spill_files_and_never_follows_a_link(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    spill.mkdir()
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    aged(target, 10_000)
    old = spill / "stdout-old.txt"
    old.write_text("old\n")
    aged(old, 10_000)
    young = spill / "stdout-young.txt"
    young.write_text("young\n")
    link = spill / "stdout-link.txt"
    link.symlink_to(target)
    aged(link, 10_000)
    folder = spill / "stdout-dir.txt"
    folder.mkdir()
    aged(folder, 10_000)
    other = spill / "report.txt"
    other.write_text("not a spill file\n")
    aged(other, 10_000)

    assert sweep_spill_dir(str(spill), 3600) == 2
    assert not old.exists() and not link.is_symlink()
    assert young.exists() and folder.is_dir() and other.exists()
    assert target.read_text() == "keep me\n"


def test_sweep_of_a_missing_directory_does_nothing(tmp_path: Path) -> None:
    assert sweep_spill_dir(str(tmp_path / "never-made"), 1) == 0
