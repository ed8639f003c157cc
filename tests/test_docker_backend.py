"""The docker backend against a real container engine.

The engine is the one DOCKER_HOST names (scripts/podman-service starts podman serving
the Docker API and prints it); the image is $HERMES_SANDBOX_TEST_IMAGE, by default
``hermes-sandbox-python:bookworm``, which the same script builds. Without an engine or
the image these tests are skipped with the reason printed; under CI (CI=true), where
the engine is started first, that is a failure instead.

Every container a test makes carries the label ``hermes-sandbox-test=<this run>``, and
the session ends by removing whatever still carries it. Tests that need no engine
(configuration, errors, the command line) run everywhere.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from conftest import IMAGE, RUN_ID, TEST_LABEL

import hermes_sandbox.environments.docker.environment as docker_backend
import hermes_sandbox.environments.docker.stream as docker_stream
from hermes_sandbox.environments import (
    BackendNotAvailable,
    EnvironmentFailure,
    FileStat,
    get_environment_class,
)
from hermes_sandbox.environments.docker import (
    LABEL_MANAGED,
    LABEL_PERSIST,
    LABEL_TASK,
    DockerEnvironment,
    DockerSettings,
    Mount,
    owner_labels,
    reap_orphaned_containers,
)
from hermes_sandbox.environments.errors import SpawnNotAvailable

try:
    import docker
except ImportError:  # the engine tests skip (or fail under CI) with the reason
    docker = None

REPO = Path(__file__).resolve().parent.parent

# A command that lists every process in the container as "pid cmdline", one per line:
# the image has no ps.
LIST_PROCESSES = (
    "for p in /proc/[0-9]*; do "
    'printf "%s " "${p#/proc/}"; tr "\\0" " " < $p/cmdline 2>/dev/null; echo; done'
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def make_config(**changes: Any) -> DockerSettings:
    labels = {TEST_LABEL: RUN_ID, **changes.pop("labels", {})}
    return DockerSettings(**{"image": IMAGE, "labels": labels, **changes})


def container_exists(client: Any, container_id: str) -> bool:
    try:
        client.api.inspect_container(container_id)
    except docker.errors.NotFound:
        return False
    return True


def remove_container(client: Any, container_id: str) -> None:
    """Remove a container (and the shared directory made for it) as a test's cleanup."""
    try:
        labels = client.api.inspect_container(container_id)["Config"]["Labels"] or {}
        client.api.remove_container(container_id, force=True, v=True)
    except docker.errors.NotFound:
        return
    docker_backend._remove_shared_dir(labels)


@pytest.fixture
async def env(engine: Any) -> AsyncIterator[DockerEnvironment]:
    async with DockerEnvironment(make_config()) as environment:
        yield environment


async def dead_process() -> anyio.abc.Process:
    """A process that has exited (and been reaped): its pid names a dead owner."""
    process = await anyio.open_process([sys.executable, "-c", "pass"])
    await process.wait()
    await process.aclose()
    return process


async def processes(environment: DockerEnvironment) -> str:
    result = await environment.execute(LIST_PROCESSES)
    assert result.exit_code == 0, result.output
    return result.output


async def assert_no_process(environment: DockerEnvironment, needle: str) -> None:
    """Fail if a process whose command line contains ``needle`` runs in the container
    (a process being reaped right now gets a moment to go)."""
    listing = ""
    for _ in range(20):
        listing = await processes(environment)
        if needle not in listing:
            return
        await anyio.sleep(0.1)
    pytest.fail(f"{needle!r} still runs in the container:\n{listing}")


# -- lifecycle -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_start_and_close_remove_the_container(engine: Any) -> None:
    environment = DockerEnvironment(make_config())
    await environment.start()
    container_id = environment.container_id
    assert container_id is not None
    assert engine.api.inspect_container(container_id)["State"]["Running"]
    labels = engine.api.inspect_container(container_id)["Config"]["Labels"]
    assert labels[LABEL_MANAGED] == "1"
    assert labels[LABEL_TASK] == environment.task_id
    assert labels["hermes-sandbox.owner-pid"] == str(os.getpid())
    assert labels["hermes-sandbox.owner-boot-id"]
    await environment.aclose()
    assert not container_exists(engine, container_id)
    await environment.aclose()  # idempotent
    with pytest.raises(EnvironmentFailure, match="closed"):
        await environment.execute("true")


@pytest.mark.anyio
async def test_close_is_not_cancelled_by_the_caller(engine: Any) -> None:
    environment = DockerEnvironment(make_config())
    await environment.start()
    container_id = environment.container_id
    assert container_id is not None
    with anyio.CancelScope() as scope:
        scope.cancel()
        await environment.aclose()
    assert not container_exists(engine, container_id)


@pytest.mark.anyio
async def test_a_persistent_container_is_kept_and_reused_by_task_id(engine: Any) -> None:
    task = f"persist-{RUN_ID}"
    config = make_config(task_id=task, persist=True)
    async with DockerEnvironment(config) as first:
        container_id = first.container_id
        assert not first.reused
        await first.write_bytes("/tmp/state", b"kept")
    assert container_id is not None
    try:
        assert container_exists(engine, container_id)
        labels = engine.api.inspect_container(container_id)["Config"]["Labels"]
        assert labels[LABEL_PERSIST] == "1"
        async with DockerEnvironment(config) as second:
            assert second.reused
            assert second.container_id == container_id
            assert await second.read_bytes("/tmp/state") == b"kept"
        # Other settings make another container: the hash label differs.
        async with DockerEnvironment(make_config(task_id=task, persist=True, memory="768m")) as x:
            assert x.container_id != container_id
            assert not x.reused
            other_id = x.container_id
        assert other_id is not None
        remove_container(engine, other_id)
    finally:
        remove_container(engine, container_id)


@pytest.mark.anyio
async def test_environments_of_one_process_share_the_task_container(engine: Any) -> None:
    config = make_config(task_id=f"shared-{RUN_ID}")
    first = DockerEnvironment(config)
    second = DockerEnvironment(config)
    await first.start()
    try:
        await second.start()
        assert second.reused and second.container_id == first.container_id
        container_id = first.container_id
        assert container_id is not None
        await first.aclose()
        assert container_exists(engine, container_id)  # the second still uses it
        assert (await second.execute("echo still")).output == "still\n"
    finally:
        await first.aclose()
        await second.aclose()
    assert not container_exists(engine, container_id)


@pytest.mark.anyio
async def test_a_live_owners_container_is_not_taken(engine: Any) -> None:
    """A non-persistent container of another live owner would vanish when that owner
    closes: a new environment for the same task makes its own."""
    config = make_config(task_id=f"owned-{RUN_ID}")
    async with DockerEnvironment(config) as first:
        assert first.container_id is not None
        # As if another process had made it: this process does not use it.
        docker_backend._SHARED.pop(first.container_id)
        try:
            async with DockerEnvironment(config) as second:
                assert not second.reused
                assert second.container_id != first.container_id
        finally:
            docker_backend._SHARED[first.container_id] = 1


@pytest.mark.anyio
async def test_the_reaper_removes_containers_of_dead_owners(engine: Any) -> None:
    dead = await dead_process()
    base = {LABEL_MANAGED: "1", TEST_LABEL: RUN_ID}

    def create(labels: dict[str, str]) -> Any:
        return engine.containers.run(
            IMAGE,
            ["sleep", "infinity"],
            detach=True,
            init=True,
            network_mode="none",
            labels={**base, **labels},
        )

    made = []
    persistent = create({LABEL_TASK: "kept", LABEL_PERSIST: "1", **owner_labels(dead.pid)})
    alive = create({LABEL_TASK: "alive", **owner_labels()})
    made += [persistent.id, alive.id]
    try:
        # Any docker environment started on this machine reaps too (a test in another
        # pytest worker): its reaper may take the orphan first, and this call find
        # nothing. Then the orphan is made again, a few times.
        for _ in range(5):
            orphan = create({LABEL_TASK: "orphan", **owner_labels(dead.pid)})
            made.append(orphan.id)
            removed = await reap_orphaned_containers()
            assert not container_exists(engine, orphan.id)
            if removed:
                break
        assert orphan.name in removed, removed
        assert container_exists(engine, persistent.id)
        assert container_exists(engine, alive.id)
    finally:
        for container_id in made:
            remove_container(engine, container_id)


@pytest.mark.anyio
async def test_start_runs_the_reaper(engine: Any) -> None:
    dead = await dead_process()
    orphan = engine.containers.run(
        IMAGE,
        ["sleep", "infinity"],
        detach=True,
        network_mode="none",
        labels={LABEL_MANAGED: "1", TEST_LABEL: RUN_ID, **owner_labels(dead.pid)},
    )
    try:
        async with DockerEnvironment(make_config()):
            assert not container_exists(engine, orphan.id)
    finally:
        remove_container(engine, orphan.id)


# -- isolation -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_isolation_settings_are_in_effect(env: DockerEnvironment, engine: Any) -> None:
    assert env.container_id is not None
    host = engine.api.inspect_container(env.container_id)["HostConfig"]
    # Docker keeps ["ALL"]; podman expands it into the list of default capabilities.
    assert host["CapDrop"] == ["ALL"] or {"CHOWN", "DAC_OVERRIDE", "KILL", "SETUID"} <= set(
        host["CapDrop"]
    )
    assert not host.get("CapAdd")
    assert any(opt.startswith("no-new-privileges") for opt in host["SecurityOpt"])
    assert host["PidsLimit"] == 256
    assert host["Memory"] == 1024**3
    assert host["NanoCpus"] == 10**9
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True
    assert host["Init"] is True
    assert "/tmp" in host["Tmpfs"] and "/workspace" in host["Tmpfs"]


@pytest.mark.anyio
async def test_isolation_seen_from_inside(env: DockerEnvironment) -> None:
    interfaces = await env.execute("ls /sys/class/net")
    assert interfaces.output.split() == ["lo"]
    status = await env.execute("grep -E '^(CapEff|NoNewPrivs)' /proc/self/status")
    assert "CapEff:\t0000000000000000" in status.output
    assert "NoNewPrivs:\t1" in status.output
    root = await env.execute("echo x > /forbidden")
    assert root.exit_code != 0 and "Read-only file system" in root.output
    with pytest.raises(OSError):
        await env.write_bytes("/etc/forbidden", b"x")
    tmp = await env.execute("echo works > /tmp/f && cat /tmp/f")
    assert (tmp.exit_code, tmp.output) == (0, "works\n")
    workdir = await env.execute("pwd && echo y > here && cat here")
    assert (workdir.exit_code, workdir.output) == (0, "/workspace\ny\n")


@pytest.mark.anyio
async def test_a_container_user(engine: Any) -> None:
    async with DockerEnvironment(make_config(user="nobody")) as environment:
        who = await environment.execute("id -u && touch /workspace/mine && echo ok")
        assert who.output.split() == ["65534", "ok"]
        await environment.write_bytes("/tmp/sub/owned", b"1")
        owner = await environment.execute("stat -c %u /tmp/sub/owned")
        assert owner.output.strip() == "65534"


# -- execute ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_execute_output_and_exit_code(env: DockerEnvironment) -> None:
    result = await env.execute("echo out; echo err >&2; exit 3")
    assert result.exit_code == 3
    assert not result.timed_out
    assert result.output == "out\nerr\n"
    assert (await env.execute("kill -9 $$")).exit_code == 137


@pytest.mark.anyio
async def test_execute_cwd_and_env(engine: Any) -> None:
    async with DockerEnvironment(make_config(), env={"GREETING": "hello there"}) as environment:
        result = await environment.execute('pwd; echo "$GREETING"', cwd="/tmp")
        assert result.output == "/tmp\nhello there\n"
        with pytest.raises(FileNotFoundError, match="/no/such/dir"):
            await environment.execute("pwd", cwd="/no/such/dir")


@pytest.mark.anyio
async def test_execute_timeout_kills_the_processes_inside(env: DockerEnvironment) -> None:
    started = time.monotonic()
    result = await env.execute(
        "sleep 300 & setsid sleep 301 & echo started; sleep 302", timeout=1.5
    )
    assert result.timed_out and result.exit_code == 124
    assert result.output == "started\n"
    assert time.monotonic() - started < 60  # the sleeps last 300 s
    for needle in ("sleep 300", "sleep 301", "sleep 302"):
        await assert_no_process(env, needle)


@pytest.mark.anyio
async def test_execute_leaves_nothing_in_the_background(env: DockerEnvironment) -> None:
    result = await env.execute("sleep 303 > /dev/null 2>&1 & echo done")
    assert (result.exit_code, result.output) == (0, "done\n")
    await assert_no_process(env, "sleep 303")


@pytest.mark.anyio
async def test_cancelling_execute_kills_the_command(env: DockerEnvironment) -> None:
    with anyio.move_on_after(1.5):
        await env.execute("sleep 304")
    await assert_no_process(env, "sleep 304")


@pytest.mark.anyio
async def test_execute_output_is_capped(env: DockerEnvironment) -> None:
    result = await env.execute(
        "head -c 300000 /dev/zero | tr '\\0' a; echo END", max_output_bytes=1000
    )
    assert result.exit_code == 0
    assert "bytes omitted] ..." in result.output
    assert result.output.endswith("END\n")
    assert len(result.output) < 1200


@pytest.mark.anyio
async def test_a_missing_python_is_a_clear_failure(engine: Any) -> None:
    async with DockerEnvironment(make_config(), python="no-such-python") as environment:
        with pytest.raises(EnvironmentFailure, match="no-such-python"):
            await environment.execute("true")


# -- files -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_files_round_trip(env: DockerEnvironment) -> None:
    binary = bytes(range(256)) * 4096  # 1 MiB, every byte value
    await env.write_bytes("/tmp/deep/er/data.bin", binary)
    assert await env.read_bytes("/tmp/deep/er/data.bin") == binary
    assert await env.read_bytes("/tmp/deep/er/data.bin", max_bytes=10) == binary[:10]
    text = "héllo wörld\nzweite Zeile\n"
    await env.write_bytes("/workspace/note.txt", text.encode())
    assert (await env.read_bytes("/workspace/note.txt")).decode() == text
    await env.write_bytes("/workspace/note.txt", b"short")  # replaces
    assert await env.read_bytes("/workspace/note.txt") == b"short"
    await env.write_bytes("/tmp/private", b"s", mode=0o600)
    assert (await env.execute("stat -c %a /tmp/private")).output == "600\n"
    await env.write_bytes("/tmp/empty", b"")
    assert await env.read_bytes("/tmp/empty") == b""


@pytest.mark.anyio
async def test_file_errors(env: DockerEnvironment) -> None:
    with pytest.raises(FileNotFoundError):
        await env.write_bytes("/tmp/missing/parent/f", b"x", make_parents=False)
    with pytest.raises(FileNotFoundError):
        await env.read_bytes("/tmp/nothing-here")
    with pytest.raises(IsADirectoryError):
        await env.read_bytes("/tmp")
    with pytest.raises(OSError, match="Read-only"):
        await env.write_bytes("/usr/new-file", b"x")


@pytest.mark.anyio
async def test_stat_kinds(env: DockerEnvironment) -> None:
    await env.write_bytes("/tmp/s/file", b"12345")
    await env.execute("mkfifo /tmp/s/fifo && ln -s /tmp/s/file /tmp/s/link")
    assert await env.stat("/tmp/s/file") == FileStat("/tmp/s/file", "file", 5)
    assert (await env.stat("/tmp/s")).kind == "directory"
    assert (await env.stat("/dev/null")).kind == "char_device"
    assert (await env.stat("/tmp/s/fifo")).kind == "fifo"
    linked = await env.stat("/tmp/s/link")
    assert (linked.path, linked.kind, linked.size) == ("/tmp/s/file", "file", 5)
    with pytest.raises(FileNotFoundError):
        await env.stat("/tmp/s/absent")


@pytest.mark.anyio
async def test_private_dirs(env: DockerEnvironment) -> None:
    path = await env.make_private_dir("hermes-sandbox-")
    assert path.startswith("/tmp/hermes-sandbox-")
    assert (await env.execute(f"stat -c %a {path}")).output == "700\n"
    await env.write_bytes(f"{path}/a/b/c", b"x")
    await env.remove_tree(path)
    with pytest.raises(FileNotFoundError):
        await env.stat(path)
    await env.remove_tree(path)  # a missing path is not an error


# -- exec streams ------------------------------------------------------------------------


@pytest.fixture(params=["socket", "threads"])
async def stream_env(request: pytest.FixtureRequest, env: DockerEnvironment) -> DockerEnvironment:
    """The environment, with exec streams on the event loop or (as for TLS and SSH
    engines) on threads."""
    env.threaded_io = request.param == "threads"
    return env


async def receive_exactly(stream: docker_backend.DockerExecStream, size: int) -> bytes:
    data = b""
    while len(data) < size:
        data += await stream.receive()
    return data


@pytest.mark.anyio
async def test_exec_stream_echo_and_eof(stream_env: DockerEnvironment) -> None:
    stream = await stream_env.open_exec_stream(["cat"])
    async with stream:
        for line in (b"ping\n", b"x" * 100 + b"\n"):
            await stream.send(line)
            assert await receive_exactly(stream, len(line)) == line
        await stream.send_eof()  # cat's stdin ends, so cat exits
        with pytest.raises(anyio.EndOfStream):
            await stream.receive()
        assert await stream.wait() == 0


@pytest.mark.anyio
async def test_exec_stream_carries_a_megabyte(stream_env: DockerEnvironment) -> None:
    payload = os.urandom(1 << 20)
    async with await stream_env.open_exec_stream(["cat"]) as stream:
        received = bytearray()

        async def read_all() -> None:
            async for chunk in stream:
                received.extend(chunk)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(read_all)
            for offset in range(0, len(payload), 65536):
                await stream.send(payload[offset : offset + 65536])
            await stream.send_eof()
        assert bytes(received) == payload


@pytest.mark.anyio
async def test_exec_stream_stderr_exit_code_env_and_cwd(stream_env: DockerEnvironment) -> None:
    script = 'echo "$WHO in $(pwd)"; echo complaint >&2; exit 7'
    stream = await stream_env.open_exec_stream(
        ["sh", "-c", script], env={"WHO": "stream"}, cwd="/tmp"
    )
    async with stream:
        assert await receive_exactly(stream, 15) == b"stream in /tmp\n"
        with pytest.raises(anyio.EndOfStream):
            await stream.receive()
        assert await stream.wait() == 7
        assert stream.stderr_tail == b"complaint\n"


@pytest.mark.anyio
async def test_exec_stream_of_a_missing_program(env: DockerEnvironment) -> None:
    async with await env.open_exec_stream(["no-such-program"]) as stream:
        with pytest.raises(anyio.EndOfStream):
            await stream.receive()
        assert await stream.wait() in (126, 127)
        assert b"no-such-program" in stream.stderr_tail


@pytest.mark.anyio
async def test_exec_streams_release_their_sockets(env: DockerEnvironment) -> None:
    async def one_round() -> None:
        async with await env.open_exec_stream(["cat"]) as stream:
            await stream.send(b"x\n")
            assert await receive_exactly(stream, 2) == b"x\n"

    await one_round()  # warm up the SDK's connection pool
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(10):
        await one_round()
    assert len(os.listdir("/proc/self/fd")) <= before + 2


@pytest.mark.anyio
async def test_exec_stream_round_trip_latency(env: DockerEnvironment) -> None:
    async with await env.open_exec_stream(["cat"]) as stream:
        await stream.send(b"warm\n")
        await receive_exactly(stream, 5)
        samples = []
        for _ in range(300):
            started = time.perf_counter()
            await stream.send(b"ping\n")
            await receive_exactly(stream, 5)
            samples.append(time.perf_counter() - started)
    samples.sort()
    median = samples[len(samples) // 2]
    print(f"\nexec stream echo round trip: median {median * 1e6:.0f} us")
    assert median < 0.25  # a loose bound (busy CI machines): only a broken stream is this slow


@pytest.mark.anyio
async def test_a_shared_dir_of_the_callers_reaches_the_host(engine: Any, tmp_path: Path) -> None:
    socket_dir = tmp_path / "sock"
    socket_dir.mkdir()
    path = str(socket_dir / "s")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(1)

    def answer() -> None:
        connection, _ = server.accept()
        with connection:
            connection.sendall(connection.recv(100).upper())

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    client_code = textwrap.dedent(
        f"""
        import socket
        s = socket.socket(socket.AF_UNIX)
        s.connect({path!r})
        s.sendall(b"ping")
        print(s.recv(100).decode())
        """
    )
    try:
        async with DockerEnvironment(make_config(shared_dir=str(socket_dir))) as environment:
            await environment.write_bytes("/tmp/client.py", client_code.encode())
            result = await environment.execute("python3 /tmp/client.py")
            assert (result.exit_code, result.output) == (0, "PING\n")
    finally:
        thread.join(5)
        server.close()


# -- errors --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_container_that_cannot_start_is_removed(engine: Any) -> None:
    config = make_config(user="no-such-user", labels={"case": "cannot-start"})
    with pytest.raises(EnvironmentFailure, match="no-such-user"):
        async with DockerEnvironment(config):
            pass
    left = engine.api.containers(all=True, filters={"label": ["case=cannot-start"]})
    assert [e for e in left if e["Labels"].get(TEST_LABEL) == RUN_ID] == []


@pytest.mark.anyio
async def test_a_missing_image_that_cannot_be_pulled_is_not_available(engine: Any) -> None:
    """A missing image is pulled; when no registry answers (one on a closed port here,
    so no DNS or network is involved) the engine's reason and the ways out are said."""
    image = "localhost:1/hermes-sandbox-no-such-image:1"
    environment = DockerEnvironment(make_config(image=image))
    with pytest.raises(BackendNotAvailable) as caught:
        await environment.start()
    message = str(caught.value)
    assert image in message and "pulling it failed" in message
    assert "docker pull" in message and "scripts/podman-service" in message
    await environment.aclose()


class PullingEngine:
    """A stand-in for the SDK client where the image is missing until it is pulled (no
    registry is reachable here): it answers images.get and a streamed api.pull."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.pulled: list[tuple[str, str | None]] = []
        self._events = events
        self.images = self
        self.api = self

    def get(self, image: str) -> Any:
        if not self.pulled:
            raise docker.errors.ImageNotFound(f"No such image: {image}")
        return type("Image", (), {"id": "sha256:pulled"})()

    def pull(self, repository: str, tag: str | None = None, **kwargs: Any) -> Any:
        assert kwargs == {"stream": True, "decode": True}
        for event in self._events:
            yield event
            if "error" in event:
                return
        self.pulled.append((repository, tag))


@pytest.mark.anyio
async def test_a_missing_image_is_pulled_with_progress(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    if docker is None:
        pytest.skip("the docker SDK is not installed")
    monkeypatch.setattr(docker_backend, "PULL_REPORT_SECONDS", 3600.0)
    events = [
        {"status": "Pulling from library/python", "id": "3.12-slim"},
        {"status": "Pulling fs layer", "id": "abc"},
        {"status": "Downloading", "id": "abc", "progress": "[=>   ] 1MB/9MB"},
        {"status": "Downloading", "id": "abc", "progress": "[==>  ] 2MB/9MB"},
        {"status": "Pull complete", "id": "abc"},
    ]
    environment = DockerEnvironment(make_config(image="registry.example/python:3.12-slim"))
    environment._client = PullingEngine(events)
    with caplog.at_level("INFO", logger="hermes_sandbox.progress"):
        assert await environment._image_id() == "sha256:pulled"
    assert environment._client.pulled == [("registry.example/python", "3.12-slim")]
    said = [r.getMessage() for r in caplog.records if r.name == "hermes_sandbox.progress"]
    assert said[0] == "the image registry.example/python:3.12-slim is not here: pulling it"
    assert "abc: Pull complete" in said[-2] and said[-1].startswith("pulled the image")
    # Download ticks are reported at most every PULL_REPORT_SECONDS: one of the two here.
    assert sum("Downloading" in line for line in said) == 1


@pytest.mark.anyio
async def test_a_pull_the_registry_refuses_is_not_available() -> None:
    if docker is None:
        pytest.skip("the docker SDK is not installed")
    environment = DockerEnvironment(make_config(image="registry.example/nope:1"))
    environment._client = PullingEngine([{"error": "manifest unknown"}])
    with pytest.raises(BackendNotAvailable, match="pulling it failed: manifest unknown"):
        await environment._image_id()


@pytest.mark.anyio
async def test_an_unreachable_engine_is_not_available(tmp_path: Path) -> None:
    if docker is None:
        pytest.skip("the docker SDK is not installed")
    host = f"unix://{tmp_path}/no-engine.sock"
    environment = DockerEnvironment(DockerSettings(image=IMAGE, docker_host=host))
    with pytest.raises(BackendNotAvailable) as caught:
        await environment.start()
    assert host in str(caught.value)
    assert "DOCKER_HOST" in str(caught.value)
    await environment.aclose()
    with pytest.raises(BackendNotAvailable, match=r"no-engine\.sock"):
        await reap_orphaned_containers(host)


def test_a_missing_sdk_is_not_available() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["docker"] = None  # as if not installed
        import anyio
        from hermes_sandbox.environments import BackendNotAvailable, get_environment_class
        cls = get_environment_class("docker")
        try:
            anyio.run(cls().start)
        except BackendNotAvailable as exc:
            print(exc)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'hermes-sandbox[docker]'" in result.stdout


# -- the engine's stream framing, in memory ------------------------------------------------


def frame(stream: int, payload: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload


def test_frames_split_anywhere_are_reassembled() -> None:
    wire = frame(1, b"hello ") + frame(2, b"oops") + frame(1, b"") + frame(1, b"world")
    for cut in range(1, len(wire)):
        demux = docker_stream._FrameDemux()
        pieces = demux.feed(wire[:cut]) + demux.feed(wire[cut:])
        assert b"".join(p for s, p in pieces if s == 1) == b"hello world"
        assert b"".join(p for s, p in pieces if s == 2) == b"oops"
        assert not demux.mid_frame
    demux = docker_stream._FrameDemux()
    demux.feed(wire[:3])
    assert demux.mid_frame
    with pytest.raises(ValueError, match="not a multiplexed"):
        docker_stream._FrameDemux().feed(b"HTTP/1.1 200 OK\r\n")


class ScriptedTransport(anyio.abc.ByteStream):
    """Hands out prepared chunks, records what is sent: the engine's side in memory."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)
        self.sent: list[bytes] = []
        self.eof_sent = False
        self.closed = False

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self.chunks:
            raise anyio.EndOfStream
        return self.chunks.pop(0)

    async def send(self, item: bytes) -> None:
        self.sent.append(item)

    async def send_eof(self) -> None:
        self.eof_sent = True

    async def aclose(self) -> None:
        self.closed = True


@pytest.mark.anyio
async def test_an_exec_stream_over_memory() -> None:
    wire = frame(2, b"warning\n") + frame(1, b"abcdef") + frame(3, b"engine: x")
    transport = ScriptedTransport([wire[5:9], wire[9:]])
    released = []

    async def inspect() -> dict[str, Any]:
        return {"Running": False, "ExitCode": 4}

    stream = docker_backend.DockerExecStream(
        transport, inspect, lambda: released.append(True), pending=wire[:5]
    )
    await stream.send(b"input")
    assert await stream.receive(4) == b"abcd"
    assert await stream.receive() == b"ef"
    with pytest.raises(anyio.EndOfStream):
        await stream.receive()
    assert stream.stderr_tail == b"warning\nengine: x"
    assert await stream.wait() == 4
    await stream.aclose()
    await stream.aclose()
    assert transport.sent == [b"input"] and transport.eof_sent and transport.closed
    assert released == [True]


@pytest.mark.anyio
async def test_an_exec_stream_cut_inside_a_frame_is_broken() -> None:
    async def inspect() -> dict[str, Any]:
        return {}

    transport = ScriptedTransport([frame(1, b"whole")[:-2]])
    stream = docker_backend.DockerExecStream(transport, inspect, lambda: None)
    assert await stream.receive() == b"who"
    with pytest.raises(anyio.BrokenResourceError):
        await stream.receive()
    await stream.aclose()


# -- configuration and registration ---------------------------------------------------------


def test_the_backend_is_registered() -> None:
    assert get_environment_class("docker") is DockerEnvironment


def test_config_refuses_unknown_keys_and_bad_values() -> None:
    config = DockerSettings.from_mapping(
        {"image": "x:1", "memory": "2g", "mounts": ["/src:/dst", "/a:/b:rw"], "cpus": 0.5}
    )
    assert config.mounts == (Mount("/src", "/dst", True), Mount("/a", "/b", False))
    with pytest.raises(ValueError, match=r"unknown docker backend setting.*memroy"):
        DockerSettings.from_mapping({"memroy": "1g"})
    with pytest.raises(ValueError, match="memory"):
        DockerSettings(memory="lots")
    with pytest.raises(ValueError, match="cpus"):
        DockerSettings(cpus=0)
    with pytest.raises(ValueError, match="reserved"):
        DockerSettings(labels={"hermes-sandbox.task": "x"})
    with pytest.raises(ValueError, match="absolute"):
        DockerSettings(workdir="relative")
    with pytest.raises(ValueError, match="SOURCE:TARGET"):
        Mount.parse("just-one-part")


def test_config_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HERMES_SANDBOX_DOCKER_IMAGE", raising=False)
    monkeypatch.setenv("DOCKER_HOST", "unix:///somewhere.sock")
    config = DockerSettings()
    assert config.image == "python:3.12-slim"
    assert config.docker_host == "unix:///somewhere.sock"
    assert (config.network, config.read_only_root, config.pids_limit) == (False, True, 256)
    monkeypatch.setenv("HERMES_SANDBOX_DOCKER_IMAGE", "mine:latest")
    assert DockerSettings().image == "mine:latest"
    # The hash covers what the container is made from, not how it is reached.
    assert config.creation_hash("sha256:abc") == DockerSettings(
        image="other", docker_host=None, python="python3.12"
    ).creation_hash("abc")
    assert config.creation_hash("abc") != DockerSettings(memory="2g").creation_hash("abc")


@pytest.mark.anyio
async def test_spawn_is_not_available_yet() -> None:
    environment = DockerEnvironment(DockerSettings(image=IMAGE))
    with pytest.raises(SpawnNotAvailable) as caught:
        await environment.spawn(["true"], env={})
    assert isinstance(caught.value, NotImplementedError)
    assert isinstance(caught.value, BackendNotAvailable)


def test_the_command_line_runs_a_script_in_a_container(engine: Any, tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(
        "import os\nfrom hermes_tools import terminal\n"
        "print(os.getcwd(), terminal('echo inside')['output'].strip())\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hermes_sandbox",
            "run",
            "--backend",
            "docker",
            "--image",
            IMAGE,
            "--json",
            str(script),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    assert outcome["output"] == "/workspace inside\n"
    assert outcome["tool_calls_made"] == 1


def test_the_command_line_reports_a_missing_image_without_a_traceback(
    engine: Any, tmp_path: Path
) -> None:
    script = tmp_path / "script.py"
    script.write_text("print('hi')\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hermes_sandbox",
            "run",
            "--backend",
            "docker",
            "--image",
            f"localhost:1/no-such-image-{RUN_ID}:latest",
            str(script),
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith("hermes-sandbox: the image") and "pulling it" in lines[0]
    assert lines[-1].startswith("hermes-sandbox: error:")
    assert f"no-such-image-{RUN_ID}" in lines[-1]


# -- whole runs through the runner: the relay over docker exec ------------------------


def docker_run(code: str, **options: Any) -> Any:
    from hermes_sandbox import execute_code

    backend_options = {"image": IMAGE, "labels": {TEST_LABEL: RUN_ID}}
    backend_options.update(options.pop("backend_options", {}))
    options.setdefault("timeout", 60)
    return execute_code(
        textwrap.dedent(code), backend="docker", backend_options=backend_options, **options
    )


def test_a_script_runs_in_the_container_and_its_tools_act_there(engine: Any, tmp_path: Path):
    host_only = tmp_path / "host-only.txt"
    host_only.write_text("secret on the host")
    marker = f"written-{RUN_ID}.txt"
    result = docker_run(
        f"""
        import os
        from hermes_tools import read_file, write_file, terminal
        print(os.getcwd())
        print(write_file({marker!r}, "inside")["path"])
        print(read_file({marker!r})["content"])
        print(read_file({str(host_only)!r}))
        print(terminal("cat /proc/1/cgroup >/dev/null; hostname")["exit_code"])
        """
    )
    assert result.status == "success", result.to_dict()
    cwd, written, content, host_read, exit_code = result.output.splitlines()
    assert cwd == "/workspace"
    assert written == f"/workspace/{marker}"
    assert content == "inside"
    assert "File not found" in host_read and "secret" not in host_read
    assert exit_code == "0"
    assert not os.path.exists(f"/workspace/{marker}")  # nothing of it landed on the host
    assert result.tool_calls_made == 4


def test_calls_from_a_script_in_a_container_overlap(engine: Any):
    result = docker_run(
        """
        import threading
        from hermes_tools import terminal
        out = [None] * 6
        # A barrier in the container: each call arrives, then waits (up to 60 s) until
        # all six have arrived. Calls served one after another would each see only
        # themselves, so the overlap is observed, not inferred from a clock.
        def call(i):
            out[i] = terminal(
                f"mkdir -p /tmp/overlap && touch /tmp/overlap/{i}; "
                "for n in $(seq 600); do [ $(ls /tmp/overlap | wc -l) -ge 6 ] && break; "
                f"sleep 0.1; done; echo {i} $(ls /tmp/overlap | wc -l)",
                timeout=120,
            )["output"].strip()
        threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print(out)
        """,
        timeout=180,
    )
    assert result.status == "success", result.to_dict()
    assert result.output.strip() == str([f"{i} 6" for i in range(6)])


def test_a_timeout_kills_the_script_inside_the_container(engine: Any):
    task = f"timeout-{RUN_ID}"
    result = docker_run(
        """
        import subprocess, time
        subprocess.Popen(["sleep", "300"])
        subprocess.Popen(["sleep", "301"], start_new_session=True)
        print("started", flush=True)
        time.sleep(300)
        """,
        timeout=4,
        kill_grace=0.5,
        task_id=task,
        backend_options={"persist": True},
    )
    try:
        assert result.status == "timeout"
        assert result.exit_code == 124
        assert result.output.startswith("started")
        (container,) = engine.containers.list(filters={"label": f"hermes-sandbox.task={task}"})
        survivors = container.exec_run(["sh", "-c", LIST_PROCESSES]).output.decode()
        assert "sleep 30" not in survivors and "script.py" not in survivors, survivors
    finally:
        for container in engine.containers.list(
            all=True, filters={"label": f"hermes-sandbox.task={task}"}
        ):
            remove_container(engine, container.id)


def test_output_caps_and_exit_codes_hold_in_a_container(engine: Any, tmp_path: Path):
    result = docker_run(
        """
        import sys
        for i in range(20000):
            print(f"line {i:06d} " + "x" * 40)
        print("boom", file=sys.stderr)
        sys.exit(3)
        """,
        spill_dir=str(tmp_path),
    )
    assert result.status == "error" and result.exit_code == 3
    assert result.stdout_truncated
    assert result.stdout_bytes_total == 20000 * 53  # "line 000000 " + 40 x + newline
    assert result.stdout_bytes_captured == 50_000
    assert result.output.startswith("line 000000 ")
    assert "line 019999 " in result.output
    assert result.output.endswith("--- stderr ---\nboom\n")


@pytest.mark.parametrize("transport", ["unix", "relay", "files"])
def test_a_container_that_dies_mid_run(engine: Any, transport: str) -> None:
    """Removed from under a running script: the run ends soon, says the sandbox went
    away, and nothing of it is left (the container, its shared directory)."""
    case = f"dies-{uuid.uuid4().hex[:8]}"
    found: dict[str, Any] = {}
    script_started = threading.Event()  # it printed: staged and running (not a guess)

    def on_stdout(line: str) -> None:
        if line.startswith("started"):
            script_started.set()

    def remove_when_running() -> None:
        if not script_started.wait(60):
            return
        entries = engine.api.containers(filters={"label": [f"case={case}"]})
        if entries:
            found.update(entries[0])
            engine.api.remove_container(entries[0]["Id"], force=True)

    remover = threading.Thread(target=remove_when_running)
    remover.start()
    started = time.monotonic()
    try:
        result = docker_run(
            "import time\nprint('started', flush=True)\ntime.sleep(120)\n",
            backend_options={"labels": {TEST_LABEL: RUN_ID, "case": case}},
            transport=transport,
            timeout=90,
            on_stdout=on_stdout,
        )
    finally:
        remover.join()
    assert found, "the run's container never appeared"
    assert time.monotonic() - started < 45
    assert result.status == "error", result.to_dict()
    assert result.exit_code == 255
    assert "lost" in (result.error or ""), result.error
    assert not container_exists(engine, found["Id"])
    shared = found["Labels"].get(docker_backend.LABEL_SHARED)
    if shared:
        assert not os.path.exists(os.path.dirname(shared)), "the shared directory was left"


@pytest.mark.anyio
async def test_the_auto_shared_dir_is_made_for_the_container_and_removed(engine: Any) -> None:
    environment = DockerEnvironment(make_config())
    await environment.start()
    try:
        shared = environment.shared_directory
        assert shared is not None and await anyio.Path(shared).is_dir()
        private = anyio.Path(os.path.dirname(shared))
        assert stat.S_IMODE((await private.stat()).st_mode) == 0o700
        # the container sees it at the same path, and writes land on the host
        result = await environment.execute(f"echo inside > {shared}/probe")
        assert result.exit_code == 0, result.output
        assert await anyio.Path(shared, "probe").read_text() == "inside\n"
    finally:
        await environment.aclose()
    assert not await private.exists()


@pytest.mark.anyio
async def test_no_shared_dir_means_the_relay(engine: Any) -> None:
    async with DockerEnvironment(make_config(shared_dir="none")) as environment:
        assert environment.shared_directory is None
    result = docker_run("print('ran')", backend_options={"shared_dir": "none"})
    assert (result.status, result.output) == ("success", "ran\n")
    refused = None
    try:
        docker_run("print('ran')", backend_options={"shared_dir": "none"}, transport="unix")
    except Exception as exc:  # RunError: the unix transport needs a shared directory
        refused = exc
    assert refused is not None and "relay" in str(refused)


def test_tilde_is_the_containers_home_not_the_hosts(engine: Any) -> None:
    """~ in a tool's path is the home of the container's user (here HOME=/workspace,
    which the host does not have), not the host's."""
    result = docker_run(
        """
        from hermes_tools import read_file, terminal, write_file
        print(write_file("~/note.txt", "in the container's home")["path"])
        print(read_file("~/note.txt")["content"])
        print(terminal("cat $HOME/note.txt")["output"])
        """,
        env={"HOME": "/workspace"},
    )
    assert result.status == "success", result.to_dict()
    assert result.output.splitlines()[:3] == [
        "/workspace/note.txt",
        "in the container's home",
        "in the container's home",
    ]
    assert not os.path.exists("/workspace/note.txt")


@pytest.mark.anyio
async def test_the_reaper_removes_shared_dirs_no_container_uses(engine: Any) -> None:
    """A container removed by hand leaves its shared directory; the next start removes
    it once it is old enough not to be mid-creation, and leaves another engine's."""
    environment = DockerEnvironment(make_config(persist=True))
    await environment.start()
    shared = environment.shared_directory
    assert shared is not None
    private = os.path.dirname(shared)
    await environment.aclose()  # persistent: the container and its directory stay
    environment_id = _only_id(engine, shared)
    assert container_exists(engine, environment_id)
    engine.api.remove_container(environment_id, force=True, v=True)  # "by hand"
    other = await anyio.to_thread.run_sync(
        docker_backend._make_shared_dir, None, "unix:///somewhere/else.sock"
    )
    young = await anyio.to_thread.run_sync(
        docker_backend._make_shared_dir, None, docker_backend.engine_address(None)
    )
    old = time.time() - 3600
    for path in (private, os.path.dirname(other)):
        os.utime(path, (old, old))
    try:
        async with DockerEnvironment(make_config()):
            pass
        assert not await anyio.Path(private).exists()
        assert await anyio.Path(other).exists()  # another engine's
        assert await anyio.Path(young).exists()  # may be a container being made
    finally:
        for path in (other, young):
            await anyio.to_thread.run_sync(
                functools.partial(shutil.rmtree, os.path.dirname(path), ignore_errors=True)
            )


def _only_id(engine: Any, shared: str) -> str:
    found = [
        entry["Id"]
        for entry in engine.api.containers(all=True, filters={"label": f"{TEST_LABEL}={RUN_ID}"})
        if (entry.get("Labels") or {}).get(docker_backend.LABEL_SHARED) == shared
    ]
    assert len(found) == 1, found
    return str(found[0])
