"""One conformance suite: the same scenarios over every backend x transport here.

Each scenario is a whole run through :func:`sandbox.execute_code` with a real script:
tool calls from ten threads, a timeout that must kill the script's whole tree, the
tool-call budget, the output caps, the scrubbed environment, a request with a wrong
token, and a script that fails. Only the target differs: ``local`` on this machine,
``docker`` in a container of the engine (scripts/podman-service), over each transport
the backend offers. Checks that a process is gone ask *inside* the target, through an
environment held open for the session, so a pid means what it means there.

A backend that cannot run here is skipped with its reason printed, except under CI
(CI=true), where that is a failure (conftest.require).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio.from_thread
import pytest
from conftest import (
    IMAGE,
    RAW_ASK,
    RUN_ID,
    TEST_LABEL,
    bwrap_problem,
    engine_problem,
    marked_processes,
    require,
    ssh_server_from_environment,
    ssh_server_from_service,
)

from hermes_sandbox import ExecutionResult, execute_code
from hermes_sandbox.environments import Environment
from hermes_sandbox.environments.docker import DockerEnvironment, DockerSettings
from hermes_sandbox.environments.local import LocalEnvironment
from hermes_sandbox.environments.singularity import SingularityEnvironment
from hermes_sandbox.environments.ssh import SSHEnvironment

TIMEOUT = 60.0
REPO = Path(__file__).resolve().parent.parent

TARGETS = [
    ("local", "unix"),
    ("local", "relay"),
    ("local", "files"),
    # The local backend with isolation bwrap: the script in its own pid, network and
    # mount namespaces, the stage and its working directory the only places it writes.
    ("local-bwrap", "unix"),
    ("local-bwrap", "relay"),
    ("local-bwrap", "files"),
    ("docker", "unix"),
    ("docker", "relay"),
    ("docker", "files"),
    ("ssh", "relay"),
    # A stand-in for the apptainer command (tests/fakes/apptainer) that runs commands on
    # this machine: the backend's plumbing, not Apptainer's containment, is checked.
    ("singularity", "relay"),
    ("singularity", "unix"),
    ("singularity", "files"),
    # Fakes of the modal and daytona SDKs whose sandboxes are local processes (the
    # services cannot be reached from here; their tests check every SDK call against
    # the installed SDK's signatures).
    ("modal", "relay"),
    ("daytona", "relay"),
    # The fake backend the package ships for its users' tests (environments/testing.py):
    # a temporary directory reached through local subprocesses.
    ("fake", "relay"),
]

# Python run inside the target: which of the pids in argv still run (not zombies).
ALIVE = (
    "import sys\n"
    "for pid in sys.argv[1:]:\n"
    "    try:\n"
    "        state = open('/proc/%s/stat' % pid).read().rsplit(')', 1)[1].split()[0]\n"
    "    except (OSError, IndexError):\n"
    "        continue\n"
    "    if state not in ('Z', 'X'):\n"
    "        print(pid)\n"
)


@dataclass
class Target:
    """Where a scenario runs, and an environment held open there for checking."""

    backend: str
    transport: str
    environment: Environment
    portal: Any
    options: dict[str, Any] = field(default_factory=dict)
    spill_dir: str | None = None
    # A directory that the script and the tools both see at one path.
    scratch: str = "/tmp"
    # Whether the script runs in a pid namespace of its own (local under bwrap): the
    # pids it sees are not the host's.
    own_pids: bool = False

    def run(self, code: str, **options: Any) -> ExecutionResult:
        options.setdefault("timeout", TIMEOUT)
        options.setdefault("spill_dir", self.spill_dir)
        return execute_code(
            textwrap.dedent(code),
            backend=self.backend,
            transport=self.transport,
            **{**self.options, **options},
        )

    def alive(self, pids: list[int]) -> list[int]:
        """Those of ``pids`` still running inside the target."""
        if self.own_pids:
            return _alive_in_own_namespace(pids)
        command = "python3 -c " + _quote(ALIVE) + " " + " ".join(str(p) for p in pids)
        result = self.portal.call(self.environment.execute, command)
        assert result.exit_code == 0, result.output
        return [int(line) for line in result.output.split()]


def _alive_in_own_namespace(pids: list[int]) -> list[int]:
    """Those of ``pids``, as seen from inside a pid namespace, that are still running:
    this test's processes on the host whose innermost pid (NSpid) is one of them."""
    found = []
    for host_pid in marked_processes():
        try:
            with open(f"/proc/{host_pid}/status") as f:
                line = next(x for x in f if x.startswith("NSpid:"))
        except (OSError, StopIteration):
            continue
        if len(line.split()) > 2 and int(line.split()[-1]) in pids:
            found.append(int(line.split()[-1]))
    return sorted(found)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


@pytest.fixture(scope="session")
def portal() -> Iterator[Any]:
    with anyio.from_thread.start_blocking_portal() as running:
        yield running


@pytest.fixture(scope="session")
def held_local(portal: Any) -> Iterator[Environment]:
    environment = LocalEnvironment()
    portal.call(environment.start)
    yield environment
    portal.call(environment.aclose)


@pytest.fixture(scope="session")
def held_docker(portal: Any) -> Iterator[tuple[Environment, dict[str, Any]]]:
    """A container for the session; runs given its task id share it."""
    require(engine_problem(), "the docker conformance runs need a container engine")
    task_id = f"conformance-{RUN_ID}"
    settings = {"image": IMAGE, "labels": {TEST_LABEL: RUN_ID}}
    environment = DockerEnvironment(DockerSettings(task_id=task_id, **settings))
    portal.call(environment.start)
    yield environment, {"task_id": task_id, "backend_options": settings}
    portal.call(environment.aclose)


@pytest.fixture(scope="session")
def held_ssh(portal: Any) -> Iterator[tuple[Environment, dict[str, Any]]]:
    """A connection to the test sshd (scripts/sshd-service) for checking."""
    values = ssh_server_from_environment()
    problem = None
    if values is None:
        values, problem = ssh_server_from_service()
        if not values or "HOST" not in values:
            values = None
    require(None if values else problem, "the ssh conformance runs need an SSH server")
    assert values is not None
    settings = {
        "host": values["HOST"],
        "port": int(values["PORT"]),
        "user": values["USER"],
        "key_file": values["KEY"],
        "known_hosts": values["KNOWN_HOSTS"],
    }
    environment = SSHEnvironment.for_run(
        settings, env={}, kill_grace=2.0, task_id=None, python=None
    )
    portal.call(environment.start)
    yield environment, {"backend_options": settings}
    portal.call(environment.aclose)


@pytest.fixture
def held_singularity(
    portal: Any, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Environment, dict[str, Any]]]:
    """The apptainer stand-in first on PATH, and an instance of the run's task."""
    work = tmp_path_factory.mktemp("apptainer")
    bin_dir = work / "bin"
    bin_dir.mkdir()
    (bin_dir / "apptainer").symlink_to(REPO / "tests" / "fakes" / "apptainer")
    plain = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable
    (bin_dir / "python3").symlink_to(plain)  # not a version manager's slow shim
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HERMES_FAKE_APPTAINER_LOG", str(work / "calls.jsonl"))
    monkeypatch.setenv("HERMES_FAKE_APPTAINER_STATE", str(work / "state"))
    image = work / "python.sif"
    image.write_bytes(b"a stand-in image")
    shared = tempfile.mkdtemp(prefix="hs-conf-")
    task_id = f"conformance-{uuid.uuid4().hex[:8]}"
    settings = {"image": str(image), "shared_dir": shared}
    environment = SingularityEnvironment.for_run(
        settings, env={}, kill_grace=2.0, task_id=task_id, python=None
    )
    portal.call(environment.start)
    try:
        yield environment, {"backend_options": settings, "task_id": task_id}
    finally:
        portal.call(environment.aclose)
        shutil.rmtree(shared, ignore_errors=True)


@pytest.fixture
def held_modal(
    held_local: Environment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Environment, dict[str, Any]]]:
    """The fake modal SDK in place; its sandboxes' processes are this machine's, so the
    local environment checks on them."""
    from fakes.modal_fake import FakeModal

    import hermes_sandbox.environments.modal.environment as modal_backend

    world = FakeModal(str(tmp_path / "modal-home"))
    monkeypatch.setattr(modal_backend, "_sdk", world)
    options = {"python": sys.executable, "workdir": str(tmp_path / "workspace")}
    try:
        yield held_local, {"backend_options": options}
        deadline = time.monotonic() + 2
        while world.live_processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not world.live_processes(), "processes of a modal sandbox outlived its run"
    finally:
        world.shutdown()


@pytest.fixture
def held_daytona(
    held_local: Environment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Environment, dict[str, Any]]]:
    """The fake daytona SDK in place (sandboxes are local processes, as for modal)."""
    from fakes.daytona_fake import FakeDaytonaCloud

    import hermes_sandbox.environments.daytona.environment as daytona_backend

    cloud = FakeDaytonaCloud(tmp_path / "cloud")
    monkeypatch.setattr(daytona_backend, "_sdk", cloud.sdk())
    monkeypatch.setenv("DAYTONA_API_KEY", "test-key")
    try:
        yield held_local, {"backend_options": {"python": sys.executable}}
        assert cloud.live() == [], "a daytona sandbox outlived its run"
    finally:
        cloud.close()


@pytest.fixture
def held_fake(held_local: Environment) -> Iterator[tuple[Environment, dict[str, Any]]]:
    """The fake backend's sandboxes are this machine's processes: the local
    environment checks on them."""
    import hermes_sandbox.environments.testing  # noqa: F401 - puts "fake" in the table

    yield held_local, {}


@pytest.fixture(params=TARGETS, ids=[f"{b}-{t}" for b, t in TARGETS])
def target(request: pytest.FixtureRequest, portal: Any, tmp_path: Path) -> Target:
    backend, transport = request.param
    spill = str(tmp_path / "spill")
    if backend == "local":
        held = request.getfixturevalue("held_local")
        return Target(backend, transport, held, portal, spill_dir=spill)
    if backend == "local-bwrap":
        require(bwrap_problem(), "the local-bwrap runs need bubblewrap")
        held = request.getfixturevalue("held_local")
        work = tmp_path / "work"
        work.mkdir()
        options = {"backend_options": {"isolation": "bwrap"}, "cwd": str(work)}
        return Target(
            "local", transport, held, portal, options, spill, scratch=str(work), own_pids=True
        )
    environment, options = request.getfixturevalue(f"held_{backend}")
    return Target(backend, transport, environment, portal, options, spill_dir=spill)


def _lines(result: ExecutionResult) -> list[str]:
    return result.output.strip().splitlines()


# -- the scenarios -------------------------------------------------------------------------


def test_tool_calls_from_ten_threads(target: Target) -> None:
    result = target.run(
        """
        import json, threading
        from hermes_tools import terminal
        results = {}
        def work(i):
            results[i] = terminal(command="echo thread-%d" % i)["output"].strip()
        threads = [threading.Thread(target=work, args=(i,)) for i in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(json.dumps(results, sort_keys=True))
        """
    )
    assert result.status == "success", result.output
    assert json.loads(result.output) == {str(i): f"thread-{i}" for i in range(10)}
    assert result.tool_calls_made == 10


def test_timeout_kills_the_whole_tree(target: Target) -> None:
    result = target.run(
        """
        import os, subprocess, sys, time
        child = subprocess.Popen(
            [sys.executable, "-c",
             "import subprocess, sys, time\\n"
             "p = subprocess.Popen([sys.executable, '-c', "
             "'import os, time; os.setsid(); time.sleep(300)'])\\n"
             "print(p.pid, flush=True)\\n"
             "time.sleep(300)\\n"],
            stdout=subprocess.PIPE,
        )
        grandchild = int(child.stdout.readline())
        print(os.getpid(), child.pid, grandchild, flush=True)
        time.sleep(300)
        """,
        timeout=4,
    )
    assert result.status == "timeout", result.output
    assert "timed out after 4s" in (result.error or "")
    pids = [int(p) for p in _lines(result)[0].split()]
    assert len(pids) == 3
    if target.own_pids:  # else the check below would look for the wrong pids
        assert max(pids) < 20, f"{pids}: not the pids of a namespace of its own"
    assert target.alive(pids) == [], f"{pids} survived the timeout in {target.backend}"


def test_arguments_and_stdin_reach_the_script(target: Target) -> None:
    """``argv`` is the script's sys.argv[1:] and ``stdin`` what it reads, however the
    script is started there (spawned, or by the relay from the staged stdin file)."""
    code = """
        import sys
        print(sys.argv[1:], repr(sys.stdin.buffer.read()))
        """
    result = target.run(code, argv=["one", "two words", "--x"], stdin=b"in\x00put\n")
    assert result.status == "success", result.output
    assert result.output == "['one', 'two words', '--x'] b'in\\x00put\\n'\n"
    result = target.run(code)
    assert result.output == "[] b''\n", result.output


def test_budget_refuses_calls_past_the_limit(target: Target) -> None:
    result = target.run(
        """
        import json
        from hermes_tools import terminal
        kinds = []
        for i in range(5):
            reply = terminal(command="echo %d" % i)
            kinds.append(reply.get("error_kind", "ok"))
        print(json.dumps(kinds))
        """,
        max_tool_calls=3,
    )
    assert result.status == "success", result.output
    assert json.loads(result.output) == ["ok"] * 3 + ["budget_exhausted"] * 2
    assert result.tool_calls_made == 3


def test_output_caps_keep_head_and_tail(target: Target) -> None:
    result = target.run(
        """
        import sys
        sys.stdout.write("HEAD-MARK" + "x" * 3000000 + "TAIL-MARK\\n")
        sys.stderr.write("~" * 100000)
        """,
        max_stdout_bytes=20000,
        max_stderr_bytes=5000,
    )
    assert result.status == "success", result.error
    assert result.stdout_truncated
    assert result.stdout_bytes_total == 3000000 + 19
    assert result.stdout_bytes_captured == 20000
    assert "HEAD-MARK" in result.output and "TAIL-MARK" in result.output
    stderr = result.output.split("--- stderr ---", 1)[1]
    assert 0 < stderr.count("~") <= 5000


def test_environment_is_scrubbed(target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-host-secret")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp-host-secret")
    result = target.run(
        """
        import json, os
        from hermes_tools import terminal
        shell = terminal(command="env")["output"]
        print(json.dumps({"script": dict(os.environ), "shell": shell}))
        """,
        env={"VISIBLE_SETTING": "yes"},
    )
    assert result.status == "success", result.output
    seen = json.loads(result.output)
    assert seen["script"]["VISIBLE_SETTING"] == "yes"
    for secret in ("sk-host-secret", "ghp-host-secret"):
        assert secret not in json.dumps(seen["script"])
        assert secret not in seen["shell"]


def test_a_wrong_token_is_refused_and_not_counted(target: Target) -> None:
    result = target.run(
        f"""
        import json, os
        from hermes_tools import terminal
{textwrap.indent(RAW_ASK, " " * 8)}
        request = {{"id": 5, "tool": "terminal", "args": {{"command": "echo no"}}}}
        replies = [
            ask({{**request, "token": "wrong"}}),
            ask({{**request, "token": os.environ["HERMES_RPC_TOKEN"][:-1]}}),
            ask(request),
        ]
        good = terminal(command="echo yes")["output"].strip()
        print(json.dumps({{"replies": replies, "good": good}}))
        """
    )
    assert result.status == "success", result.output
    seen = json.loads(result.output)
    assert [r["error"]["kind"] for r in seen["replies"]] == ["unauthorized"] * 3
    assert all(r["id"] == 5 and "result" not in r for r in seen["replies"])
    assert seen["good"] == "yes"
    assert result.tool_calls_made == 1


@pytest.mark.parametrize(
    ("code", "exit_code", "error"),
    [
        ("raise ValueError('boom')", 1, "ValueError: boom"),
        ("import sys; sys.exit(3)", 3, "code 3"),
        ("def broken(:\n    pass", 1, "SyntaxError"),
    ],
    ids=["exception", "exit-code", "syntax-error"],
)
def test_script_errors_are_reported(target: Target, code: str, exit_code: int, error: str) -> None:
    result = target.run(code)
    assert result.status == "error"
    assert result.exit_code == exit_code
    assert error in (result.error or "")


def test_tools_act_where_the_script_runs(target: Target) -> None:
    # Under bwrap the script's /tmp is its own, while the tools act on the host: they
    # meet in the working directory.
    name = f"{target.scratch}/conformance-{uuid.uuid4().hex}"
    result = target.run(
        f"""
        import json
        from hermes_tools import read_file, terminal, write_file
        write_file(path={name!r}, content="made by a tool")
        with open({name!r}) as f:
            seen_by_script = f.read()
        shell = terminal(command="cat {name}")["output"]
        print(json.dumps({{"script": seen_by_script, "shell": shell}}))
        """
    )
    on_host = os.path.exists(name)
    target.portal.call(target.environment.execute, f"rm -f {name}")
    assert result.status == "success", result.output
    seen = json.loads(result.output)
    assert seen == {"script": "made by a tool", "shell": "made by a tool"}
    if target.backend == "docker":
        assert not on_host, "a tool in a container wrote on the host"
    if target.backend in ("modal", "daytona", "fake"):
        assert on_host  # the fakes' sandboxes are this machine: the stand-in's limit


# Dangerous commands in the forms issue #11 found missed (abbreviated long options,
# ${IFS}, brace expansion, wrappers, terminal writes to the files write_file protects),
# each aimed at a victim directory made for the test: run in it, "*" is only its own
# files (uniquely named), and HOME is set to it before the protected files are named.
APPROVAL_ATTACKS = [
    "rm --recur *",
    "rm --recursive --forc ./*",
    "rm${IFS}-rf${IFS}*",
    "{rm,-rf,*}",
    "flock .lock rm -rf *",
    "strace -o /dev/null rm -rf *",
    "unshare rm -rf *",
    "setpriv rm -rf *",
    "script -qc 'rm -rf *' /dev/null",
    "parallel rm -rf ::: *",
    "systemd-run --user --scope rm -rf *",
    "chrt -o 0 rm -rf *",
    "chmod --recurs 000 *",
    "export HOME=$PWD; echo key | tee ~/.ssh/authorized_keys",
    "export HOME=$PWD; echo key >> ~/.ssh/authorized_keys",
    "export HOME=$PWD; echo evil | tee -a $HOME/.bashrc",
    "export HOME=$PWD; echo evil > ~/.bashrc",
    "HOME=$PWD sh -c 'echo evil >> ~/.bashrc'",
    "export HOME=$PWD; cp .ssh/seed ~/.netrc",
    "export HOME=$PWD; sed -i s/a/b/ ~/.zshrc",
]


def test_approval_attacks_are_refused_and_never_run(target: Target, tmp_path: Path) -> None:
    """With no one to approve, every dangerous form is refused before it runs, wherever
    the tool acts; a harmless command in the same directory does run (the control)."""
    tag = uuid.uuid4().hex[:12]
    remote = target.backend in ("docker", "ssh")  # the tools act in another filesystem
    victim = f"/tmp/hs-approval-{tag}" if remote else str(tmp_path / "victim")
    canary = f"hs-canary-{tag}"

    def inside(command: str) -> str:
        done = target.portal.call(target.environment.execute, command)
        assert done.exit_code == 0, done.output
        return str(done.output)

    inside(
        f"mkdir -p {victim}/.ssh && echo a > {victim}/.ssh/seed && echo a > {victim}/{canary}"
        f" && chmod 644 {victim}/{canary}"
    )
    try:
        result = target.run(
            f"""
            import json
            from hermes_tools import terminal
            attacks = {APPROVAL_ATTACKS!r}
            replies = [terminal(command=c, workdir={victim!r}) for c in attacks]
            control = terminal(command="touch control-{tag}", workdir={victim!r})
            print(json.dumps({{"replies": replies, "control": control}}))
            """
        )
        after = inside(f"cd {victim} && ls -A . .ssh && stat -c %a {canary}")
    finally:
        if remote:
            target.portal.call(target.environment.execute, f"rm -rf {victim}")
    assert result.status == "success", result.output
    seen = json.loads(result.output)
    ran = [
        command
        for command, reply in zip(APPROVAL_ATTACKS, seen["replies"], strict=True)
        if reply.get("approval_required") is not True
    ]
    assert not ran, f"not refused: {ran}"
    assert seen["control"].get("exit_code") == 0, seen["control"]
    names = set(after.split())
    assert f"control-{tag}" in names, after  # the tool did act in the victim directory
    assert canary in names and after.split()[-1] == "644", after
    assert not names & {"authorized_keys", ".bashrc", ".netrc", ".zshrc", ".lock"}, after
