"""How a run's tool calls reach the host: the launchers, one per transport.

A launcher starts the script in its environment with the environment variables its
hermes_tools needs, serves its calls with the given server, and yields the running
script as a :class:`environments.SandboxProcess`-shaped object (``stdout``, ``stderr``,
``wait``, ``kill``, ``aclose``). The runner does the rest the same way whatever the
transport.

- ``unix``: the host listens on a Unix socket the script can reach at the same path
  (this machine; a container with the stage directory bind-mounted).
- ``relay``: a stdlib relay in the sandbox carries the script's output, exit status
  and RPC over the backend's exec stream; for any backend that can attach to a
  process's stdin and stdout.
"""

from __future__ import annotations

import posixpath
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from environments import Environment
from rpc import RPCServer, serve_unix_socket
from rpc.relay import RelayError, RelaySession
from stubs import RELAY_MODULE

SOCKET_NAME = "rpc.sock"

Launcher = Callable[..., AbstractAsyncContextManager[Any]]


class TransportUnavailable(Exception):
    """The transport cannot work with this environment; the message says why."""


@asynccontextmanager
async def launch_unix(
    environment: Environment,
    server: RPCServer,
    *,
    stage: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str | None,
    marker: str,
) -> AsyncIterator[Any]:
    path = environment.host_socket_path(stage, SOCKET_NAME)
    if path is None:
        raise TransportUnavailable(
            f"the {environment.name} backend cannot reach a Unix socket on this host; "
            "use the relay transport"
        )
    async with serve_unix_socket(server, path):
        process = await environment.spawn(argv, env={**env, "HERMES_RPC_SOCKET": path}, cwd=cwd)
        try:
            yield process
        finally:
            await process.aclose()


@asynccontextmanager
async def launch_relay(
    environment: Environment,
    server: RPCServer,
    *,
    stage: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str | None,
    marker: str,
) -> AsyncIterator[Any]:
    socket_path = posixpath.join(stage, SOCKET_NAME)
    channel = await environment.open_exec_stream(
        [environment.python, posixpath.join(stage, RELAY_MODULE)],
        env={"PYTHONPATH": stage, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    failure: TransportUnavailable | None = None
    async with RelaySession(channel, server, max_frame_size=server.max_frame_size) as session:
        try:
            await session.start(
                argv,
                env={**env, "HERMES_RPC_SOCKET": socket_path},
                cwd=cwd,
                socket_path=socket_path,
                marker=marker,
            )
        except RelayError as exc:
            details = channel.stderr_tail.decode("utf-8", "replace").strip()
            failure = TransportUnavailable(
                f"the relay could not start the script: {exc}"
                + (f"\n{details[-2000:]}" if details else "")
            )
        if failure is None:
            yield session
    if failure is not None:  # raised out here, not wrapped in the session's task group
        raise failure


TRANSPORTS: dict[str, Launcher] = {"unix": launch_unix, "relay": launch_relay}


def choose_transport(requested: str, environment: Environment) -> str:
    """The transport to use: the one asked for, or for "auto" the fastest that works."""
    if requested == "auto":
        return "unix" if environment.host_socket_path("/", SOCKET_NAME) is not None else "relay"
    if requested not in TRANSPORTS:
        raise TransportUnavailable(
            f"unknown transport {requested!r}; choose one of: auto, {', '.join(TRANSPORTS)}"
        )
    return requested
