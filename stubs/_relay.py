"""hermes-sandbox stream relay: runs inside the sandbox, on the far end of an exec stream.

Stdlib only, Python 3.8+. Started as ``python3 _hermes_relay.py`` with its stdin and
stdout attached to the host (a docker exec, an ssh channel, a pipe). Over that one
channel it carries, multiplexed, the script's stdout and stderr, its exit status, and
the bytes of every RPC connection the script opens to the Unix socket the relay
listens on inside the sandbox, so the same hermes_tools client works unchanged.

Channel messages are frames (4-byte big-endian length, one msgpack map), as in
docs/protocol.md section "Stream relay". Host to relay: run, rpc, close, kill.
Relay to host: started, open, rpc, eof, close, out, exit, error. End of input from the
host means it is gone: the relay kills everything it started, removes the run's stage
(``--remove STAGE``), with each ``--also-remove DIR`` (the other private directories
the host made there, e.g. a session's workspace), and exits. With ``--remove-after``
too (a one-shot run) it removes
the stage once the script has exited as well, before it reports the exit, and says in
that report whether the stage is gone (``removed``). It is a child subreaper: whatever
the script starts stays below it however it daemonises, and is found by /proc ancestry (the host
prepends stubs/_proctree.py's source to this one). It reports its own pid, so that the
host can kill it with its tree through another exec if the script stops it.

The relay never blocks on a script's connection: each one's output is a bounded
buffer written as the socket accepts it, and a connection that stops reading (its
buffer over the bound) is dropped, so the host's kill always gets through.
"""

import os
import select
import struct
import sys
import time

# The C modules, not their Python layers: signal's and socket's import enum, and
# selectors imports collections, together about 5 ms of every relay's start (every
# relayed run's path on docker and ssh).
try:
    import _signal as signal
except ImportError:  # not CPython
    import signal  # type: ignore[no-redef]
try:
    import _socket as socket
except ImportError:  # not CPython
    import socket  # type: ignore[no-redef]

if "kill_tree" not in globals():  # run alone: the host prepends _proctree.py's source
    from _proctree import become_subreaper, close_inherited, kill_tree, reap

try:
    import msgpack as _mp

    def _pack(obj):
        return _mp.packb(obj, use_bin_type=True)

    def _unpack(data):
        return _mp.unpackb(data, raw=False, strict_map_key=False)

except Exception:
    from _hermes_msgpack import packb as _pack, unpackb as _unpack  # type: ignore[no-redef]

EVENT_READ, EVENT_WRITE = 1, 2  # as selectors names them


class _Key(object):
    __slots__ = ("data", "events", "fd", "fileobj")


class _Selector(object):
    """What the relay uses of selectors.PollSelector (register, modify, unregister,
    select, with the same ready events: a hang-up or error is ready for either), on
    select.poll, without importing selectors."""

    def __init__(self):
        self._poll = select.poll()
        self._keys = {}

    @staticmethod
    def _mask(events):
        return (select.POLLIN if events & EVENT_READ else 0) | (
            select.POLLOUT if events & EVENT_WRITE else 0
        )

    def register(self, fileobj, events, data=None):
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        if fd in self._keys:
            raise KeyError("%r is already registered" % (fileobj,))
        key = _Key()
        key.fileobj, key.fd, key.events, key.data = fileobj, fd, events, data
        self._poll.register(fd, self._mask(events))
        self._keys[fd] = key
        return key

    def unregister(self, fileobj):
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = self._keys.pop(fd)
        self._poll.unregister(fd)
        return key

    def modify(self, fileobj, events, data=None):
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = self._keys[fd]
        key.events, key.data = events, data
        self._poll.modify(fd, self._mask(events))
        return key

    def select(self, timeout=None):
        # poll takes milliseconds, rounded up as selectors does (never a busy 0 for 0.4 ms)
        wait = None if timeout is None else max(0, -int(-timeout * 1000 // 1))
        try:
            fired = self._poll.poll(wait)
        except InterruptedError:
            return []
        ready = []
        for fd, mask in fired:
            key = self._keys.get(fd)
            if key is None:
                continue
            events = (EVENT_WRITE if mask & ~select.POLLIN else 0) | (
                EVENT_READ if mask & ~select.POLLOUT else 0
            )
            if events & key.events:
                ready.append((key, events & key.events))
        return ready


def _accepted(listener):
    """A connection from ``listener``, a socket (_socket's, or socket's where there is
    no C module)."""
    if hasattr(listener, "_accept"):
        fd, _ = listener._accept()
        return socket.socket(fileno=fd)
    return listener.accept()[0]


_HEADER = struct.Struct(">I")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_CHUNK = 65536
# The most read from the channel or a connection at once. Reads go into one buffer the
# relay keeps: a new bytes object of this size for every read is, above malloc's mmap
# threshold, an mmap, an mremap and a munmap (and a page fault) for every message each
# way, most of the relay's system calls per call (docs/benchmarks.md, "The relay's per
# call (session 12)").
_READ_SIZE = 262144
_MAX_FRAME = 64 * 1024 * 1024
_DRAIN_SECONDS = 2.0
# Replies held for one connection that its script does not read; past this the
# connection is dropped. Above any one reply the host sends in practice.
_CONN_OUTPUT_LIMIT = 32 * 1024 * 1024
# Bytes waiting for the host past which the relay stops reading the script.
_CHANNEL_PAUSE = 1024 * 1024
# After it passes a call on, the relay looks for the call's next step without sleeping
# for this long before it blocks in select again: after a request, for the host's
# reply (while the host's replies come within this time); after a reply, for the
# script's next request. On a VM whose idle vCPU halts,
# a write wakes a blocked relay through an interrupt to that halted vCPU, which cost
# 40-75 us a call over docker and ssh (docs/benchmarks.md, "Relay wake (session 9)";
# the wait for the host's reply, "The relay's per call (session 12)"). Bounded: a call
# left unanswered, or an idle script, costs at most this much CPU once.
_SPIN_SECONDS = 150e-6
_RELAY_ONLY_VARS = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")


# The per-call messages, {"op": "rpc", "conn": N, "data": BIN} and {"op": "out", "fd":
# N, "data": BIN}, are written and read here without the generic codec (in a sandbox
# without msgpack that codec is pure Python, and it would cost more than the channel's
# round trip). The bytes are what msgpack writes for those maps, keys in that order;
# an rpc message from the host in any other valid encoding takes the generic path.
_RPC_HEAD = b"\x83\xa2op\xa3rpc\xa4conn"
_DATA_KEY = b"\xa4data"


def _uint(n):
    """A non-negative int as msgpack writes it (the smallest form)."""
    if n < 0x80:
        return bytes((n,))
    if n < 0x100:
        return b"\xcc" + bytes((n,))
    if n < 0x10000:
        return b"\xcd" + _U16.pack(n)
    return b"\xce" + _U32.pack(n)


def data_frame(head, data):
    """The whole frame of a message whose encoding starts with ``head`` (its map
    header, its op and its fields up to the key "data") and ends with ``data`` as bin."""
    n = len(data)
    if n < 0x100:
        size = b"\xc4" + bytes((n,))
    elif n < 0x10000:
        size = b"\xc5" + _U16.pack(n)
    else:
        size = b"\xc6" + _U32.pack(n)
    return b"".join((_HEADER.pack(len(head) + len(size) + n), head, size, data))


_OUT_HEADS = {fd: b"\x83\xa2op\xa3out\xa2fd" + _uint(fd) + _DATA_KEY for fd in (1, 2)}


def rpc_head(conn_id):
    return _RPC_HEAD + _uint(conn_id) + _DATA_KEY


def read_rpc(body):
    """(conn, data) of an rpc message as :func:`data_frame` writes it, else None."""
    try:
        pos = len(_RPC_HEAD)
        if body[:pos] != _RPC_HEAD:
            return None
        b = body[pos]
        if b < 0x80:
            conn, pos = b, pos + 1
        elif b == 0xCC:
            conn, pos = body[pos + 1], pos + 2
        elif b == 0xCD:
            conn, pos = _U16.unpack_from(body, pos + 1)[0], pos + 3
        elif b == 0xCE:
            conn, pos = _U32.unpack_from(body, pos + 1)[0], pos + 5
        else:
            return None
        if body[pos : pos + 5] != _DATA_KEY:
            return None
        b = body[pos + 5]
        if b == 0xC4:
            n, pos = body[pos + 6], pos + 7
        elif b == 0xC5:
            n, pos = _U16.unpack_from(body, pos + 6)[0], pos + 8
        elif b == 0xC6:
            n, pos = _U32.unpack_from(body, pos + 6)[0], pos + 10
        else:
            return None
    except (IndexError, struct.error):
        return None
    if pos + n != len(body):
        return None
    return conn, body[pos:]


class _Conn(object):
    """An RPC connection of the script: its socket and the replies not yet written."""

    __slots__ = ("closing", "events", "head", "input_ended", "out", "sock")

    def __init__(self, sock, conn_id):
        self.sock = sock
        self.head = rpc_head(conn_id)  # of its rpc messages to the host
        self.out = bytearray()
        self.events = 0  # what it is selected for
        self.input_ended = False  # the script shut its writing side
        self.closing = False  # the host closed it: close once out is written


def _program(name, env):
    """The file ``os.execvpe(name, ..., env)`` would run, found before the fork (in the
    child, execvpe's lookup imports warnings, which searches the stage first, and
    tries each directory of the path in turn); None when the child must look itself
    (a relative directory in the path, which the child's working directory decides)."""
    if os.sep in name:
        return name
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        if not directory.startswith(os.sep):
            return None
        candidate = os.path.join(directory, name)
        if os.access(candidate, os.X_OK) and os.path.isfile(candidate):
            return candidate
    return None


class _Child(object):
    """The script, started as ``subprocess.Popen`` would (a new session, stdin from a
    file or /dev/null, stdout and stderr pipes, no other descriptor, SIGPIPE and
    SIGXFSZ as by default) with fork and exec: importing subprocess (and with it
    locale and re) was the largest part of the relay's start."""

    def __init__(self, argv, env, cwd, stdin_fd):
        program = _program(argv[0], env)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        check_r, check_w = os.pipe()  # closed by the exec; else carries the reason
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                os.setsid()
                os.dup2(stdin_fd, 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                close_inherited(check_w)
                for number in ("SIGPIPE", "SIGXFSZ"):
                    if hasattr(signal, number):
                        signal.signal(getattr(signal, number), signal.SIG_DFL)
                if cwd:
                    os.chdir(cwd)
                if program is not None:
                    try:
                        os.execve(program, argv, env)
                    except OSError:
                        pass  # as execvpe would, try the path's other directories
                os.execvpe(argv[0], argv, env)
            except BaseException as exc:
                try:
                    os.write(check_w, str(exc).encode("utf-8", "replace") or b"?")
                finally:
                    os._exit(127)
        os.close(out_w)
        os.close(err_w)
        os.close(check_w)
        reason = b""
        while True:
            chunk = os.read(check_r, 4096)
            if not chunk:
                break
            reason += chunk
        os.close(check_r)
        if reason:
            os.waitpid(pid, 0)
            os.close(out_r)
            os.close(err_r)
            raise OSError(reason.decode("utf-8", "replace"))
        self.pid = pid
        self.returncode = None
        self.stdout = os.fdopen(out_r, "rb", 0)
        self.stderr = os.fdopen(err_r, "rb", 0)

    def poll(self):
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped already (its returncode set then)
                return self.returncode
            if pid:
                self.returncode = (
                    -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                )
        return self.returncode


def remove_tree(path):
    """Remove the stage, following no symlink (what shutil.rmtree does, without its
    imports)."""
    try:
        if not os.path.isdir(path) or os.path.islink(path):
            return
        for root, dirs, files in os.walk(path, topdown=False):
            for name in files + dirs:
                full = os.path.join(root, name)
                try:
                    if name in dirs and not os.path.islink(full):
                        os.rmdir(full)
                    else:
                        os.unlink(full)
                except OSError:
                    pass
        os.rmdir(path)
    except OSError:
        pass


class Relay(object):
    def __init__(self, channel_in, channel_out, stage=None, remove_after=False, also=()):
        self.stage = stage
        self.remove_after = remove_after and stage is not None
        self.also_remove = list(also)  # removed with the stage when the host is gone
        self.cin = channel_in
        self.cout = channel_out
        self.sel = _Selector()
        self.inbuf = bytearray()
        self.readbuf = bytearray(_READ_SIZE)  # every read lands here (_READ_SIZE)
        self.readview = memoryview(self.readbuf)
        self.child = None
        self.listener = None
        self.socket_path = None
        self.conns = {}
        self.next_conn = 0
        self.pipes = {}
        self.exit_code = None
        self.killing = False
        self.chan_out = bytearray()  # frames for the host not yet written
        self.chan_waiting = False  # the channel is selected for writing
        self.passed = False  # a call went through in this pass of the loop (_SPIN_SECONDS)
        # When the last request went to the host (0.0: answered), and whether its reply
        # came within _SPIN_SECONDS: only then is the host's next reply polled for (on a
        # busy machine replies come later, and the polling would take the CPU they need).
        self.asked = 0.0
        self.quick_replies = True
        self.paused = False  # too much waits for the host: the script is not read
        self.sigchld_r, self.sigchld_w = os.pipe()
        os.set_blocking(self.sigchld_w, False)
        os.set_blocking(self.sigchld_r, False)

    # -- channel -----------------------------------------------------------------------
    def send(self, message):
        body = _pack(message)
        self.send_frame(_HEADER.pack(len(body)) + body)

    def send_frame(self, frame):
        """Write a whole frame now if the channel takes it, else queue what is left."""
        if not self.chan_out:
            try:
                written = os.write(self.cout, frame)
            except (BlockingIOError, InterruptedError):
                written = 0
            except OSError:  # the host is gone
                return
            if written == len(frame):
                return
            frame = memoryview(frame)[written:]
        self.chan_out += frame
        self.flush_channel()

    def flush_channel(self):
        """Write what the channel accepts now. While more than a bound waits, stop
        reading the script (its connections and output), never the host's input."""
        try:
            while self.chan_out:
                written = os.write(self.cout, self.chan_out[:262144])
                del self.chan_out[:written]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:  # the host is gone
            self.chan_out.clear()
        pending = bool(self.chan_out)
        if pending != self.chan_waiting:
            self.chan_waiting = pending
            if pending:
                self.sel.register(self.cout, EVENT_WRITE, ("channel_out", None))
            else:
                self.sel.unregister(self.cout)
        paused = len(self.chan_out) > _CHANNEL_PAUSE
        if paused != self.paused:
            self.paused = paused
            for conn_id in list(self.conns):
                self.watch_conn(conn_id)
            for fd in self.pipes:
                if paused:
                    self.sel.unregister(fd)
                else:
                    self.sel.register(fd, EVENT_READ, ("out", self.pipes[fd][0]))

    def flush_channel_blocking(self):
        """Write everything still queued, waiting as long as it takes (at the end)."""
        if self.chan_waiting:
            self.sel.unregister(self.cout)
            self.chan_waiting = False
        os.set_blocking(self.cout, True)
        try:
            while self.chan_out:
                written = os.write(self.cout, self.chan_out[:262144])
                del self.chan_out[:written]
        except OSError:
            self.chan_out.clear()
        self.flush_channel()  # resumes reading the script

    def read_channel(self):
        try:
            n = os.readv(self.cin, (self.readbuf,))
        except BlockingIOError:
            return
        if not n:
            self.host_gone()
            return
        chunk = self.readview[:n]  # read before the next read: bodies are copied out
        if self.inbuf:
            self.inbuf += chunk
            data = self.inbuf
        else:
            data = chunk  # the usual case: whole frames, read without a copy
        pos, end = 0, len(data)
        while end - pos >= 4:
            (size,) = _HEADER.unpack_from(data, pos)
            if size == 0 or size > _MAX_FRAME:
                self.fatal("bad frame from the host (%d bytes)" % size)
            if end - pos - 4 < size:
                break
            body = bytes(data[pos + 4 : pos + 4 + size])
            pos += 4 + size
            rpc = read_rpc(body)
            if rpc is not None:
                self.deliver(rpc[0], rpc[1])
            else:
                self.handle(_unpack(body))
        if data is self.inbuf:
            del self.inbuf[:pos]
        elif pos < end:
            self.inbuf += data[pos:]

    def deliver(self, conn_id, data):
        """Reply bytes from the host for one of the script's connections."""
        conn = self.conns.get(conn_id)
        if conn is not None and data:
            self.passed = True
            if self.asked:
                self.quick_replies = time.monotonic() - self.asked < _SPIN_SECONDS
                self.asked = 0.0
            self.write_conn(conn_id, data)

    def handle(self, message):
        op = message.get("op")
        if op == "rpc":
            self.deliver(message.get("conn"), message.get("data") or b"")
        elif op == "close":
            conn = self.conns.get(message.get("conn"))
            if conn is not None:
                conn.closing = True  # after what is queued for it is written
                self.write_conn(message.get("conn"))
        elif op == "run":
            self.start(message)
        elif op == "kill":
            self.kill_all(float(message.get("grace", 2.0)))
        else:
            self.send({"op": "error", "message": "unknown op %r" % (op,)})

    # -- the script --------------------------------------------------------------------
    def start(self, message):
        if self.child is not None:
            self.send({"op": "error", "message": "already running"})
            return
        # The script starts from the sandbox's own environment (the image's PATH, the
        # login's HOME), less what was set for the relay itself, plus the run's
        # variables.
        env = dict(os.environ)
        for name in _RELAY_ONLY_VARS:
            env.pop(name, None)
        env.update(message.get("env") or {})
        self.socket_path = message.get("socket")
        stdin = None
        try:
            if message.get("stdin"):
                stdin = os.open(message["stdin"], os.O_RDONLY)
            else:
                stdin = os.open(os.devnull, os.O_RDONLY)
            if self.socket_path:
                self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.listener.bind(self.socket_path)
                os.chmod(self.socket_path, 0o600)
                self.listener.listen(64)
                self.listener.setblocking(False)
                self.sel.register(self.listener, EVENT_READ, ("accept", None))
            self.child = _Child(message["argv"], env, message.get("cwd") or None, stdin)
        except Exception as exc:
            if stdin is not None:
                os.close(stdin)
            self.send({"op": "error", "message": "cannot start the script: %s" % (exc,)})
            self.exit_code = 127
            self.report_exit(127)
            return
        os.close(stdin)  # the script has its own copy
        for fd_number, pipe in ((1, self.child.stdout), (2, self.child.stderr)):
            os.set_blocking(pipe.fileno(), False)
            self.pipes[pipe.fileno()] = (fd_number, pipe)
            if not self.paused:
                self.sel.register(pipe.fileno(), EVENT_READ, ("out", fd_number))
        self.send({"op": "started", "pid": self.child.pid, "relay_pid": os.getpid()})

    def read_output(self, fd):
        fd_number, pipe = self.pipes[fd]
        try:
            data = os.read(fd, _CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self.send_frame(data_frame(_OUT_HEADS[fd_number], data))
        else:
            try:
                self.sel.unregister(fd)
            except KeyError:  # not selected while paused
                pass
            pipe.close()
            del self.pipes[fd]

    def child_exited(self):
        if self.child is None or self.exit_code is not None:
            return False
        code = self.child.poll()
        if code is None:
            return False
        self.exit_code = code
        return True

    def finish(self):
        """The script exited: remove what it left, drain its output, report."""
        self.flush_channel_blocking()  # from here on the channel is written blocking
        self.end_tree(2.0)
        deadline = time.monotonic() + _DRAIN_SECONDS
        while self.pipes and time.monotonic() < deadline:
            for key, _ in self.sel.select(timeout=0.05):
                if key.data[0] == "out":
                    self.read_output(key.fd)
        code = self.exit_code
        self.report_exit(128 - code if code < 0 else code)

    def report_exit(self, code):
        """The last message: the script's exit code, the stage removed first if asked
        (the host then need not remove it itself)."""
        self.shutdown()
        message = {"op": "exit", "code": code}
        if self.remove_after:
            remove_tree(self.stage)
            message["removed"] = not os.path.lexists(self.stage)
        self.send(message)

    # -- RPC connections ---------------------------------------------------------------
    def accept(self):
        try:
            sock = _accepted(self.listener)
        except (BlockingIOError, InterruptedError):
            return
        self.next_conn += 1
        conn_id = self.next_conn
        sock.setblocking(False)
        conn = self.conns[conn_id] = _Conn(sock, conn_id)
        conn.events = EVENT_READ
        self.sel.register(sock, conn.events, ("conn", conn_id))
        self.send({"op": "open", "conn": conn_id})

    def watch_conn(self, conn_id):
        """Select on what the connection waits for: input until its end, and output
        while some is queued."""
        conn = self.conns[conn_id]
        events = 0 if conn.input_ended or self.paused else EVENT_READ
        if conn.out:
            events |= EVENT_WRITE
        if events == conn.events:
            return
        conn.events = events
        try:
            if events:
                self.sel.modify(conn.sock, events, ("conn", conn_id))
            else:
                self.sel.unregister(conn.sock)
        except KeyError:
            if events:
                self.sel.register(conn.sock, events, ("conn", conn_id))

    def conn_ready(self, conn_id, events):
        if events & EVENT_WRITE:
            self.write_conn(conn_id)
        if events & EVENT_READ and conn_id in self.conns:
            self.read_conn(conn_id)

    def read_conn(self, conn_id):
        conn = self.conns.get(conn_id)
        if conn is None:
            return
        try:
            n = conn.sock.recv_into(self.readbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close_conn(conn_id, tell_host=True)
            return
        if n:
            self.send_frame(data_frame(conn.head, self.readview[:n]))  # joined: a copy
            self.asked = time.monotonic()
            self.passed = self.passed or self.quick_replies
            return
        # The script shut its writing side (or closed): the host answers what is in
        # flight, then closes; replies still go out until then.
        conn.input_ended = True
        self.watch_conn(conn_id)
        self.send({"op": "eof", "conn": conn_id})

    def write_conn(self, conn_id, data=b""):
        """Write what the connection's socket takes of its queued replies and ``data``,
        and queue the rest."""
        conn = self.conns.get(conn_id)
        if conn is None:
            return
        try:
            if data and not conn.out:  # the usual case: straight to the socket
                try:
                    data = memoryview(data)[conn.sock.send(data) :]
                except (BlockingIOError, InterruptedError):
                    pass
            conn.out += data
            while conn.out:
                sent = conn.sock.send(conn.out[:262144])
                del conn.out[:sent]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:  # the script closed it
            self.close_conn(conn_id, tell_host=not conn.closing)
            return
        if len(conn.out) > _CONN_OUTPUT_LIMIT:
            # The script does not read its replies: drop it rather than hold more.
            self.close_conn(conn_id, tell_host=not conn.closing)
        elif conn.closing and not conn.out:
            self.close_conn(conn_id, tell_host=False)
        else:
            self.watch_conn(conn_id)

    def close_conn(self, conn_id, tell_host):
        conn = self.conns.pop(conn_id, None)
        if conn is None:
            return
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        if tell_host:
            self.send({"op": "close", "conn": conn_id})

    # -- killing -----------------------------------------------------------------------
    def end_tree(self, grace):
        """Kill everything below the relay: the script and all it started."""
        kill_tree(os.getpid(), grace)
        self.reap()

    def reap(self):
        # The relay is the parent of orphans (a subreaper), maybe pid 1: reap them all.
        status = reap(None if self.child is None else self.child.pid)
        if status is not None and self.exit_code is None:
            self.child.returncode = (
                -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            )

    def kill_all(self, grace):
        if self.killing:
            return
        self.killing = True
        self.end_tree(grace)

    def host_gone(self):
        self.end_tree(0)
        self.shutdown()
        for path in [self.stage, *self.also_remove] if self.stage else []:
            remove_tree(path)
        os._exit(0)

    def fatal(self, message):
        try:
            self.send({"op": "error", "message": message})
            self.flush_channel_blocking()
        finally:
            self.end_tree(0)
            self.shutdown()
            os._exit(2)

    def shutdown(self):
        for conn_id in list(self.conns):
            self.close_conn(conn_id, tell_host=False)
        if self.listener is not None:
            self.listener.close()
            self.listener = None
            try:
                os.unlink(self.socket_path)
            except OSError:
                pass
        self.done = True

    # -- main loop ---------------------------------------------------------------------
    def run(self):
        self.done = False
        become_subreaper()
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.sigchld_w)
        os.set_blocking(self.cin, False)
        os.set_blocking(self.cout, False)
        self.sel.register(self.cin, EVENT_READ, ("channel", None))
        self.sel.register(self.sigchld_r, EVENT_READ, ("sigchld", None))
        spin_until = 0.0  # until then, poll for a call's next step (_SPIN_SECONDS)
        while not self.done:
            if spin_until and time.monotonic() < spin_until:
                ready = self.sel.select(timeout=0)
                if not ready:
                    continue  # a SIGCHLD is a ready key too: nothing is missed
            else:
                ready = self.sel.select(timeout=0.5)
            spin_until = 0.0
            self.passed = False
            # The script's exit is looked for after a SIGCHLD (its wakeup byte is among
            # the ready keys) and on every timeout, not on every call's pass.
            check_child = not ready
            for key, events in ready:
                kind, arg = key.data
                if kind == "channel":
                    self.read_channel()
                elif kind == "out":
                    if key.fd in self.pipes:
                        self.read_output(key.fd)
                elif kind == "conn":
                    self.conn_ready(arg, events)
                elif kind == "channel_out":
                    self.flush_channel()
                elif kind == "accept":
                    self.accept()
                elif kind == "sigchld":
                    try:
                        os.read(self.sigchld_r, 4096)
                    except OSError:
                        pass
                    self.reap()  # the script, or an orphan reparented here
                    check_child = True
                if self.done:
                    break
            if self.passed:
                spin_until = time.monotonic() + _SPIN_SECONDS
            if check_child and not self.done and self.child_exited():
                self.finish()
        self.flush_channel_blocking()


def main():
    # The channel is fds 0 and 1; nothing else may write to fd 1, so point the
    # relay's own sys.stdout elsewhere.
    channel_out = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    sys.stdout = sys.stderr
    stage, remove_after, also = _parse(sys.argv[1:])
    Relay(0, channel_out, stage, remove_after, also).run()
    # Everything is said and done: no interpreter teardown (its time would be taken
    # from the host's end of the run on a small machine).
    sys.stderr.flush()
    os._exit(0)


def _parse(args):
    """``[--remove STAGE [--remove-after] [--also-remove DIR]...]``"""
    stage, remove_after, also = None, False, []
    while args:
        name = args.pop(0)
        if name == "--remove-after":
            remove_after = True
        elif name == "--remove" and args:
            stage = args.pop(0)
        elif name == "--also-remove" and args:
            also.append(args.pop(0))
        else:
            raise SystemExit("_hermes_relay.py: bad option %s" % name)
    return stage, remove_after, also


if __name__ == "__main__":
    main()
