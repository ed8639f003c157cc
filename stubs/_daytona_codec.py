"""The daytona codec: run inside a Daytona sandbox as a session command
(``python3 -c SOURCE``) under which every command of the daytona backend runs.

It turns the session's text lines into a clean byte stream both ways (see
environments/daytona/environment.py and docs/backends/daytona.md). Host to codec, one
line per item: ``h`` the header (argv, environment, cwd, whether stdin is wanted, the
kill grace, the idle limit, a marker), ``d<base64>`` bytes for the command's stdin,
``c`` end of its stdin, ``k`` kill it, ``p`` keep-alive. Codec to host: ``o<base64>``
stdout, ``e<base64>`` stderr, ``x<code>`` the exit, last. Stdlib only, Python 3.6+.
"""

import binascii
import os
import selectors
import signal
import subprocess
import sys
import time

MARK = "HERMES_SANDBOX_CODEC"
CHUNK = 3000  # raw bytes per output line: with its tag, under 4 KiB


def strings(field):
    if field == "-":
        return []
    raw = binascii.a2b_base64(field)
    return [s.decode("utf-8", "surrogateescape") for s in raw.split(b"\0")]


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def marked(entry):
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            try:
                with open("/proc/%s/environ" % name, "rb") as f:
                    if entry in f.read().split(b"\0"):
                        found.append(int(name))
            except OSError:
                pass
    return [pid for pid in found if alive(pid)]


def signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


class Codec(object):
    def __init__(self):
        self.sel = selectors.DefaultSelector()
        self.inbuf = b""
        self.host_open = True
        self.pending = b""
        self.close_stdin = False
        self.child = None
        self.stdin_fd = None
        self.outputs = {}
        self.code = None
        self.drain_until = None
        self.kill_stage = 0
        self.kill_at = None
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *a: None)
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")

    def emit(self, tag, data=b""):
        if not self.host_open:
            return
        line = tag + (binascii.b2a_base64(data, newline=False) if data else b"") + b"\n"
        view = memoryview(line)
        try:
            while view:
                view = view[os.write(1, view) :]
        except OSError:
            self.host_open = False
            self.kill(True)

    def read_header(self):
        self.sel.register(0, selectors.EVENT_READ, "host")
        while b"\n" not in self.inbuf:
            if not self.sel.select(600):
                sys.exit(125)
            chunk = os.read(0, 262144)
            if not chunk:
                sys.exit(125)
            self.inbuf += chunk
        line, _, self.inbuf = self.inbuf.partition(b"\n")
        return line.decode("ascii").split(" ")

    def start(self, fields):
        self.want_stdin = fields[1] == "1"
        self.idle = float(fields[2])
        self.grace = float(fields[3])
        cwd, argv = strings(fields[4]), strings(fields[5])
        env = dict(os.environ)
        for item in strings(fields[6]):
            name, _, value = item.partition("=")
            env[name] = value
        env[MARK] = fields[7]
        self.entry = (MARK + "=" + fields[7]).encode()
        self.last_input = time.monotonic()
        try:
            self.child = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd[0] if cwd else None,
                stdin=subprocess.PIPE if self.want_stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except OSError as exc:
            self.emit(b"e", ("cannot run %r: %s\n" % (argv[0], exc)).encode())
            self.emit(b"x127" if isinstance(exc, FileNotFoundError) else b"x126")
            sys.exit(127)
        if self.want_stdin:
            self.stdin_fd = self.child.stdin.fileno()
            os.set_blocking(self.stdin_fd, False)
        for stream, tag in ((self.child.stdout, b"o"), (self.child.stderr, b"e")):
            self.outputs[stream.fileno()] = tag
            self.sel.register(stream.fileno(), selectors.EVENT_READ, tag)
        # The daemon ends a deleted session with SIGTERM: take the command down with it.
        signal.signal(signal.SIGTERM, lambda *a: self.kill(True))
        self.lines()

    def lines(self):
        while b"\n" in self.inbuf:
            line, _, self.inbuf = self.inbuf.partition(b"\n")
            self.last_input = time.monotonic()
            tag = line[:1]
            if tag == b"d":
                if self.stdin_fd is not None and not self.close_stdin:
                    self.pending += binascii.a2b_base64(line[1:])
            elif tag == b"c":
                self.close_stdin = True
            elif tag == b"k":
                self.kill(False)
        self.feed()

    def feed(self):
        if self.stdin_fd is None:
            return
        try:
            while self.pending:
                self.pending = self.pending[os.write(self.stdin_fd, self.pending[:65536]) :]
        except BlockingIOError:
            pass
        except OSError:
            self.pending = b""
            self.close_stdin = True
        if self.close_stdin and not self.pending:
            self.drop_stdin()
        elif self.pending:
            self.watch_stdin(True)

    def watch_stdin(self, on):
        registered = self.stdin_fd in self.sel.get_map()
        if on and not registered:
            self.sel.register(self.stdin_fd, selectors.EVENT_WRITE, "stdin")
        elif registered and not on:
            self.sel.unregister(self.stdin_fd)

    def drop_stdin(self):
        if self.stdin_fd is None:
            return
        try:
            self.sel.unregister(self.stdin_fd)
        except KeyError:
            pass
        try:
            self.child.stdin.close()
        except OSError:
            pass
        self.stdin_fd = None
        self.pending = b""

    def kill(self, hurry):
        # End of input first (the relay then stops its script itself), then SIGTERM
        # and SIGKILL to every process carrying the marker.
        if self.kill_stage == 0:
            self.drop_stdin()
            self.kill_stage = 1
            self.kill_at = time.monotonic() + (0 if hurry else self.grace)
        elif hurry and self.kill_stage == 1:
            self.kill_at = time.monotonic()

    def escalate(self):
        if self.kill_stage == 1:
            signal_all(marked(self.entry), signal.SIGTERM)
            signal_all(marked(self.entry), signal.SIGCONT)
            self.kill_stage = 2
            self.kill_at = time.monotonic() + min(self.grace, 2.0)
        elif self.kill_stage == 2:
            self.sweep()
            self.kill_stage = 3
            self.kill_at = None

    def sweep(self):
        for _ in range(200):
            targets = marked(self.entry)
            if not targets:
                return
            signal_all(targets, signal.SIGKILL)
            time.sleep(0.005)

    def timeout(self, now):
        deadlines = [t for t in (self.kill_at, self.drain_until) if t is not None]
        if self.kill_stage == 0:
            deadlines.append(self.last_input + self.idle)
        return max(0.0, min(deadlines) - now) if deadlines else None

    def run(self):
        self.start(self.read_header())
        while True:
            now = time.monotonic()
            if self.code is None and self.child.poll() is not None:
                rc = self.child.returncode
                self.code = 128 - rc if rc < 0 else rc
                self.drain_until = now + 1.0
                self.drop_stdin()
            if self.code is not None and (not self.outputs or now >= self.drain_until):
                break
            if self.kill_stage == 0 and now - self.last_input > self.idle:
                self.kill(False)
            if self.kill_at is not None and now >= self.kill_at:
                self.escalate()
            for key, _ in self.sel.select(self.timeout(time.monotonic())):
                what = key.data
                if what == "wake":
                    try:
                        os.read(self.wake_r, 4096)
                    except OSError:
                        pass
                elif what == "host":
                    chunk = os.read(0, 262144)
                    if chunk:
                        self.inbuf += chunk
                        self.lines()
                    else:  # the daemon's stdin holder is gone: so is the host
                        self.sel.unregister(0)
                        self.kill(False)
                elif what == "stdin":
                    self.watch_stdin(False)
                    self.feed()
                else:
                    data = os.read(key.fd, CHUNK)
                    if data:
                        self.emit(what, data)
                    else:
                        self.sel.unregister(key.fd)
                        del self.outputs[key.fd]
        if self.kill_stage:
            self.sweep()
        self.emit(b"x%d" % self.code)
        sys.exit(min(self.code, 255))


if __name__ == "__main__":
    Codec().run()
