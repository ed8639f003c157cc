"""The fake backend the package ships for its users' tests
(hermes_sandbox.environments.testing): a real exec-stream backend in a temporary
directory, run through the whole runtime."""

from __future__ import annotations

import importlib.util
import json
import marshal
import os
import sys

import anyio
import psutil
import pytest

from hermes_sandbox import SettingError, execute_code
from hermes_sandbox.environments import BACKENDS, CommandResult, get_environment_class
from hermes_sandbox.environments.exec_stream import ExecStreamEnvironment
from hermes_sandbox.environments.testing import FakeEnvironment, FakeSettings
from hermes_sandbox.stubs import RELAY_MODULE

SCRIPT = """\
import json, os
from hermes_tools import read_file, terminal, write_file
write_file(path="made.txt", content="by a tool")
print(json.dumps({
    "cwd": os.getcwd(),
    "home": os.environ.get("HOME"),
    "shell": terminal(command="cat made.txt; echo; echo $RUN_VAR")["output"],
    "read": read_file(path="made.txt")["content"],
}))
"""


def test_a_whole_run_on_the_fake_backend():
    result = execute_code(SCRIPT, backend=FakeSettings(), env={"RUN_VAR": "given"}, timeout=30)
    assert result.status == "success", result.output
    seen = json.loads(result.output)
    assert os.path.basename(seen["cwd"]).startswith("hermes-fake-")
    assert seen["home"] == seen["cwd"]
    assert seen["shell"] == "by a tool\ngiven\n"
    assert "by a tool" in seen["read"]
    assert result.tool_calls_made == 3
    assert not os.path.exists(seen["cwd"]), "the fake sandbox outlived its run"


def test_it_is_in_the_table_and_is_an_exec_stream_backend():
    assert BACKENDS["fake"] == "hermes_sandbox.environments.testing:FakeEnvironment"
    assert get_environment_class("fake") is FakeEnvironment
    assert issubclass(FakeEnvironment, ExecStreamEnvironment)
    assert FakeSettings.backend == "fake"
    with pytest.raises(SettingError, match="--image: the fake backend runs no image"):
        FakeSettings.flag_layers(image="x", network=False)


def test_a_timeout_kills_what_the_script_started():
    result = execute_code(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(300)\n",
        backend=FakeSettings(),
        timeout=3,
    )
    assert result.status == "timeout"
    pid = int(result.output.split()[0])
    try:
        psutil.Process(pid).wait(3)  # raises TimeoutExpired if it lives on
    except psutil.NoSuchProcess:
        pass
    assert not psutil.pid_exists(pid)


@pytest.mark.anyio
async def test_it_records_and_a_handler_answers_commands_unrun(tmp_path):
    ran = tmp_path / "ran"

    def handler(command: str) -> CommandResult | None:
        return CommandResult("answered", 0) if "never" in command else None

    async with FakeEnvironment(FakeSettings(command_handler=handler)) as env:
        answered = await env.execute(f"touch {ran}-never")
        done = await env.execute(f"touch {ran}-yes && echo made")
        assert (answered.output, done.output) == ("answered", "made\n")
        assert env.commands == [f"touch {ran}-never", f"touch {ran}-yes && echo made"]
        assert env.execs and env.execs[-1][0] == env.python
        root = env.root
        assert root is not None and await anyio.Path(root).is_dir()
    assert not (tmp_path / "ran-never").exists() and (tmp_path / "ran-yes").exists()
    assert not await anyio.Path(root).exists()


@pytest.mark.anyio
async def test_the_lifecycle_errors_come_from_the_seam():
    env = FakeEnvironment()
    with pytest.raises(Exception, match="the fake environment is not started"):
        await env.execute("true")
    async with env:
        assert env.alive
        with anyio.fail_after(10):
            assert (await env.execute("echo $HOME")).output.strip() == env.root
    assert not env.alive
    with pytest.raises(Exception, match="the fake environment is closed"):
        await env.read_bytes("/etc/hostname")
    with pytest.raises(Exception, match="this fake environment was closed; make a new one"):
        await env.start()


@pytest.mark.anyio
async def test_make_stage_writes_every_file_in_one_exec():
    async with FakeEnvironment(FakeSettings()) as env:
        before = len(env.execs)
        files = {"a.py": b"print(1)\n", "odd name \xe9.txt": b"\0" * 70000, "empty": b""}
        stage = await env.make_stage("hermes-test-", files)
        assert len(env.execs) == before + 1
        assert os.path.basename(stage).startswith("hermes-test-")
        assert os.stat(stage).st_mode & 0o777 == 0o700
        assert sorted(os.listdir(stage)) == sorted(files)
        for name, data in files.items():
            path = anyio.Path(stage, name)
            assert (await path.stat()).st_mode & 0o777 == 0o600
            assert await path.read_bytes() == data
        assert env.home is not None


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["../escaped", "sub/file", "..", "."])
async def test_make_stage_refuses_a_name_that_leaves_the_directory(name):
    async with FakeEnvironment(FakeSettings()) as env:
        assert env.root is not None
        with pytest.raises(OSError) as caught:
            await env.make_stage("hermes-test-", {"first.txt": b"x", name: b"y"})
        assert not isinstance(caught.value, FileNotFoundError)
        # nothing is left: no stage, nothing written beside it
        assert [e for e in os.listdir(env.root) if e.startswith("hermes-test-")] == []
        assert not await anyio.Path(env.root, "escaped").exists()


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["../escaped", "sub/file", ".."])
async def test_the_helper_refuses_a_bundle_name_that_leaves_the_directory(name):
    # Past the host's own check: the helper inside the sandbox checks again.
    async with FakeEnvironment(FakeSettings()) as env:
        assert env.root is not None
        bundle = (
            b"%s 600 1\nx" % b"first".hex().encode() + b"%s 600 1\ny" % name.encode().hex().encode()
        )
        with pytest.raises(OSError, match="not a file name"):
            await env._helper("stage", "hermes-test-", env.root, data=bundle)
        assert [e for e in os.listdir(env.root) if e.startswith("hermes-test-")] == []
        assert not await anyio.Path(env.root, "escaped").exists()


@pytest.mark.anyio
async def test_files_go_in_with_the_program_and_never_through_a_planted_symlink(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("kept")
    async with FakeEnvironment(FakeSettings()) as env:
        stage = await env.make_stage("hermes-test-", {})
        await anyio.Path(stage, "script.py").symlink_to(outside)  # planted by a script
        before = len(env.execs)
        reader = "import sys; print(open(sys.argv[1]).read()); print(sys.stdin.read())"
        stream = await env.open_exec_stream(
            [sys.executable, "-c", reader, f"{stage}/script.py"],
            stage=stage,
            files={"script.py": b"new", "stdin": b"\0" * 100000},
        )
        async with stream:
            await stream.send(b"the rest")
            await stream.send_eof()
            output = b"".join([chunk async for chunk in stream])
            assert await stream.wait() == 0
        assert len(env.execs) == before + 1
        assert output == b"new\nthe rest\n"
        assert outside.read_text() == "kept"
        assert not await anyio.Path(stage, "script.py").is_symlink()
        assert await anyio.Path(stage, "stdin").read_bytes() == b"\0" * 100000


@pytest.mark.anyio
@pytest.mark.parametrize("own_magic", [True, False])
async def test_the_relay_exec_runs_the_hosts_compiled_relay_for_its_own_python(own_magic):
    """open_relay makes the stage and runs the relay in the same interpreter: the code
    the host compiled when it is for this Python's bytecode magic, else the source."""
    magic = importlib.util.MAGIC_NUMBER.hex() if own_magic else "00000000"
    files = {
        RELAY_MODULE: b"print('source')\n",
        f"{RELAY_MODULE}.{magic}.code": marshal.dumps(compile("print('code')", "r", "exec")),
    }
    async with FakeEnvironment(FakeSettings()) as env:
        await env.make_private_dir("hermes-test-")  # learns the home
        stage = env.fresh_stage_path("hermes-test-")
        assert stage is not None
        try:
            stream = await env.open_relay(stage, [], files=files, make_stage=True)
            out = b"".join([chunk async for chunk in stream])
            assert (out, await stream.wait()) == (b"code\n" if own_magic else b"source\n", 0)
            await stream.aclose()
            assert os.stat(stage).st_mode & 0o777 == 0o700
        finally:
            await env.remove_tree(stage)
