"""The exec helper: run inside the sandbox by an exec-stream backend, as ``python3
_exec_helper.py VERB ARGS`` (its source passed with ``-c``), with the sandbox's own Python.

Stdlib only, and only modules that even Debian's python3-minimal has (no json, shutil,
tempfile); Python 3.6+. Data goes to stdout. A failed file operation is one line on
stderr: ``HERMES-SANDBOX-ERROR``, then the errno name, the message and the file name,
each hex-encoded UTF-8, joined by tabs (the host raises the same OSError).

The host runs it with stubs/_proctree.py's source before this one (HELPER_SOURCE).

Verbs: ``run TOKEN GRACE CWD COMMAND`` (``/bin/sh -c COMMAND`` in a new session with
``HERMES_SANDBOX_EXEC=TOKEN`` in its environment, stdout and stderr combined, under
this process as a child subreaper: what it leaves running is killed when it exits),
``killrun TOKEN GRACE`` (the ``run`` of that token and everything below it),
``killtree PID GRACE`` (a process and everything below it), ``kill TOKEN GRACE`` (every
process with the marker, and their sessions: for the Modal backend's own execs),
``stat PATH``, ``read PATH MAX``, ``write PATH PARENTS
MODE`` (data on stdin), ``mkdtemp PREFIX PARENT`` (prints the new directory and the
user's home), ``stage PREFIX PARENT`` (``mkdtemp``, then the files of the bundle on
stdin written into the new directory: per file a line ``NAME MODE SIZE``, the name
hex-encoded and the mode octal, then SIZE bytes), ``put DIRECTORY SIZE ARGV...`` (the
files of the bundle of SIZE bytes at the start of stdin written into DIRECTORY, then
ARGV run in this process, its stdin the rest), ``rmtree PATH``; and
``relay DIRECTORY SIZE NEW ARGS...`` (stubs/_stage_files.py, which the host puts before
this source and runs alone for the relay's exec).
"""

import io
import os
import signal
import stat
import sys
import time

if "kill_tree" not in globals():  # run alone: the host prepends _proctree.py's source
    from _proctree import alive, become_subreaper, kill_tree, signal_all
if "write_bundle" not in globals():  # run alone: the host prepends _stage_files.py's too
    from _stage_files import fail, hexed, read_fd_exactly, remove_tree, write_bundle

MARK = "HERMES_SANDBOX_EXEC"


def others():
    me = os.getpid()
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            yield int(name)


def members(entry, own_sid):
    # The command's processes: those carrying the marker, and every process in a
    # session one of them is in (a child may have scrubbed its environment).
    found, sids = set(), set()
    for pid in others():
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                if entry in f.read().split(b"\0"):
                    found.add(pid)
                    sids.add(os.getsid(pid))
        except OSError:
            pass
    sids.discard(own_sid)
    if sids:
        for pid in others():
            try:
                if os.getsid(pid) in sids:
                    found.add(pid)
            except OSError:
                pass
    return set(pid for pid in found if alive(pid))


def sweep(token, grace):
    entry = (MARK + "=" + token).encode()
    own = os.getsid(0)
    targets = members(entry, own)
    if targets and grace > 0:
        signal_all(targets, signal.SIGTERM)
        signal_all(targets, signal.SIGCONT)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(alive(p) for p in targets):
            time.sleep(0.01)
    for _ in range(200):  # until nothing is left, however fast they fork
        targets = members(entry, own)
        if not targets:
            return
        signal_all(targets, signal.SIGKILL)
        time.sleep(0.005)


def run(token, grace, cwd, command):
    if cwd:
        try:
            os.chdir(cwd)
        except OSError as exc:
            fail(exc)
    env = dict(os.environ)
    env[MARK] = token
    become_subreaper()  # the command's orphans stay below us, however they daemonise
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            os.dup2(1, 2)
            os.execve("/bin/sh", ["/bin/sh", "-c", command], env)
        except OSError as exc:
            os.write(2, ("cannot run /bin/sh: %s\n" % exc).encode())
        os._exit(127)
    status = os.waitpid(pid, 0)[1]
    code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    kill_tree(os.getpid(), grace, reap_children=True)  # what the command left in the background
    sys.exit(code)


def runs_of(token):
    """The ``run`` helpers started with ``token`` (found by their command line)."""
    needle = b"\0run\0" + token.encode() + b"\0"
    found = set()
    for pid in others():
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                if needle in f.read():
                    found.add(pid)
        except OSError:
            pass
    return found


def kill_run(token, grace):
    """Kill what a ``run`` started; it then exits by itself, or (stopped) is killed."""
    roots = runs_of(token)
    for root in roots:
        kill_tree(root, grace)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and any(alive(p) for p in roots):
        time.sleep(0.01)
    for root in roots:
        kill_tree(root, 0, include_root=True)


def kind_of(mode):
    for test, name in (
        (stat.S_ISREG, "file"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISCHR, "char_device"),
        (stat.S_ISBLK, "block_device"),
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "other"


def make_private_dir(prefix, parent):
    while True:
        path = os.path.join(parent, prefix + os.urandom(6).hex())
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue


def stage(prefix, parent, bundle):
    """Make a private directory and write the bundle's files into it; on failure
    nothing is left."""
    made = make_private_dir(prefix, parent)
    try:
        write_bundle(made, bundle)
    except BaseException:
        remove_tree(made)
        raise
    return made


def put_and_exec(directory, size, argv):
    """Write the bundle of ``size`` bytes at the start of stdin into ``directory``, then
    become ``argv``, whose stdin is the rest."""
    write_bundle(directory, io.BytesIO(read_fd_exactly(0, size)))
    os.execvp(argv[0], argv)


def main(verb, args):
    if verb == "run":
        return run(args[0], float(args[1]), args[2], args[3])
    if verb == "kill":
        return sweep(args[0], float(args[1]))
    if verb == "killrun":
        return kill_run(args[0], float(args[1]))
    if verb == "killtree":
        return kill_tree(int(args[0]), float(args[1]), include_root=True)
    out = sys.stdout.buffer
    try:
        if verb == "stat":
            st = os.stat(args[0])
            real = os.path.realpath(args[0])
            out.write(("%s\t%d\t%s" % (kind_of(st.st_mode), st.st_size, hexed(real))).encode())
        elif verb == "read":
            left = int(args[1])
            with open(args[0], "rb") as f:
                while left != 0:
                    chunk = f.read(65536 if left < 0 else min(65536, left))
                    if not chunk:
                        break
                    out.write(chunk)
                    left -= len(chunk) if left > 0 else 0
        elif verb == "write":
            path, parents, mode = args[0], args[1] == "1", args[2]
            data = sys.stdin.buffer.read()
            if parents:
                parent = os.path.dirname(os.path.abspath(path))
                if not os.path.isdir(parent):
                    os.makedirs(parent)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, int(mode or "644", 8))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            if mode:
                os.chmod(path, int(mode, 8))
        elif verb == "put":
            put_and_exec(args[0], int(args[1]), args[2:])
        elif verb in ("mkdtemp", "stage"):
            if verb == "stage":
                made = stage(args[0], args[1], sys.stdin.buffer)
            else:
                made = make_private_dir(args[0], args[1])
            out.write((hexed(made) + "\t" + hexed(os.path.expanduser("~"))).encode())
        elif verb == "rmtree":
            remove_tree(args[0])
        else:
            raise SystemExit("unknown verb " + verb)
    except OSError as exc:
        fail(exc)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
