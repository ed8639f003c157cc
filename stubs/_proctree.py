"""A process and everything below it: find them by /proc ancestry, kill them all.

Stdlib only (ctypes optional), Python 3.6+, Linux. Shared by the supervisor
(stubs/_supervisor.py), the relay and the exec helper (the host prepends this source to
theirs) and by the local backend on the host, which imports it. Nothing here reads an
environment variable or a session id: a process cannot leave its parent's subtree
while that parent is a child subreaper (:func:`become_subreaper`), so the subtree is
the whole of what it started.
"""

import os

try:  # the C module: signal's enums alone cost the supervisor a fifth of its start-up
    import _signal as signal
except ImportError:  # not CPython
    import signal  # type: ignore[no-redef]
import time


def _prctl(option, value):
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except Exception:  # no ctypes (a minimal Python) or no prctl: not Linux
        return False


def become_subreaper():
    """Make orphans below this process reparent to it, not to init
    (PR_SET_CHILD_SUBREAPER); False where that cannot be done."""
    return _prctl(36, 1)


def forbid_tracing():
    """Make this process undumpable (PR_SET_DUMPABLE 0): other processes of the same
    user can neither trace it nor open its /proc files (descriptors, memory,
    environment); a program it execs is dumpable again. False where that cannot be
    done."""
    return _prctl(4, 0)


def set_name(name):
    """What ps shows this process as (PR_SET_NAME: its comm, 15 bytes at most); False
    where that cannot be done."""
    return _prctl(15, name.encode()[:15])


def die_with_parent(sig):
    """Have the kernel send ``sig`` when the parent (thread) that made this process
    exits (PR_SET_PDEATHSIG); False where that cannot be done."""
    return _prctl(1, int(sig))


def close_inherited(keep):
    """In a forked child before its exec: close every descriptor above 2 but ``keep``
    (what Popen's close_fds does), listed from /proc/self/fd, else the usual range."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc
        fds = list(range(3, 1024))
    for fd in fds:
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _parents():
    """Map pid -> parent pid of every process visible in /proc."""
    parents = {}  # type: dict[int, int]
    try:
        names = os.listdir("/proc")
    except OSError:
        return parents
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            parents[int(name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    return parents


def descendants(root):
    """The pids below ``root`` (not ``root`` itself), zombies included."""
    children = {}  # type: dict[int, list[int]]
    for pid, parent in _parents().items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found and child != root:
                found.add(child)
                todo.append(child)
    return found


def alive(pid):
    """Whether ``pid`` runs: present and neither a zombie nor dead."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X", b"x")
    except (OSError, IndexError):
        return False


def signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def reap(watched=None):
    """Collect the exit status of every child that has one (a subreaper's orphans
    included); return the wait status of ``watched`` if it was among them."""
    found = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except (ChildProcessError, OSError):
            return found
        if pid == 0:
            return found
        if pid == watched:
            found = status


def has_children():
    """Whether this process has a child, running, stopped or a zombie (True where
    that cannot be asked). A process with none has nothing below it: every process
    below it descends from a child of its."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WSTOPPED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    except (AttributeError, OSError):  # no waitid: not Linux
        return True
    return True


def _freeze(root, include_root, frozen):
    """SIGSTOP what is below ``root`` (and ``root``) until nothing new turns up, so
    nothing forks away between finding and killing. Returns every pid frozen."""
    for _ in range(50):
        new = descendants(root) - frozen
        if include_root and root not in frozen and alive(root):
            new.add(root)
        new = set(pid for pid in new if alive(pid))
        if not new:
            break
        signal_all(new, signal.SIGSTOP)
        frozen |= new
    return frozen


def kill_tree(root, grace, include_root=False, reap_children=False, deadline=10.0):
    """Kill every process below ``root`` (and ``root`` itself with ``include_root``).

    With ``grace`` > 0 they get SIGTERM (and SIGCONT, so stopped ones can act on it)
    and that many seconds; then whatever is left, frozen first, gets SIGKILL, which
    works on stopped processes too. Loops until nothing below ``root`` runs (or
    ``deadline`` seconds pass). ``reap_children`` collects the zombies of our own
    children (a subreaper's orphans). Returns the number of processes signalled.
    Below the calling process with no child, nothing is there: no /proc scan (each
    reads every process's stat file, the largest part of a short run's end).
    """
    if root == os.getpid() and not include_root and not has_children():
        return 0
    targets = _freeze(root, False, set())
    if targets and grace > 0:
        signal_all(targets, signal.SIGTERM)
        signal_all(targets, signal.SIGCONT)
        until = time.monotonic() + grace
        while time.monotonic() < until and any(alive(p) for p in targets):
            if reap_children:
                reap()
            time.sleep(0.01)
    signalled = set(targets)
    until = time.monotonic() + deadline
    while True:
        # Earlier targets stay targets (one whose parent died has left the subtree),
        # and are stopped again: the SIGCONT above woke them.
        frozen = set(p for p in signalled if alive(p))
        signal_all(frozen, signal.SIGSTOP)
        frozen = _freeze(root, include_root, frozen)
        live = set(p for p in frozen if alive(p))
        if not live:
            break
        signal_all(live, signal.SIGKILL)
        signalled |= live
        if time.monotonic() > until:
            break
        time.sleep(0.005)
        if reap_children:
            reap()
    if reap_children:
        reap()
    return len(signalled)
