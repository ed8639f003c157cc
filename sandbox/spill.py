"""Removing old spill files, the full stdout of runs whose output passed the cap.

A spill file stays for the retention period (a day by default, the config's
``limits.spill_retention``) so the agent can page through it with read_file after the
run; then it goes. Each run sweeps its spill directory as it starts: spill files
(``stdout-*.txt``, as :class:`~hermes_sandbox.output.CappedOutput` names them) last
modified longer ago than the retention are removed. Nothing else in the directory is
touched, and a symlink is removed as a link, never followed.
"""

from __future__ import annotations

import os
import stat
import time

DEFAULT_SPILL_RETENTION = 24 * 3600.0  # seconds a spill file is kept
SPILL_PREFIX = "stdout-"
SPILL_SUFFIX = ".txt"


def sweep_spill_dir(directory: str, retention: float, *, now: float | None = None) -> int:
    """Remove the spill files in ``directory`` older than ``retention`` seconds; return
    how many went. Never raises: a missing directory, or a file that another run removed
    first or that may not be removed, is skipped (and logged at debug level)."""
    cutoff = (time.time() if now is None else now) - retention
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for entry in entries:
        if not (entry.name.startswith(SPILL_PREFIX) and entry.name.endswith(SPILL_SUFFIX)):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode) or info.st_mtime >= cutoff:
                continue
            os.unlink(entry.path)
        except OSError as exc:
            import logging  # not at import: the command line reads this module's default only

            logging.getLogger(__name__).debug("could not sweep spill file %s: %s", entry.path, exc)
            continue
        removed += 1
    return removed
