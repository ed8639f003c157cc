"""The ssh backend's connections: logging in with paramiko (its errors translated
here), and the pool that shares one authenticated transport per host, user and key
among the environments of this process (see environments/ssh/environment.py)."""

from __future__ import annotations

import atexit
import functools
import heapq
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hermes_sandbox.environments.errors import BackendNotAvailable, EnvironmentFailure
from hermes_sandbox.environments.ssh.settings import SDK_MISSING, SSHSettings
from hermes_sandbox.environments.ssh.stream import ReceiptTransport

try:
    import paramiko
except ImportError:  # reported by SSHEnvironment.start, so SSHSettings works without it
    paramiko = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

_KEEPALIVE_SECONDS = 15
# How long a standby relay may take to say it is ready; and how many standbys may fail
# to start on one share before it stops making them (a remote Python that cannot).
STANDBY_START_SECONDS = 30.0
STANDBY_FAILURES = 3
# How long after a run's relay has ended its standby is started: past the end of that
# run (its result is shaped and returned in about a millisecond), which the new
# standby's thread and exec would otherwise slow down.
STANDBY_DELAY_SECONDS = 0.01


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
            # Its channels' streams may read their data on its thread (relayed calls).
            transport_factory=ReceiptTransport,
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


# -- the pool's clock ------------------------------------------------------------------


class _Due:
    """A call :class:`_Clock` makes later, unless cancelled first."""

    __slots__ = ("args", "cancelled", "fn")

    def __init__(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _Clock:
    """One thread that makes the pool's timed calls (a share's idle expiry, the start
    of a standby), so that the end of a run starts no thread: ``threading.Timer``
    started one per release, on the run's path. A due call runs on this thread and
    must not block for long (one that does starts a thread of its own). Started on
    first use; a child of ``fork`` (which has no thread but the forker) starts afresh."""

    def __init__(self) -> None:
        self._forget()

    def _forget(self) -> None:
        """No thread and nothing due (the state of a new clock)."""
        self._changed = threading.Condition(threading.Lock())
        self._due: list[tuple[float, int, _Due]] = []
        self._order = itertools.count()  # ties go in the order they were asked for
        self._running = False

    def call_later(self, delay: float, fn: Callable[..., None], *args: Any) -> _Due:
        due = _Due(fn, args)
        with self._changed:
            when, order = time.monotonic() + delay, next(self._order)
            heapq.heappush(self._due, (when, order, due))
            if not self._running:
                try:
                    threading.Thread(target=self._run, name="hermes-ssh-pool", daemon=True).start()
                except RuntimeError:  # no thread to be had: nothing will be called
                    self._due.remove((when, order, due))
                    heapq.heapify(self._due)
                    raise
                self._running = True
            self._changed.notify()
        return due

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._changed.wait(self._due[0][0] - time.monotonic() if self._due else None)
                due = heapq.heappop(self._due)[2]
            if due.cancelled:
                continue
            try:
                due.fn(*due.args)
            except Exception:  # one call's failure must not stop the others'
                log.exception("the ssh pool's timed call %r failed", due.fn)


_CLOCK = _Clock()
os.register_at_fork(after_in_child=_CLOCK._forget)


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


class Standby:
    """A relay started on a pooled connection before its run (see
    :meth:`_Share.want_standby`): its channel, which has said ``ready``."""

    def __init__(self, channel: Any, release: Callable[[], None]) -> None:
        self.channel = channel
        self.release = release  # blocking: gives the channel's slot back to the pool

    def usable(self) -> bool:
        channel = self.channel
        transport = channel.get_transport()
        return bool(
            transport is not None
            and transport.is_active()
            and not channel.closed
            and not channel.eof_received
            and not channel.exit_status_ready()
        )

    def discard(self) -> None:
        """Close the channel (the standby, waiting for its run, sees the end of its
        input and exits having made nothing) and give its slot back."""
        try:
            self.channel.close()
        except Exception as exc:  # a broken connection: nothing left to close
            log.debug("closing a standby relay's channel: %s", exc)
        self.release()


class _Share:
    """The connections of one pool key, and how many environments use them."""

    def __init__(self, key: tuple[Any, ...]) -> None:
        self.key = key
        self.users = 0
        self.connections: list[_Connection] = []
        self.connects = 0  # connections made over the share's life
        # What the probe found, by (python, workdir), for the connection count it ran
        # at: a new connection (the host may have been changed or restarted) probes anew.
        self.probes: dict[tuple[str, str | None], tuple[int, Any]] = {}
        self.timer: _Due | None = None  # the idle expiry, while nobody uses the share
        self.lock = threading.Lock()  # connects and channel bookkeeping
        self.standbys: dict[str, Standby] = {}  # by remote python, ready for a run
        self._making: set[str] = set()  # pythons whose standby is being started
        self.standby_failures = 0
        self.closed = False

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

    def probed(self, key: tuple[str, str | None]) -> Any:
        """The probe's result for ``key`` if it ran since the last connection was made."""
        with self.lock:
            found = self.probes.get(key)
            return found[1] if found is not None and found[0] == self.connects else None

    def remember_probe(self, key: tuple[str, str | None], connects: int, result: Any) -> None:
        with self.lock:
            self.probes[key] = (connects, result)

    def _add(self, config: SSHSettings) -> _Connection:
        conn = _Connection(_connect(config), config.max_sessions)
        self.connections.append(conn)
        self.connects += 1
        return conn

    def open_channel(self, config: SSHSettings, *, connect: bool = True) -> tuple[_Connection, Any]:
        """A new session channel on a connection with room for it (blocking); with
        ``connect`` false, only on a connection open already."""
        last: Exception | None = None
        for _ in range(8):
            with self.lock:
                self.prune()
                conn = next((c for c in self.connections if c.sessions < c.capacity), None)
                if conn is None and self.closed:
                    raise EnvironmentFailure(
                        f"the pooled SSH connection to {config.login} was closed "
                        "(close_pooled_connections, or the process is exiting): start a new "
                        "environment to connect again"
                    )
                if conn is None and not connect:
                    raise EnvironmentFailure(f"no open SSH connection to {config.login} has room")
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

    # -- standby relays ----------------------------------------------------------------

    def take_standby(self, python: str) -> Standby | None:
        """The standby relay of ``python`` for a run to use, if one is ready."""
        with self.lock:
            standby = self.standbys.pop(python, None)
        if standby is None or standby.usable():
            return standby
        standby.discard()
        return None

    def want_standby(self, config: SSHSettings, python: str, command: str, preload: bytes) -> None:
        """Start a standby relay for ``python`` in the background unless one is ready or
        on its way: soon (``STANDBY_DELAY_SECONDS``, past the end of the run that asked),
        a thread opens a channel on a connection open already, runs ``command`` there,
        sends ``preload`` (the relay and its codec) and keeps the channel once the relay
        says ``ready``. Never blocks."""
        with self.lock:
            if (
                self.closed
                or python in self.standbys
                or python in self._making
                or self.standby_failures >= STANDBY_FAILURES
            ):
                return
            self._making.add(python)
        try:
            _CLOCK.call_later(
                STANDBY_DELAY_SECONDS, self._start_standby, config, python, command, preload
            )
        except RuntimeError:  # no thread to be had: runs start their relay themselves
            with self.lock:
                self._making.discard(python)

    def _start_standby(
        self, config: SSHSettings, python: str, command: str, preload: bytes
    ) -> None:
        """On the pool's clock: the thread that makes the standby (it waits for a remote
        Python, which the clock must not)."""
        thread = threading.Thread(
            target=self._make_standby,
            args=(config, python, command, preload),
            name="hermes-ssh-standby",
            daemon=True,
        )
        try:
            thread.start()
        except RuntimeError:  # no thread to be had: runs start their relay themselves
            with self.lock:
                self._making.discard(python)

    def _make_standby(self, config: SSHSettings, python: str, command: str, preload: bytes) -> None:
        standby: Standby | None = None
        conn: _Connection | None = None
        try:
            conn, channel = self.open_channel(config, connect=False)
            standby = Standby(channel, functools.partial(self.release_channel, conn))
            channel.exec_command(command)
            channel.sendall(preload)
            channel.settimeout(STANDBY_START_SECONDS)
            said = b""
            while len(said) < len(_READY) and (chunk := channel.recv(len(_READY) - len(said))):
                said += chunk
            if said != _READY:
                raise EnvironmentFailure(f"the standby relay said {said!r}")
            channel.settimeout(None)
        except Exception as exc:  # the run after this one starts its relay itself
            log.info("no standby relay on %s: %s", config.login, exc)
            with self.lock:
                self.standby_failures += 1
            if standby is not None:
                standby.discard()
            standby = None
        finally:
            with self.lock:
                self._making.discard(python)
                kept = standby is not None and not self.closed and conn in self.connections
                if kept:
                    self.standbys[python] = standby  # type: ignore[assignment]
        if standby is not None and not kept:
            standby.discard()

    def close_all(self) -> None:
        with self.lock:
            self.closed = True
            connections, self.connections = self.connections, []
            standbys, self.standbys = list(self.standbys.values()), {}
        for standby in standbys:
            standby.discard()
        for conn in connections:
            conn.close()


@dataclass(frozen=True, slots=True)
class PoolStats:
    """What the pool holds for one (host, port, user, key, known_hosts)."""

    users: int  # environments holding a share now
    open_connections: int
    connections_made: int  # since the share was created (it goes after its idle time)
    open_channels: int  # held by environments (commands, runs), not by standby relays
    local_ports: tuple[int, ...] = ()  # this side's TCP ports: sshd's log names them
    standby_relays: int = 0  # relays started ahead, ready for a run


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

    def acquire_connected(self, config: SSHSettings) -> _Share | None:
        """Take a share of the connection for ``config`` if one is open already, else
        None (then :meth:`acquire` connects); never blocks, so the event loop may call it."""
        with self._lock:
            share = self._shares.get(config.pool_key)
            if share is None or not any(c.alive() for c in share.connections):
                return None
            share.users += 1
            if share.timer is not None:
                share.timer.cancel()
                share.timer = None
        return share

    def release(self, share: _Share, idle_timeout: float) -> None:
        """Give a share back; the last user's leaving starts the idle timer. Blocks
        only with ``idle_timeout`` 0 (the last user's leaving closes the connection)."""
        with self._lock:
            share.users -= 1
            if share.users > 0:
                return
            if idle_timeout <= 0:
                self._shares.pop(share.key, None)
            else:
                share.timer = _CLOCK.call_later(idle_timeout, self._expire, share)
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
            standbys = sum(1 for s in share.standbys.values() if s.usable())
            return PoolStats(
                share.users,
                len(live),
                share.connects,
                max(0, sum(c.sessions for c in live) - len(share.standbys) - len(share._making)),
                tuple(ports),
                standbys,
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


_READY = b"ready\n"  # what a standby relay says once it can take a run
_POOL = _ConnectionPool()
atexit.register(_POOL.close_all)


def pool_stats(config: SSHSettings) -> PoolStats:
    """How many connections this process holds for ``config``'s login, and their use."""
    return _POOL.stats(config)


def close_pooled_connections() -> None:
    """Close every idle or used pooled SSH connection now (also done at exit)."""
    _POOL.close_all()


__all__ = ["PoolStats", "close_pooled_connections", "pool_stats"]
