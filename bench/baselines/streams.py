"""Floors for the remote backends: the raw exec stream, and the bare start of a process.

Each is measured through the same engine or connection pool our backend uses, so what
our side adds is what the ratio shows:

- :func:`docker_exec_echo`: a 64-byte echo through ``cat`` in a running container, over
  an exec's stdin and stdout as the engine hands them over (the hijacked socket and the
  engine's 8-byte frame headers): the stream the docker relay rides on.
- :func:`ssh_channel_echo`: the same echo through ``cat`` on a session channel of a
  pooled paramiko connection: the stream the ssh relay rides on.
- :func:`docker_run`: ``docker run --rm IMAGE python3 -c 1`` through the engine's API
  (create, start, wait, remove), as our one-shot docker run pays for a container.
- :func:`docker_exec`: ``docker exec CONTAINER python3 -c 1`` through the engine's API
  in a warm session's running container, as a run in a warm container pays for an exec.
- :func:`ssh_exec`: ``python3 -c 1`` on a fresh channel of a pooled connection.

Every function raises :class:`bench.subject.NotAvailable` when its service does not
answer here. The echo clients run in the benchmark's process and are timed by
:func:`bench.timing.time_calls`, like every round trip.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from bench.subject import NotAvailable
from bench.timing import time_calls

MESSAGE = b"e" * 64  # about the size of a relayed request frame for the echo tool
CONTAINER_PREFIX = "hermes-bench-floor-"


def _echo(
    send: Callable[[bytes], Any], receive: Callable[[], bytes], first: bytes = b""
) -> Callable[[int], None]:
    """One timed call: send MESSAGE, read until it came back whole, check it."""
    backlog = bytearray(first)

    def call(_i: int) -> None:
        send(MESSAGE)
        while len(backlog) < len(MESSAGE):
            backlog.extend(receive())
        if bytes(backlog[: len(MESSAGE)]) != MESSAGE:
            raise AssertionError("the echo changed the message")
        del backlog[: len(MESSAGE)]

    return call


# -- docker ------------------------------------------------------------------------------


def _docker_client() -> Any:
    try:
        import docker
    except ImportError as exc:
        raise NotAvailable("the docker SDK is not installed") from exc
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:
        raise NotAvailable(f"no container engine answers: {exc}") from exc
    return client


def _docker_image() -> tuple[str, str]:
    """The image and interpreter our docker backend uses by default."""
    from hermes_sandbox.environments.docker.settings import DockerSettings

    settings = DockerSettings()
    return settings.image, settings.python


@contextlib.contextmanager
def _container(client: Any, image: str) -> Iterator[str]:
    """A running container that only sleeps, removed afterwards (no runtime labels:
    the runtime's reaper has no business with it)."""
    container = client.containers.run(
        image,
        ["sleep", "600"],
        name=f"{CONTAINER_PREFIX}{uuid.uuid4().hex[:12]}",
        detach=True,
        network_disabled=True,
    )
    try:
        yield container.id
    finally:
        container.remove(force=True)


def docker_exec_echo(calls: int, warmup: int = 0) -> dict[str, Any]:
    """One round: ``calls`` echoes through ``cat`` over one exec's stdin and stdout."""
    from hermes_sandbox.environments.docker.engine import _exec_socket_stream
    from hermes_sandbox.environments.docker.stream import _FrameDemux

    client = _docker_client()
    image, _ = _docker_image()
    try:
        with _container(client, image) as container_id:
            exec_id = client.api.exec_create(
                container_id, ["cat"], stdin=True, stdout=True, stderr=False, tty=False
            )["Id"]
            sock, pending = _exec_socket_stream(client.api.exec_start(exec_id, socket=True))
            if not hasattr(sock, "sendall"):
                raise NotAvailable(f"the engine's exec stream is a {type(sock).__name__}")
            demux = _FrameDemux()
            first = b"".join(p for _, p in demux.feed(pending))

            def receive() -> bytes:
                data = sock.recv(65536)
                if not data:
                    raise EOFError("the exec stream ended")
                return b"".join(piece for stream, piece in demux.feed(data) if stream == 1)

            call = _echo(sock.sendall, receive, first)
            try:
                return time_calls(call, calls, 1, warmup)
            finally:
                sock.close()
    finally:
        client.close()


def docker_run(runs: int) -> dict[str, Any]:
    """One round: ``runs`` times ``docker run --rm IMAGE python3 -c 1``, each timed."""
    client = _docker_client()
    image, python = _docker_image()
    times: list[float] = []
    try:
        for _ in range(runs + 1):  # the first, untimed, warms the engine's image cache
            t0 = time.perf_counter()
            client.containers.run(image, [python, "-c", "1"], remove=True)
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        client.close()
    return {"ms": times[1:], "argv": ["docker", "run", "--rm", image, python, "-c", "1"]}


def docker_exec(run_options: Mapping[str, Any], runs: int) -> dict[str, Any]:
    """One round: ``runs`` times ``python3 -c 1`` by exec in the container of a warm
    docker :class:`Session` (made as ``warm.docker``'s is), each timed from creating the
    exec to its exit code (create, start, output to its end, inspect)."""
    from hermes_sandbox import RunError, Session
    from hermes_sandbox.environments import BackendError

    client = _docker_client()
    try:
        session = Session(tools=(), **run_options)
        session.start()
    except (RunError, BackendError) as exc:
        client.close()
        raise NotAvailable(str(exc)) from exc
    times: list[float] = []
    try:
        with session:
            environment: Any = session.environment
            container_id, python = environment.container_id, environment.python
            for _ in range(runs + 1):  # the first, untimed, warms the engine's caches
                t0 = time.perf_counter()
                exec_id = client.api.exec_create(
                    container_id, [python, "-c", "1"], stdout=True, stderr=True
                )["Id"]
                client.api.exec_start(exec_id)
                code = client.api.exec_inspect(exec_id)["ExitCode"]
                times.append((time.perf_counter() - t0) * 1000)
                if code != 0:
                    raise RuntimeError(f"{python} -c 1 exited with {code} in the container")
    finally:
        client.close()
    return {"ms": times[1:], "argv": ["docker", "exec", "CONTAINER", python, "-c", "1"]}


# -- ssh ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _ssh_share(backend_options: Mapping[str, Any]) -> Iterator[tuple[Any, Any]]:
    """(share, settings): a share of the pooled connection our ssh backend would use."""
    from hermes_sandbox.environments.errors import BackendNotAvailable
    from hermes_sandbox.environments.ssh.connection import _POOL
    from hermes_sandbox.environments.ssh.settings import SSHSettings

    if not backend_options:
        raise NotAvailable('no SSH server configured: eval "$(scripts/sshd-service)" first')
    config = SSHSettings(**backend_options)
    try:
        share = _POOL.acquire(config)
    except BackendNotAvailable as exc:
        raise NotAvailable(str(exc)) from exc
    try:
        yield share, config
    finally:
        _POOL.release(share, config.idle_timeout)


@contextlib.contextmanager
def _channel(share: Any, config: Any) -> Iterator[Any]:
    conn, channel = share.open_channel(config)
    try:
        yield channel
    finally:
        channel.close()
        share.release_channel(conn)


def ssh_channel_echo(
    backend_options: Mapping[str, Any], calls: int, warmup: int = 0
) -> dict[str, Any]:
    """One round: ``calls`` echoes through ``cat`` on one channel of the pooled connection."""
    with _ssh_share(backend_options) as (share, config), _channel(share, config) as channel:
        channel.exec_command("cat")

        def receive() -> bytes:
            data: bytes = channel.recv(65536)
            if not data:
                raise EOFError("the channel closed")
            return data

        call = _echo(channel.sendall, receive)
        return time_calls(call, calls, 1, warmup)


def ssh_exec(backend_options: Mapping[str, Any], runs: int) -> dict[str, Any]:
    """One round: ``runs`` times ``python3 -c 1`` on a new channel of the pooled
    connection, each timed from opening the channel to its exit status."""
    times: list[float] = []
    with _ssh_share(backend_options) as (share, config):
        python = config.python
        for _ in range(runs + 1):  # the first, untimed, warms the remote side's caches
            t0 = time.perf_counter()
            with _channel(share, config) as channel:
                channel.exec_command(f"{python} -c 1")
                status = channel.recv_exit_status()
            times.append((time.perf_counter() - t0) * 1000)
            if status != 0:
                raise RuntimeError(f"{python} -c 1 exited with {status} over ssh")
    return {"ms": times[1:], "argv": ["ssh", config.login, python, "-c", "1"]}


__all__ = ["docker_exec", "docker_exec_echo", "docker_run", "ssh_channel_echo", "ssh_exec"]
