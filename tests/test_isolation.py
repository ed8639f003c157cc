"""The local backend under bubblewrap (environments/isolation.py), attacked through the
real command line: a script that writes outside its working directory, reads a home
directory, reaches a host port, looks at the host's processes, or outlives a killed
runner. Each attack is also run without isolation where that shows the test can fail.

The suite runs without isolation by default (conftest sets HERMES_SANDBOX_ISOLATION to
none); these tests ask for it. Where bwrap cannot run they skip, and fail under CI.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from conftest import bwrap_problem, marked_processes, require
from test_cli import CLI, assert_usage_error, cli, cli_env

from hermes_sandbox.environments.isolation import (
    ISOLATION_VARIABLE,
    BwrapProbe,
    Isolation,
    forget_bwrap_probe,
    probe_bwrap,
)
from hermes_sandbox.environments.local import LocalEnvironment
from hermes_sandbox.environments.local_settings import LocalSettings

BWRAP = ["--isolation", "bwrap"]


@pytest.fixture
def bwrap() -> None:
    require(bwrap_problem(), "isolation tests need a bubblewrap that works here")


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """The script's working directory, inside the test's directory."""
    path = tmp_path / "work"
    path.mkdir()
    return path


def run_script(
    work: Path, code: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``hermes-sandbox run`` of ``code`` in ``work``, with --json; the process."""
    script = work.parent / f"script-{uuid.uuid4().hex[:8]}.py"
    script.write_text(textwrap.dedent(code))
    return cli("run", str(script), "--json", "--cwd", str(work), *args, cwd=work, env=env)


def output(done: subprocess.CompletedProcess[str]) -> str:
    result = json.loads(done.stdout)
    assert result["status"] == "success", result
    return str(result["output"])


@pytest.fixture
def home_dir() -> Iterator[Path]:
    """A fresh directory in this user's home, removed afterwards."""
    home = Path.home().resolve()
    if not any(home == Path(h) or Path(h) in home.parents for h in ("/root", "/home")):
        pytest.skip(f"the home directory {home} is not under /root or /home")
    path = home / f".hermes-isolation-test-{uuid.uuid4().hex}"
    path.mkdir()
    try:
        yield path
    finally:
        subprocess.run(["rm", "-rf", str(path)], check=True)


# -- what a script cannot reach ------------------------------------------------------------


@pytest.mark.usefixtures("bwrap")
@pytest.mark.parametrize("transport", ["unix", "relay", "files"])
def test_writes_outside_the_working_directory_never_reach_the_host(
    tmp_path: Path, work: Path, transport: str
) -> None:
    beside = tmp_path / "beside.txt"
    beside.write_text("original")
    created = tmp_path / "created.txt"
    with tempfile.NamedTemporaryFile("w", prefix="hermes-isolation-", delete=False) as f:
        f.write("original")  # in the host's own temporary directory
    host_tmp = Path(f.name)
    system = Path(f"/usr/hermes-isolation-{uuid.uuid4().hex}")  # the read-only system
    try:
        done = run_script(
            work,
            f"""
            import json
            outcome = {{}}
            for path in [{str(beside)!r}, {str(created)!r}, {str(host_tmp)!r}, {str(system)!r}]:
                try:
                    with open(path, "w") as f:
                        f.write("overwritten")
                    outcome[path] = "written"
                except OSError as exc:
                    outcome[path] = type(exc).__name__
            with open("inside.txt", "w") as f:
                f.write("made inside")
            print(json.dumps(outcome))
            """,
            *BWRAP,
            "--transport",
            transport,
        )
        seen = json.loads(output(done))
        assert beside.read_text() == "original", seen
        assert not created.exists(), seen
        assert host_tmp.read_text() == "original", seen
        assert not system.exists(), seen
        assert seen[str(system)] == "OSError"  # read-only: EROFS
        assert (work / "inside.txt").read_text() == "made inside"
    finally:
        host_tmp.unlink()
        system.unlink(missing_ok=True)


@pytest.mark.usefixtures("bwrap")
def test_a_file_in_a_home_directory_is_hidden(work: Path, home_dir: Path) -> None:
    secret = home_dir / "secret.txt"
    secret.write_text("host secret")
    code = f"""
        import os
        try:
            print(open({str(secret)!r}).read())
        except OSError as exc:
            print(type(exc).__name__)
        print({home_dir.name!r} in os.listdir({str(home_dir.parent)!r}))
        """
    assert output(run_script(work, code, "--isolation", "none")).split() == [
        "host",
        "secret",
        "True",
    ]
    assert output(run_script(work, code, *BWRAP)).split() == ["FileNotFoundError", "False"]


@pytest.mark.usefixtures("bwrap")
def test_a_working_directory_in_a_home_is_writable_and_the_rest_of_it_hidden(
    home_dir: Path,
) -> None:
    (home_dir / "secret.txt").write_text("host secret")
    project = home_dir / "project"
    project.mkdir()
    done = run_script(
        project,
        """
        import os
        with open("made.txt", "w") as f:
            f.write("ok")
        print(os.getcwd(), sorted(os.listdir("..")))
        """,
        *BWRAP,
    )
    assert output(done).split() == [str(project), "['project']"]
    assert (project / "made.txt").read_text() == "ok"


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP listener on 127.0.0.1 that greets whoever connects; its port."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.sendall(b"hello")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        server.close()


@pytest.mark.usefixtures("bwrap")
def test_the_network_is_there_only_when_asked_for(work: Path, listener: int) -> None:
    code = f"""
        import socket
        try:
            with socket.create_connection(("127.0.0.1", {listener}), timeout=10) as s:
                print(s.recv(5).decode())
        except OSError as exc:
            print(type(exc).__name__)
        """
    assert output(run_script(work, code, *BWRAP)).strip() == "ConnectionRefusedError"
    assert output(run_script(work, code, *BWRAP, "--network")).strip() == "hello"


@pytest.mark.usefixtures("bwrap")
@pytest.mark.parametrize("transport", ["unix", "relay"])
def test_host_processes_are_invisible(work: Path, transport: str) -> None:
    code = """
        import json, os
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        print(json.dumps({"me": os.getpid(), "pids": pids}))
        """
    seen = json.loads(output(run_script(work, code, *BWRAP, "--transport", transport)))
    # bwrap's init, the script (and the relay): the host's hundreds are not there.
    assert seen["me"] < 10 and max(seen["pids"]) < 10, seen
    assert len(seen["pids"]) <= 4, seen
    unisolated = json.loads(output(run_script(work, code, "--isolation", "none")))
    assert os.getpid() in unisolated["pids"]  # the same look, without bwrap, sees the host


@pytest.mark.usefixtures("bwrap")
def test_tools_act_on_the_host_not_in_the_scripts_view(work: Path) -> None:
    # The decision pinned here: the tools' commands (terminal, search) run on the host,
    # as the tools do; only the script is contained.
    with tempfile.NamedTemporaryFile("w", prefix="hermes-isolation-", suffix=".txt") as f:
        f.write("on the host")
        f.flush()
        done = run_script(
            work,
            f"""
            import os
            from hermes_tools import terminal
            print(os.path.exists({f.name!r}), terminal("cat {f.name}")["output"])
            """,
            *BWRAP,
        )
        assert output(done).split() == ["False", "on", "the", "host"]


@pytest.mark.usefixtures("bwrap")
def test_an_interpreter_in_a_hidden_home_still_runs(work: Path, home_dir: Path) -> None:
    venv = home_dir / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    done = run_script(
        work, "import sys; print(sys.prefix)", *BWRAP, "-o", f"python={venv}/bin/python"
    )
    assert output(done).strip() == str(venv)


@pytest.mark.usefixtures("bwrap")
def test_killing_the_runner_takes_the_sandbox_and_its_stage_with_it(
    work: Path, short_dir: Path
) -> None:
    script = work.parent / "sleeper.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "daemon = 'import os, time; os.setsid(); time.sleep(300)'\n"
        "subprocess.Popen([sys.executable, '-c', daemon])\n"
        "open('started', 'w').close()\n"
        "time.sleep(300)\n"
    )
    temp = short_dir  # where the run's stage is made, with the socket in it
    said = work.parent / "runner-output"  # what the runner printed, if it ends early
    with said.open("wb") as out:
        runner = subprocess.Popen(
            [*CLI, "run", str(script), "--cwd", str(work), *BWRAP],
            cwd=work,
            env={**cli_env(work), "TMPDIR": str(temp)},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while not (work / "started").exists():
            assert time.monotonic() < deadline, "the script did not start"
            if runner.poll() is not None:
                pytest.fail(f"the runner ended early ({runner.returncode}): {said.read_text()}")
            time.sleep(0.05)
        assert marked_processes(), "the script's processes are not found by their tag"
        runner.send_signal(signal.SIGKILL)
        runner.wait(10)
        deadline = time.monotonic() + 10  # die-with-parent acts at once; room for a loaded host
        while marked_processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not marked_processes(), "the sandbox outlived its SIGKILLed runner"
        while list(temp.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(temp.iterdir()) == [], "the stage outlived its SIGKILLed runner (its keeper)"
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(10)


# -- choosing it ------------------------------------------------------------------------------


# -- a sandbox bubblewrap could not set up --------------------------------------------------

SETUP_FAILURE = (
    "bwrap: Can't bind mount /oldroot/ on /newroot/: Unable to apply mount flags: "
    'remount "/newroot/var/lib/containers/storage/overlay/0/merged": Invalid argument'
)


def failing_bwrap(tmp_path: Path, failures: int) -> dict[str, str]:
    """An environment whose bwrap fails its first ``failures`` launches of a script as
    bubblewrap fails when a mount of the host's changes while it sets a sandbox up
    (containers/bubblewrap#650, seen beside a container engine): it says so on stderr and
    exits 1 before it starts anything. The real bwrap does the rest (its probe among
    them); each launch it was asked for is a line in ``tmp_path/launches``."""
    real = shutil.which("bwrap")
    assert real is not None
    wrapper = tmp_path / "bin" / "bwrap"
    wrapper.parent.mkdir()
    launches = tmp_path / "launches"
    wrapper.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            for arg in "$@"; do
              case "$arg" in
                *.py)
                  echo launch >> {launches}
                  if [ "$(wc -l < {launches})" -le {failures} ]; then
                    echo {shlex.quote(SETUP_FAILURE)} >&2
                    exit 1
                  fi
                  break;;
              esac
            done
            exec {real} "$@"
            """
        )
    )
    wrapper.chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),  # the wrapper's probe, not the user's
    }


def launches(tmp_path: Path) -> int:
    path = tmp_path / "launches"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.usefixtures("bwrap")
@pytest.mark.parametrize("transport", ["unix", "relay", "files"])
def test_a_sandbox_bwrap_failed_to_set_up_is_launched_again(
    tmp_path: Path, work: Path, transport: str
) -> None:
    env = failing_bwrap(tmp_path, failures=1)
    done = run_script(work, "print('ran')", *BWRAP, "--transport", transport, env=env)
    assert output(done) == "ran\n"  # nothing of the failure in it
    assert "bwrap" not in json.loads(done.stdout).get("error", "")
    assert launches(tmp_path) >= 2


@pytest.mark.usefixtures("bwrap")
def test_a_launch_made_again_keeps_nothing_of_the_failed_one(
    tmp_path: Path, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exec stream's stderr (a file of its own, read when a relay fails) starts
    empty on the launch made again: bubblewrap's words are not the script's."""
    env = failing_bwrap(tmp_path, failures=1)
    for name in ("PATH", "XDG_CACHE_HOME"):
        monkeypatch.setenv(name, env[name])
    forget_bwrap_probe()
    script = work / "says.py"
    script.write_text("import sys\nsys.stderr.write('the script said this')\n")

    async def main() -> tuple[bytes, int]:
        env = LocalEnvironment(LocalSettings(isolation="bwrap"))
        await env.start()
        try:
            stream = await env.open_exec_stream([sys.executable, str(script)], cwd=str(work))
            code = await stream.wait()
            tail = stream.stderr_tail
            await stream.aclose()
            return tail, code
        finally:
            await env.aclose()

    try:
        tail, code = anyio.run(main)
    finally:
        forget_bwrap_probe()  # the real bwrap's, not the wrapper's, for the next tests
    assert (tail, code) == (b"the script said this", 0)
    assert launches(tmp_path) == 2


@pytest.mark.usefixtures("bwrap")
def test_a_sandbox_never_set_up_fails_the_run_saying_why(tmp_path: Path, work: Path) -> None:
    env = failing_bwrap(tmp_path, failures=100)
    done = run_script(work, "print('ran')", *BWRAP, env=env)
    result = json.loads(done.stdout)
    assert result["status"] == "error", result
    assert "Can't bind mount" in result["error"], result
    assert "ran" not in result["output"]
    assert launches(tmp_path) == 3  # tried three times, then the failure is the run's


@pytest.mark.usefixtures("bwrap")
def test_a_script_that_says_what_a_failed_set_up_says_runs_once(work: Path) -> None:
    """A launch is made again only when bubblewrap never started the command (it never
    read its --block-fd), not because of what a script writes and how it exits."""
    code = f"""
        import sys
        with open("runs", "a") as runs:
            runs.write("x")
        sys.stderr.write({SETUP_FAILURE!r} + "\\n")
        sys.exit(1)
    """
    done = run_script(work, code, *BWRAP)
    result = json.loads(done.stdout)
    assert (result["status"], result["exit_code"]) == ("error", 1), result
    assert (work / "runs").read_text() == "x"


def without_isolation_variable(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != ISOLATION_VARIABLE}
    env.update(extra)
    return env


def test_bwrap_asked_for_where_it_is_missing_is_a_clear_error(tmp_path: Path, work: Path) -> None:
    no_bwrap = {"PATH": str(tmp_path / "empty")}
    done = run_script(work, "print('ran')", *BWRAP, env=without_isolation_variable(**no_bwrap))
    assert_usage_error(done, "bwrap not found on PATH", "install bubblewrap", "--isolation none")
    # auto, the default, runs it without isolation, and says so in `backends`
    assert output(run_script(work, "print('ran')", env=without_isolation_variable(**no_bwrap)))
    done = cli("backends", cwd=tmp_path, env=without_isolation_variable(**no_bwrap))
    assert "isolation: none (bwrap not found on PATH)" in done.stdout.splitlines()[1]


@pytest.mark.usefixtures("bwrap")
def test_backends_reports_the_isolation(tmp_path: Path) -> None:
    version = probe_bwrap().version
    done = cli("backends", cwd=tmp_path, env=without_isolation_variable())
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["local", "available"], done.stdout
    assert lines[1].strip() == f"isolation: bwrap {version} (auto)"
    done = cli("backends", "--json", cwd=tmp_path, env={**os.environ, ISOLATION_VARIABLE: "none"})
    assert json.loads(done.stdout)[0]["isolation"] == "none (as asked)"
    config = tmp_path / "config.yaml"
    config.write_text("backends:\n  local:\n    isolation: bwrap\n")
    done = cli(
        "backends", "--config", str(config), cwd=tmp_path, env={"PATH": str(tmp_path / "empty")}
    )
    assert done.stdout.startswith("local        not available: isolation bwrap was asked for")


@pytest.mark.parametrize(
    ("args", "env", "place"),
    [
        (["--isolation", "jail"], {}, "--isolation jail"),
        (["-o", "isolation=jail"], {}, "-o isolation=jail"),
        ([], {ISOLATION_VARIABLE: "jail"}, f"${ISOLATION_VARIABLE}"),
        (["--backend", "ssh", "--isolation", "bwrap"], {}, "--isolation bwrap"),
    ],
    ids=["flag", "option", "variable", "other-backend"],
)
def test_an_unknown_isolation_is_refused_naming_its_place(
    work: Path, args: list[str], env: dict[str, str], place: str
) -> None:
    done = run_script(work, "print('ran')", *args, env={**os.environ, **env})
    assert_usage_error(done, place)


def test_an_unknown_isolation_in_the_config_file_names_the_file(work: Path) -> None:
    config = work.parent / "config.yaml"
    config.write_text("backends:\n  local:\n    isolation: jail\n")
    done = run_script(work, "print('ran')", "--config", str(config))
    assert_usage_error(done, f"backends.local.isolation in {config}", "auto, bwrap, none")


# -- the sandbox's shape ----------------------------------------------------------------------

WORKING = Isolation("bwrap", "bwrap", BwrapProbe("/usr/bin/bwrap", "0.8.0", None))


def mounts(argv: list[str]) -> list[tuple[str, str]]:
    """(option, destination) of each mount in a bwrap command line, in order."""
    found = []
    for i, word in enumerate(argv):
        if word in ("--ro-bind", "--bind"):
            found.append((word, argv[i + 2]))
        elif word in ("--tmpfs", "--dev", "--proc"):
            found.append((word, argv[i + 1]))
    return found


def test_no_isolation_adds_nothing() -> None:
    none = Isolation("none", "none")
    assert none.prefix(cwd="/srv", writable=[], python=sys.executable, network=False) == []


def test_a_working_directory_in_tmp_lies_over_the_private_tmp() -> None:
    with (
        tempfile.TemporaryDirectory(dir="/tmp") as job,
        tempfile.TemporaryDirectory(dir="/tmp") as stage,
    ):
        job, stage = os.path.realpath(job), os.path.realpath(stage)
        argv = WORKING.prefix(cwd=job, writable=[stage], python="/usr/bin/python3", network=False)
        gone = WORKING.prefix(cwd=job, writable=[stage + "-removed"], python="/", network=False)
        networked = WORKING.prefix(cwd=job, writable=[], python="/", network=True)
    order = mounts(argv)
    assert order[0] == ("--ro-bind", "/")
    assert order.index(("--tmpfs", "/tmp")) < order.index(("--bind", job))
    assert order.index(("--tmpfs", "/tmp")) < order.index(("--bind", stage))
    assert argv[argv.index("--chdir") + 1] == job
    assert argv[-1] == "--"
    assert "--unshare-net" in argv and "--unshare-pid" in argv and "--die-with-parent" in argv
    assert "--unshare-net" not in networked
    assert ("--bind", stage + "-removed") not in mounts(gone)  # bwrap would refuse it


def test_a_root_working_directory_still_gets_private_and_hidden_directories() -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as stage:
        stage = os.path.realpath(stage)
        argv = WORKING.prefix(cwd="/", writable=[stage], python="/usr/bin/python3", network=False)
    order = mounts(argv)
    assert order[0] == ("--bind", "/")  # asked for: the whole system writable
    assert ("--ro-bind", "/") not in order
    assert ("--dev", "/dev") in order and ("--proc", "/proc") in order
    assert order.index(("--tmpfs", "/tmp")) < order.index(("--bind", stage))


def test_an_interpreter_under_a_hidden_directory_is_bound_read_only() -> None:
    if not os.path.isdir("/root") or os.path.islink("/root"):
        pytest.skip("no /root directory here")
    order = mounts(
        WORKING.prefix(cwd="/srv", writable=[], python="/root/.venvs/x/bin/python", network=False)
    )
    assert order.index(("--tmpfs", "/root")) < order.index(("--ro-bind", "/root/.venvs/x"))
