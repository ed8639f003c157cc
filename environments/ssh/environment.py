"""The SSH backend: scripts and commands run on a remote host, reached with paramiko.

Lifecycle. :meth:`SSHEnvironment.start` takes a share of a pooled SSH connection
(:class:`_ConnectionPool`): one authenticated paramiko transport per (host, port,
user, key, known_hosts) serves every environment of this process that names them,
counted by reference, kept open :attr:`SSHSettings.idle_timeout` seconds after its last
user leaves (consecutive runs reuse it) and closed at exit. A transport found dead is
replaced. Every exec is a session channel of that transport; OpenSSH allows ten per
connection (``MaxSessions``), so when they are all in use, or the server refuses
another, the pool opens a second connection rather than waiting (a run's relay holds
its channel for the whole run). Then ``start`` asks the remote Python for the user's
home (the default working directory) and checks that it has the standard library the
runtime needs. :meth:`SSHEnvironment.aclose` only gives the share back; the runner
removes its stage directory itself.

Commands, files, scratch directories. Everything runs the stdlib helper of
environments/helper.py with the remote ``python3`` through :meth:`_open_exec`, so a
timeout kills a command's whole tree *on the remote host*, by its marker variable.

The command line. An exec is ``exec_command`` of one string, run by the remote user's
login shell (which must be a POSIX shell: sh, bash, dash, zsh, ksh): ``cd DIR && exec
env NAME=VALUE ... ARGV`` with every word quoted by :func:`shlex.quote`. Variables go
on the command line because sshd refuses ``env`` requests unless its ``AcceptEnv``
allows them, and so any user of the remote host can read them in ``ps``: only the
runtime's own, non-secret ones go this way (``PYTHONPATH`` of the relay). Secrets never
do: the RPC token and the script's variables travel inside the relay stream, and the
run's variables are not put on the command lines of commands either (a terminal
command starts with the login's environment).

Streams. :class:`SSHExecStream` reads a channel without a thread per read: paramiko's
transport thread fills the channel's buffers and pokes a pipe of ours
(:class:`_Wakeup`) that the event loop waits on. Small writes go straight into the
channel when its window has room (one SSH packet, never waiting for the peer); larger
ones, and the wait for the exit status, go through ``anyio.to_thread``. The transport's
socket has ``TCP_NODELAY``: without it every channel open waits ~40 ms for a delayed
ACK. A small echo round trip costs about 0.15-0.2 ms on the test machine (0.25-0.45 ms
with a thread hop per read); starting a command costs a channel open and a remote
Python start.

Errors of paramiko and the socket layer are translated here into
:mod:`environments.errors` and never leak: a host that cannot be reached, a refused
key, an unknown host key or a missing ``python3`` each say what to do.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shlex
import socket
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import anyio

from hermes_sandbox.environments.base import ExecStream
from hermes_sandbox.environments.errors import BackendNotAvailable, EnvironmentFailure
from hermes_sandbox.environments.helper import HelperEnvironment
from hermes_sandbox.environments.ssh.settings import (
    OPENSSH_MAX_SESSIONS,
    SDK_MISSING,
    SSHSettings,
)

try:
    import paramiko
except ImportError:  # reported by SSHEnvironment.start, so SSHSettings works without it
    paramiko = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

MIN_REMOTE_PYTHON = (3, 8)  # what the relay needs

_STDERR_TAIL = 8192
_DIRECT_SEND_LIMIT = 16384  # below one SSH packet: written without a thread hop
_KEEPALIVE_SECONDS = 15
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Run by the remote Python at start: the user's home, whether the working directory
# exists, and whether the stdlib the runtime imports is there (python3-minimal lacks json).
_PROBE = r"""
import os, sys
home = os.path.expanduser("~")
workdir = sys.argv[1] or home
print(home)
print("%d.%d" % sys.version_info[:2])
print("dir" if os.path.isdir(workdir) else "missing")
try:
    import json, selectors, socket, subprocess, threading
    print("ok")
except ImportError as exc:
    print("missing module: %s" % exc)
"""


# -- connecting ------------------------------------------------------------------------


def _require_paramiko() -> None:
    if paramiko is None:
        raise BackendNotAvailable(SDK_MISSING)


def _host_key_name(config: SSHSettings) -> str:
    """How known_hosts names the server: ``host`` on port 22, else ``[host]:port``."""
    return config.host if config.port == 22 else f"[{config.host}]:{config.port}"


class _RecordNewHostKey:
    """paramiko's missing-host-key policy for ``accept_new_host_keys``: trust the key
    and append one line for it to the known_hosts file (never rewriting the file, as
    paramiko's AutoAddPolicy would, which drops its comments)."""

    def __init__(self, path: str) -> None:
        self._path = path

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        os.makedirs(os.path.dirname(self._path) or ".", mode=0o700, exist_ok=True)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(line)
        log.warning("added the host key of %s to %s", hostname, self._path)


def _connect(config: SSHSettings) -> Any:
    """A paramiko SSHClient logged in to the host (blocking); BackendNotAvailable with
    advice for every way that can fail."""
    _require_paramiko()
    login = config.login
    known_hosts = os.path.expanduser(config.known_hosts)
    key_file = os.path.expanduser(config.key_file) if config.key_file else None
    if key_file is not None and not os.path.isfile(key_file):
        raise BackendNotAvailable(
            f"the ssh key_file {key_file} does not exist: set key_file to a private key "
            f"that {login} accepts"
        )
    try:
        sock = socket.create_connection((config.host, config.port), config.connect_timeout)
    except socket.gaierror as exc:
        raise BackendNotAvailable(
            f"cannot resolve the ssh host {config.host!r}: {exc.strerror or exc}; check host"
        ) from exc
    except TimeoutError as exc:
        raise BackendNotAvailable(
            f"connecting to {config.host}:{config.port} timed out after "
            f"{config.connect_timeout:g} s (connect_timeout): is the host up and the port "
            "open to this machine?"
        ) from exc
    except ConnectionRefusedError as exc:
        raise BackendNotAvailable(
            f"connection refused by {config.host}:{config.port}: no SSH server listens there; "
            "start sshd on the host or set port"
        ) from exc
    except OSError as exc:
        raise BackendNotAvailable(
            f"cannot reach {config.host}:{config.port}: {exc.strerror or exc}"
        ) from exc
    # Without TCP_NODELAY every channel open waits for a delayed ACK (~40 ms).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    client = paramiko.SSHClient()
    try:
        if os.path.isfile(known_hosts):
            client.load_host_keys(known_hosts)
        if config.accept_new_host_keys:
            client.set_missing_host_key_policy(_RecordNewHostKey(known_hosts))
        else:
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(
            config.host,
            port=config.port,
            username=config.user_name,
            key_filename=key_file,
            look_for_keys=key_file is None,
            allow_agent=key_file is None,
            sock=sock,
            timeout=config.connect_timeout,
            banner_timeout=config.connect_timeout,
            auth_timeout=config.connect_timeout,
        )
    except BaseException as exc:
        client.close()
        sock.close()
        if isinstance(exc, Exception):
            raise _connect_error(config, exc, known_hosts, key_file) from exc
        raise
    transport = client.get_transport()
    transport.set_keepalive(_KEEPALIVE_SECONDS)
    return client


def _connect_error(
    config: SSHSettings, exc: Exception, known_hosts: str, key_file: str | None
) -> BackendNotAvailable:
    login = config.login
    name = _host_key_name(config)
    if isinstance(exc, paramiko.BadHostKeyException):
        return BackendNotAvailable(
            f"the host key of {name} is not the one recorded in {known_hosts}: someone may be "
            "intercepting the connection, or the host was reinstalled. If the change is "
            f"expected, remove the old entry (ssh-keygen -R '{name}' -f {known_hosts}) and "
            "connect again"
        )
    if isinstance(exc, paramiko.PasswordRequiredException):
        return BackendNotAvailable(
            f"the ssh key {key_file} is protected by a passphrase: use a key without one, or "
            "leave key_file unset and load the key into an ssh-agent"
        )
    if isinstance(exc, paramiko.AuthenticationException):
        tried = f"the key {key_file}" if key_file else "the ssh-agent's and ~/.ssh/id_* keys"
        return BackendNotAvailable(
            f"{login} refused {tried}: add its public key to ~{config.user_name}/.ssh/"
            "authorized_keys on the host, or set key_file (and user) to a key it accepts"
        )
    if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
        where = known_hosts if os.path.isfile(known_hosts) else f"{known_hosts} (missing)"
        return BackendNotAvailable(
            f"the host key of {name} is unknown: it is not in {where}. Add it (ssh-keyscan "
            f"-p {config.port} {config.host} >> {known_hosts}, after checking its fingerprint), "
            "set known_hosts to a file that has it, or set accept_new_host_keys to trust "
            "and record it on first connection"
        )
    if isinstance(exc, TimeoutError):
        return BackendNotAvailable(
            f"{config.host}:{config.port} did not complete the SSH handshake within "
            f"{config.connect_timeout:g} s (connect_timeout)"
        )
    if isinstance(exc, paramiko.SSHException | EOFError):
        return BackendNotAvailable(
            f"the SSH handshake with {config.host}:{config.port} failed: {exc or type(exc)}. "
            "Is an SSH server listening there?"
        )
    if isinstance(exc, OSError):
        return BackendNotAvailable(f"connecting to {login} failed: {exc.strerror or exc}")
    return BackendNotAvailable(f"connecting to {login} failed: {type(exc).__name__}: {exc}")


# -- the connection pool ---------------------------------------------------------------


class _Connection:
    """One logged-in SSH connection and how many of its channels are open."""

    def __init__(self, client: Any, capacity: int) -> None:
        self.client = client
        self.transport = client.get_transport()
        self.capacity = capacity
        self.sessions = 0

    def alive(self) -> bool:
        return bool(self.transport is not None and self.transport.is_active())

    def close(self) -> None:
        try:
            self.client.close()
        except Exception as exc:  # closing a broken connection: nothing left to do
            log.debug("closing an ssh connection: %s", exc)


class _Share:
    """The connections of one pool key, and how many environments use them."""

    def __init__(self, key: tuple[Any, ...]) -> None:
        self.key = key
        self.users = 0
        self.connections: list[_Connection] = []
        self.connects = 0  # connections made over the share's life
        self.timer: threading.Timer | None = None
        self.lock = threading.Lock()  # connects and channel bookkeeping

    def prune(self) -> None:
        """Forget connections that died (holding ``lock``)."""
        for conn in [c for c in self.connections if not c.alive()]:
            self.connections.remove(conn)
            conn.close()

    def ensure_connection(self, config: SSHSettings) -> None:
        """Connect unless a live connection is there (blocking)."""
        with self.lock:
            self.prune()
            if not self.connections:
                self._add(config)

    def _add(self, config: SSHSettings) -> _Connection:
        conn = _Connection(_connect(config), config.max_sessions)
        self.connections.append(conn)
        self.connects += 1
        return conn

    def open_channel(self, config: SSHSettings) -> tuple[_Connection, Any]:
        """A new session channel on a connection with room for it (blocking)."""
        last: Exception | None = None
        for _ in range(8):
            with self.lock:
                self.prune()
                conn = next((c for c in self.connections if c.sessions < c.capacity), None)
                if conn is None:
                    try:
                        conn = self._add(config)
                    except BackendNotAvailable as exc:
                        raise EnvironmentFailure(
                            f"could not open another SSH connection to {config.login}: {exc}"
                        ) from exc
                conn.sessions += 1
            try:
                return conn, conn.transport.open_session(timeout=config.connect_timeout)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                last = exc
                with self.lock:
                    conn.sessions -= 1
                if "Timeout" in str(exc):
                    break  # the server does not answer: trying again would only wait more
                with self.lock:
                    if conn.alive():
                        # The server refused another channel: its MaxSessions is lower
                        # than ours. (paramiko reports a ChannelException to only one
                        # of several threads refused at once; the others get a plain
                        # SSHException.) Remember the real limit; use another connection.
                        conn.capacity = max(1, conn.sessions)
                # A connection that died under us is pruned; the next round connects anew.
        raise EnvironmentFailure(
            f"could not open an SSH channel to {config.login}: {last or 'no connection'}"
        )

    def release_channel(self, conn: _Connection) -> None:
        with self.lock:
            conn.sessions = max(0, conn.sessions - 1)

    def close_all(self) -> None:
        with self.lock:
            connections, self.connections = self.connections, []
        for conn in connections:
            conn.close()


@dataclass(frozen=True, slots=True)
class PoolStats:
    """What the pool holds for one (host, port, user, key, known_hosts)."""

    users: int  # environments holding a share now
    open_connections: int
    connections_made: int  # since the share was created (it goes after its idle time)
    open_channels: int
    local_ports: tuple[int, ...] = ()  # this side's TCP ports: sshd's log names them


class _ConnectionPool:
    """Connections shared by the environments of this process (see the module
    docstring). Thread-safe: runs may start from any thread or event loop; every
    method blocks, so async code calls them through ``anyio.to_thread``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shares: dict[tuple[Any, ...], _Share] = {}

    def acquire(self, config: SSHSettings) -> _Share:
        """Take a share of the connection for ``config``, connecting if needed."""
        with self._lock:
            share = self._shares.get(config.pool_key)
            if share is None:
                share = self._shares[config.pool_key] = _Share(config.pool_key)
            share.users += 1
            if share.timer is not None:
                share.timer.cancel()
                share.timer = None
        try:
            share.ensure_connection(config)
        except BaseException:
            self.release(share, 0)
            raise
        return share

    def release(self, share: _Share, idle_timeout: float) -> None:
        """Give a share back; the last user's leaving starts the idle timer."""
        with self._lock:
            share.users -= 1
            if share.users > 0:
                return
            if idle_timeout <= 0:
                self._shares.pop(share.key, None)
            else:
                timer = threading.Timer(idle_timeout, self._expire, (share,))
                timer.daemon = True
                share.timer = timer
                timer.start()
                return
        share.close_all()

    def _expire(self, share: _Share) -> None:
        with self._lock:
            if share.users > 0 or self._shares.get(share.key) is not share:
                return
            del self._shares[share.key]
        share.close_all()

    def stats(self, config: SSHSettings) -> PoolStats:
        with self._lock:
            share = self._shares.get(config.pool_key)
        if share is None:
            return PoolStats(0, 0, 0, 0)
        with share.lock:
            live = [c for c in share.connections if c.alive()]
            ports = []
            for conn in live:
                try:
                    ports.append(int(conn.transport.sock.getsockname()[1]))
                except (OSError, AttributeError, IndexError):
                    pass
            return PoolStats(
                share.users,
                len(live),
                share.connects,
                sum(c.sessions for c in live),
                tuple(ports),
            )

    def close_all(self) -> None:
        """Close every pooled connection (at exit; environments still open break)."""
        with self._lock:
            shares = list(self._shares.values())
            self._shares.clear()
        for share in shares:
            if share.timer is not None:
                share.timer.cancel()
            share.close_all()


_POOL = _ConnectionPool()
atexit.register(_POOL.close_all)


def pool_stats(config: SSHSettings) -> PoolStats:
    """How many connections this process holds for ``config``'s login, and their use."""
    return _POOL.stats(config)


def close_pooled_connections() -> None:
    """Close every idle or used pooled SSH connection now (also done at exit)."""
    _POOL.close_all()


# -- exec streams ------------------------------------------------------------------------


class _Wakeup:
    """A pipe the event loop waits on, made readable when paramiko's transport thread
    puts data (or end of data) into a channel's buffers.

    It stands in for the threading.Event those buffers take (``set``/``clear``). Edge
    semantics: :meth:`set` writes one byte unless one is pending, :meth:`drain` takes it,
    ``clear`` does nothing; a reader drains, then checks the buffers, then waits, so no
    wakeup is lost. Unlike the pipe of ``Channel.fileno``, closing it is under a lock,
    so a late ``set`` from the transport thread never writes to a reused descriptor.
    """

    def __init__(self) -> None:
        self.fd, self._write_fd = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._write_fd, False)
        self._lock = threading.Lock()
        self._pending = False
        self._closed = False

    def set(self) -> None:
        with self._lock:
            if self._pending or self._closed:
                return
            self._pending = True
            try:
                os.write(self._write_fd, b"!")
            except BlockingIOError:  # cannot happen with one byte pending; harmless
                pass

    def clear(self) -> None:
        return None

    def drain(self) -> None:
        with self._lock:
            if self._pending and not self._closed:
                self._pending = False
                try:
                    os.read(self.fd, 64)
                except BlockingIOError:
                    pass

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self.fd)
                os.close(self._write_fd)


class SSHExecStream(ExecStream):
    """A remote command's stdin and stdout as one stream over an SSH session channel;
    its stderr kept as a short tail. See the module docstring for how it waits."""

    def __init__(self, channel: Any, login: str, release: Any) -> None:
        self._channel = channel
        self._login = login
        self._release = release  # blocking: gives the channel's slot back to the pool
        self._wakeup = _Wakeup()
        channel.in_buffer.set_event(self._wakeup)
        channel.in_stderr_buffer.set_event(self._wakeup)
        self._send_lock = anyio.Lock()
        self._closed = False
        self._lost_noted = False
        self._stderr = b""

    @property
    def stderr_tail(self) -> bytes:  # type: ignore[override]
        self._drain_stderr()
        return self._stderr

    def _drain_stderr(self) -> None:
        channel = self._channel
        while channel.recv_stderr_ready():
            self._stderr = (self._stderr + channel.recv_stderr(65536))[-_STDERR_TAIL:]

    def _connection_lost(self) -> bool:
        """True (and noted in the stderr tail) if the SSH connection went away."""
        transport = self._channel.get_transport()
        if transport is not None and transport.is_active():
            return False
        if not self._lost_noted:
            self._lost_noted = True
            note = f"\n[hermes-sandbox: the SSH connection to {self._login} was lost]\n"
            self._stderr = (self._stderr + note.encode())[-_STDERR_TAIL:]
        return True

    async def receive(self, max_bytes: int = 65536) -> bytes:
        channel = self._channel
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            self._wakeup.drain()
            self._drain_stderr()
            if channel.recv_ready():
                data: bytes = channel.recv(max_bytes)
                if data:
                    return data
            if channel.eof_received or channel.closed:
                if channel.recv_ready():
                    continue
                if not channel.eof_received and self._connection_lost():
                    raise anyio.BrokenResourceError(f"the SSH connection to {self._login} was lost")
                raise anyio.EndOfStream
            try:
                await anyio.wait_readable(self._wakeup.fd)
            except anyio.ClosedResourceError:
                raise anyio.ClosedResourceError from None

    async def send(self, item: bytes) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        channel = self._channel
        view = memoryview(item)
        async with self._send_lock:
            try:
                if len(view) <= _DIRECT_SEND_LIMIT and channel.send_ready():
                    # Room in the window: this sends without waiting for the peer.
                    view = view[channel.send(item) :]
                    if not view and not channel.closed:
                        return
                if view:
                    await anyio.to_thread.run_sync(
                        channel.sendall, bytes(view), abandon_on_cancel=True
                    )
            except (OSError, EOFError, paramiko.SSHException) as exc:
                if self._closed:
                    raise anyio.ClosedResourceError from exc
                self._connection_lost()
                raise anyio.BrokenResourceError(
                    f"writing to a command on {self._login} failed: {exc}"
                ) from exc
            if channel.closed:
                raise anyio.BrokenResourceError(f"the command on {self._login} went away")

    async def send_eof(self) -> None:
        if self._closed:
            return
        try:
            await anyio.to_thread.run_sync(self._channel.shutdown_write)
        except (OSError, EOFError, paramiko.SSHException):
            pass

    async def wait(self) -> int:
        """The command's exit status; 255 (as ssh reports it) when there is none: the
        connection was lost, or the command was killed by a signal."""
        channel = self._channel
        if not channel.status_event.is_set():
            await anyio.to_thread.run_sync(channel.status_event.wait, abandon_on_cancel=True)
        status = channel.exit_status
        if status is None or status < 0:
            self._connection_lost()
            return 255
        return int(status)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            self._drain_stderr()
            anyio.notify_closing(self._wakeup.fd)
            self._wakeup.close()
            try:
                await anyio.to_thread.run_sync(self._channel.close)
            except (OSError, EOFError, paramiko.SSHException) as exc:
                log.debug("closing an ssh channel: %s", exc)
            await anyio.to_thread.run_sync(self._release)


# -- the environment -----------------------------------------------------------------------


class SSHEnvironment(HelperEnvironment):
    """A user account on a remote host (see the module docstring).

    ``config`` says where and how to log in; ``env`` holds the run's variables (they
    reach scripts inside the relay stream, never a command line); ``kill_grace`` is
    how long a command gets between SIGTERM and SIGKILL; ``python`` overrides
    ``config.python``.
    """

    name: ClassVar[str] = "ssh"
    settings_class: ClassVar[type[SSHSettings]] = SSHSettings
    where: ClassVar[str] = "on the remote host"
    can_spawn: ClassVar[bool] = False

    def __init__(
        self,
        config: SSHSettings,
        *,
        env: Mapping[str, str] | None = None,
        kill_grace: float = 2.0,
        python: str | None = None,
    ) -> None:
        self.config = config
        self._env = dict(env or {})
        self.kill_grace = kill_grace
        self.scratch_parent = config.scratch_dir
        self._python = python or config.python
        self._share: _Share | None = None
        self._workdir: str | None = config.workdir
        self._closed = False

    @property
    def default_cwd(self) -> str:
        """The configured workdir, else the remote user's home (known once started)."""
        return self._workdir or self._home or "/"

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Log in (or reuse this process's connection) and check the remote Python.

        Raises BackendNotAvailable: no paramiko, host unreachable, key refused, host key
        unknown or changed, no usable ``python3`` there, a missing ``workdir``.
        """
        if self._closed:
            raise EnvironmentFailure("this ssh environment was closed; make a new one")
        if self._share is not None:
            return
        _require_paramiko()
        self._share = await anyio.to_thread.run_sync(_POOL.acquire, self.config)
        try:
            await self._probe()
        except BaseException:
            with anyio.CancelScope(shield=True):
                share, self._share = self._share, None
                await anyio.to_thread.run_sync(_POOL.release, share, self.config.idle_timeout)
            raise

    async def _probe(self) -> None:
        login = self.config.login
        argv = [self.python, "-c", _PROBE, self.config.workdir or ""]
        stream = await self._open_exec(argv, env=None, cwd=None, stdin=False)
        out = bytearray()
        try:
            async for chunk in stream:
                out += chunk
            code = await stream.wait()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise EnvironmentFailure(f"the connection to {login} broke at start: {exc}") from exc
        finally:
            await stream.aclose()
        lines = out.decode("utf-8", "replace").splitlines()
        details = stream.stderr_tail.decode("utf-8", "replace").strip()[-1000:]
        if code in (126, 127) or len(lines) < 4:
            raise BackendNotAvailable(
                f"cannot run {self.python!r} on {login} (exit code {code}"
                + (f": {details}" if details else "")
                + "): install python3 on the host, or set the ssh backend's python setting "
                "to the path of a Python 3.8+ there"
            )
        home, version, workdir_state, modules = lines[:4]
        major, minor = (int(part) for part in version.split("."))
        if (major, minor) < MIN_REMOTE_PYTHON:
            raise BackendNotAvailable(
                f"{self.python!r} on {login} is Python {version}; the runtime needs "
                f"{'.'.join(map(str, MIN_REMOTE_PYTHON))} or newer: set python to a newer one"
            )
        if modules != "ok":
            raise BackendNotAvailable(
                f"{self.python!r} on {login} lacks part of its standard library ({modules}): "
                "install the full python3 package there (not only python3-minimal)"
            )
        if workdir_state != "dir":
            raise BackendNotAvailable(
                f"the workdir {self.config.workdir} does not exist on {login}: create it, or "
                "unset workdir to start in the user's home"
            )
        self._home = home
        self._workdir = self.config.workdir or home

    async def aclose(self) -> None:
        """Give the connection share back (the connection itself stays open for the
        pool's idle time). Idempotent; not cancellable."""
        if self._closed:
            return
        self._closed = True
        share, self._share = self._share, None
        if share is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_POOL.release, share, self.config.idle_timeout)

    # -- processes -------------------------------------------------------------------------

    def command_line(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None, cwd: str | None
    ) -> str:
        """The string the remote login shell runs for ``argv`` (see the module
        docstring): never give it a secret in ``env``."""
        if not argv:
            raise ValueError("argv is empty")
        words = [shlex.quote(word) for word in argv]
        if env:
            bad = [name for name in env if not _ENV_NAME.match(name)]
            if bad:
                raise ValueError(f"not valid environment variable names: {bad}")
            if "=" in argv[0]:
                raise ValueError(f"a program name with '=' cannot follow env: {argv[0]!r}")
            assignments = [f"{name}={shlex.quote(value)}" for name, value in env.items()]
            words = ["env", *assignments, *words]
        command = "exec " + " ".join(words)
        if cwd:
            command = f"cd {shlex.quote(cwd)} && {command}"
        return command

    async def _open_exec(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | None,
        stdin: bool,
    ) -> SSHExecStream:
        """Start ``argv`` on the remote host as the login's user. ``env`` goes on the
        command line (``env NAME=VALUE ...``): only non-secret variables. A bad ``cwd``
        or a missing program shows as exit code 1/127 and the shell's message in
        ``stderr_tail``."""
        share = self._share
        if share is None:
            state = "closed" if self._closed else "not started"
            raise EnvironmentFailure(f"the ssh environment is {state}")
        config = self.config
        command = self.command_line(argv, env=env, cwd=cwd)

        def begin() -> tuple[_Connection, Any]:
            conn, channel = share.open_channel(config)
            try:
                channel.exec_command(command)
                if not stdin:
                    channel.shutdown_write()
            except BaseException:
                channel.close()
                share.release_channel(conn)
                raise
            return conn, channel

        try:
            conn, channel = await anyio.to_thread.run_sync(begin)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise EnvironmentFailure(
                f"could not start {argv[0]!r} on {config.login}: {exc or type(exc).__name__}"
            ) from exc
        return SSHExecStream(channel, config.login, lambda: share.release_channel(conn))


__all__ = [
    "OPENSSH_MAX_SESSIONS",
    "PoolStats",
    "SSHEnvironment",
    "SSHExecStream",
    "close_pooled_connections",
    "pool_stats",
]
