"""The keeper of this host process's local directories (stubs/_keeper.py).

One keeper process per host process, started at the first directory the local backend
makes, the way multiprocessing starts its resource tracker. The host tells it each
private directory it makes (:meth:`Keeper.keep`) and each it removes
(:meth:`Keeper.release`); when this process ends in any way, SIGKILL included, the
keeper sees the end of its input, kills any bubblewrap sandbox still running in those
directories and removes them. So a run's stage and a session's workspace never outlive
the host, and a run needs no per-launch supervisor to remove them.

The keeper runs in a session of its own with an empty environment and no descriptor
of this process but its input pipe, whose write end only this process holds (close on
exec; closed in a child this process forks). A keeper that died is started again at
the next change, and told every directory still kept.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

from hermes_sandbox.stubs import _proctree

# Run by path, beside _proctree, which it imports (as the supervisor is).
KEEPER_PATH = os.path.join(os.path.dirname(_proctree.__file__), "_keeper.py")


class Keeper:
    """This process's keeper: started on first use, told of every change."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: set[str] = set()
        self._process: subprocess.Popen[bytes] | None = None
        self._pipe: int | None = None

    @property
    def pid(self) -> int | None:
        """The keeper's pid, once started (for tests and diagnostics)."""
        return None if self._process is None else self._process.pid

    def keep(self, path: str) -> None:
        """Have ``path`` (a directory this process made) removed if this process dies."""
        path = os.path.realpath(path)  # as bubblewrap's command line names it
        with self._lock:
            self._kept.add(path)
            self._tell(["keep", path])

    def release(self, path: str) -> None:
        """``path`` is removed, or no longer this process's to remove."""
        path = os.path.realpath(path)
        with self._lock:
            if path in self._kept:
                self._kept.discard(path)
                self._tell(["release", path])

    def _tell(self, message: list[str]) -> None:
        if self._pipe is not None:
            try:
                os.write(self._pipe, _line(message))  # short: one atomic write
                return
            except BrokenPipeError:  # the keeper died: a new one, told what is kept now
                self._stop()
        self._start()
        assert self._pipe is not None
        for path in sorted(self._kept):
            os.write(self._pipe, _line(["keep", path]))

    def _start(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-E", "-S", KEEPER_PATH],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={},
            cwd="/",
            start_new_session=True,  # a terminal's Ctrl-C and hang-up are the host's
        )
        assert self._process.stdin is not None
        self._pipe = os.dup(self._process.stdin.fileno())  # close-on-exec, as dup makes it
        self._process.stdin.close()

    def _stop(self) -> None:
        if self._pipe is not None:
            os.close(self._pipe)
            self._pipe = None
        if self._process is not None:
            self._process.poll()  # reap one that died
            self._process = None

    def _forget_in_child(self) -> None:
        """In a child this process forked: the directories are not its to keep, and
        its parent's keeper must see the end of its input when the parent ends."""
        self._lock = threading.Lock()
        self._kept = set()
        if self._pipe is not None:
            try:
                os.close(self._pipe)
            except OSError:
                pass
        self._pipe = None
        if self._process is not None:
            _INHERITED.append(self._process)  # the parent's to wait for: never collected here
        self._process = None


# Keepers a forked child inherited from its parent (a Popen collected unwaited warns).
_INHERITED: list[subprocess.Popen[bytes]] = []


def _line(message: list[str]) -> bytes:
    # ASCII: json escapes the rest, a path's undecodable bytes (surrogates) included.
    return (json.dumps(message) + "\n").encode("ascii")


_KEEPER = Keeper()
os.register_at_fork(after_in_child=_KEEPER._forget_in_child)


def keeper() -> Keeper:
    """This process's keeper."""
    return _KEEPER
