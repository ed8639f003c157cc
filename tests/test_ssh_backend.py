"""The ssh backend against a real OpenSSH server on 127.0.0.1.

The server is the one the HERMES_TEST_SSH_* variables describe (``eval "$(scripts/
sshd-service)"`` sets them); when they are unset the session fixture runs
scripts/sshd-service itself (it needs root the first time: it installs openssh-server
and creates the test user). When no server can be had these tests are skipped with the
reason printed; under CI (CI=true) that is a failure instead.

The "remote" host is this machine, reached as another user, so what a run does there
is checked from here: file owners, pids with psutil, /proc/*/cmdline, /tmp. Tests that
need their own connection (to kill it, to count it) use a pool key of their own (a
copy of the known_hosts file), so the pooled connection of other tests is not touched.
Tests of configuration alone run everywhere.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from conftest import read_relay_slowly, ssh_server_from_environment, ssh_server_from_service

import hermes_sandbox.environments.ssh.connection as ssh_connection
from hermes_sandbox import SettingError, execute_code, execute_code_async
from hermes_sandbox.environments import (
    BackendNotAvailable,
    EnvironmentFailure,
    get_environment_class,
)
from hermes_sandbox.environments.errors import SpawnNotAvailable
from hermes_sandbox.environments.exec_stream import helper_failure_text
from hermes_sandbox.environments.ssh import (
    SSHEnvironment,
    SSHSettings,
    close_pooled_connections,
    pool_stats,
)

REPO = Path(__file__).resolve().parent.parent
SERVICE = REPO / "scripts" / "sshd-service"
# make_private_dir's names: stages, and sessions' workspaces
STAGE_RE = re.compile(r"^hermes-(sandbox|session)-[0-9a-f]{12}$")
STANDBY_NAME = "hermes-standby"  # what ps shows for a relay started ahead of its run
# Processes get this long to go after a run before a test calls them left behind.
SETTLE_SECONDS = 5.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- the server --------------------------------------------------------------------------


@dataclass(frozen=True)
class Server:
    host: str
    port: int
    user: str
    key: str
    known_hosts: str
    pid: int
    log: str | None

    @property
    def uid(self) -> int:
        return pwd.getpwnam(self.user).pw_uid

    @property
    def home(self) -> str:
        return pwd.getpwnam(self.user).pw_dir

    def options(self, **changes: Any) -> dict[str, Any]:
        """backend_options for a run against this server."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "key_file": self.key,
            "known_hosts": self.known_hosts,
            **changes,
        }

    def config(self, **changes: Any) -> SSHSettings:
        return SSHSettings.from_mapping(self.options(**changes))

    def accepted_ports(self) -> list[int]:
        """Client ports of every login sshd has logged so far."""
        assert self.log is not None
        text = Path(self.log).read_text(errors="replace")
        pattern = rf"Accepted publickey for {re.escape(self.user)} from \S+ port (\d+)"
        return [int(port) for port in re.findall(pattern, text)]


@pytest.fixture(scope="session")
def sshd() -> Iterator[Server]:
    """The test server; skips (fails under CI) when there is none. Closes this
    process's pooled connections at the end."""
    values = ssh_server_from_environment()
    problem = ""
    if values is None:
        values, problem = ssh_server_from_service()
    if not values or not all(k in values for k in ("HOST", "PORT", "USER", "KEY", "PID")):
        message = f"ssh backend tests need an SSH server: {problem}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (CI=true: .ci/run starts sshd, so this is a failure)")
        print(f"\nSKIPPED: {message}", file=sys.stderr)
        pytest.skip(message)
    server = Server(
        host=values["HOST"],
        port=int(values["PORT"]),
        user=values["USER"],
        key=values["KEY"],
        known_hosts=values["KNOWN_HOSTS"],
        pid=int(values["PID"]),
        log=values.get("LOG") if values.get("LOG") and os.path.isfile(values["LOG"]) else None,
    )
    try:
        yield server
    finally:
        close_pooled_connections()


def user_processes(server: Server, *, standbys: bool = False) -> dict[int, str]:
    """Live processes of the test user that this test may have left (pid: command
    line); see :func:`processes_by_owner`."""
    return processes_by_owner(server, standbys=standbys)[0]


def processes_by_owner(
    server: Server, *, standbys: bool = False
) -> tuple[dict[int, str], dict[int, str]]:
    """Live processes of the test user, but sshd's own (a pooled connection keeps an
    ``sshd: user@notty`` process) and, unless ``standbys``, the relays the pool keeps
    started ahead of a run (``hermes-standby``: they go with the pool;
    test_a_standby_relay_goes_with_its_connection), as (pid: command line) of those
    this test may have left, and of another client's.

    Other sessions on this machine (a benchmark, another suite) log in as the same user
    at the same time. Every process of a login carries the login's client address in
    ``SSH_CLIENT`` (sshd sets it; the relay passes it on to the script), so a process
    whose client port a live process outside this process's tree holds is theirs: a
    test neither counts nor kills it. What has no live client counts, an orphan whose
    host died included."""
    ours = {os.getpid(), *(child.pid for child in psutil.Process().children(recursive=True))}
    clients = {
        c.laddr.port: c.pid
        for c in psutil.net_connections("tcp")
        if c.raddr and c.raddr.port == server.port and c.pid is not None
    }
    mine, theirs = {}, {}
    for process in psutil.process_iter(["username", "name", "cmdline", "status"]):
        info = process.info
        if info["username"] != server.user or info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if info["name"] == "sshd" or (info["cmdline"] or [""])[0].startswith("sshd:"):
            continue
        if info["name"] == STANDBY_NAME and not standbys:
            continue
        try:
            with open(f"/proc/{process.pid}/environ", "rb") as f:
                entries = f.read().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        ports = [entry.split()[1] for entry in entries if entry.startswith(b"SSH_CLIENT=")]
        client = clients.get(int(ports[0])) if ports and ports[0].isdigit() else None
        command = " ".join(info["cmdline"] or [info["name"] or "?"])
        (theirs if client is not None and client not in ours else mine)[process.pid] = command
    return mine, theirs


def stage_dirs(server: Server) -> set[str]:
    """The test user's stage directories in /tmp, but those another client's live run
    names on a command line (its relay's stage, a session's workspace)."""
    found = set()
    for entry in os.scandir("/tmp"):
        try:
            if (
                STAGE_RE.match(entry.name)
                and entry.stat(follow_symlinks=False).st_uid == server.uid
            ):
                found.add(entry.path)
        except OSError:
            continue
    theirs = processes_by_owner(server)[1].values()
    return found - {word for command in theirs for word in command.split()}


@pytest.fixture
def server(sshd: Server) -> Iterator[Server]:
    """The server, for a test that must leave nothing behind on it: afterwards no
    process of the test user runs but sshd's, and no stage directory of its is left."""
    before = stage_dirs(sshd)
    yield sshd
    deadline = time.monotonic() + SETTLE_SECONDS
    while user_processes(sshd) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = user_processes(sshd)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    new_dirs = stage_dirs(sshd) - before
    for path in new_dirs:
        shutil.rmtree(path, ignore_errors=True)
    assert not left, f"processes of {sshd.user} left running: {left}"
    assert not new_dirs, f"stage directories left behind: {new_dirs}"


@pytest.fixture
def own_known_hosts(sshd: Server, tmp_path: Path) -> str:
    """A copy of the server's known_hosts: a pool key (so a connection) of this test's own."""
    path = tmp_path / "known_hosts"
    shutil.copyfile(sshd.known_hosts, path)
    return str(path)


def server_processes(port: int) -> list[psutil.Process]:
    """The sshd processes serving the connection whose client side is ``port``."""
    found = []
    for process in psutil.process_iter(["name"]):
        if process.info["name"] != "sshd":
            continue
        try:
            connections = process.net_connections("tcp")
        except psutil.Error:
            continue
        if any(c.raddr and c.raddr.port == port for c in connections):
            found.append(process)
    return found


def kill_connection(config: SSHSettings) -> list[int]:
    """Kill (SIGKILL) the sshd processes serving the pooled connection of ``config``,
    as a server crash would; their pids."""
    ports = pool_stats(config).local_ports
    assert len(ports) == 1, f"expected one pooled connection, have {ports}"
    victims = server_processes(ports[0])
    assert victims, f"no sshd process serves client port {ports[0]}"
    for process in victims:
        process.kill()
    return [p.pid for p in victims]


def make_key(path: Path) -> Path:
    """A fresh ed25519 key pair no server knows; the private key's path."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


def wait_for_file(path: Path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            text = path.read_text()
        except FileNotFoundError:
            text = ""
        if text.strip():
            return text
        time.sleep(0.02)
    pytest.fail(f"{path} was not written within {timeout}s")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids: list[int], timeout: float = SETTLE_SECONDS) -> list[int]:
    """The pids still alive after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(gone(p) for p in pids):
        time.sleep(0.02)
    return [p for p in pids if not gone(p)]


def shared_tmp(server: Server) -> Path:
    """A fresh directory in /tmp both this process and the test user can write."""
    path = Path("/tmp") / f"hermes-ssh-test-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o777)
    path.chmod(0o777)
    return path


# -- configuration (no server needed) -------------------------------------------------------


def test_config_refuses_unknown_keys_and_names_the_known_ones() -> None:
    with pytest.raises(ValueError) as caught:
        SSHSettings.from_mapping({"host": "h", "hots": "x", "keyfile": "k"})
    message = str(caught.value)
    assert "hots, keyfile" in message
    for known in ("host", "port", "user", "key_file", "known_hosts", "accept_new_host_keys"):
        assert known in message


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({}, "needs a host"),
        ({"host": "h", "port": 0}, r"\(port=0\): must be between"),
        ({"host": "h", "port": "22"}, r"\(port='22'\): expected a whole number"),
        ({"host": "h", "workdir": "relative"}, "absolute"),
        ({"host": "h", "connect_timeout": 0}, "connect_timeout"),
        ({"host": "h", "max_sessions": 0}, "max_sessions"),
        ({"host": "h", "accept_new_host_keys": "yes"}, "true or false"),
        ({"host": ""}, r"\(host=''\): must not be empty"),
    ],
)
def test_config_refuses_bad_values(settings: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        SSHSettings.from_mapping(settings)


def test_defaults_are_the_safe_ones() -> None:
    config = SSHSettings(host="h")
    assert config.port == 22
    assert config.accept_new_host_keys is False
    assert config.known_hosts == "~/.ssh/known_hosts"
    assert config.python == "python3"
    assert config.scratch_dir == "/tmp"


def test_backend_is_registered_and_for_run_takes_settings() -> None:
    cls = get_environment_class("ssh")
    assert cls is SSHEnvironment
    env = cls.for_run(
        {"host": "example.invalid", "user": "u"},
        env={},
        kill_grace=1.0,
        task_id=None,
        python="python3.11",
    )
    assert isinstance(env, SSHEnvironment)
    assert env.python == "python3.11"
    assert env.shared_directory is None
    with pytest.raises(ValueError, match="unknown ssh backend setting"):
        cls.for_run({"host": "h", "image": "x"}, env={}, kill_grace=1, task_id=None, python=None)


def test_bad_backend_options_are_refused_with_their_place() -> None:
    with pytest.raises(SettingError, match="backend_options: unknown ssh backend setting nope"):
        execute_code("print(1)", backend="ssh", backend_options={"host": "h", "nope": 1})


def test_command_line_quotes_every_word_and_refuses_bad_names() -> None:
    env = SSHEnvironment(SSHSettings(host="h"))
    line = env.command_line(["python3", "a b", "$(x)"], env={"A": "1 2"}, cwd="/t m")
    assert line == "cd '/t m' && exec env A='1 2' python3 'a b' '$(x)'"
    with pytest.raises(ValueError, match="variable names"):
        env.command_line(["true"], env={"A;rm": "x"}, cwd=None)


@pytest.mark.anyio
async def test_missing_paramiko_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ssh_connection, "paramiko", None)
    with pytest.raises(BackendNotAvailable, match=r"pip install 'hermes-sandbox\[ssh\]'"):
        await SSHEnvironment(SSHSettings(host="127.0.0.1")).start()


@pytest.mark.anyio
async def test_connection_refused_is_clear() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = SSHEnvironment(SSHSettings(host="127.0.0.1", port=port, connect_timeout=5))
    with pytest.raises(BackendNotAvailable, match=f"connection refused by 127.0.0.1:{port}"):
        await env.start()


@pytest.mark.anyio
async def test_a_server_that_does_not_answer_times_out(tmp_path: Path) -> None:
    with socket.socket() as silent:  # accepts connections, never speaks SSH
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        config = SSHSettings(
            host="127.0.0.1",
            port=port,
            connect_timeout=0.5,
            known_hosts=str(tmp_path / "kh"),
            key_file=__file__,
        )
        started = time.monotonic()
        with pytest.raises(BackendNotAvailable, match=r"connect_timeout|handshake"):
            await SSHEnvironment(config).start()
        assert time.monotonic() - started < 15  # connect_timeout 0.5, not the default


@pytest.mark.anyio
async def test_an_unreachable_host_is_clear() -> None:
    # 192.0.2.0/24 is TEST-NET-1: never routed. Depending on the network this is an
    # immediate "unreachable" or a timeout after connect_timeout.
    config = SSHSettings(host="192.0.2.1", connect_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(BackendNotAvailable, match=r"192\.0\.2\.1:22"):
        await SSHEnvironment(config).start()
    assert time.monotonic() - started < 15  # connect_timeout 0.5, not the default


# -- the environment on its own ----------------------------------------------------------------


@pytest.mark.anyio
async def test_execute_gives_output_and_exit_code(server: Server) -> None:
    async with SSHEnvironment(server.config()) as env:
        assert env.home == server.home
        assert env.default_cwd == server.home
        result = await env.execute("whoami; pwd; echo to-stderr >&2; exit 3")
        assert result.exit_code == 3
        assert result.output.split() == [server.user, server.home, "to-stderr"]
        assert (await env.execute("pwd", cwd="/tmp")).output == "/tmp\n"
        with pytest.raises(FileNotFoundError):
            await env.execute("true", cwd="/no/such/dir")
        with pytest.raises(SpawnNotAvailable):
            await env.spawn(["true"], env={})


@pytest.mark.anyio
async def test_timeout_kills_the_remote_tree(server: Server) -> None:
    scratch = shared_tmp(server)
    pids_file = scratch / "pids"
    command = (
        f"sleep 61 & echo $! >> {pids_file}; "
        f"(trap '' TERM; sleep 62) & echo $! >> {pids_file}; "
        f"echo $$ >> {pids_file}; echo started; sleep 63"
    )
    try:
        async with SSHEnvironment(server.config(), kill_grace=0.5) as env:
            started = time.monotonic()
            result = await env.execute(command, timeout=1.5)
            elapsed = time.monotonic() - started
        pids = [int(p) for p in pids_file.read_text().split()]
        assert result.timed_out and result.exit_code == 124
        assert "started" in result.output
        assert elapsed < 6, elapsed
        assert len(pids) == 3
        assert wait_gone(pids, 0.5) == [], "the command's processes survived its timeout"
        assert not [c for c in user_processes(server).values() if "sleep 6" in c]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.mark.anyio
async def test_files_round_trip(server: Server) -> None:
    payload = os.urandom(300_000) + b"\0end"
    async with SSHEnvironment(server.config()) as env:
        stage = await env.make_private_dir("hermes-sandbox-")
        try:
            path = f"{stage}/deep/er/data.bin"
            await env.write_bytes(path, payload, mode=0o640)
            assert await env.read_bytes(path) == payload
            assert await env.read_bytes(path, max_bytes=10) == payload[:10]
            info = await env.stat(path)
            assert (info.kind, info.size) == ("file", len(payload))
            assert (await env.stat(stage + "/deep")).kind == "directory"
            on_disk = os.stat(path)  # the "remote" host is this machine
            assert on_disk.st_uid == server.uid
            assert on_disk.st_mode & 0o777 == 0o640
            with pytest.raises(FileNotFoundError):
                await env.stat(stage + "/missing")
            with pytest.raises(FileNotFoundError):
                await env.write_bytes(stage + "/no/parent", b"x", make_parents=False)
            with pytest.raises(PermissionError):
                await env.read_bytes("/etc/shadow")
        finally:
            await env.remove_tree(stage)


@pytest.mark.anyio
async def test_stage_dir_is_private_and_removed(server: Server) -> None:
    async with SSHEnvironment(server.config()) as env:
        stage = await env.make_private_dir("hermes-sandbox-")
        assert os.path.dirname(stage) == "/tmp"
        info = os.stat(stage)
        assert info.st_mode & 0o777 == 0o700
        assert info.st_uid == server.uid
        await env.write_bytes(stage + "/x/y", b"1")
        await env.remove_tree(stage)
        assert not await anyio.Path(stage).exists()
        await env.remove_tree(stage)  # a missing path is not an error


@pytest.mark.anyio
async def test_the_relay_exec_makes_its_stage_exclusively(server: Server) -> None:
    """A stage the relay's exec makes is new and private: at a path someone else took
    first it writes nothing, starts no relay and says why."""
    async with SSHEnvironment(server.config()) as env:
        path = env.fresh_stage_path("hermes-sandbox-")
        assert path is not None and os.path.dirname(path) == "/tmp"
        os.mkdir(path, 0o777)  # taken first, by another user (root here)
        try:
            stream = await env.open_relay(
                path, [], files={"_hermes_relay.py": b"print('ran')\n"}, make_stage=True
            )
            out = b"".join([chunk async for chunk in stream])
            code = await stream.wait()
            await stream.aclose()
            assert (out, code) == (b"", 125)
            assert "EEXIST" in helper_failure_text(stream.stderr_tail) or (
                "File exists" in helper_failure_text(stream.stderr_tail)
            )
            assert os.listdir(path) == []
        finally:
            os.rmdir(path)
        made = env.fresh_stage_path("hermes-sandbox-")
        assert made is not None and made != path
        stream = await env.open_relay(
            made, [], files={"_hermes_relay.py": b"print('ran')\n"}, make_stage=True
        )
        out = b"".join([chunk async for chunk in stream])
        assert (out, await stream.wait()) == (b"ran\n", 0)
        await stream.aclose()
        info = os.stat(made)
        assert (info.st_mode & 0o777, info.st_uid) == (0o700, server.uid)
        await env.remove_tree(made)
        assert not await anyio.Path(made).exists()


@pytest.mark.anyio
async def test_exec_stream_env_cwd_and_secrets_stay_off_command_lines(server: Server) -> None:
    """open_exec_stream's env reaches the program, quoted intact; the stream carries
    stdin both ways and ends cleanly."""
    value = "a b'c\"$HOME;`x`"
    code = "import os,sys; print(os.getcwd()); print(os.environ['ODD']); print(sys.stdin.read())"
    async with SSHEnvironment(server.config()) as env:
        stream = await env.open_exec_stream(["python3", "-c", code], env={"ODD": value}, cwd="/")
        await stream.send(b"from stdin")
        await stream.send_eof()
        out = b""
        async for chunk in stream:
            out += chunk
        assert await stream.wait() == 0
        await stream.aclose()
    assert out.decode().splitlines() == ["/", value, "from stdin"]


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.anyio
async def test_echo_round_trips_small_and_large(server: Server, anyio_backend: str) -> None:
    """The relay carries every tool call over one of these streams: small echoes come
    back whole, one after another, and so does one past the channel's window."""
    echo = "import os\nwhile True:\n d = os.read(0, 65536)\n if not d: break\n os.write(1, d)"
    async with SSHEnvironment(server.config()) as env:
        stream = await env.open_exec_stream(["python3", "-c", echo])
        try:
            for _ in range(20):  # warm up
                await stream.send(b"x" * 100)
                await stream.receive()
            rounds = 300
            started = time.perf_counter()
            for _ in range(rounds):
                await stream.send(b"y" * 100)
                got = 0
                while got < 100:
                    got += len(await stream.receive())
            per_round = (time.perf_counter() - started) / rounds
            big = os.urandom(3_000_000)  # past the window: the threaded path
            received = bytearray()

            async def read_all() -> None:
                while len(received) < len(big):
                    received.extend(await stream.receive())

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(read_all)
                await stream.send(big)
            assert bytes(received) == big
            await stream.send_eof()
            with pytest.raises(anyio.EndOfStream):
                await stream.receive()
            assert await stream.wait() == 0
        finally:
            await stream.aclose()
    # Its speed is the benchmark's (rtt.floor.ssh.c1), not a timed assertion here.
    print(f"\nssh echo round trip ({anyio_backend}): {per_round * 1000:.3f} ms")


# -- whole runs ------------------------------------------------------------------------------


def test_run_acts_on_the_remote_side(server: Server, tmp_path: Path) -> None:
    name = f"hermes-ssh-test-{uuid.uuid4().hex[:8]}.txt"
    code = f"""
        import os
        from hermes_tools import terminal, write_file, read_file
        print("whoami", terminal("whoami")["output"].strip())
        print("uid", os.getuid(), "cwd", os.getcwd())
        print(write_file({name!r}, "written remotely\\n").get("status"))
        print("read", read_file({name!r})["content"].strip())
    """
    try:
        result = execute_code(
            textwrap.dedent(code),
            backend="ssh",
            backend_options=server.options(),
            timeout=20,
            spill_dir=str(tmp_path),
        )
        assert result.status == "success", result.output
        lines = result.output.splitlines()
        assert lines[0] == f"whoami {server.user}"
        assert lines[1] == f"uid {server.uid} cwd {server.home}"
        assert lines[3] == "read written remotely"
        written = Path(server.home) / name
        assert written.read_text() == "written remotely\n"
        assert written.stat().st_uid == server.uid  # written by the ssh user, not us
        assert result.tool_calls_made == 3
    finally:
        (Path(server.home) / name).unlink(missing_ok=True)


def test_tool_calls_from_ten_threads(server: Server, own_known_hosts: str) -> None:
    """Ten concurrent calls plus the relay need eleven channels: more than OpenSSH's
    ten per connection, so the pool opens a second connection instead of failing."""
    code = """
        import threading
        from hermes_tools import terminal
        out = [None] * 10
        def call(i):
            out[i] = terminal("sleep 0.3; echo call-%d" % i)
        threads = [threading.Thread(target=call, args=(i,)) for i in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(" ".join(o["output"].strip() for o in out))
        print(sorted(set(o["exit_code"] for o in out)))
    """
    options = server.options(known_hosts=own_known_hosts, idle_timeout=0)
    started = time.monotonic()
    result = execute_code(textwrap.dedent(code), backend="ssh", backend_options=options, timeout=30)
    elapsed = time.monotonic() - started
    assert result.status == "success", result.output
    first, second = result.output.splitlines()
    assert first == " ".join(f"call-{i}" for i in range(10))
    assert second == "[0]"
    assert result.tool_calls_made == 10
    assert elapsed < 10, f"ten 0.3 s calls in parallel took {elapsed:.1f} s"


def test_more_channels_than_the_server_allows(server: Server, own_known_hosts: str) -> None:
    """Told max_sessions=40, the pool meets sshd's real limit (10), learns it from the
    refusal and opens another connection: every call still succeeds."""
    code = """
        import threading
        from hermes_tools import terminal
        out = []
        def call(i):
            out.append(terminal("sleep 0.5; echo %d" % i)["output"].strip())
        threads = [threading.Thread(target=call, args=(i,)) for i in range(14)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(len(out), sorted(int(x) for x in out) == list(range(14)))
    """
    options = server.options(known_hosts=own_known_hosts, max_sessions=40, idle_timeout=5)
    result = execute_code(
        textwrap.dedent(code),
        backend="ssh",
        backend_options=options,
        timeout=30,
        max_tool_calls=20,
    )
    assert result.status == "success", result.output
    assert result.output.strip() == "14 True"
    assert pool_stats(SSHSettings.from_mapping(options)).connections_made >= 2
    close_pooled_connections()


def test_run_timeout_kills_the_remote_script(server: Server) -> None:
    scratch = shared_tmp(server)
    code = f"""
        import os, subprocess, time
        child = subprocess.Popen(["sleep", "60"], start_new_session=True)
        with open("{scratch}/pids", "w") as f:
            f.write("%d %d" % (os.getpid(), child.pid))
        print("running", flush=True)
        time.sleep(60)
    """
    try:
        started = time.monotonic()
        result = execute_code(
            textwrap.dedent(code),
            backend="ssh",
            backend_options=server.options(),
            timeout=2,
            kill_grace=0.5,
        )
        elapsed = time.monotonic() - started
        assert result.status == "timeout"
        assert result.exit_code == 124
        assert "running" in result.output
        assert elapsed < 8, elapsed
        pids = [int(p) for p in (scratch / "pids").read_text().split()]
        assert wait_gone(pids, 1.0) == []
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.mark.anyio
async def test_cancelling_a_run_kills_the_remote_script(server: Server) -> None:
    scratch = shared_tmp(server)
    pid_file = scratch / "pid"
    code = f"""
        import os, time
        open("{pid_file}", "w").write(str(os.getpid()))
        time.sleep(60)
    """
    try:
        async with anyio.create_task_group() as tasks:

            async def cancel_once_running() -> None:
                await anyio.to_thread.run_sync(wait_for_file, pid_file)
                tasks.cancel_scope.cancel()

            tasks.start_soon(cancel_once_running)
            await execute_code_async(
                textwrap.dedent(code), backend="ssh", backend_options=server.options(), timeout=30
            )
            pytest.fail("the run ended before it was cancelled")
        pid = int(pid_file.read_text())
        assert await anyio.to_thread.run_sync(wait_gone, [pid], 3.0) == []
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_tool_call_budget(server: Server) -> None:
    code = """
        from hermes_tools import terminal
        for i in range(4):
            r = terminal("echo %d" % i)
            print(i, r.get("output", "").strip() or "refused: " + r.get("error", ""))
    """
    result = execute_code(
        textwrap.dedent(code),
        backend="ssh",
        backend_options=server.options(),
        timeout=20,
        max_tool_calls=2,
    )
    assert result.status == "success", result.output
    lines = result.output.splitlines()
    assert lines[:2] == ["0 0", "1 1"]
    assert lines[2].startswith("2 refused: ") and lines[3].startswith("3 refused: ")
    assert result.tool_calls_made == 2


def test_output_caps(server: Server, tmp_path: Path) -> None:
    code = """
        import sys
        sys.stdout.write("A" * 5000 + "B" * 200000 + "Z" * 5000)
        sys.stderr.write("q" * 50000)
    """
    result = execute_code(
        textwrap.dedent(code),
        backend="ssh",
        backend_options=server.options(),
        timeout=20,
        max_stdout_bytes=10_000,
        max_stderr_bytes=2_000,
        spill_dir=str(tmp_path),
    )
    assert result.status == "success"
    assert result.stdout_truncated
    assert result.stdout_bytes_total == 210_000
    assert result.stdout_bytes_captured == 10_000
    assert result.output.startswith("A")
    stdout_part, _, stderr_part = result.output.partition("--- stderr ---")
    assert stdout_part.rstrip().endswith("Z")
    assert "B" * 50_000 not in stdout_part
    assert 0 < stderr_part.count("q") <= 2_000
    assert "bytes omitted] ..." in stderr_part


def test_token_is_on_no_remote_command_line(server: Server) -> None:
    """The RPC token reaches the script inside the relay stream: sampled while the
    run goes on, from inside and from here, no process's command line carries it."""
    code = """
        import os, threading, time
        token = os.environ["HERMES_RPC_TOKEN"]
        from hermes_tools import terminal
        print("TOKEN", token, flush=True)
        call = threading.Thread(target=terminal, args=("sleep 1",))
        call.start()
        seen, hits, deadline = 0, [], time.time() + 1.0
        while time.time() < deadline:
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    try:
                        with open("/proc/%s/cmdline" % pid, "rb") as f:
                            data = f.read()
                    except OSError:
                        continue
                    seen += 1
                    if token.encode() in data:
                        hits.append(pid)
        call.join()
        print("SEEN", seen, "HITS", hits)
    """
    sampled: set[bytes] = set()
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for process in psutil.process_iter(["username", "cmdline"]):
                if process.info["username"] == server.user and process.info["cmdline"]:
                    sampled.add("\0".join(process.info["cmdline"]).encode())
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = execute_code(
            textwrap.dedent(code), backend="ssh", backend_options=server.options(), timeout=20
        )
    finally:
        done.set()
        sampler.join()
    assert result.status == "success", result.output
    token = re.search(r"^TOKEN (\S+)$", result.output, re.M)
    seen = re.search(r"^SEEN (\d+) HITS (.*)$", result.output, re.M)
    assert token and seen
    assert len(token.group(1)) >= 32
    assert int(seen.group(1)) > 0 and seen.group(2) == "[]"
    assert any(b"_hermes_relay" in line for line in sampled), "the sampler missed the run"
    assert any(b"sleep 1" in line for line in sampled), "the sampler missed the tool call"
    assert not [line for line in sampled if token.group(1).encode() in line]


# Another client of the test server: runs a script that writes "PID STAGE" to MARKS/pid
# and waits for MARKS/go, then writes the run's status to MARKS/status. With DETACH 1
# it first forks and its parent exits, so it runs outside the test's process tree.
OTHER_CLIENT = """
import json, os, sys
options, marks, detach = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
if detach and os.fork():
    os._exit(0)
from hermes_sandbox import execute_code
code = '''
import os, time
marks = os.environ["MARKS"]
with open(marks + "/pid", "w") as f:
    f.write("%d %s" % (os.getpid(), os.path.dirname(os.path.abspath(__file__))))
end = time.monotonic() + 30
while not os.path.exists(marks + "/go") and time.monotonic() < end:
    time.sleep(0.02)
'''
result = execute_code(
    code, backend="ssh", backend_options=options, env={"MARKS": marks}, timeout=40
)
with open(marks + "/status", "w") as f:
    f.write(result.status + " " + result.output[-500:])
"""


def test_the_server_check_counts_this_tests_processes_not_another_clients(
    server: Server,
) -> None:
    """Other sessions on this machine log in as the test user too (a benchmark, another
    suite): the ``server`` fixture neither counts nor kills their runs, nor their
    stages (it once failed a test with another session's relay and script, and killed
    them), and still counts this test's own."""
    marks = shared_tmp(server)
    options = json.dumps(server.options())
    clients = {"detached": "1", "own": "0"}  # detached: outside this process's tree
    hosts = []
    try:
        for name, detach in clients.items():
            (marks / name).mkdir(mode=0o777)
            (marks / name).chmod(0o777)
            argv = [sys.executable, "-c", OTHER_CLIENT, options, str(marks / name), detach]
            hosts.append(subprocess.Popen(argv))
        started = {name: wait_for_file(marks / name / "pid").split() for name in clients}
        pids = {name: int(pid) for name, (pid, _) in started.items()}
        stages = {name: stage for name, (_, stage) in started.items()}
        mine, theirs = processes_by_owner(server)
        assert pids["detached"] in theirs, (mine, theirs)
        assert pids["own"] in mine and pids["own"] not in theirs, (mine, theirs)
        assert set(user_processes(server)) == set(mine)
        found = stage_dirs(server)
        assert stages["own"] in found
        assert stages["detached"] not in found, found
    finally:
        for name in clients:
            (marks / name / "go").touch()
        for host in hosts:
            host.wait(SETTLE_SECONDS)
        statuses = {name: wait_for_file(marks / name / "status") for name in clients}
        shutil.rmtree(marks, ignore_errors=True)
    assert all(status.startswith("success") for status in statuses.values()), statuses


def test_nothing_is_left_behind(server: Server) -> None:
    """A script that leaves a detached process behind and exits: the relay kills it,
    the stage directory goes; the ``server`` fixture checks for the rest."""
    scratch = shared_tmp(server)
    code = f"""
        import os, subprocess
        child = subprocess.Popen(["sleep", "60"], start_new_session=True)
        open("{scratch}/pid", "w").write(str(child.pid))
        print(os.path.dirname(os.path.abspath(__file__)))
    """
    try:
        result = execute_code(
            textwrap.dedent(code), backend="ssh", backend_options=server.options(), timeout=20
        )
        assert result.status == "success", result.output
        stage = result.output.strip()
        assert STAGE_RE.match(os.path.basename(stage)), stage
        assert not os.path.exists(stage)
        assert wait_gone([int((scratch / "pid").read_text())]) == []
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def count_execs(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The argv of every exec the ssh backend opens from now on."""
    seen: list[list[str]] = []
    original = SSHEnvironment._open_exec

    async def counted(self: SSHEnvironment, argv: list[str], **kwargs: Any) -> Any:
        seen.append(list(argv))
        return await original(self, argv, **kwargs)

    monkeypatch.setattr(SSHEnvironment, "_open_exec", counted)
    return seen


def test_a_run_is_one_exec_that_makes_and_removes_its_stage(
    server: Server, own_known_hosts: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a probed connection a one-shot run opens one exec: it makes the stage, the
    relay runs the script and removes the stage, so no stage exec and no removal exec."""
    options = {**server.options(), "known_hosts": own_known_hosts}
    first = execute_code("print(1)", backend="ssh", backend_options=options, timeout=20)
    assert first.output.strip() == "1"
    execs = count_execs(monkeypatch)
    code = "import os; print(os.path.dirname(os.path.abspath(__file__)))"
    result = execute_code(code, backend="ssh", backend_options=options, timeout=20)
    assert result.status == "success", result.output
    stage = result.output.strip()
    assert STAGE_RE.match(os.path.basename(stage)), stage
    assert not os.path.exists(stage)
    assert len(execs) == 1, execs
    assert "relay" in execs[0] and stage in execs[0]


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("raise SystemExit(3)", "error"),  # the relay removes the stage and says so
        # The relay killed: it reports nothing, so the host removes the stage itself. The
        # script outlives its relay, out of the runner's reach (docs/security.md, "Known
        # limits"), for a second: the server fixture waits for it to end.
        ("import os, signal, time; os.kill(os.getppid(), signal.SIGKILL); time.sleep(1)", None),
    ],
)
def test_no_stage_is_left_behind_whoever_ends_the_run(
    server: Server, monkeypatch: pytest.MonkeyPatch, code: str, status: str | None
) -> None:
    """A crashed script, or a relay that was killed: the ``server`` fixture checks that
    the stage is gone; an rm exec is opened only where the relay did not remove it."""
    execs = count_execs(monkeypatch)
    result = execute_code(code, backend="ssh", backend_options=server.options(), timeout=20)
    if status is not None:
        assert result.status == status, result.output
    removals = [argv for argv in execs if argv[:2] == ["rm", "-rf"]]
    assert len(removals) == (0 if status else 1), execs


def test_connection_is_reused_by_consecutive_runs(server: Server, own_known_hosts: str) -> None:
    options = server.options(known_hosts=own_known_hosts)
    config = SSHSettings.from_mapping(options)
    logins_before = server.accepted_ports() if server.log else []
    for _ in range(3):
        result = execute_code("print('ok')", backend="ssh", backend_options=options, timeout=20)
        assert result.status == "success", result.output
    stats = pool_stats(config)
    assert stats.connections_made == 1
    assert stats.open_connections == 1 and stats.users == 0  # idle, kept for the next run
    if server.log:
        new = server.accepted_ports()[len(logins_before) :]
        ours = [port for port in new if port in stats.local_ports]
        assert ours == list(stats.local_ports), f"sshd logged logins from {new}"
    # A dead connection is replaced, not reused.
    kill_connection(config)
    deadline = time.monotonic() + 5
    while pool_stats(config).open_connections and time.monotonic() < deadline:
        time.sleep(0.02)
    result = execute_code("print('again')", backend="ssh", backend_options=options, timeout=20)
    assert result.status == "success", result.output
    assert pool_stats(config).connections_made == 2


def test_idle_connection_closes_after_its_idle_time(server: Server, own_known_hosts: str) -> None:
    # Long enough for the check below to find the connection open on a loaded machine.
    options = server.options(known_hosts=own_known_hosts, idle_timeout=1.5)
    config = SSHSettings.from_mapping(options)
    assert execute_code("print(1)", backend="ssh", backend_options=options).status == "success"
    ports = pool_stats(config).local_ports
    assert len(ports) == 1 and server_processes(ports[0])
    deadline = time.monotonic() + 5
    while pool_stats(config).open_connections and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool_stats(config).open_connections == 0
    deadline = time.monotonic() + 5
    while server_processes(ports[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not server_processes(ports[0]), "sshd still serves the closed connection"


def test_idle_connections_hold_no_thread_each(
    server: Server, tmp_path: Path, own_known_hosts: str
) -> None:
    """A released share waits out its idle time on the pool's one clock thread, not on
    a timer thread of its own (one per release, started on the run's path): three idle
    connections, and no timer thread among this process's threads; each still closes
    after its idle time."""
    configs = []
    for n in range(3):
        known_hosts = tmp_path / f"known_hosts_{n}"  # a pool key, so a connection, each
        shutil.copyfile(own_known_hosts, known_hosts)
        options = server.options(known_hosts=str(known_hosts), idle_timeout=2.0)
        result = execute_code("print(1)", backend="ssh", backend_options=options, timeout=20)
        assert result.status == "success", result.output
        configs.append(SSHSettings.from_mapping(options))
    assert all(pool_stats(config).open_connections == 1 for config in configs)
    timers = [t.name for t in threading.enumerate() if isinstance(t, threading.Timer)]
    assert not timers, f"idle shares hold timer threads: {timers}"
    assert [t.name for t in threading.enumerate()].count("hermes-ssh-pool") == 1
    assert wait_for(lambda: not any(pool_stats(c).open_connections for c in configs), 10.0)


def test_server_going_away_mid_run_ends_the_run(server: Server, own_known_hosts: str) -> None:
    """The sshd processes serving the run's connection are killed while the script
    sleeps: the run ends at once as an error, and the script dies with its relay."""
    scratch = shared_tmp(server)
    options = server.options(known_hosts=own_known_hosts, idle_timeout=0)
    config = SSHSettings.from_mapping(options)
    code = f"""
        import os, time
        open("{scratch}/pid", "w").write(str(os.getpid()))
        print("sleeping", flush=True)
        time.sleep(60)
    """
    killed: list[int] = []

    def crash_the_server() -> None:
        wait_for_file(scratch / "pid")
        killed.extend(kill_connection(config))

    crasher = threading.Thread(target=crash_the_server)
    crasher.start()
    try:
        started = time.monotonic()
        result = execute_code(
            textwrap.dedent(code), backend="ssh", backend_options=options, timeout=30
        )
        elapsed = time.monotonic() - started
        crasher.join()
        assert killed
        assert result.status == "error", result.output
        assert result.exit_code != 0
        assert "sleeping" in result.output
        assert elapsed < 10, f"the run took {elapsed:.1f} s to notice"
        assert wait_gone([int((scratch / "pid").read_text())]) == []
    finally:
        crasher.join()
        shutil.rmtree(scratch, ignore_errors=True)


SESSION_HOST = """
import json, os, sys, time
from hermes_sandbox import Session
s = Session(persistent=True, backend="ssh", backend_options=json.loads(sys.argv[1]), timeout=60)
s.start()
result = s.run("import hermes_tools, os; print(os.getcwd()); print(hermes_tools.__file__)")
print(result.output, flush=True)
time.sleep(600)
"""


def test_a_session_whose_host_dies_leaves_nothing_on_the_server(
    server: Server, own_known_hosts: str
) -> None:
    """The host holding a persistent session is killed (SIGKILL: no clean-up of its
    own). The relay sees its input end: it kills the interpreter and removes the stage
    and the session's workspace, which the host's death orphaned too (the ``server``
    fixture checks that no process and no directory of the test user is left)."""
    options = json.dumps(server.options(known_hosts=own_known_hosts))
    with subprocess.Popen(
        [sys.executable, "-c", SESSION_HOST, options], stdout=subprocess.PIPE, text=True
    ) as host:
        try:
            assert host.stdout is not None
            workspace, stub = host.stdout.readline().strip(), host.stdout.readline().strip()
            made = {Path(workspace), Path(stub).parent}
            assert all(path.is_dir() for path in made), (workspace, stub)
        finally:
            host.kill()
            host.wait(SETTLE_SECONDS)
    deadline = time.monotonic() + SETTLE_SECONDS
    while any(path.exists() for path in made) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [path for path in made if path.exists()], "left on the server by a dead host"


@pytest.mark.anyio
async def test_a_lost_connection_breaks_the_stream_and_says_so(
    server: Server, own_known_hosts: str
) -> None:
    config = server.config(known_hosts=own_known_hosts, idle_timeout=0)
    async with SSHEnvironment(config) as env:
        # cat ends when its stdin does: when sshd's side of the session dies.
        stream = await env.open_exec_stream(["cat"])
        try:
            await anyio.to_thread.run_sync(kill_connection, config)
            with anyio.fail_after(5), pytest.raises(anyio.BrokenResourceError, match="lost"):
                await stream.receive()
            assert await stream.wait() == 255
            assert b"SSH connection to" in stream.stderr_tail
        finally:
            await stream.aclose()
        # The environment reconnects for what comes next.
        assert (await env.execute("echo back")).output == "back\n"


@pytest.mark.anyio
async def test_a_command_cut_off_by_a_lost_connection_is_killed(
    server: Server, own_known_hosts: str
) -> None:
    """execute() fails at once when the connection dies under a running command, and
    the command (which would go on running: it never reads its stdin) is killed
    through a new connection by its marker."""
    scratch = shared_tmp(server)
    pid_file = scratch / "pid"
    config = server.config(known_hosts=own_known_hosts, idle_timeout=0)
    try:
        async with SSHEnvironment(config) as env:

            async def crash() -> None:
                await anyio.to_thread.run_sync(wait_for_file, pid_file)
                await anyio.to_thread.run_sync(kill_connection, config)

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(crash)
                with anyio.fail_after(10), pytest.raises(EnvironmentFailure, match="broke"):
                    await env.execute(f"echo $$ > {pid_file}; exec sleep 60")
            pid = int(pid_file.read_text())
            assert await anyio.to_thread.run_sync(wait_gone, [pid], 3.0) == []
            assert pool_stats(config).connections_made == 2
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# -- clear errors ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_refused_key_names_the_key_file(sshd: Server, tmp_path: Path) -> None:
    key = await anyio.to_thread.run_sync(make_key, tmp_path / "stranger")
    env = SSHEnvironment(sshd.config(key_file=str(key)))
    with pytest.raises(BackendNotAvailable) as caught:
        await env.start()
    message = str(caught.value)
    assert str(key) in message and "refused" in message and "authorized_keys" in message
    missing = SSHEnvironment(sshd.config(key_file=str(tmp_path / "nope")))
    with pytest.raises(BackendNotAvailable, match="does not exist"):
        await missing.start()


def test_a_refused_key_fails_a_whole_run_clearly(sshd: Server, tmp_path: Path) -> None:
    key = make_key(tmp_path / "stranger")
    with pytest.raises(BackendNotAvailable, match="refused the key"):
        execute_code("print(1)", backend="ssh", backend_options=sshd.options(key_file=str(key)))


@pytest.mark.anyio
async def test_unknown_host_key_refused_then_accepted_and_recorded(
    server: Server, tmp_path: Path
) -> None:
    known_hosts = tmp_path / "ssh" / "known_hosts"
    strict = server.config(known_hosts=str(known_hosts), idle_timeout=0)
    with pytest.raises(BackendNotAvailable) as caught:
        await SSHEnvironment(strict).start()
    message = str(caught.value)
    assert str(known_hosts) in message and "accept_new_host_keys" in message
    assert not known_hosts.exists()

    trusting = server.config(
        known_hosts=str(known_hosts), accept_new_host_keys=True, idle_timeout=0
    )
    async with SSHEnvironment(trusting) as env:
        assert (await env.execute("whoami")).output.strip() == server.user
    recorded = (await anyio.Path(known_hosts).read_text()).split()
    expected = (await anyio.Path(server.known_hosts).read_text()).split()
    assert recorded[:3] == expected[:3]  # [127.0.0.1]:PORT ssh-ed25519 KEY
    assert (await anyio.Path(known_hosts).stat()).st_mode & 0o777 == 0o600

    async with SSHEnvironment(strict) as env:  # now known: strict checking passes
        assert (await env.execute("true")).exit_code == 0


@pytest.mark.anyio
async def test_a_changed_host_key_is_refused_even_when_accepting_new_ones(
    sshd: Server, tmp_path: Path
) -> None:
    other = await anyio.to_thread.run_sync(make_key, tmp_path / "other")
    public = await anyio.Path(f"{other}.pub").read_text()
    known_hosts = anyio.Path(tmp_path / "known_hosts")
    name = f"[{sshd.host}]:{sshd.port}"
    await known_hosts.write_text(f"{name} {' '.join(public.split()[:2])}\n")
    config = sshd.config(known_hosts=str(known_hosts), accept_new_host_keys=True)
    with pytest.raises(BackendNotAvailable, match="not the one recorded") as caught:
        await SSHEnvironment(config).start()
    assert "ssh-keygen -R" in str(caught.value)


@pytest.mark.anyio
async def test_missing_remote_python_is_clear(server: Server) -> None:
    env = SSHEnvironment(server.config(python="python3-nope"))
    with pytest.raises(BackendNotAvailable) as caught:
        await env.start()
    message = str(caught.value)
    assert "python3-nope" in message and "install python3" in message
    assert "python setting" in message
    assert pool_stats(server.config(python="python3-nope")).users == 0  # share given back


def test_missing_remote_python_fails_a_whole_run_clearly(server: Server) -> None:
    with pytest.raises(BackendNotAvailable, match="install python3"):
        execute_code(
            "print(1)", backend="ssh", backend_options=server.options(python="/nope/python3")
        )


@pytest.mark.anyio
async def test_a_python_without_its_standard_library_is_clear(server: Server) -> None:
    """A real interpreter that cannot import json (as with Debian's python3-minimal)."""
    scratch = shared_tmp(server)
    fake = scratch / "python3-minimal"
    fake.write_text(
        "#!/bin/sh\n"
        'exec python3 -c \'import sys; sys.modules["json"] = None; '
        'code = sys.argv[2]; sys.argv = sys.argv[2:]; exec(code)\' "$@"\n'
    )
    fake.chmod(0o755)
    try:
        env = SSHEnvironment(server.config(python=str(fake)))
        with pytest.raises(BackendNotAvailable, match="lacks part of its standard library"):
            await env.start()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.mark.anyio
async def test_missing_workdir_is_clear(server: Server) -> None:
    env = SSHEnvironment(server.config(workdir="/no/such/workdir"))
    with pytest.raises(BackendNotAvailable, match="workdir /no/such/workdir does not exist"):
        await env.start()


@pytest.mark.anyio
async def test_a_closed_environment_refuses_work(server: Server) -> None:
    env = SSHEnvironment(server.config())
    with pytest.raises(EnvironmentFailure, match="not started"):
        await env.execute("true")
    await env.start()
    await env.aclose()
    await env.aclose()  # idempotent
    with pytest.raises(EnvironmentFailure, match="closed"):
        await env.execute("true")
    with pytest.raises(EnvironmentFailure, match="closed"):
        await env.start()


# -- scripts/sshd-service ----------------------------------------------------------------------


def _exports(stdout: str) -> dict[str, str]:
    values = {}
    for line in stdout.splitlines():
        words = shlex.split(line)
        assert len(words) == 2 and words[0] == "export", f"not an export line: {line!r}"
        name, _, value = words[1].partition("=")
        values[name] = value
    return values


def test_service_script_starts_a_second_server_reuses_it_and_stops_it(sshd: Server) -> None:
    """A server of its own (state directory, port): made from nothing, logged in to
    with strict host key checking, reused by a second call, stopped by ``stop``."""
    if os.geteuid() != 0:
        message = "scripts/sshd-service needs root to start sshd"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    state = f"/run/hermes-sandbox-sshd-test-{uuid.uuid4().hex[:8]}"
    settings = {
        **os.environ,
        "HERMES_SANDBOX_SSHD_DIR": state,
        "HERMES_SANDBOX_SSHD_PORT": str(sshd.port),  # taken: it must pick the next free one
        "HERMES_SANDBOX_SSHD_USER": sshd.user,
    }

    def service(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SERVICE), *args], env=settings, capture_output=True, text=True, timeout=60
        )

    try:
        first = service()
        assert first.returncode == 0, first.stderr
        values = _exports(first.stdout)
        assert set(values) == {
            f"HERMES_TEST_SSH_{n}"
            for n in ("HOST", "PORT", "USER", "KEY", "KNOWN_HOSTS", "PID", "LOG")
        }
        port, pid = int(values["HERMES_TEST_SSH_PORT"]), int(values["HERMES_TEST_SSH_PID"])
        assert port != sshd.port and not gone(pid)
        config = SSHSettings(
            host=values["HERMES_TEST_SSH_HOST"],
            port=port,
            user=values["HERMES_TEST_SSH_USER"],
            key_file=values["HERMES_TEST_SSH_KEY"],
            known_hosts=values["HERMES_TEST_SSH_KNOWN_HOSTS"],
            idle_timeout=0,
        )

        async def whoami() -> str:
            async with SSHEnvironment(config) as env:
                return (await env.execute("whoami")).output.strip()

        assert anyio.run(whoami) == sshd.user
        again = service()
        assert again.returncode == 0, again.stderr
        assert _exports(again.stdout) == values
        assert "reusing" in again.stderr
        stopped = service("stop")
        assert stopped.returncode == 0, stopped.stderr
        assert wait_gone([pid]) == []
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
            pass
    finally:
        service("stop")
        shutil.rmtree(state, ignore_errors=True)


# -- a cold run's round trips: the probe once per connection -------------------------------


def count_calls(monkeypatch: pytest.MonkeyPatch, name: str) -> list[Any]:
    """Record the positional arguments of every call of SSHEnvironment.<name>."""
    calls: list[Any] = []
    original = getattr(SSHEnvironment, name)

    async def counted(self: SSHEnvironment, *args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(SSHEnvironment, name, counted)
    return calls


def test_the_probe_runs_once_per_pooled_connection(
    server: Server, own_known_hosts: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    probes = count_calls(monkeypatch, "_run_probe")
    options = server.options(known_hosts=own_known_hosts)
    for _ in range(3):
        result = execute_code("print('ok')", backend="ssh", backend_options=options, timeout=20)
        assert result.status == "success", result.output
    assert len(probes) == 1
    # A new connection (the host may have changed under it) probes again.
    kill_connection(SSHSettings.from_mapping(options))
    deadline = time.monotonic() + 5
    while pool_stats(SSHSettings.from_mapping(options)).open_connections:
        assert time.monotonic() < deadline, "the killed connection still looks open"
        time.sleep(0.02)
    result = execute_code("print('again')", backend="ssh", backend_options=options, timeout=20)
    assert result.status == "success", result.output
    assert len(probes) == 2


@pytest.mark.anyio
async def test_a_failed_probe_is_not_remembered(server: Server, own_known_hosts: str) -> None:
    scratch = shared_tmp(server)
    workdir = scratch / "later"
    config = server.config(known_hosts=own_known_hosts, workdir=str(workdir))
    try:
        with pytest.raises(BackendNotAvailable, match="does not exist"):
            await SSHEnvironment(config).start()
        workdir.mkdir(mode=0o777)
        workdir.chmod(0o777)
        async with SSHEnvironment(config) as env:
            assert env.default_cwd == str(workdir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_the_relay_imports_nothing_from_the_scripts_working_directory(server: Server) -> None:
    """The relay runs in the script's working directory, which anyone with access to it
    may fill: modules there named as the relay's imports are never imported."""
    scratch = shared_tmp(server)
    names = ["selectors", "socket", "struct", "subprocess", "shutil", "signal", "msgpack"]
    try:
        for name in names:
            (scratch / f"{name}.py").write_text(
                f"open({str(scratch / ('imported-' + name))!r}, 'w').close()\n"
                "raise SystemExit('imported from the working directory')\n"
            )
        result = execute_code(
            "print('ran')",
            backend="ssh",
            backend_options=server.options(),
            cwd=str(scratch),
            timeout=20,
        )
        assert result.status == "success", result.output
        assert result.output.strip() == "ran"
        assert not list(scratch.glob("imported-*"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_relayed_calls_are_answered_on_the_transport_thread(server: Server) -> None:
    """Over the ssh relay the host answers a call that can be answered at once on
    paramiko's transport thread, right where it received it: no task woken, and no
    hop to the event loop's thread (its wake-up pipe left alone). A call that cannot
    (a plain tool) still runs, answered from the loop."""
    import threading

    import paramiko

    from hermes_sandbox.tools.registry import ToolRegistry

    on_transport: list[bool] = []
    plain_on_transport: list[bool] = []

    def where(args: dict[str, Any]) -> str:
        on_transport.append(isinstance(threading.current_thread(), paramiko.Transport))
        return "ok"

    def plain(args: dict[str, Any]) -> str:
        plain_on_transport.append(isinstance(threading.current_thread(), paramiko.Transport))
        return "plain"

    registry = ToolRegistry()
    for name, handler, inline in (("where", where, True), ("plain", plain, False)):
        schema = {"name": name, "description": "Note where it ran.", "parameters": {}}
        registry.register(name, "test", schema, handler, inline=inline)
    result = execute_code(
        "from hermes_tools import where, plain\n"
        "for _ in range(5):\n"
        "    where()\n"
        "    assert plain() == 'plain'\n"
        "print('done')",
        backend="ssh",
        backend_options=server.options(),
        transport="relay",
        tools=("where", "plain"),
        registry=registry,
        timeout=30,
    )
    assert result.status == "success", result.output
    assert len(on_transport) == 5
    # The first call may come in one read with the connection's opening, which the
    # loop's task acts on; the calls after it come alone.
    assert on_transport[1:] == [True] * 4
    assert plain_on_transport == [False] * 5


def test_relayed_output_and_calls_keep_their_order(server: Server) -> None:
    """Output read on the transport thread waits in order for the loop's task, and
    calls behind it are answered after it: bursts of output between calls arrive
    whole and in order, and every call gets its own answer."""
    code = (
        "import sys\n"
        "from hermes_tools import echo\n"
        "for burst in range(20):\n"
        "    sys.stdout.write(''.join('%d.%d\\n' % (burst, i) for i in range(300)))\n"
        "    sys.stdout.flush()\n"
        "    assert echo(n=burst) == {'n': burst}, burst\n"
        "print('done')"
    )
    from hermes_sandbox.tools.registry import ToolRegistry

    registry = ToolRegistry()
    schema = {
        "name": "echo",
        "description": "Echo.",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}},
    }
    registry.register("echo", "test", schema, lambda args: json.dumps(args), inline=True)
    result = execute_code(
        code,
        backend="ssh",
        backend_options=server.options(),
        transport="relay",
        tools=("echo",),
        registry=registry,
        timeout=60,
    )
    assert result.status == "success", result.output[-2000:]
    expected = [f"{burst}.{i}" for burst in range(20) for i in range(300)] + ["done"]
    assert result.output.splitlines() == expected
    assert result.tool_calls_made == 20


@pytest.mark.anyio
async def test_relayed_output_past_the_hold_pauses_the_channel_from_the_transport_thread(
    server: Server,
) -> None:
    """A stand-in relay over a real channel floods output past what the host holds,
    with a call behind it, then sends calls one at a time: the channel is paused from
    the transport thread that read the output and resumed by the loop, the output
    arrives whole and in order to a slow reader, the call behind it is answered after
    it, and the calls sent alone are answered on the transport thread."""
    import threading

    import msgpack
    import paramiko

    from hermes_sandbox.rpc import relay as host_relay
    from hermes_sandbox.rpc.framing import encode_frame
    from hermes_sandbox.rpc.server import RPCServer

    token = "t" * 43

    class Answers:
        def __init__(self) -> None:
            self.answered: list[tuple[str, bool]] = []

        def answer_now(self, request: Any) -> str:
            on_transport = isinstance(threading.current_thread(), paramiko.Transport)
            self.answered.append((str(request.args["n"]), on_transport))
            return str(request.args["n"])

        async def __call__(self, request: Any) -> str:
            raise AssertionError("answered at once")

    outputs = 3 * host_relay._HELD_MESSAGES
    first = encode_frame({"op": "started", "pid": 42, "relay_pid": 41}) + encode_frame(
        {"op": "open", "conn": 1}
    )
    first += b"".join(
        encode_frame({"op": "out", "fd": 1, "data": b"%d\n" % i}) for i in range(outputs)
    )
    calls = []
    for n in range(5):
        request = {"id": n, "tool": "echo", "args": {"n": n}, "token": token}
        body = msgpack.packb(request, use_bin_type=True)
        calls.append(
            encode_frame({"op": "rpc", "conn": 1, "data": len(body).to_bytes(4, "big") + body})
        )
    program = f"""
import os
def put(b):
    while b:
        b = b[os.write(1, b):]
def take(n):
    got = b""
    while len(got) < n:
        chunk = os.read(0, n - len(got))
        if not chunk:
            raise SystemExit(3)
        got += chunk
    return got
def reply():
    take(int.from_bytes(take(4), "big"))
put({first + calls[0]!r})
reply()
for call in {calls[1:]!r}:
    put(call)
    reply()
put({encode_frame({"op": "exit", "code": 0})!r})
"""
    answers = Answers()
    async with SSHEnvironment(server.config()) as env:
        stream = await env.open_exec_stream(["python3", "-c", program])
        paused_on: list[bool] = []
        pause = stream.pause_reading

        def noting_pause() -> None:  # a spy: the real pause runs
            paused_on.append(isinstance(threading.current_thread(), paramiko.Transport))
            pause()

        stream.pause_reading = noting_pause  # type: ignore[method-assign]
        async with host_relay.RelaySession(stream, RPCServer(answers, token=token)) as session:
            got, status = await read_relay_slowly(session)
            assert status == 0
    assert got == b"".join(b"%d\n" % i for i in range(outputs))
    assert [n for n, _ in answers.answered] == ["0", "1", "2", "3", "4"]
    assert True in paused_on  # paused from the transport thread
    # The call behind the output was answered by the loop's task, after it; the calls
    # sent alone on the transport thread (the first of them may come before the loop
    # has resumed the channel, and be read by the loop).
    where = [on_transport for _, on_transport in answers.answered]
    assert where[0] is False
    assert where[2:] == [True] * 3


# -- the standby relay: started ahead of the next run on a pooled connection -------------


def standbys(server: Server, config: SSHSettings | None = None) -> set[int]:
    """The test user's relays started ahead of a run (named ``hermes-standby``); with
    ``config``, only those on its pooled connection (children of the sshd serving it)."""
    found = set(user_processes(server, standbys=True)) - set(user_processes(server))
    if config is None:
        return found
    ports = pool_stats(config).local_ports
    serving = {process.pid for port in ports for process in server_processes(port)}
    mine = set()
    for pid in found:
        try:
            if psutil.Process(pid).ppid() in serving:
                mine.add(pid)
        except psutil.Error:  # gone meanwhile
            continue
    return mine


def wait_for(predicate: Any, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


PARENT_SCRIPT = """
import os
from hermes_tools import read_file
assert "error" in read_file("/nonexistent/file")  # a tool call, over the relay's RPC
ppid = os.getppid()
with open("/proc/%d/comm" % ppid) as f:
    comm = f.read().strip()
with open("/proc/%d/cmdline" % ppid, "rb") as f:
    argv = f.read().split(b"\\0")
print(comm, argv[5].decode() if len(argv) > 5 else "?")
"""


def test_a_run_after_a_relayed_run_takes_the_standby_relay(
    server: Server, own_known_hosts: str
) -> None:
    """After a relayed run the pool starts a relay for the next run on the same
    connection; the next run is handed to it (its relay is the standby renamed, not a
    new exec) and a new standby follows it."""
    options = server.options(known_hosts=own_known_hosts)
    config = SSHSettings.from_mapping(options)
    first = execute_code(PARENT_SCRIPT, backend="ssh", backend_options=options, timeout=20)
    assert first.status == "success", first.output
    assert first.output.split() == ["python3", "relay"]  # a relay exec of its own
    assert wait_for(lambda: pool_stats(config).standby_relays == 1)
    [ahead] = standbys(server, config)
    second = execute_code(PARENT_SCRIPT, backend="ssh", backend_options=options, timeout=20)
    assert second.status == "success", second.output
    assert second.output.split() == ["hermes-relay", "standby"]
    assert wait_for(lambda: pool_stats(config).standby_relays == 1)
    assert ahead not in standbys(server), "the standby that took the run is gone"
    assert len(standbys(server, config)) == 1
    assert pool_stats(config).connections_made == 1


def test_a_standby_relay_goes_with_its_connection(server: Server, own_known_hosts: str) -> None:
    """Nothing is left behind by the relay started ahead: when the pool closes the
    connection (idle time, exit) the standby, which has made nothing, exits."""
    options = server.options(known_hosts=own_known_hosts, idle_timeout=2.0)
    config = SSHSettings.from_mapping(options)
    result = execute_code("print(1)", backend="ssh", backend_options=options, timeout=20)
    assert result.status == "success", result.output
    assert wait_for(lambda: pool_stats(config).standby_relays == 1)
    ahead = standbys(server, config)
    assert len(ahead) == 1
    assert wait_for(lambda: not pool_stats(config).open_connections)
    assert wait_for(lambda: not ahead & standbys(server), 5.0), "the standby outlived the pool"


def test_no_standby_relay_when_turned_off(server: Server, own_known_hosts: str) -> None:
    options = server.options(known_hosts=own_known_hosts, standby_relay=False)
    config = SSHSettings.from_mapping(options)
    for _ in range(2):
        result = execute_code(PARENT_SCRIPT, backend="ssh", backend_options=options, timeout=20)
        assert result.output.split() == ["python3", "relay"], result.output
    time.sleep(0.5)  # a standby would be ready by now (tens of ms)
    assert pool_stats(config).standby_relays == 0
    assert not standbys(server, config)


def test_a_dead_standby_relay_is_not_handed_a_run(server: Server, own_known_hosts: str) -> None:
    """A standby killed on the remote is dropped, and the next run starts its own relay."""
    options = server.options(known_hosts=own_known_hosts)
    config = SSHSettings.from_mapping(options)
    assert execute_code("print(1)", backend="ssh", backend_options=options).status == "success"
    assert wait_for(lambda: pool_stats(config).standby_relays == 1)
    [ahead] = standbys(server, config)
    os.kill(ahead, signal.SIGKILL)
    assert wait_for(lambda: pool_stats(config).standby_relays == 0)
    result = execute_code(PARENT_SCRIPT, backend="ssh", backend_options=options, timeout=20)
    assert result.output.split() == ["python3", "relay"], result.output


PRYING_SCRIPT = """
import json, os, sys, time
found, tried = None, {}
deadline = time.time() + 15
while found is None and time.time() < deadline:
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open("/proc/%s/comm" % name) as f:
                comm = f.read().strip()
            uid = os.stat("/proc/%s" % name).st_uid
        except OSError:
            continue
        if comm == "hermes-standby":
            found = int(name)
            break
    time.sleep(0.02)
if found is not None:
    for what in ("environ", "mem", "fd/0", "fd/1", "cwd/."):
        try:
            if what.startswith("cwd"):
                os.listdir("/proc/%d/cwd" % found)
            else:
                os.close(os.open("/proc/%d/%s" % (found, what), os.O_RDONLY))
            tried[what] = "opened"
        except OSError as exc:
            tried[what] = type(exc).__name__
print(json.dumps({"found": found, "tried": tried}))
"""


def test_a_script_cannot_reach_into_a_standby_relay(server: Server, own_known_hosts: str) -> None:
    """Attack: a script that runs while the pool holds a relay started ahead for the
    next run (which may be another task's) looks for it among its user's processes and
    tries to open its environment, memory, descriptors and working directory: the
    standby is not dumpable, so every one is refused to processes of the same user."""
    options = server.options(known_hosts=own_known_hosts)
    config = SSHSettings.from_mapping(options)
    outcome: dict[str, Any] = {}

    def pry() -> None:
        outcome["result"] = execute_code(
            PRYING_SCRIPT, backend="ssh", backend_options=options, timeout=30
        )

    prying = threading.Thread(target=pry)
    prying.start()
    try:
        # A quick run beside it: once it ends, the pool starts a standby.
        assert execute_code("print(1)", backend="ssh", backend_options=options).status == "success"
        assert wait_for(lambda: pool_stats(config).standby_relays == 1)
    finally:
        prying.join()
    result = outcome["result"]
    assert result.status == "success", result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report["found"] is not None, "the script did not see the standby"
    assert report["tried"] and "opened" not in report["tried"].values(), report


@pytest.mark.anyio
async def test_a_standby_runs_the_relay_the_run_stages(
    server: Server, own_known_hosts: str
) -> None:
    """A standby has loaded the runtime's relay; a run that stages another one (here a
    stand-in that prints) gets that one run, as a relay exec of its own would."""
    config = server.config(known_hosts=own_known_hosts)
    assert (
        execute_code(
            "print(1)", backend="ssh", backend_options=server.options(known_hosts=own_known_hosts)
        ).status
        == "success"
    )
    assert wait_for(lambda: pool_stats(config).standby_relays == 1)
    async with SSHEnvironment(config) as env:
        made = env.fresh_stage_path("hermes-sandbox-")
        assert made is not None
        stream = await env.open_relay(
            made, [], files={"_hermes_relay.py": b"print('ran')\n"}, make_stage=True
        )
        out = b"".join([chunk async for chunk in stream])
        assert (out, await stream.wait()) == (b"ran\n", 0)
        # Taken (the next one is started once this stream is closed).
        assert pool_stats(config).standby_relays == 0, "the run did not take the standby"
        await stream.aclose()
        await env.remove_tree(made)


def test_a_run_returns_once_its_relay_has_ended(server: Server, own_known_hosts: str) -> None:
    """Nothing of a run is still running when it returns: not the script (killed before
    the relay's exit report) and not the relay, which leaves right after that report
    (os._exit, no interpreter teardown) and whose channel's end the run waits for.
    (With neither, most runs returned with their relay still exiting.)"""
    options = server.options(known_hosts=own_known_hosts)
    still = []
    for _ in range(20):
        result = execute_code(
            "import os; print(os.getppid())", backend="ssh", backend_options=options, timeout=20
        )
        assert result.status == "success", result.output
        relay = int(result.output.split()[-1])
        if not gone(relay):
            still.append(relay)
    assert not still, f"runs returned with their relay still running: {still}"


@pytest.mark.anyio
async def test_an_environment_left_open_past_the_pools_close_says_so(
    server: Server, own_known_hosts: str
) -> None:
    """close_pooled_connections() ends the connections of environments still open (as
    at exit): their next command fails saying why, and opens no connection the pool
    would never close."""
    config = server.config(known_hosts=own_known_hosts)
    async with SSHEnvironment(config) as env:
        assert (await env.execute("echo hi")).output.strip() == "hi"
        close_pooled_connections()
        with pytest.raises(EnvironmentFailure, match="was closed"):
            await env.execute("echo again")
    assert pool_stats(config).connections_made == 0  # the share is gone, none was made
