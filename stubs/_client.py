# ---------------------------------------------------------------------------
# hermes-sandbox RPC client: stdlib-only, Python 3.8+. Every generated hermes_tools.py
# runs it in its own namespace (staged as _hermes_client.py; also compiled, where the
# sandbox runs the host's own Python: stubs/generate.py, client_code_file);
# the protocol it speaks is docs/protocol.md.
# ---------------------------------------------------------------------------
import itertools as _itertools
import json as _json
import os as _os
import select as _select
import shlex as _shlex
import socket as _socket
import struct as _struct
import threading as _threading
import time as _time

try:
    import msgpack as _mp

    # Each thread keeps a Packer (packb builds one on every call, which costs more than
    # packing a small request); one that packed a large request is let go, with its buffer.
    _packers = _threading.local()
    _KEEP_PACKER_UP_TO = 64 * 1024

    def _pack(obj):
        try:
            pack = _packers.pack
        except AttributeError:
            pack = _packers.pack = _mp.Packer(use_bin_type=True).pack
        body = pack(obj)
        if len(body) > _KEEP_PACKER_UP_TO:
            del _packers.pack
        return body

    def _unpack(data):
        return _mp.unpackb(data, raw=False, strict_map_key=False)

except Exception:  # no msgpack in this interpreter: the staged pure-Python codec
    from _hermes_msgpack import packb as _pack  # type: ignore[no-redef]
    from _hermes_msgpack import unpackb as _unpack  # type: ignore[no-redef]

_HEADER = _struct.Struct(">I")

# A large result costs its call a few blocks of its size (the frame, the decoded string,
# the parsed result). glibc's malloc serves a block over 128 KB with mmap and gives the
# top of its heap back to the kernel once 128 KB lie free there, so each such call
# would fault its pages in anew, unless a larger block was freed before: freeing one
# raises both thresholds to its size (glibc's dynamic threshold). Compiling this client
# in the sandbox used to do that by chance; now it may arrive compiled, so one 4 MiB
# block is freed here (untouched pages: tens of us): a call with a 100 KB result
# 160 -> 120 us, with a 1 MiB result 1.8 -> 0.7 ms (p50). Elsewhere it does nothing.
_warm_heap = bytearray(4 << 20)
del _warm_heap


def _max_frame():
    try:
        return int(_os.environ.get("HERMES_RPC_MAX_FRAME", "")) or None
    except ValueError:
        return None


def _over_cap(request_id, body, limit):
    """The error reply for a request the host would refuse as too large (over
    ``limit``, from :func:`_max_frame`), or None."""
    if limit is None or len(body) <= limit:
        return None
    message = (
        "this call's request is %d bytes, over the host's %d-byte limit "
        "(HERMES_RPC_MAX_FRAME); pass less per call (a script can write a large "
        "file itself with open())" % (len(body), limit)
    )
    return {"id": request_id, "error": {"kind": "frame_too_large", "message": message}}


class ToolCallError(RuntimeError):
    """A tool call that could not be made or answered: the host is unreachable or gone."""


class _Retired(ToolCallError):
    """A call found its connection retired before it sent anything: it is made again
    on a new connection (:func:`_call`)."""


class _Waiter(object):
    """A waiting call's own wake-up: a lock held until :meth:`wake` releases it.
    ``woken`` (guarded by the :class:`_ReplyBoard`'s lock) is true from a release until the
    caller has taken the lock again, so the lock is never released twice; a wake in
    between finds the caller about to look at the state it changed first."""

    __slots__ = ("lock", "woken")

    def __init__(self):
        self.lock = _threading.Lock()
        self.lock.acquire()
        self.woken = False

    def wake(self):
        if not self.woken:
            self.woken = True
            self.lock.release()


class _ReplyBoard(object):
    """Where the calls of one connection wait for their replies, and the read turn they
    pass between them (leader/follower): the one mechanism of both clients, which differ
    only in how the caller holding the turn reads (a socket, a directory).

    A call :meth:`register` s its key before it sends its request, then :meth:`wait` s:
    it returns the reply another caller delivered to it; or, when no caller holds the
    read turn, takes it and returns what ``read_until(key)`` reads, that caller handing
    the replies of others to them with :meth:`deliver` as they come; or else it sleeps
    on its own :class:`_Waiter`, made only then (a lone caller never sleeps: it always
    finds the turn free). The caller leaving the turn wakes one still sleeping, which
    takes the turn on. After :meth:`fail` every wait, now and later, raises.
    """

    __slots__ = ("_arrived", "_lock", "_reading", "_waiting", "failure")

    def __init__(self):
        self._lock = _threading.Lock()  # guards the four below and each _Waiter's flag
        # key -> the _Waiter of the call still waiting, None until it sleeps
        self._waiting = {}
        self._arrived = {}  # key -> its reply (never None), read by another caller
        self._reading = False  # a caller holds the read turn
        self.failure = None  # the error that ended the connection

    def register(self, key):
        """Register a new call before its request is sent (its reply may be quick)."""
        with self._lock:
            self._waiting[key] = None

    def forget(self, key):
        """A registered call that leaves without its reply and without the read turn
        (it sent nothing, the connection failed, or an exception interrupted its wait):
        it is dropped, and a turn that may have been handed to it is handed on."""
        with self._lock:
            self._waiting.pop(key, None)
            self._arrived.pop(key, None)
            if not self._reading:
                self._wake_one()

    def wait(self, key, read_until):
        """The reply for ``key``: delivered by the caller holding the read turn, or read
        by ``read_until(key)`` once this caller takes the turn. Raises :attr:`failure`
        once set, or what ``read_until`` raises."""
        lock = self._lock
        waiter = None
        try:
            while True:
                with lock:
                    reply = self._arrived.pop(key, None)
                    if reply is not None:
                        return reply
                    if self.failure is not None:
                        raise self.failure
                    if not self._reading:
                        self._reading = True
                        break
                    if waiter is None:  # the first time it must sleep
                        waiter = self._waiting[key] = _Waiter()
                waiter.lock.acquire()  # woken by its reply, a failure, or to take the turn
                with lock:
                    waiter.woken = False  # only now: never released twice, never lost
        except BaseException:  # the failure, or a signal handler's exception (Ctrl-C)
            self.forget(key)
            raise
        try:
            return read_until(key)
        finally:
            with lock:
                self._waiting.pop(key, None)
                self._reading = False
                self._wake_one()  # one caller still waiting reads on

    def _wake_one(self):
        """Under the lock: wake one sleeping caller to take the read turn (one not yet
        asleep finds the turn free when it comes to wait)."""
        for other in self._waiting.values():
            if other is not None:
                other.wake()
                break

    def deliver(self, key, reply):
        """Hand ``reply`` (never None) to the call waiting for ``key``, waking it alone;
        dropped if no call waits for it."""
        with self._lock:
            waiting = self._waiting
            if key in waiting:
                self._arrived[key] = reply
                waiter = waiting.pop(key)
                if waiter is not None:
                    waiter.wake()

    def idle(self):
        """No call is registered and no caller holds the read turn."""
        with self._lock:
            return not self._waiting and not self._reading

    def waited_among(self, keys):
        """The keys among ``keys`` that calls wait for."""
        with self._lock:
            return self._waiting.keys() & keys

    def fail(self, error):
        """End every wait with ``error``, or with the failure set before it; return
        the failure."""
        with self._lock:
            if self.failure is None:
                self.failure = error
            for waiter in self._waiting.values():
                if waiter is not None:
                    waiter.wake()
        return self.failure


class _Connection(object):
    """One socket to the host, shared by every thread of the script.

    Calls overlap: each gets a fresh request id, its frame is written whole under a
    short send lock, and whichever waiting caller holds the read turn reads replies
    and hands each to its owner (a :class:`_ReplyBoard`), so no call waits on
    another's tool.

    Replies are read with ``recv_into`` into one buffer kept for the connection and
    decoded where they lie; a reply too long for it is read into a buffer of its own,
    grown only as bytes arrive, so a header that overstates its length costs no more
    memory than the bytes that really came.

    A send that a signal handler's exception interrupts (a Ctrl-C the script catches, an
    alarm's timeout) may have written part of its frame, after which the host would read
    any later frame as the rest of it: the connection is then :attr:`retired`. Calls
    already sent still get their replies on it, later ones raise :class:`_Retired`
    without writing, and its socket is closed once no call is left on it.
    """

    _BUFFER = 256 * 1024

    def __init__(self, sock, token):
        self._sock = sock
        self._token = token
        self._max_frame = _max_frame()  # once: os.environ costs µs on every call
        self._ids = _itertools.count(1)  # next() is atomic: no lock needed for ids
        self._send_lock = _threading.Lock()
        self._board = _ReplyBoard()  # keyed by request id
        # Only the caller holding the read turn touches these.
        self._buffer = bytearray(self._BUFFER)
        self._view = memoryview(self._buffer)
        self._start = 0  # the unread bytes are _buffer[_start:_end]
        self._end = 0
        self.retired = False  # set under the send lock: nothing more is written

    def call(self, tool, args):
        board = self._board
        if board.failure is not None:
            raise board.failure
        request_id = next(self._ids)
        body = _pack({"id": request_id, "tool": tool, "args": args, "token": self._token})
        limit = self._max_frame
        if limit is not None and len(body) > limit:
            return _over_cap(request_id, body, limit)
        board.register(request_id)
        try:
            with self._send_lock:
                if self.retired:
                    raise _Retired("the connection was retired")
                try:
                    self._sock.sendall(_HEADER.pack(len(body)) + body)
                except BaseException as exc:
                    if not isinstance(exc, OSError):  # a signal handler's: part may be out
                        self.retired = True
                    raise
        except OSError as exc:
            self._fail(ToolCallError("lost the connection to the host: %s" % (exc,)))
        except BaseException:  # Ctrl-C in the send, or retired: it will not wait
            board.forget(request_id)
            if self.retired:
                self._close_if_idle()
            raise
        try:
            return board.wait(request_id, self._read_until)
        finally:
            if self.retired:
                self._close_if_idle()

    def _close_if_idle(self):
        """Close a retired connection's socket once no call waits on it (a call that
        comes later raises :class:`_Retired` before it would touch the socket)."""
        if self._board.idle():
            self.close()

    def _read_until(self, request_id):
        deliver = self._board.deliver
        try:
            while True:
                reply = self._read_frame()
                reply_id = reply.get("id")
                if reply_id == request_id:
                    return reply
                if reply_id is None:  # the host refused the connection itself
                    error = reply.get("error") or {}
                    self._fail(
                        ToolCallError(
                            "the host closed the connection: %s" % (error.get("message"),)
                        )
                    )
                deliver(reply_id, reply)  # dropped if no call of ours waits for it
        except ToolCallError:
            raise
        except (OSError, ValueError, EOFError) as exc:
            self._fail(ToolCallError("lost the connection to the host: %s" % (exc,)))

    def _read_frame(self):
        """The next reply, decoded straight from the bytes received: no copy of a
        reply that fits the connection's buffer."""
        while self._end - self._start < 4:
            self._fill()
        start = self._start
        (size,) = _HEADER.unpack_from(self._buffer, start)
        end = start + 4 + size
        if end > self._end:  # not all here yet
            if 4 + size > self._BUFFER:
                return self._decode(self._read_long(size))
            if end > self._BUFFER:  # its end would not fit: move it down
                self._compact()
                start, end = 0, 4 + size
            while self._end < end:
                self._fill()
        body = self._view[start + 4 : end]
        try:
            reply = _unpack(body)
        finally:
            body.release()
        if end == self._end:
            self._start = self._end = 0
        else:
            self._start = end
        if not isinstance(reply, dict):
            raise ValueError("reply is not a map")
        return reply

    def _fill(self):
        if self._start == self._end:
            self._start = self._end = 0
        elif self._end == self._BUFFER:  # full, a header cut at its end: move it down
            self._compact()
        received = self._sock.recv_into(self._view[self._end :])
        if not received:
            raise EOFError("the host closed the connection")
        self._end += received

    def _compact(self):
        held = self._buffer[self._start : self._end]  # a copy: the two ranges may overlap
        self._buffer[: len(held)] = held
        self._start, self._end = 0, len(held)

    def _read_long(self, size):
        """A reply body of ``size`` bytes, longer than the buffer: grown by what arrives,
        so a header that overstates its length costs no more than the bytes that came
        (growth reallocates in place for bodies this large, where a preallocated one
        would be zero-filled first: slower for 10 MiB replies)."""
        body = bytearray(self._view[self._start + 4 : self._end])
        self._start = self._end = 0
        while len(body) < size:
            chunk = self._sock.recv(min(size - len(body), self._BUFFER))
            if not chunk:
                raise EOFError("the host closed the connection")
            body += chunk
        return body

    @staticmethod
    def _decode(body):
        reply = _unpack(body)
        if not isinstance(reply, dict):
            raise ValueError("reply is not a map")
        return reply

    def _fail(self, error):
        failure = self._board.fail(error)
        try:
            self._sock.close()
        except OSError:
            pass
        raise failure

    def close(self):
        try:
            self._sock.close()
        except OSError:
            pass


# os.open/os.read rather than open(): a call's files are small and new, and the file
# object's extra fstat, ioctl and lseek calls cost about a tenth of a files round trip.
_O_CLOEXEC = getattr(_os, "O_CLOEXEC", 0)


def _write_file(path, data, reuse=None):
    """Write ``data`` to a new file at ``path``, or with ``reuse`` (the file's size) over
    an existing one, then cut to its length if it was longer: not O_TRUNC, a truncation
    to 0, which on ext4 has the close start writing the file out to disk."""
    flags = _os.O_WRONLY | _O_CLOEXEC | (0 if reuse else _os.O_CREAT | _os.O_TRUNC)
    fd = _os.open(path, flags, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[_os.write(fd, view) :]
        if reuse is not None and reuse > len(data):
            _os.ftruncate(fd, len(data))
    finally:
        _os.close(fd)


def _unlink(path):
    try:
        _os.unlink(path)
    except OSError:
        pass


def _read_file(path):
    """The file's bytes, and whether it has no other name (its link count is 1)."""
    fd = _os.open(path, _os.O_RDONLY | _O_CLOEXEC)
    try:
        info = _os.fstat(fd)
        single = info.st_nlink == 1
        # One read for the whole file, as a rule: a regular file's short read is its end.
        chunk = _os.read(fd, info.st_size + 1)
        if len(chunk) <= info.st_size:
            return chunk, single
        chunks = [chunk]
        while True:
            chunk = _os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks), single
            chunks.append(chunk)
    finally:
        _os.close(fd)


class _ReplyWatch(object):
    """inotify on the call directory (Linux, through ctypes): the names of the files
    renamed into it, so a waiting caller wakes when its reply lands instead of polling.
    Raises OSError (or ImportError, AttributeError) where there is no inotify."""

    _IN_MOVED_TO = 0x80
    _IN_Q_OVERFLOW = 0x4000
    _EVENT = _struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name

    def __init__(self, directory):
        import ctypes  # here: an interpreter without ctypes polls instead

        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(_os.O_NONBLOCK | _os.O_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        if libc.inotify_add_watch(fd, _os.fsencode(directory), self._IN_MOVED_TO) < 0:
            error = ctypes.get_errno()
            _os.close(fd)
            raise OSError(error, "inotify_add_watch failed")
        self.fd = fd
        self._poll = _select.poll()  # not select(): descriptors past 1024 are fine
        self._poll.register(fd, _select.POLLIN)

    def names(self, timeout):
        """The names renamed into the directory since the last call, waiting up to
        ``timeout`` seconds for the first; None if the kernel dropped some (look at all)."""
        if timeout > 0 and not self._poll.poll(timeout * 1000):
            return set()
        found = set()
        while True:
            try:
                data = _os.read(self.fd, 65536)
            except BlockingIOError:
                return found
            offset = 0
            while offset < len(data):
                _wd, mask, _cookie, size = self._EVENT.unpack_from(data, offset)
                offset += self._EVENT.size
                if mask & self._IN_Q_OVERFLOW:
                    found = None
                elif found is not None:
                    found.add(data[offset : offset + size].rstrip(b"\0").decode("utf-8", "replace"))
                offset += size
            if len(data) < 65536 - 4096:  # all there was: no read to fail saying so
                return found

    def close(self):
        _os.close(self.fd)


class _FileConnection(object):
    """Calls as request and reply files in a directory the host watches (the files
    transport): each call writes <key>.req atomically and waits for <key>.rep. The key
    carries the pid, so a forked child's calls never collide with its parent's.

    One waiting thread at a time looks for replies, for every waiting call of this
    process, and hands each to its caller (a :class:`_ReplyBoard`), waking that caller
    alone (a reply never wakes the other waiting threads, which under many threads
    cost more than the call): it sleeps on inotify where
    the kernel reports the directory's renames, else it polls the directory with one
    listing per look, however many calls wait. A look that finds a reply inotify did not
    report (a shared filesystem that does not tell) turns inotify off for good.
    """

    _SAFETY_LOOK = 0.05  # with inotify: look anyway this often (an unreported rename)
    _POLL_MIN, _POLL_MAX = 0.0001, 0.005
    # Reply files read and kept, under their own names, to be written again as requests:
    # a call makes no new inode where the host writes each reply into its request's file
    # (creating a file on an ext4 without a journal scans past every inode freed lately).
    _SPARES = 16

    def __init__(self, directory, token):
        self._directory = directory
        self._token = token
        self._max_frame = _max_frame()
        self._ids = _itertools.count(1)
        self._nonce = _os.urandom(6).hex()
        # (name, size) of the read replies to write again (append/pop: atomic)
        self._spares = []
        # Keyed by reply file name; a reply is the file's bytes, or the OSError reading it.
        self._board = _ReplyBoard()
        try:
            self._watch = _ReplyWatch(directory)
        except Exception:  # no inotify here (not Linux, no ctypes, a full watch table)
            self._watch = None

    def call(self, tool, args):
        request_id = next(self._ids)
        key = "%d-%s-%d" % (_os.getpid(), self._nonce, request_id)
        body = _pack({"id": request_id, "tool": tool, "args": args, "token": self._token})
        refused = _over_cap(request_id, body, self._max_frame)
        if refused is not None:
            return refused
        reply_name = key + ".rep"
        self._board.register(reply_name)
        try:
            temporary = self._write_request(key, _HEADER.pack(len(body)) + body)
            _os.rename(temporary, _os.path.join(self._directory, key + ".req"))
        except OSError as exc:
            self._board.forget(reply_name)
            raise ToolCallError(
                "cannot write the request in %s: %s" % (self._directory, exc)
            ) from None
        except BaseException:  # Ctrl-C while writing: it will not wait
            self._board.forget(reply_name)
            raise
        # The host answers every request; the run's timeout bounds this.
        data = self._board.wait(reply_name, self._look_until)
        if isinstance(data, OSError):
            raise ToolCallError("cannot read the reply: %s" % (data,))
        try:
            (size,) = _HEADER.unpack_from(data)
            reply = _unpack(data[4 : 4 + size])
        except Exception as exc:
            raise ToolCallError("cannot decode the host's reply: %s" % (exc,)) from None
        if not isinstance(reply, dict):
            raise ToolCallError("the host's reply is not a map")
        return reply

    def _write_request(self, key, data):
        """Write ``data`` into a spare file if there is one, else a new one; its path."""
        while True:
            try:
                name, size = self._spares.pop()
                spare = _os.path.join(self._directory, name)
            except IndexError:
                break
            try:
                _write_file(spare, data, reuse=size)
            except OSError:  # the host's own file (not writable here), or gone
                _unlink(spare)
                continue
            return spare
        temporary = _os.path.join(self._directory, "." + key + ".req.tmp")
        _write_file(temporary, data)
        return temporary

    def _spare(self, name, size):
        """Keep the read reply file ``name`` to be written again, or remove it. It keeps
        its name (a reply's, which the host passes over, never waited for again: keys
        are not reused): a rename to a spare name would wake both sides' watches."""
        if len(self._spares) < self._SPARES:
            self._spares.append((name, size))
        else:
            _unlink(_os.path.join(self._directory, name))

    def _look_until(self, reply_name):
        """The reply for ``reply_name``, looked for by the caller holding the read turn,
        which hands the other callers theirs as it finds them."""
        delay = self._POLL_MIN
        while True:
            watch = self._watch
            if watch is None:
                found = self._listed()
                if not found:
                    _time.sleep(delay)
                    delay = min(delay * 1.5, self._POLL_MAX)
                    continue
                delay = self._POLL_MIN
            else:
                found = watch.names(self._SAFETY_LOOK)
                if not found:  # nothing reported (None: the kernel dropped some): look
                    listed = self._listed()
                    reported = watch.names(0) if listed else set()
                    if reported is not None and not listed <= reported:
                        self._watch = None  # renames here are not reported: poll
                        watch.close()
                    found = listed | (reported or set())
            mine = self._collect(found, reply_name)
            if mine is not None:
                return mine

    def _listed(self):
        try:
            names = _os.listdir(self._directory)
        except OSError:
            return set()
        return self._board.waited_among(names)

    def _collect(self, names, reply_name):
        """Read and remove the reply files among ``names`` that calls wait for, and
        hand each to its caller; return the one for ``reply_name`` if among them."""
        mine = None
        for name in self._board.waited_among(names):
            path = _os.path.join(self._directory, name)
            try:
                data, single = _read_file(path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                data = exc
                _unlink(path)
            else:
                # A reply with another name still (a host that lands it by link, then
                # drops its own name) is not written again: the host refuses a request
                # file with other links.
                if single:
                    self._spare(name, len(data))
                else:
                    _unlink(path)
            if name == reply_name:
                mine = data
            else:
                self._board.deliver(name, data)
        return mine

    def close(self):
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()


_connection = None
_connection_lock = _threading.Lock()


def _connect():
    global _connection
    with _connection_lock:
        if _connection is None:
            directory = _os.environ.get("HERMES_RPC_DIR")
            if directory:
                _connection = _FileConnection(directory, _os.environ.get("HERMES_RPC_TOKEN", ""))
                return _connection
            path = _os.environ.get("HERMES_RPC_SOCKET")
            if not path:
                raise ToolCallError(
                    "HERMES_RPC_SOCKET is not set: hermes_tools only works inside a "
                    "script run by hermes-sandbox"
                )
            sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            try:
                sock.connect(path)
            except OSError as exc:
                sock.close()
                raise ToolCallError("cannot reach the host at %s: %s" % (path, exc)) from exc
            _connection = _Connection(sock, _os.environ.get("HERMES_RPC_TOKEN", ""))
        return _connection


def _replace(retired):
    """The connection to use in place of ``retired`` (made now if no other call made
    one first)."""
    global _connection
    with _connection_lock:
        if _connection is retired:
            _connection = None
    return _connect()


def _forget_connection():
    # After os.fork() the child must not share its parent's socket and read turn.
    global _connection, _connection_lock
    if isinstance(_connection, _FileConnection):
        _connection.close()  # the child's copy of the parent's inotify descriptor
    _connection = None
    _connection_lock = _threading.Lock()


if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(after_in_child=_forget_connection)


def _call(tool, args):
    """Call ``tool`` on the host with ``args``; return its parsed result.

    Refusals (an unknown or disallowed tool, a spent budget, a bad token) come back
    as ``{"error": ..., "error_kind": ...}`` like any tool error; a connection that
    cannot be made or breaks raises ToolCallError naming the tool.
    """
    args = {k: v for k, v in args.items() if v is not None}
    try:
        connection = _connection or _connect()
        try:
            reply = connection.call(tool, args)
        except _Retired:  # nothing of this call was sent: make it on a new connection
            reply = _replace(connection).call(tool, args)
    except ToolCallError as exc:
        raise ToolCallError("%s(): %s" % (tool, exc)) from None
    error = reply.get("error")
    if error is not None:
        if not isinstance(error, dict):
            error = {"message": str(error)}
        return {"error": error.get("message"), "error_kind": error.get("kind", "internal")}
    result = reply.get("result")
    if isinstance(result, str):
        try:
            return _json.loads(result)
        except ValueError:
            return result
    return result


# ---------------------------------------------------------------------------
# Helpers for scripts
# ---------------------------------------------------------------------------


def json_parse(text):
    """Parse JSON text leniently: control characters inside strings and a leading
    UTF-8 byte-order mark are accepted. Use it on text from terminal() or files."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    return _json.loads(text, strict=False)


def shell_quote(s):
    """Quote a string for safe use in a terminal() command:
    terminal("cat " + shell_quote(path))"""
    return _shlex.quote(str(s))


def retry(fn, max_attempts=3, delay=2.0, backoff=2.0, retry_on=(Exception,)):
    """Call fn() until it succeeds, at most max_attempts times, sleeping delay,
    delay*backoff, ... seconds between attempts; re-raise the last error.
    A tool result that is an error dict is a return value, not an exception:
    check result.get("error") yourself."""
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    for attempt in range(max_attempts):
        try:
            return fn()
        except retry_on:
            if attempt == max_attempts - 1:
                raise
            _time.sleep(delay * (backoff**attempt))
