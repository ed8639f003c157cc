"""The keeper: what the local backend made goes when the host process dies.

Stdlib only, Python 3.6+, Linux; one per host process, started by the host's Python
as ``python -E -S _keeper.py`` (environments/keeper.py), with the write end of its
stdin held by the host alone. The host writes one line of JSON per change:

- ``["keep", PATH]``: a private directory the host made (a run's stage, a session's
  workspace);
- ``["release", PATH]``: removed by the host itself, or no longer the host's to remove.

At the end of its input, which comes when the host process ends in any way (SIGKILL
included), the keeper

1. kills every bubblewrap sandbox still running whose command line names a kept
   directory, with everything below it (found by /proc ancestry). A sandbox dies with
   the host by itself (``--die-with-parent``); this catches one whose host died before
   bubblewrap asked for that;
2. removes each kept directory (twice, a moment apart, for a process that was still
   writing into one as it died);
3. exits.

It ignores SIGINT and SIGHUP (it runs in a session of its own; a terminal's Ctrl-C is
the host's to handle) and holds nothing else open.
"""

import json
import os
import shutil

try:  # the C module: signal's enums cost start-up for nothing here
    import _signal as signal
except ImportError:  # not CPython
    import signal  # type: ignore[no-redef]
import sys
import time

if "kill_tree" not in globals():  # run as a file: _proctree.py sits beside it
    from _proctree import kill_tree

_AGAIN_SECONDS = 0.2  # between the two removals


def read_kept(stream):
    """The directories kept when ``stream`` ends: each ``keep`` not ``release``d since."""
    kept = []
    for line in stream:
        try:
            what, path = json.loads(line)
        except ValueError:
            continue  # a torn last line from a host killed mid-write: nothing to keep
        if what == "keep" and path not in kept:
            kept.append(path)
        elif what == "release" and path in kept:
            kept.remove(path)
    return kept


def sandboxes_in(kept):
    """The pids of bubblewrap processes whose command line names one of ``kept``."""
    wanted = set(os.fsencode(path) for path in kept)
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % name, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"bwrap" and wanted.intersection(argv):
            found.append(int(name))
    return found


def clean(kept):
    if not kept:
        return
    for pid in sandboxes_in(kept):
        kill_tree(pid, 0, include_root=True)
    for path in kept:
        shutil.rmtree(path, ignore_errors=True)
    time.sleep(_AGAIN_SECONDS)  # a writer that was dying may have made one again
    for path in kept:
        shutil.rmtree(path, ignore_errors=True)


def main():
    for name in ("SIGINT", "SIGHUP", "SIGPIPE"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    stdin = os.fdopen(0, "r", encoding="utf-8", errors="surrogateescape")
    clean(read_kept(stdin))


if __name__ == "__main__":
    sys.exit(main())
