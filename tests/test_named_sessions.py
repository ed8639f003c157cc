"""Named sessions through the real command line: ``run --session NAME``, ``sessions``,
``sessions rm``. Each test has a sessions directory (and so a daemon) of its own, and
stops that daemon at its end."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from hermes_sandbox.environments.keeper import KEEPER_PATH
from tests.conftest import engine_problem, is_gone, require

CLI = [sys.executable, "-m", "hermes_sandbox"]
SERVE = [sys.executable, "-m", "hermes_sandbox.named_sessions", "serve"]
DIR_VARIABLE = "HERMES_SANDBOX_SESSIONS_DIR"
GONE_WITHIN = 30.0  # generous: a loaded 2-core machine


def daemon_pid(directory: Path) -> int | None:
    """The pid of the daemon serving ``directory`` (its socket's peer), or None."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(directory / "daemon.sock"))
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    finally:
        sock.close()
    return struct.unpack("3i", creds)[0]


def descendants(pid: int) -> set[int]:
    try:
        return {child.pid for child in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def interpreters(pid: int) -> set[int]:
    """What runs below the daemon but its keeper (environments/keeper.py), which stays
    as long as the daemon does."""
    found = set()
    for child in descendants(pid):
        try:
            if KEEPER_PATH not in psutil.Process(child).cmdline():
                found.add(child)
        except psutil.NoSuchProcess:
            pass
    return found


def wait_gone(pids: set[int], timeout: float = GONE_WITHIN) -> set[int]:
    """Those of ``pids`` still alive after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    alive = {pid for pid in pids if not is_gone(pid)}
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = {pid for pid in alive if not is_gone(pid)}
    return alive


def stop_daemon(directory: Path) -> None:
    pid = daemon_pid(directory)
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    if wait_gone({pid}):
        os.kill(pid, signal.SIGKILL)


class Sessions:
    """The command line with a private sessions directory."""

    def __init__(self, tmp_path: Path, directory: Path) -> None:
        self.cwd = tmp_path
        self.directory = directory
        self.env = dict(os.environ)
        self.env.pop("HERMES_SANDBOX_CONFIG", None)
        self.env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg-config")
        self.env[DIR_VARIABLE] = str(directory)

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, *args],
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
        )

    def script(self, name: str, code: str) -> str:
        path = self.cwd / name
        path.write_text(code)
        return str(path)

    def run_json(self, *args: str) -> dict:
        done = self("run", "--json", *args)
        assert "Traceback" not in done.stderr, done.stderr
        return json.loads(done.stdout)

    def listed(self) -> list[dict]:
        done = self("sessions", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    @property
    def pid(self) -> int:
        pid = daemon_pid(self.directory)
        assert pid is not None, "no daemon answers"
        return pid


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[Sessions]:
    directory = tmp_path / "sessions"
    cli = Sessions(tmp_path, directory)
    try:
        yield cli
    finally:
        stop_daemon(directory)


def test_state_survives_runs_is_listed_and_removed(sessions: Sessions) -> None:
    first = sessions.script("first.py", "x = 41\n")
    second = sessions.script("second.py", "x += 1\nprint(x)\n")
    done = sessions("run", "--session", "s1", first)
    assert done.returncode == 0, done.stderr
    result = sessions.run_json("--session", "s1", second)
    assert result["status"] == "success", result
    assert result["output"] == "42\n"
    assert result["interpreter_started"] is False
    plain = sessions("run", "--session", "s1", second)  # printed as a normal run
    assert (plain.returncode, plain.stdout) == (0, "43\n"), plain.stderr

    [row] = sessions.listed()
    assert (row["name"], row["backend"], row["alive"], row["runs"]) == ("s1", "local", True, 3)
    assert "s1" in sessions("sessions").stdout

    held = interpreters(sessions.pid)
    assert held, "the session's interpreter runs under the daemon"
    done = sessions("sessions", "rm", "s1")
    assert (done.returncode, done.stdout) == (0, "removed s1\n"), done.stderr
    assert not wait_gone(held), "the interpreter outlived `sessions rm`"
    assert sessions.listed() == []
    again = sessions("sessions", "rm", "s1")
    assert again.returncode == 2 and "no session named 's1'" in again.stderr


def test_rm_all_removes_every_session(sessions: Sessions) -> None:
    script = sessions.script("a.py", "y = 1\n")
    for name in ("a", "b"):
        assert sessions("run", "--session", name, script).returncode == 0
    assert sorted(row["name"] for row in sessions.listed()) == ["a", "b"]
    held = interpreters(sessions.pid)
    done = sessions("sessions", "rm", "--all")
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == ["a", "b", "removed", "removed"]
    assert sessions.listed() == []
    assert not wait_gone(held)
    fresh = sessions.run_json("--session", "a", sessions.script("p.py", "print(y)\n"))
    assert fresh["status"] == "error" and "NameError" in (fresh["error"] or "")


def test_another_backend_for_a_name_is_refused(sessions: Sessions) -> None:
    script = sessions.script("a.py", "z = 1\n")
    assert sessions("run", "--session", "s", script).returncode == 0
    refused = sessions.run_json("--session", "s", "--backend", "docker", script)
    assert refused["status"] == "error"
    assert "runs on local, not docker" in refused["error"]
    other = sessions.run_json("--session", "s", "--env", "A=1", script)
    assert other["status"] == "error" and "other env" in other["error"]
    assert [row["backend"] for row in sessions.listed()] == ["local"]


def test_script_arguments_and_sessions_rm_usage_are_refused(sessions: Sessions) -> None:
    script = sessions.script("a.py", "pass\n")
    done = sessions("run", "--session", "s", script, "--", "arg")
    assert done.returncode == 2 and "no script arguments" in done.stderr
    done = sessions("sessions", "rm")
    assert done.returncode == 2 and "NAME or --all" in done.stderr
    # Checked here as for a run in this process, though the client loads no tools and
    # builds no approval policy of its own (the daemon does).
    done = sessions("run", "--session", "s", "--allow-command", "re:(", script)
    assert done.returncode == 2 and "--allow-command: allowlist entry 're:('" in done.stderr
    done = sessions("run", "--session", "s", "--toolsets", "nosuch", "--json", script)
    assert done.returncode == 2 and "unknown toolset: nosuch" in done.stderr
    assert json.loads(done.stdout)["status"] == "error"
    assert sessions("sessions").stdout == ""  # no daemon started for any of these


def test_dangerous_command_is_refused_without_an_allowlist(sessions: Sessions) -> None:
    target = sessions.cwd / "keep"
    target.mkdir()
    code = f"from hermes_tools import terminal\nprint(terminal('rm -rf {target}'))\n"
    script = sessions.script("danger.py", code)
    result = sessions.run_json("--session", "s", "--tools", "terminal", script)
    assert "no one can approve" in result["output"], result
    assert target.exists()


def test_socket_is_private_and_refuses_another_uid(sessions: Sessions) -> None:
    python = "/usr/bin/python3"  # one that nobody may run (not a venv under /root)
    if os.geteuid() != 0 or shutil.which("setpriv") is None or not os.path.exists(python):
        pytest.skip("running a client as nobody needs root, setpriv and /usr/bin/python3")
    # A directory nobody can reach once opened up, unlike pytest's 0700 tmp_path.
    outer = Path(tempfile.mkdtemp(prefix="hermes-named-"))
    sessions.directory = outer / "s"
    sessions.env[DIR_VARIABLE] = str(sessions.directory)
    try:
        assert sessions("run", "--session", "s", sessions.script("a.py", "v = 1\n")).returncode == 0
        sock = sessions.directory / "daemon.sock"
        assert stat.S_IMODE(os.stat(sessions.directory).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        client = (
            "import socket, struct, json, sys\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "try:\n"
            "    s.connect(sys.argv[1])\n"
            "except PermissionError:\n"
            "    print('no access'); sys.exit(0)\n"
            "data = json.dumps({'op': 'rm', 'all': True}).encode()\n"
            "try:\n"
            "    s.sendall(struct.pack('>I', len(data)) + data)\n"
            "    print('answer', s.recv(100))\n"
            "except (ConnectionResetError, BrokenPipeError):\n"  # closed unread: refused
            "    print('answer', b'')\n"
        )
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

        def attack() -> str:
            done = subprocess.run(
                [*as_nobody, python, "-c", client, str(sock)],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            return done.stdout.strip()

        os.chmod(outer, 0o711)
        assert attack() == "no access"  # the 0700 directory keeps it out
        # With the directory and the socket opened up, the peer's uid still counts.
        os.chmod(sessions.directory, 0o711)
        os.chmod(sock, 0o666)
        assert attack() == "answer b''"
        opened = sessions("sessions")  # and our own client will not use such a directory
        assert opened.returncode == 2 and "open to other users" in opened.stderr
        os.chmod(sessions.directory, 0o700)
        assert [row["name"] for row in sessions.listed()] == ["s"]  # the attack removed nothing
    finally:
        stop_daemon(sessions.directory)
        shutil.rmtree(outer, ignore_errors=True)


def test_killing_the_daemon_leaves_no_interpreter_and_no_directory(sessions: Sessions) -> None:
    script = sessions.script(
        "a.py", "import os, hermes_tools\nprint(os.getcwd())\nprint(hermes_tools.__file__)\n"
    )
    done = sessions("run", "--session", "k", script)
    assert done.returncode == 0, done.stderr
    workspace, stub = done.stdout.split()
    made = {Path(workspace), Path(stub).parent}  # the session's workspace and stage
    assert all(path.is_dir() for path in made), made
    pid = sessions.pid
    held = descendants(pid)
    assert held
    os.kill(pid, signal.SIGKILL)
    assert not wait_gone({pid})
    assert not wait_gone(held), "an interpreter outlived its daemon"
    deadline = time.monotonic() + GONE_WITHIN
    while any(path.exists() for path in made) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [path for path in made if path.exists()], "left behind by a killed daemon"


def test_an_idle_daemon_exits_and_removes_its_socket(tmp_path: Path) -> None:
    directory = tmp_path / "idle"
    daemon = subprocess.Popen(
        [*SERVE, str(directory), "--linger", "1"],
        stdin=subprocess.DEVNULL,
    )
    try:
        assert daemon.wait(timeout=60) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert not (directory / "daemon.sock").exists()


def test_docker_session_keeps_state_and_rm_removes_the_container(sessions: Sessions) -> None:
    require(engine_problem(), "docker backend tests need a container engine")
    import docker

    first = sessions.script("first.py", "import os\nseen = os.getpid()\n")
    second = sessions.script("second.py", "import os\nprint(seen == os.getpid())\n")
    done = sessions("run", "--session", "d", "--backend", "docker", first)
    assert done.returncode == 0, done.stderr
    result = sessions.run_json("--session", "d", "--backend", "docker", second)
    assert (result["status"], result["output"]) == ("success", "True\n"), result
    label = f"hermes-sandbox.owner-pid={sessions.pid}"
    client = docker.from_env()
    try:
        [container] = client.api.containers(filters={"label": label})
        done = sessions("sessions", "rm", "d")
        assert done.returncode == 0, done.stderr
        assert client.api.containers(all=True, filters={"id": container["Id"]}) == []
    finally:
        for entry in client.api.containers(all=True, filters={"label": label}):
            client.api.remove_container(entry["Id"], force=True, v=True)
        client.close()
