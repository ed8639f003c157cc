"""The supervisor: a local launch outside a sandbox runs under it, and what it launched
dies with it. (A launch behind bubblewrap needs none: its pid namespace does this.)

Stdlib only, Python 3.6+, Linux; run by the host's Python as ``python -E -S
_supervisor.py --lifeline FD --parent PID -- ARGV...``. It

- is a child subreaper, so whatever ARGV starts (daemons that double-fork, leave the
  session or clear their environment) stays below it;
- starts ARGV with its own stdin, stdout and stderr;
- ends everything below it (found by /proc ancestry, stopped processes included) when
  ARGV exits, when the runner is gone (end of input on the lifeline pipe FD, whose other
  end only the runner holds; a parent-death signal; or a parent pid that is no longer
  PID), or on SIGTERM (the directories the runner made are its keeper's to remove:
  environments/keeper.py);
- exits with ARGV's status (killed by a signal: by the same signal).

The host kills the tree itself too (environments/local.py), so a supervisor that the
script stops with SIGSTOP cannot keep its processes alive while the runner lives.
"""

import os
import select

try:  # the C module: signal's enums alone cost the supervisor a fifth of its start-up
    import _signal as signal
except ImportError:  # not CPython
    import signal  # type: ignore[no-redef]
import sys

# Start-up is on the path of every launch it supervises, so only what each needs is
# imported: no subprocess (a fork and an exec, below), no selectors (poll), _signal
# rather than signal (which imports enum). os, select, _signal and _proctree (ctypes,
# for prctl) are about half of what they were.

if "kill_tree" not in globals():  # run as a file: _proctree.py sits beside it
    from _proctree import become_subreaper, close_inherited, die_with_parent, kill_tree, reap


def _parse(args):
    options = {"lifeline": None, "parent": None}
    while args and args[0] != "--":
        name = args.pop(0).lstrip("-")
        if name in options and args:
            options[name] = args.pop(0)
        else:
            raise SystemExit("_supervisor.py: bad option --%s" % name)
    if not args[1:]:
        raise SystemExit("_supervisor.py: nothing to run (ARGV after --)")
    return options, args[1:]


class Supervisor(object):
    def __init__(self, argv, lifeline, parent):
        self.argv = argv
        self.lifeline = lifeline
        self.parent = parent
        self.child = None  # the pid of ARGV
        self.status = None
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)

    def on_signal(self, number, _frame):
        if number in (signal.SIGHUP, signal.SIGTERM):
            self.stop_requested = True

    def reap(self):
        if self.child is None:
            return
        status = reap(self.child)
        if status is not None:
            self.status = status

    def run(self):
        self.stop_requested = False
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGHUP, self.on_signal)
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the runner's
        signal.set_wakeup_fd(self.wake_w)
        become_subreaper()
        die_with_parent(signal.SIGHUP)
        if self.parent is not None and os.getppid() != self.parent:
            return self.finish()  # it died before the parent-death signal was set
        problem = self.start()
        if problem is not None:
            os.write(2, ("cannot run %s: %s\n" % (self.argv[0], problem)).encode())
            self.finish()
            return 127
        # The child has stdin and stdout now; the supervisor keeps neither open.
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.close(devnull)
        poller = select.poll()
        poller.register(self.wake_r, select.POLLIN)
        if self.lifeline is not None:
            poller.register(self.lifeline, select.POLLIN)
        while self.status is None and not self.stop_requested:
            for fd, _ in poller.poll(500):
                try:
                    data = os.read(fd, 4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if fd == self.lifeline and not data:
                    self.stop_requested = True
                    poller.unregister(fd)  # at its end: it would poll ready forever
            if self.parent is not None and os.getppid() != self.parent:
                self.stop_requested = True
            self.reap()
        return self.finish()

    def start(self):
        """Fork and exec ARGV (as subprocess.Popen would with close_fds,
        restore_signals and the signals back to their defaults); None, or why it
        could not be run (then the child has exited and is reaped)."""
        report_r, report_w = os.pipe()  # close-on-exec: it ends at the exec
        pid = os.fork()
        if pid == 0:  # the child: only os calls from here to the exec
            try:
                os.close(report_r)
                _exec(self.argv, report_w)
            finally:
                os._exit(127)
        os.close(report_w)
        chunks = []
        while True:
            chunk = os.read(report_r, 4096)  # end of file: the exec happened
            if not chunk:
                break
            chunks.append(chunk)
        os.close(report_r)
        if chunks:
            os.waitpid(pid, 0)
            return b"".join(chunks).decode("utf-8", "replace")
        self.child = pid
        return None

    def finish(self):
        """Kill everything below; return the child's exit status as a wait status
        (None: it did not exit by itself)."""
        kill_tree(os.getpid(), 0, reap_children=True)
        self.reap()
        return self.status


# Back to their defaults in ARGV: the supervisor's handlers, its ignored SIGINT, and
# SIGPIPE and SIGXFSZ, which Python ignores (Popen's restore_signals).
_DEFAULT_SIGNALS = ("SIGHUP", "SIGTERM", "SIGINT", "SIGCHLD", "SIGPIPE", "SIGXFSZ")


def _exec(argv, report):
    """In the forked child: signals to their defaults, every descriptor but 0, 1, 2
    closed (``report`` at the exec), then ARGV found on PATH; on failure, why, to
    ``report``."""
    try:
        signal.set_wakeup_fd(-1)
        for name in _DEFAULT_SIGNALS:
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_DFL)
        close_inherited(report)
        os.execvp(argv[0], argv)
    except OSError as exc:
        os.write(report, str(exc).encode("utf-8", "replace") or b"exec failed")
    except BaseException:
        os.write(report, b"exec failed")


def _exit_like(status):
    if status is None:
        os._exit(1)
    if isinstance(status, int) and status == 127:
        os._exit(127)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        except (ImportError, ValueError, OSError):
            pass
        try:
            signal.signal(number, signal.SIG_DFL)  # SIGKILL's cannot be set, nor needs to
        except (OSError, ValueError):
            pass
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [number])
        os.kill(os.getpid(), number)
        os._exit(128 + number)
    os._exit(os.WEXITSTATUS(status))


def main(args):
    options, argv = _parse(list(args))
    lifeline = None if options["lifeline"] is None else int(options["lifeline"])
    parent = None if options["parent"] is None else int(options["parent"])
    if lifeline is not None:
        os.set_blocking(lifeline, False)
    _exit_like(Supervisor(argv, lifeline, parent).run())


if __name__ == "__main__":
    main(sys.argv[1:])
