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
stubs/_exec_helper.py with the remote ``python3`` through :meth:`_open_exec`, so a
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
(:class:`_Wakeup`) that the event loop waits on; a relay's reader, which may be
called from any thread, is handed the bytes on the transport thread itself
(:class:`ReceiptTransport`), so a quick call is answered there. Small writes go straight into the
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

import functools
import logging
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import anyio

from hermes_sandbox.environments.base import ExecStream
from hermes_sandbox.environments.errors import BackendNotAvailable, EnvironmentFailure
from hermes_sandbox.environments.exec_stream import (
    HELPER_FLAGS,
    STANDBY_SOURCE,
    ExecStreamEnvironment,
    bundle_files,
)
from hermes_sandbox.environments.ssh.connection import (
    _POOL,
    PoolStats,
    Standby,
    _Connection,
    _require_paramiko,
    _Share,
    close_pooled_connections,
    paramiko,
    pool_stats,
)
from hermes_sandbox.environments.ssh.settings import (
    OPENSSH_MAX_SESSIONS,
    SSHSettings,
)
from hermes_sandbox.environments.ssh.stream import SSHExecStream
from hermes_sandbox.stubs import program_source
from hermes_sandbox.stubs.generate import (
    CODEC_MODULE,
    RELAY_MODULE,
    codec_source,
    relay_code_file,
    relay_source,
)

log = logging.getLogger(__name__)

MIN_REMOTE_PYTHON = (3, 8)  # what the relay needs

_STDERR_TAIL = 8192
_DIRECT_SEND_LIMIT = 16384  # below one SSH packet: written without a thread hop
_KEEPALIVE_SECONDS = 15
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Run by the remote Python at start (stubs/_ssh_probe.py): the user's home, whether the
# working directory exists, and whether the stdlib the runtime needs is there.
_PROBE = program_source("_ssh_probe.py")


# -- the environment -----------------------------------------------------------------------


class SSHEnvironment(ExecStreamEnvironment):
    """A user account on a remote host (see the module docstring).

    ``settings`` say where and how to log in; ``env`` holds the run's variables (they
    reach scripts inside the relay stream, never a command line); ``kill_grace`` is
    how long a command gets between SIGTERM and SIGKILL; ``python`` overrides
    ``settings.python``.
    """

    name: ClassVar[str] = "ssh"
    settings_class: ClassVar[type[SSHSettings]] = SSHSettings
    where: ClassVar[str] = "on the remote host"
    can_spawn: ClassVar[bool] = False

    settings: SSHSettings

    def _setup(self) -> None:
        self.scratch_parent = self.settings.scratch_dir
        self._share: _Share | None = None
        self._workdir: str | None = self.settings.workdir
        self._stages: set[str] = set()  # stages made here and not removed yet

    @property
    def default_cwd(self) -> str:
        """The configured workdir, else the remote user's home (known once started)."""
        return self._workdir or self._home or "/"

    # -- lifecycle -----------------------------------------------------------------------

    async def _start(self) -> None:
        """Log in (or reuse this process's connection) and check the remote Python.

        Raises BackendNotAvailable: no paramiko, host unreachable, key refused, host key
        unknown or changed, no usable ``python3`` there, a missing ``workdir``.
        """
        _require_paramiko()
        # A pooled connection open already is shared without a thread hop.
        self._share = _POOL.acquire_connected(self.settings) or await anyio.to_thread.run_sync(
            _POOL.acquire, self.settings
        )
        try:
            await self._probe()
        except BaseException:
            with anyio.CancelScope(shield=True):
                share, self._share = self._share, None
                await anyio.to_thread.run_sync(_POOL.release, share, self.settings.idle_timeout)
            raise

    async def _probe(self) -> None:
        """Learn the remote home and check the remote Python, once per pooled
        connection for each (python, workdir): later environments on it reuse the
        answer (a reconnect asks again; a failed answer is not kept)."""
        share = self._share
        assert share is not None
        key = (self.python, self.settings.workdir)
        lines = share.probed(key)
        if lines is None:
            connects = share.connects
            lines = await self._run_probe()
            self._check_probe(lines)
            share.remember_probe(key, connects, lines)
        else:
            self._check_probe(lines)

    async def _run_probe(self) -> list[str]:
        login = self.settings.login
        argv = [self.python, "-c", _PROBE, self.settings.workdir or ""]
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
        return lines

    def _check_probe(self, lines: list[str]) -> None:
        login = self.settings.login
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
                f"the workdir {self.settings.workdir} does not exist on {login}: create it, or "
                "unset workdir to start in the user's home"
            )
        self._home = home
        self._workdir = self.settings.workdir or home

    # -- stages: made in one helper exec, removed without a remote Python ------------------

    async def make_stage(
        self,
        prefix: str,
        files: Mapping[str, bytes],
        *,
        parent: str | None = None,
        mode: int = 0o600,
    ) -> str:
        path = await super().make_stage(prefix, files, parent=parent, mode=mode)
        self._stages.add(path)
        return path

    def fresh_stage_path(self, prefix: str) -> str | None:
        path = super().fresh_stage_path(prefix)
        if path is not None:
            self._stages.add(path)  # made by the relay's exec: removed as a stage
        return path

    async def remove_tree(self, path: str) -> None:
        """A stage made here is removed with ``rm -rf`` (it follows no symlink; no
        remote Python start), anything else by the helper."""
        if path in self._stages:
            self._stages.discard(path)
            if await self._status(["rm", "-rf", "--", path]) == 0:
                self._forget(path)
                return
        await super().remove_tree(path)

    async def _status(self, argv: list[str]) -> int:
        """The exit status of ``argv``, run with no input, its output ignored."""
        stream = await self._open_exec(argv, env=None, cwd=None, stdin=False)
        try:
            async for _ in stream:
                pass
            return await stream.wait()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return 255
        finally:
            with anyio.CancelScope(shield=True):
                await stream.aclose()

    async def _stop(self) -> None:
        """Give the connection share back (the connection itself stays open for the
        pool's idle time)."""
        share, self._share = self._share, None
        if share is not None and self.settings.idle_timeout > 0:
            _POOL.release(share, self.settings.idle_timeout)  # starts a timer: no waiting
        elif share is not None:
            await anyio.to_thread.run_sync(_POOL.release, share, self.settings.idle_timeout)

    # -- the relay: started ahead of its run where the pool holds one ----------------------

    async def open_relay(
        self,
        stage: str,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        files: Mapping[str, bytes] | None = None,
        make_stage: bool = False,
    ) -> ExecStream:
        """The run's relay: the standby the pool holds for this connection and Python
        when there is one (it was started after an earlier run, so this run does not
        wait for a Python to start), else a new exec; either way, once this run's
        relay has ended, a standby for the next run is started in the background
        (``standby_relay``)."""
        share = self._share
        # A connection closed as its last user leaves (idle_timeout 0) has no next run.
        wanted = (
            share is not None and self.settings.standby_relay and self.settings.idle_timeout > 0
        )
        standby = share.take_standby(self.python) if wanted and share is not None else None
        stream = None
        if standby is not None:
            stream = await self._hand_run_to(standby, stage, args, cwd, files or {}, make_stage)
        if stream is None:
            stream = await super().open_relay(
                stage, args, env=env, cwd=cwd, files=files, make_stage=make_stage
            )
        if wanted and share is not None and isinstance(stream, SSHExecStream):
            # Once this run is over: started beside it, the standby would slow it down.
            preload = _standby_preload()
            argv = [self.python, *HELPER_FLAGS, "-c", STANDBY_SOURCE, "standby"]
            command = self.command_line([*argv, str(len(preload))], env=None, cwd=None)
            stream.then_release(
                functools.partial(share.want_standby, self.settings, self.python, command, preload)
            )
        return stream

    async def _hand_run_to(
        self,
        standby: Standby,
        stage: str,
        args: Sequence[str],
        cwd: str | None,
        files: Mapping[str, bytes],
        make_stage: bool,
    ) -> ExecStream | None:
        """Send the run to ``standby`` (stubs/_stage_files.py, ``standby``): its spec,
        then the bundle of its files; None if the standby is gone (the caller starts a
        relay anew)."""
        # The standby has loaded the relay: its files need not travel again (the codec
        # does: the script's hermes_tools imports it from the stage). Another relay
        # does, and the standby runs that one.
        relay = _relay_files()
        if all(files.get(name) == data for name, data in relay.items()):
            files = {k: v for k, v in files.items() if k not in relay}
        files_bundle = bundle_files(files)
        words = [cwd or ".", stage, str(len(files_bundle)), "1" if make_stage else "0", *args]
        spec = " ".join(w.encode("utf-8", "surrogateescape").hex() for w in words).encode()
        stream = SSHExecStream(standby.channel, self.settings.login, standby.release)
        try:
            await stream.send(b"%08x" % len(spec) + spec + files_bundle)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            log.info("the standby relay on %s is gone (%s): starting one", self.settings.login, exc)
            await stream.aclose()
            return None
        return stream

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
        self._require_started()
        share = self._share
        assert share is not None  # taken by _start before any exec
        config = self.settings
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


@functools.cache
def _relay_files() -> dict[str, bytes]:
    """The relay's files: its source, and its code as this Python compiled it."""
    code_name, code = relay_code_file()
    return {RELAY_MODULE: relay_source().encode(), code_name: code}


@functools.cache
def _standby_preload() -> bytes:
    """What a standby relay loads before its run: the relay and its codec."""
    return bundle_files({**_relay_files(), CODEC_MODULE: codec_source().encode()})


__all__ = [
    "OPENSSH_MAX_SESSIONS",
    "PoolStats",
    "SSHEnvironment",
    "SSHExecStream",
    "close_pooled_connections",
    "pool_stats",
]
