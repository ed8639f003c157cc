"""How a run's tool calls reach the host: the launchers, one per transport.

A launcher starts the script in its environment with the environment variables its
hermes_tools needs, serves its calls with the given server, and yields the running
script as a :class:`environments.SandboxProcess`-shaped object (``stdout``, ``stderr``,
``wait``, ``kill``, ``aclose``). The runner does the rest the same way whatever the
transport.

- ``unix``: the host listens on a Unix socket in the stage directory, which the
  script reaches at the same path (this machine; a container or instance with the
  environment's shared directory bind-mounted).
- ``files``: request and reply files in a directory of the stage's, or in memory where
  the environment has one with room (``make_memory_dir``: /dev/shm on the local
  backend) (rpc/files.py); for a shared directory where a socket is not wanted.
- ``relay``: a stdlib relay in the sandbox carries the script's output, exit status
  and RPC over the backend's exec stream; for any backend that can attach to a
  process's stdin and stdout.

``unix`` and ``files`` need the stage in the environment's
:attr:`~environments.Runtime.shared_directory`. They start the script with the
environment's own ``spawn`` where it has one, else under the relay with the relay
carrying only the script's output and exit status (the calls go the shorter way).
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hermes_sandbox.errors import TransportUnavailable

if TYPE_CHECKING:  # the command line reads TRANSPORTS for its choices, without these
    from hermes_sandbox.environments import Runtime
    from hermes_sandbox.rpc import RPCServer

SOCKET_NAME = "rpc.sock"
FILES_DIR_PREFIX = "rpc-"
# The free space a filesystem in memory must have for a files run's call directory to go
# there: 64 requests or replies at the default 4 MB frame cap, the most that one run's
# threads have in flight at once in all but extreme scripts. A container's /dev/shm
# (64 MB) has less, and the directory stays in the stage. A reply that does not fit
# anyway gets an error reply (rpc/files.py).
FILES_MEMORY_ROOM = 256 * 1024 * 1024
FILES_MEMORY_PREFIX = "hermes-sandbox-rpc-"


@dataclass(frozen=True, slots=True)
class Script:
    """What to start: the staged script's command line, its environment and working
    directory, the stage it lives in, and the file in the sandbox its stdin reads (None:
    /dev/null)."""

    stage: str
    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str | None
    stdin_path: str | None = None
    # Files (by name) to write into the stage before it starts: the run's script, in
    # the same exec as the relay where the relay starts it.
    files: Mapping[str, bytes] = dataclasses.field(default_factory=dict)
    # A one-shot run over the relay: the relay's exec makes the stage (which does not
    # exist yet) and the relay removes it after the script's exit.
    make_stage: bool = False
    remove_after: bool = False

    def with_env(self, **extra: str) -> Script:
        return dataclasses.replace(self, env={**self.env, **extra})


Launcher = Callable[["Runtime", "RPCServer", Script], AbstractAsyncContextManager[Any]]


def needs_relay(transport: str, environment: Runtime) -> bool:
    """Whether the run must stage the relay: it carries the calls, or it starts the
    script where the environment cannot spawn one itself."""
    return transport == "relay" or not environment.can_spawn


@asynccontextmanager
async def _under_relay(
    environment: Runtime, server: RPCServer, script: Script, socket_path: str | None
) -> AsyncIterator[Any]:
    """The script started by the relay in the sandbox; with ``socket_path`` the relay
    listens there and carries the script's calls to ``server`` too."""
    from hermes_sandbox.environments.exec_stream import helper_failure_text
    from hermes_sandbox.hints import bwrap_failure_hint
    from hermes_sandbox.rpc.relay import RelayError, RelaySession  # only relay runs need them

    # In the script's working directory: where the relay is contained (local under
    # bwrap), that directory is what the script may write.
    # The relay removes the stage when its input ends (this host process is gone), with
    # what else this runtime made that the death orphans (a session's workspace), and
    # with --remove-after once the script has exited too (it then says so: the
    # session's stage_removed).
    args = ["--remove", script.stage, *(["--remove-after"] if script.remove_after else [])]
    for path in environment.orphaned_with(script.stage)[1:]:
        args += ["--also-remove", path]
    channel = await environment.open_relay(
        script.stage,
        args,
        env={"PYTHONPATH": script.stage, "PYTHONDONTWRITEBYTECODE": "1"},
        cwd=script.cwd,
        files=script.files,
        make_stage=script.make_stage,
    )
    failure: TransportUnavailable | None = None
    async with RelaySession(
        channel,
        server,
        kill_relay_tree=environment.kill_process_tree,
        relay_reaped=channel.wait_reaped,
    ) as session:
        try:
            await session.start(
                script.argv,
                env=script.env,
                cwd=script.cwd,
                socket_path=socket_path,
                stdin_path=script.stdin_path,
            )
        except RelayError as exc:
            details = helper_failure_text(channel.stderr_tail)
            hint = bwrap_failure_hint(details)
            said = f"the relay could not start the script: {exc}"
            if details and details.splitlines()[-1] not in said:  # not said already
                said += f"\n{details[-2000:]}"
            failure = TransportUnavailable(said + (f"\n{hint}" if hint else ""))
        if failure is None:
            yield session
    if failure is not None:  # raised out here, not wrapped in the session's task group
        raise failure


@asynccontextmanager
async def _started(environment: Runtime, server: RPCServer, script: Script) -> AsyncIterator[Any]:
    """The script, started natively where the environment can, else by the relay
    (which then only starts and watches it: the calls take the other way)."""
    if environment.can_spawn:
        for name, data in script.files.items():
            await environment.write_bytes(posixpath.join(script.stage, name), data, mode=0o600)
        process = await environment.spawn(
            script.argv,
            env=script.env,
            cwd=script.cwd,
            stage=script.stage,
            stdin_path=script.stdin_path,
        )
        try:
            yield process
        finally:
            await process.aclose()
        return
    async with _under_relay(environment, server, script, socket_path=None) as session:
        yield session


@asynccontextmanager
async def launch_unix(
    environment: Runtime, server: RPCServer, script: Script
) -> AsyncIterator[Any]:
    from hermes_sandbox.rpc import serve_unix_socket

    path = posixpath.join(script.stage, SOCKET_NAME)
    async with (
        serve_unix_socket(server, path),
        _started(environment, server, script.with_env(HERMES_RPC_SOCKET=path)) as process,
    ):
        yield process


@asynccontextmanager
async def launch_files(
    environment: Runtime, server: RPCServer, script: Script
) -> AsyncIterator[Any]:
    import anyio

    from hermes_sandbox.rpc.files import serve_files  # only files runs need it

    # Made by the sandbox's user, who must write there (the host can, as its owner or
    # as root): in memory where the environment has room there (a call is a dozen
    # syscalls on this directory, each side; docs/benchmarks.md, "Many runs over files
    # (session 12)"), else in the stage, which is in the shared directory, so the host
    # sees it at this path.
    # In memory, it goes in a private directory of its own, removed as a whole like the
    # stage: what the script leaves beside it (a renamed directory, its own files) goes
    # too, never into the shared /dev/shm.
    memory = await environment.make_memory_dir(FILES_MEMORY_PREFIX, room=FILES_MEMORY_ROOM)
    try:
        directory = await environment.make_private_dir(
            FILES_DIR_PREFIX, parent=script.stage if memory is None else memory
        )
        async with (
            serve_files(server, directory),
            _started(environment, server, script.with_env(HERMES_RPC_DIR=directory)) as process,
        ):
            yield process
    finally:
        if memory is not None:  # not in the stage, which goes with its run
            with anyio.CancelScope(shield=True):
                await environment.remove_tree(memory)


@asynccontextmanager
async def launch_relay(
    environment: Runtime, server: RPCServer, script: Script
) -> AsyncIterator[Any]:
    path = posixpath.join(script.stage, SOCKET_NAME)
    async with _under_relay(
        environment, server, script.with_env(HERMES_RPC_SOCKET=path), socket_path=path
    ) as session:
        yield session


TRANSPORTS: dict[str, Launcher] = {
    "unix": launch_unix,
    "relay": launch_relay,
    "files": launch_files,
}
# Transports whose stage must be in the environment's shared_directory.
SHARED_DIRECTORY_TRANSPORTS = frozenset({"unix", "files"})


def check_transport(requested: str) -> None:
    """Refuse a transport name that does not exist (before anything is started)."""
    if requested != "auto" and requested not in TRANSPORTS:
        raise TransportUnavailable(
            f"unknown transport {requested!r}; choose one of: auto, {', '.join(TRANSPORTS)}"
        )


def choose_transport(requested: str, environment: Runtime) -> str:
    """The transport to use with a started environment: the one asked for, or for
    "auto" the fastest that works there (a Unix socket in a shared directory, else
    the relay)."""
    check_transport(requested)
    shared = environment.shared_directory is not None
    if requested == "auto":
        return "unix" if shared else "relay"
    if requested in SHARED_DIRECTORY_TRANSPORTS and not shared:
        raise TransportUnavailable(
            f"the {requested} transport needs a directory that this host and the "
            f"{environment.name} backend both see, and this {environment.name} environment "
            "has none; use --transport relay (or auto)"
        )
    return requested
