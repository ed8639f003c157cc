"""The singularity backend, driven through a stand-in for the apptainer command line.

No Apptainer can be installed on the machines these tests run on, so every test puts
tests/fakes/apptainer first on PATH (a symlink named ``apptainer``, or only
``singularity``). The stand-in records each invocation's argv (the log these tests
read the exact command lines from), keeps instances in a state directory, validates
the options it knows like Apptainer 1.4 and fails like it on unknown ones, and runs
every command ON THIS MACHINE, with no isolation at all: a path "inside" is the host's
path, a bind is only checked, a cgroup limit only validated. So these tests check the
backend's command lines, lifecycle and plumbing (real processes, real timeouts, real
kills, whole runs with real tool calls), not Apptainer's containment: they are marked
``not_live``.

Every process of a stand-in instance carries ``HERMES_SANDBOX_FAKE_INSTANCE=<state
dir>/<name>``; after each test, one still alive fails the test (and is killed).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from hermes_sandbox import SettingError, execute_code
from hermes_sandbox.api import execute_code_async
from hermes_sandbox.environments import (
    BackendNotAvailable,
    EnvironmentFailure,
    get_environment_class,
)
from hermes_sandbox.environments.exec_stream import HELPER_FLAGS, HELPER_SOURCE
from hermes_sandbox.environments.singularity import (
    IMAGE_VAR,
    Bind,
    SingularityEnvironment,
    SingularitySettings,
)

pytestmark = pytest.mark.not_live

REPO = Path(__file__).resolve().parent.parent
FAKE = REPO / "tests" / "fakes" / "apptainer"
TAG_VAR = "HERMES_SANDBOX_FAKE_INSTANCE"
TOOLS = ["terminal", "read_file", "write_file"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- the stand-in ------------------------------------------------------------------------


@dataclass
class FakeCLI:
    """The stand-in as installed for one test: its log, state and a dummy image."""

    name: str
    bin_dir: Path
    log: Path
    state: Path
    image: Path

    def calls(self) -> list[list[str]]:
        """Every invocation so far, argv[0] reduced to the name it was called by."""
        if not self.log.exists():
            return []
        calls = []
        for line in self.log.read_text().splitlines():
            argv = json.loads(line)
            calls.append([os.path.basename(argv[0]), *argv[1:]])
        return calls

    def calls_of(self, *words: str) -> list[list[str]]:
        """The invocations whose arguments start with ``words``."""
        return [c for c in self.calls() if c[1 : 1 + len(words)] == list(words)]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin_dir / self.name), *args], capture_output=True, text=True, timeout=30
        )

    def instances(self) -> dict[str, Any]:
        result = self.run("instance", "list", "--json")
        assert result.returncode == 0, result.stderr
        return {entry["instance"]: entry for entry in json.loads(result.stdout)["instances"]}

    def processes(self) -> set[int]:
        """Live processes of this test's stand-in instances."""
        prefix = f"{TAG_VAR}={self.state}{os.sep}".encode()
        found = set()
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    entries = f.read().split(b"\0")
            except OSError:
                continue
            if any(entry.startswith(prefix) for entry in entries) and not _gone(int(name)):
                found.add(int(name))
        return found


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return True


def _path_without_real_clis() -> list[str]:
    """PATH without any directory that holds a real apptainer or singularity."""
    return [
        entry
        for entry in os.environ.get("PATH", "").split(os.pathsep)
        if entry
        and not any(os.path.exists(os.path.join(entry, n)) for n in ("apptainer", "singularity"))
    ]


def _install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> FakeCLI:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / name).symlink_to(FAKE)
    # The stand-in's `#!/usr/bin/env python3` then finds a plain interpreter, not a
    # version manager's shim that costs a few hundred milliseconds per call.
    plain = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable
    (bin_dir / "python3").symlink_to(plain)
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_dir), *_path_without_real_clis()]))
    fake = FakeCLI(
        name=name,
        bin_dir=bin_dir,
        log=tmp_path / "calls.jsonl",
        state=tmp_path / "state",
        image=tmp_path / "python.sif",
    )
    fake.image.write_bytes(b"a SIF stand-in: the stand-in only checks that it exists")
    monkeypatch.setenv("HERMES_FAKE_APPTAINER_LOG", str(fake.log))
    monkeypatch.setenv("HERMES_FAKE_APPTAINER_STATE", str(fake.state))
    return fake


def _check_nothing_left(fake: FakeCLI) -> None:
    deadline = time.monotonic() + 2
    leftovers = fake.processes()
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.05)
        leftovers = fake.processes()
    if not leftovers:
        return
    described = []
    for pid in sorted(leftovers):
        try:
            described.append(f"{pid} {psutil.Process(pid).cmdline()}")
            os.kill(pid, signal.SIGKILL)
        except (OSError, psutil.Error):
            described.append(str(pid))
    pytest.fail("processes of stand-in instances left alive: " + "; ".join(described))


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCLI]:
    """The stand-in first on PATH as ``apptainer``; fails the test on leftovers."""
    fake = _install(tmp_path, monkeypatch, "apptainer")
    yield fake
    _check_nothing_left(fake)


@pytest.fixture
def singularity_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCLI]:
    """The stand-in on PATH only as ``singularity``."""
    fake = _install(tmp_path, monkeypatch, "singularity")
    yield fake
    _check_nothing_left(fake)


def make_env(fake: FakeCLI, **settings: Any) -> SingularityEnvironment:
    env = settings.pop("env", None)
    settings.setdefault("image", str(fake.image))
    return SingularityEnvironment(SingularitySettings(**settings), env=env, kill_grace=0.5)


def wait_for_pids(path: Path, count: int, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pids = [int(p) for p in path.read_text().split()]
        except (FileNotFoundError, ValueError):
            pids = []
        if len(pids) >= count:
            return pids
        time.sleep(0.02)
    pytest.fail(f"{count} pids did not appear in {path} within {timeout}s")


def assert_gone(pids: list[int], what: str) -> None:
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.02)
    survivors = [p for p in pids if not _gone(p)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"{survivors} of {pids} survived {what}"


# -- configuration -----------------------------------------------------------------------


def test_unknown_settings_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"unknown singularity backend setting imge;"):
        SingularitySettings.from_mapping({"image": "/x.sif", "imge": "typo"})
    with pytest.raises(ValueError, match=r"known: .*binds.*shared_dir"):
        SingularitySettings.from_mapping({"image": "/x.sif", "mounts": []})


def test_an_image_is_required_and_may_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(IMAGE_VAR, raising=False)
    with pytest.raises(
        ValueError, match="needs an image that apptainer can run: set image to a SIF file"
    ):
        SingularitySettings()
    monkeypatch.setenv(IMAGE_VAR, "docker://python:3.11-slim")
    assert SingularitySettings().image == "docker://python:3.11-slim"


def test_binds_parse_like_the_docker_backends_mounts() -> None:
    config = SingularitySettings(
        image="/x.sif",
        binds=[
            "/srv/data:/data",
            "/srv/out:/out:rw",
            {"source": "/a", "target": "/b", "read_only": False},
            Bind("/c", "/d"),
        ],
    )
    assert config.binds == (
        Bind("/srv/data", "/data", True),
        Bind("/srv/out", "/out", False),
        Bind("/a", "/b", False),
        Bind("/c", "/d", True),
    )
    assert [b.spec() for b in config.binds] == [
        "/srv/data:/data:ro",
        "/srv/out:/out:rw",
        "/a:/b:rw",
        "/c:/d:ro",
    ]
    assert SingularitySettings(image="/x.sif", binds="/e:/f").binds == (Bind("/e", "/f"),)
    for bad, message in [
        ("/only-one", "SOURCE:TARGET"),
        ("/a:/b:rx", "SOURCE:TARGET"),
        ("rel:/b", "absolute"),
        ("/a,b:/c", "cannot contain ','"),
        ({"source": "/a", "target": "/b", "mode": "ro"}, "unknown bind key"),
        (42, "a bind is a"),
    ]:
        with pytest.raises(ValueError, match=message):
            SingularitySettings(image="/x.sif", binds=[bad])


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"memory": "lots"}, r"\(memory='lots'\): must be a size"),
        ({"cpus": 0}, r"\(cpus=0.0\): must be at least 0.01"),
        ({"cpus": "many"}, r"\(cpus='many'\): expected a number"),
        ({"pids_limit": 0}, r"\(pids_limit=0\): must be >= 1"),
        ({"workdir": "work"}, r"\(workdir='work'\): must be an absolute path"),
        ({"overlay": "ov.img"}, r"\(overlay='ov.img'\): must be an absolute path"),
        ({"shared_dir": "/tmp/" + "x" * 60}, "Unix socket path inside it would not fit"),
        ({"start_timeout": 0}, r"\(start_timeout=0.0\): must be > 0"),
        ({"executable": ""}, r"\(executable=''\): must be a command name"),
    ],
)
def test_bad_settings_say_what_is_wrong(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SingularitySettings(image="/x.sif", **settings)


def test_for_run_takes_the_runs_task_python_and_settings() -> None:
    cls = get_environment_class("singularity")
    assert cls is SingularityEnvironment
    env = cls.for_run(
        {"image": "/x.sif", "memory": "1g"},
        env={"A": "1"},
        kill_grace=0.25,
        task_id="task-7",
        python="/usr/bin/python3",
    )
    assert isinstance(env, SingularityEnvironment)
    assert env.settings.task_id == "task-7" and env.settings.memory == "1g"
    assert env.python == "/usr/bin/python3" and env.kill_grace == 0.25
    assert env.task_key.startswith("hermes-task-7-")
    with pytest.raises(ValueError, match="unknown singularity backend setting"):
        cls.for_run({"image": "/x.sif", "nope": 1}, env={}, kill_grace=1, task_id=None, python=None)


def test_bad_backend_options_are_refused_with_their_place(cli: FakeCLI) -> None:
    with pytest.raises(SettingError, match=r"backend_options\['memory'\]: must be a size"):
        execute_code(
            "print(1)", backend="singularity", backend_options={"image": "/x", "memory": "?"}
        )
    assert cli.calls() == []  # refused before anything ran


# -- command lines -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_start_exec_and_stop_command_lines(
    cli: FakeCLI, tmp_path: Path, short_dir: Path
) -> None:
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    out.mkdir()
    env = make_env(
        cli,
        binds=[f"{data}:/data", f"{out}:/out:rw"],
        memory="512m",
        cpus=1.5,
        pids_limit=64,
        shared_dir=str(short_dir),
    )
    async with env:
        name = env.instance_name
        shared = env.shared_directory
        assert name is not None and name.startswith(env.task_key + "-")
        assert shared is not None and os.path.dirname(shared) == str(short_dir)
        assert stat.S_IMODE(os.stat(shared).st_mode) == 0o700
        result = await env.execute("echo hello")
        assert (result.output, result.exit_code) == ("hello\n", 0)
    calls = cli.calls()
    assert calls[0] == ["apptainer", "instance", "list", "--json", "hermes-*"]
    assert calls[1] == [
        "apptainer",
        "instance",
        "start",
        "--containall",
        "--no-home",
        "--writable-tmpfs",
        "--bind",
        f"{data}:/data:ro",
        "--bind",
        f"{out}:/out:rw",
        "--bind",
        f"{shared}:{shared}:rw",  # the shared directory at the same path inside
        "--net",
        "--network",
        "none",
        "--memory",
        "512m",
        "--cpus",
        "1.5",
        "--pids-limit",
        "64",
        str(cli.image),
        name,
    ]
    execs = cli.calls_of("exec")
    assert len(execs) == 1
    token = execs[0][13]
    assert execs[0] == [
        "apptainer",
        "exec",
        "--cleanenv",
        "--no-eval",
        "--pwd",
        "/tmp",
        f"instance://{name}",
        "python3",
        *HELPER_FLAGS,
        "-c",
        HELPER_SOURCE,
        "run",
        token,
        "0.5",
        "",
        "echo hello",
    ]
    assert calls[-1] == ["apptainer", "instance", "stop", name]
    assert not await anyio.Path(shared).exists()  # the shared directory went with it
    assert cli.instances() == {}


@pytest.mark.anyio
async def test_settings_turn_their_flags_off_and_on(cli: FakeCLI, tmp_path: Path) -> None:
    async with make_env(
        cli, containall=False, no_home=False, writable_tmpfs=False, network=True
    ) as env:
        name = env.instance_name
    (start,) = cli.calls_of("instance", "start")
    assert start == ["apptainer", "instance", "start", str(cli.image), name]

    overlay = tmp_path / "overlay"
    overlay.mkdir()
    async with make_env(cli, overlay=str(overlay)) as env:
        name = env.instance_name
    start = cli.calls_of("instance", "start")[-1]
    assert start[3:] == [
        "--containall",
        "--no-home",
        "--overlay",
        str(overlay),  # a persistent overlay instead of the throw-away tmpfs
        "--net",
        "--network",
        "none",
        str(cli.image),
        name,
    ]


@pytest.mark.anyio
async def test_variables_reach_commands_but_never_a_command_line(
    cli: FakeCLI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOST_ONLY_VARIABLE", "leaked")
    monkeypatch.setenv("APPTAINERENV_SMUGGLED", "leaked")
    secret = "s3cret-$HOME-${PATH}-value"
    async with make_env(cli, env={"API_TOKEN": secret}) as env:
        result = await env.execute(
            'printf "%s|%s|%s|%s" "$API_TOKEN" "${HOST_ONLY_VARIABLE:-unset}" '
            '"${SMUGGLED:-unset}" "$APPTAINER_COMMAND"'
        )
    # Literal (--no-eval), the host's own variables kept out (--cleanenv), and the
    # command really went through `apptainer exec` (the stand-in sets APPTAINER_COMMAND).
    assert result.output == f"{secret}|unset|unset|exec"
    assert not any(secret in arg for call in cli.calls() for arg in call)


@pytest.mark.anyio
async def test_only_singularity_on_path_is_used_with_its_variable_prefix(
    singularity_cli: FakeCLI,
) -> None:
    assert shutil.which("apptainer") is None
    async with make_env(singularity_cli, env={"GREETING": "hi from singularity"}) as env:
        assert env.executable is not None
        assert os.path.basename(env.executable) == "singularity"
        assert env._cli_env({"GREETING": "x"})["SINGULARITYENV_GREETING"] == "x"
        result = await env.execute('echo "$GREETING"')
        assert result.output == "hi from singularity\n"
        name = env.instance_name
    assert {call[0] for call in singularity_cli.calls()} == {"singularity"}
    assert singularity_cli.calls()[-1] == ["singularity", "instance", "stop", name]


@pytest.mark.anyio
async def test_a_missing_executable_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    env = SingularityEnvironment(SingularitySettings(image="/x.sif"))
    with pytest.raises(BackendNotAvailable) as caught:
        await env.start()
    message = str(caught.value)
    assert "neither is on PATH" in message
    assert "install Apptainer" in message and "SingularityCE" in message
    assert "`executable`" in message
    await env.aclose()

    env = SingularityEnvironment(
        SingularitySettings(image="/x.sif", executable=str(tmp_path / "no" / "apptainer"))
    )
    with pytest.raises(BackendNotAvailable, match=r"executable '.*/no/apptainer' was not found"):
        await env.start()
    await env.aclose()


def test_a_run_without_the_executable_fails_with_the_advice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BackendNotAvailable, match="install Apptainer"):
        execute_code("print(1)", backend="singularity", backend_options={"image": "/x.sif"})


@pytest.mark.anyio
async def test_a_bad_image_is_reported_and_leaves_nothing(
    cli: FakeCLI, tmp_path: Path, short_dir: Path
) -> None:
    missing = tmp_path / "missing.sif"
    env = make_env(cli, image=str(missing), shared_dir=str(short_dir))
    with pytest.raises(BackendNotAvailable) as caught:
        await env.start()
    message = str(caught.value)
    assert f"cannot open the image '{missing}'" in message
    assert "apptainer pull" in message and "`image`" in message
    await env.aclose()
    assert cli.instances() == {}
    assert not [p async for p in anyio.Path(short_dir).iterdir()]  # its shared dir is gone
    assert cli.calls_of("exec") == []


@pytest.mark.anyio
async def test_a_failed_start_is_an_environment_failure(cli: FakeCLI, tmp_path: Path) -> None:
    env = make_env(cli, binds=[f"{tmp_path / 'absent'}:/data"])
    with pytest.raises(EnvironmentFailure, match=r"mount source .*absent doesn't exist"):
        await env.start()
    await env.aclose()
    assert cli.instances() == {}


def test_the_stand_in_fails_like_apptainer(cli: FakeCLI) -> None:
    assert cli.run("version").stdout == "1.4.4\n"
    bogus = cli.run("instance", "start", "--bogus", str(cli.image), "x")
    assert bogus.returncode == 255 and "unknown flag: --bogus" in bogus.stderr
    missing = cli.run("instance", "start", "/nonexistent.sif", "x")
    assert missing.returncode == 255 and "could not open image /nonexistent.sif" in missing.stderr
    assert cli.run("exec", "instance://nobody", "true").returncode == 255
    assert "no instance found" in cli.run("instance", "stop", "nobody").stderr
    bad_cpus = cli.run("instance", "start", "--cpus", "100000", str(cli.image), "x")
    assert bad_cpus.returncode == 255 and "cpus value must be in range" in bad_cpus.stderr
    assert cli.instances() == {}


# -- lifecycle ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_an_instance_per_task_is_shared_and_stopped_with_its_last_user(
    cli: FakeCLI,
) -> None:
    first = make_env(cli, task_id="task-a")
    second = make_env(cli, task_id="task-a")
    await first.start()
    await second.start()
    try:
        assert first.instance_name == second.instance_name
        assert not first.reused and second.reused
        assert len(cli.calls_of("instance", "start")) == 1
        await first.aclose()
        assert second.instance_name in cli.instances()  # still in use
        assert (await second.execute("echo still")).output == "still\n"
    finally:
        await first.aclose()
        await second.aclose()
    assert cli.instances() == {}
    assert len(cli.calls_of("instance", "stop")) == 1
    async with make_env(cli, task_id="task-a") as third:  # a new one after the last closed
        assert third.instance_name != first.instance_name and not third.reused


@pytest.mark.anyio
async def test_other_settings_or_tasks_get_other_instances(cli: FakeCLI) -> None:
    async with (
        make_env(cli, task_id="task-b") as one,
        make_env(cli, task_id="task-b", network=True) as other_settings,
        make_env(cli, task_id="task-c") as other_task,
    ):
        names = {one.instance_name, other_settings.instance_name, other_task.instance_name}
        assert len(names) == 3
        assert set(cli.instances()) == names
    assert cli.instances() == {}


@pytest.mark.anyio
async def test_a_persistent_instance_is_kept_and_found_again(cli: FakeCLI) -> None:
    async with make_env(cli, task_id="keep", persist=True) as env:
        name = env.instance_name
        assert name == env.task_key  # found again by this name
        await env.execute("echo kept > /dev/null")
    try:
        assert name in cli.instances()
        assert cli.calls_of("instance", "stop") == []
        async with make_env(cli, task_id="keep", persist=True) as again:
            assert again.instance_name == name and again.reused
        assert len(cli.calls_of("instance", "start")) == 1
        assert name in cli.instances()
    finally:
        assert cli.run("instance", "stop", name).returncode == 0
    assert cli.instances() == {}


REAPER_VICTIM = """
import os, signal, sys
import anyio
sys.path.insert(0, {repo!r})
from hermes_sandbox.environments.singularity import SingularitySettings, SingularityEnvironment

async def main():
    env = SingularityEnvironment(SingularitySettings(image={image!r}, shared_dir={shared!r}))
    await env.start()
    print(env.instance_name, env.shared_directory, flush=True)
    if {die}:
        os.kill(os.getpid(), signal.SIGKILL)  # no aclose: the instance is orphaned
    sys.stdin.read()  # until the test lets go
    await env.aclose()

anyio.run(main)
"""


def _owner(fake: FakeCLI, shared: Path, *, die: bool) -> subprocess.Popen[str]:
    code = REAPER_VICTIM.format(repo=str(REPO), image=str(fake.image), shared=str(shared), die=die)
    return subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


@pytest.mark.anyio
async def test_instances_of_dead_owners_are_reaped_and_live_ones_left(
    cli: FakeCLI, short_dir: Path
) -> None:
    live = _owner(cli, short_dir, die=False)
    try:
        assert live.stdout is not None
        living, living_shared = live.stdout.readline().split()
        dead = _owner(cli, short_dir, die=True)
        orphan, orphan_shared = dead.communicate(timeout=30)[0].split()
        assert dead.returncode == -signal.SIGKILL
        assert {orphan, living} <= set(cli.instances())
        assert await anyio.Path(orphan_shared).is_dir()
        async with make_env(cli, shared_dir=str(short_dir)) as env:
            running = set(cli.instances())
            assert orphan not in running and not await anyio.Path(orphan_shared).exists()
            assert living in running and await anyio.Path(living_shared).is_dir()
            assert env.instance_name in running
        assert ["apptainer", "instance", "stop", orphan] in cli.calls()
    finally:
        live.communicate(input="", timeout=30)
    assert live.returncode == 0
    assert cli.instances() == {}


@pytest.mark.anyio
async def test_a_cancelled_start_leaves_nothing(
    cli: FakeCLI, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HERMES_FAKE_APPTAINER_START_DELAY", "30")  # a slow image pull
    env = make_env(cli, shared_dir=str(short_dir))
    started = time.monotonic()
    with anyio.move_on_after(1.5) as scope:
        await env.start()
    assert scope.cancelled_caught and time.monotonic() - started < 20  # the start takes 30 s
    (start,) = cli.calls_of("instance", "start")
    name = start[-1]
    assert ["apptainer", "instance", "stop", name] in cli.calls()
    assert cli.instances() == {}
    assert not [p async for p in anyio.Path(short_dir).iterdir()]
    assert env.instance_name is None
    await env.aclose()


@pytest.mark.anyio
async def test_a_start_that_takes_too_long_fails_and_leaves_nothing(
    cli: FakeCLI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HERMES_FAKE_APPTAINER_START_DELAY", "30")
    env = make_env(cli, start_timeout=1)
    with pytest.raises(EnvironmentFailure, match="did not finish within 1s"):
        await env.start()
    await env.aclose()
    assert cli.instances() == {}


@pytest.mark.anyio
async def test_closing_during_a_command_stops_it_and_the_instance(
    cli: FakeCLI, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pids"
    env = make_env(cli)
    await env.start()
    name = env.instance_name
    try:
        with anyio.move_on_after(2):
            await env.execute(f"sleep 300 & echo $! $$ > {pidfile}; wait")
    finally:
        await env.aclose()
    pids = wait_for_pids(pidfile, 2, timeout=1)
    assert_gone(pids, "the cancelled command")
    assert name not in cli.instances()


@pytest.mark.anyio
async def test_a_command_timeout_kills_its_whole_tree(cli: FakeCLI, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    async with make_env(cli) as env:
        started = time.monotonic()
        result = await env.execute(
            f"sleep 300 & setsid sleep 301 & echo $! $$ >> {pidfile}; sleep 302 & "
            f"echo $! >> {pidfile}; echo before; wait",
            timeout=1.5,
        )
        elapsed = time.monotonic() - started
        assert result.timed_out and result.exit_code == 124
        assert result.output == "before\n"
        assert elapsed < 6
        pids = wait_for_pids(pidfile, 3)
        assert_gone(pids, "the command's timeout")  # while the instance still runs
        assert env.instance_name in cli.instances()


@pytest.mark.anyio
async def test_command_results_and_output_cap(cli: FakeCLI) -> None:
    async with make_env(cli) as env:
        result = await env.execute("echo out; echo err >&2; exit 3")
        assert (result.output, result.exit_code) == ("out\nerr\n", 3)
        big = await env.execute("yes 0123456789 | head -c 100000", max_output_bytes=1000)
        assert "bytes omitted] ..." in big.output and len(big.output) < 1200
        with pytest.raises(FileNotFoundError):
            await env.execute("true", cwd="/nonexistent-dir")


@pytest.mark.anyio
async def test_files_move_through_the_instance(cli: FakeCLI) -> None:
    async with make_env(cli) as env:
        scratch = await env.make_private_dir("hs-files-")
        try:
            assert scratch.startswith("/tmp/hs-files-")
            assert stat.S_IMODE(os.stat(scratch).st_mode) == 0o700
            assert env.home == os.environ["HOME"]
            path = f"{scratch}/sub/data.bin"
            payload = bytes(range(256)) * 1000
            await env.write_bytes(path, payload, mode=0o600)
            assert await env.read_bytes(path) == payload
            assert await env.read_bytes(path, max_bytes=10) == payload[:10]
            info = await env.stat(path)
            assert (info.kind, info.size) == ("file", len(payload))
            assert (await env.stat(scratch)).kind == "directory"
            with pytest.raises(FileNotFoundError):
                await env.read_bytes(f"{scratch}/absent")
            with pytest.raises(FileNotFoundError):
                await env.write_bytes(f"{scratch}/no/such", b"x", make_parents=False)
            read_bytes_calls = [c for c in cli.calls_of("exec") if c[12:13] == ["read"]]
            assert read_bytes_calls, "file operations run the helper through apptainer exec"
        finally:
            await env.remove_tree(scratch)
        assert not await anyio.Path(scratch).exists()


@pytest.mark.anyio
async def test_a_working_directory_is_made_and_commands_start_there(
    cli: FakeCLI, short_dir: Path
) -> None:
    workdir = short_dir / "work" / "dir"
    async with make_env(cli, workdir=str(workdir)) as env:
        assert env.default_cwd == str(workdir)
        assert workdir.is_dir()
        assert (await env.execute("pwd")).output == f"{workdir}\n"
    assert cli.calls_of("exec")[0][4:6] == ["--pwd", "/"]  # the mkdir itself started at /


@pytest.mark.anyio
async def test_a_closed_environment_refuses_work(cli: FakeCLI) -> None:
    env = make_env(cli)
    with pytest.raises(EnvironmentFailure, match="not started"):
        await env.execute("true")
    async with env:
        pass
    await env.aclose()  # idempotent
    with pytest.raises(EnvironmentFailure, match="closed"):
        await env.execute("true")
    with pytest.raises(EnvironmentFailure, match="closed; make a new one"):
        await env.start()


# -- whole runs ----------------------------------------------------------------------------


def singularity_run(fake: FakeCLI, code: str, **options: Any) -> Any:
    backend_options = {"image": str(fake.image)}
    backend_options.update(options.pop("backend_options", {}))
    options.setdefault("timeout", 30)
    options.setdefault("tools", TOOLS)
    return execute_code(
        textwrap.dedent(code), backend="singularity", backend_options=backend_options, **options
    )


TOOLS_SCRIPT = """
import os
from hermes_tools import terminal, write_file, read_file
print("HERMES_SANDBOX_FAKE_INSTANCE" in os.environ, os.getcwd())
print(terminal("echo via-terminal $APPTAINER_COMMAND")["output"].strip())
print(write_file({path!r}, "written inside")["path"])
print(read_file({path!r})["content"])
print(os.environ.get("HERMES_RPC_SOCKET"))
"""


@pytest.mark.parametrize("transport", ["auto", "relay"])
def test_a_run_over_the_relay_acts_through_the_instance(
    cli: FakeCLI, tmp_path: Path, transport: str
) -> None:
    target = tmp_path / "written.txt"
    result = singularity_run(cli, TOOLS_SCRIPT.format(path=str(target)), transport=transport)
    assert result.status == "success", result.to_dict()
    script_env, terminal_out, written, content, socket = result.output.splitlines()
    assert script_env == "True /tmp"  # the script itself runs under apptainer exec
    assert terminal_out == "via-terminal exec"  # so does the terminal tool's command
    assert written == str(target) and content == "written inside"
    assert result.tool_calls_made == 3
    execs = cli.calls_of("exec")
    # The relay is started by the stage writer of the relay's exec, in that interpreter.
    assert any(c[7:8] == ["python3"] and c[12:13] == ["relay"] for c in execs)
    assert any(c[-1] == "echo via-terminal $APPTAINER_COMMAND" for c in execs)
    assert socket.startswith("/tmp/hermes-sandbox-")  # the relay's socket, in the instance
    (start,) = cli.calls_of("instance", "start")
    assert cli.calls()[-1] == ["apptainer", "instance", "stop", start[-1]]
    assert cli.instances() == {}


@pytest.mark.parametrize("transport", ["auto", "unix", "files"])
def test_a_run_over_the_shared_directory(
    cli: FakeCLI, tmp_path: Path, short_dir: Path, transport: str
) -> None:
    target = tmp_path / "written.txt"
    result = singularity_run(
        cli,
        TOOLS_SCRIPT.format(path=str(target)),
        transport=transport,
        backend_options={"shared_dir": str(short_dir)},
    )
    assert result.status == "success", result.to_dict()
    script_env, terminal_out, _, content, socket = result.output.splitlines()
    assert script_env == "True /tmp"
    assert terminal_out == "via-terminal exec"
    assert content == "written inside"
    (start,) = cli.calls_of("instance", "start")
    shared_bind = start[start.index("--net") - 1]
    shared = shared_bind.split(":")[0]
    assert os.path.dirname(shared) == str(short_dir)
    if transport == "files":
        assert socket == "None"
    else:  # the host listens on a socket in the shared directory
        assert socket.startswith(shared + "/hermes-sandbox-")
    assert cli.instances() == {} and list(short_dir.iterdir()) == []


def test_a_run_timeout_kills_the_script_tree_and_the_instance(cli: FakeCLI, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    started = time.monotonic()
    result = singularity_run(
        cli,
        f"""
        import os, subprocess, time
        a = subprocess.Popen(["sleep", "300"])
        b = subprocess.Popen(["sleep", "301"], start_new_session=True)
        with open({str(pidfile)!r}, "w") as f:
            f.write(f"{{os.getpid()}} {{a.pid}} {{b.pid}}")
        print("started", flush=True)
        time.sleep(300)
        """,
        timeout=3,
        kill_grace=0.5,
    )
    assert result.status == "timeout" and result.exit_code == 124
    assert result.output.startswith("started")
    assert time.monotonic() - started < 20
    assert_gone(wait_for_pids(pidfile, 3, timeout=1), "the run's timeout")
    assert cli.instances() == {}


def test_the_tool_call_budget_holds(cli: FakeCLI) -> None:
    result = singularity_run(
        cli,
        """
        from hermes_tools import terminal
        for i in range(4):
            r = terminal(f"echo call-{i}")
            print(r.get("output", "").strip() or r.get("error"))
        """,
        max_tool_calls=2,
    )
    assert result.status == "success", result.to_dict()
    lines = result.output.splitlines()
    assert lines[:2] == ["call-0", "call-1"]
    assert all("Tool call limit reached (2)" in line for line in lines[2:4])
    assert result.tool_calls_made == 2
    assert [c for c in cli.calls_of("exec") if c[-1].startswith("echo call-")] == [
        c for c in cli.calls_of("exec") if c[-1] in ("echo call-0", "echo call-1")
    ]


def test_output_caps_and_exit_codes_hold(cli: FakeCLI, tmp_path: Path) -> None:
    result = singularity_run(
        cli,
        """
        import sys
        for i in range(20000):
            print(f"line {i:06d} " + "x" * 40)
        print("boom", file=sys.stderr)
        sys.exit(3)
        """,
        spill_dir=str(tmp_path / "spill"),
    )
    assert result.status == "error" and result.exit_code == 3
    assert result.stdout_truncated
    assert result.stdout_bytes_total == 20000 * 53
    assert result.stdout_bytes_captured == 50_000
    assert "line 019999 " in result.output
    assert result.output.endswith("--- stderr ---\nboom\n")


@pytest.mark.anyio
async def test_a_cancelled_run_leaves_nothing(cli: FakeCLI, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    code = f"""
import os, subprocess, time
a = subprocess.Popen(["sleep", "300"])
with open({str(pidfile)!r}, "w") as f:
    f.write(f"{{os.getpid()}} {{a.pid}}")
time.sleep(300)
"""
    with anyio.move_on_after(4) as scope:
        await execute_code_async(
            code,
            backend="singularity",
            backend_options={"image": str(cli.image)},
            tools=TOOLS,
            timeout=60,
            kill_grace=0.5,
        )
    assert scope.cancelled_caught
    assert_gone(wait_for_pids(pidfile, 2, timeout=1), "the cancelled run")
    assert cli.instances() == {}


def test_the_command_line_runs_a_script_in_an_instance(cli: FakeCLI, tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(
        "import os\nfrom hermes_tools import terminal\n"
        "print(terminal('echo $APPTAINER_COMMAND')['output'].strip())\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hermes_sandbox",
            "run",
            str(script),
            "--backend",
            "singularity",
            "--image",
            str(cli.image),
            "--tools",
            "terminal",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["status"], result["output"]) == ("success", "exec\n")
    (start,) = cli.calls_of("instance", "start")
    assert start[-2] == str(cli.image)
    assert cli.instances() == {}
