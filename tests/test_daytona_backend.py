"""The Daytona backend. These tests never touch the live Daytona service (it cannot be
reached from here); they are marked ``not_live``.

Two kinds of evidence:

- Conformance with the installed SDK. The fake in tests/fakes/daytona_fake.py records
  every call the backend makes to the SDK; each is bound against the real SDK
  attribute's signature (and its argument types checked where the annotation is plain),
  after every test. The fake's own signatures are compared with the real ones, the
  attributes the backend reads are fields of the real models, and one scenario reaches
  every SDK method that environments/daytona.py names. An SDK change that breaks a call
  the backend makes fails here.
- Behaviour, end to end. The fake's sandboxes run commands as real local processes, with
  sessions shaped as Daytona's daemon shapes them (a bash per session, FIFOs, a
  line-copying loop per stream), so the codec, the helper program, the stream relay and
  whole runs with ``execute_code(backend="daytona")`` really run.

A few tests use the real SDK and no service: without credentials it refuses before any
request; pointed at a stub HTTP server on 127.0.0.1 its creation errors come through its
real HTTP layer and request encoding.

Not checked here (only the live service could): that the real daemon's logs and input
behave as the fake models them; latency and throughput.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import sys
import textwrap
import threading
import time
import typing
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from conftest import removing_stages_of_vanished_fake_sandboxes

import hermes_sandbox.environments.daytona.environment as daytona_backend
from hermes_sandbox import ExecutionResult, RunError, environments, execute_code
from hermes_sandbox.environments import (
    BackendNotAvailable,
    EnvironmentFailure,
    get_environment_class,
)
from hermes_sandbox.environments.daytona import (
    LABEL_MANAGED,
    LABEL_PERSIST,
    LABEL_TASK,
    DaytonaEnvironment,
    DaytonaSettings,
)

try:
    import daytona as real
    from fakes.daytona_fake import (
        FAKE_CLASSES,
        REAL_CLASSES,
        TAG_VAR,
        Call,
        FakeDaytonaCloud,
        FakeSandbox,
    )
except ImportError as exc:  # the SDK is missing: say so; under CI that is a failure
    if os.environ.get("CI") == "true":
        raise
    print(f"\nSKIPPED: the daytona SDK is not installed: {exc}", file=sys.stderr)
    pytest.skip(
        f"the daytona SDK is not installed (pip install 'hermes-sandbox[daytona]'): {exc}",
        allow_module_level=True,
    )

pytestmark = pytest.mark.not_live

PY = sys.executable
BACKEND_SOURCE = Path(daytona_backend.__file__).read_text()
LEFTOVER_GRACE = 3.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- conformance helpers -------------------------------------------------------------------

_PLAIN_TYPES: dict[str, Any] = {
    "str": str,
    "int": int,
    "float": (int, float),
    "bool": bool,
    "bytes": bytes,
    "dict": dict,
    "list": list,
}
_FAKE_TO_REAL = {fake: REAL_CLASSES[owner] for owner, fake in FAKE_CLASSES.items()}


def _type_problem(value: Any, annotation: Any, globalns: dict[str, Any]) -> str | None:
    """Why ``value`` does not fit a plain annotation ("str | None", "AsyncSandbox"), or
    None. Annotations this does not understand (generics, callables) are not checked."""
    if annotation is inspect.Parameter.empty:
        return None
    text = annotation if isinstance(annotation, str) else str(annotation)
    accepted: list[Any] = []
    for part in text.split("|"):
        name = part.strip().strip("'\"")
        if name == "None":
            accepted.append(type(None))
        elif name in _PLAIN_TYPES:
            accepted.append(_PLAIN_TYPES[name])
        elif isinstance(globalns.get(name), type):
            accepted.append(globalns[name])
        else:
            return None
    kind = _FAKE_TO_REAL.get(type(value), type(value))
    for expected in accepted:
        if issubclass(kind, expected) or isinstance(value, expected):
            return None
    return f"{value!r} is not {text}"


def bind_to_sdk(call: Call) -> None:
    """Bind a recorded call against the installed SDK; fail saying what does not fit."""
    owner, _, method = call.name.partition(".")
    if owner not in REAL_CLASSES:
        pytest.fail(f"the fake recorded a call on an unknown class: {call.name}")
    real_class = REAL_CLASSES[owner]
    if not method:  # a constructor
        candidates: list[Any] = [real_class]
        offset: tuple[Any, ...] = ()
    else:
        if not hasattr(real_class, method):
            pytest.fail(f"the installed SDK has no {call.name}")
        attribute = getattr(real_class, method)
        original = inspect.unwrap(attribute)
        candidates = list(typing.get_overloads(original)) or [attribute]
        offset = (None,)  # self
    problems = []
    for candidate in candidates:
        try:
            bound = inspect.signature(candidate).bind(*offset, *call.args, **call.kwargs)
        except TypeError as exc:
            problems.append(f"{inspect.signature(candidate)}: {exc}")
            continue
        globalns = getattr(inspect.unwrap(candidate), "__globals__", None)
        if globalns is None:  # a class: its module
            globalns = vars(sys.modules[candidate.__module__])
        parameters = inspect.signature(candidate).parameters
        mismatches = [
            f"{name}: {problem}"
            for name, value in bound.arguments.items()
            if name != "self"
            and parameters[name].kind
            not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
            and (problem := _type_problem(value, parameters[name].annotation, globalns))
        ]
        if not mismatches:
            return
        problems.append(f"{inspect.signature(candidate)}: {'; '.join(mismatches)}")
    pytest.fail(f"{call.name}(*{call.args!r}, **{call.kwargs!r}) does not fit the SDK: {problems}")


def _shape(function: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture
def cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDaytonaCloud]:
    """A fake Daytona behind environments.daytona, with an API key in the environment.

    Afterwards: every call the backend made is bound against the real SDK, and nothing
    of a deleted or stopped sandbox may still run."""
    cloud = FakeDaytonaCloud(tmp_path / "cloud")
    monkeypatch.setattr(daytona_backend, "_sdk", cloud.sdk())
    monkeypatch.setenv("DAYTONA_API_KEY", "test-key")
    monkeypatch.delenv("DAYTONA_JWT_TOKEN", raising=False)
    if environments.BACKENDS.get("daytona") is None:  # until the registry names it
        monkeypatch.setitem(
            environments.BACKENDS,
            "daytona",
            "hermes_sandbox.environments.daytona:DaytonaEnvironment",
        )
    try:
        yield cloud
        gone = [s.id for s in cloud.sandboxes.values() if s not in cloud.live()]
        leftovers = _wait_until_empty(lambda: set().union(*map(cloud.processes, gone), set()))
        assert not leftovers, f"processes of deleted sandboxes still run: {leftovers}"
        for call in cloud.calls:
            bind_to_sdk(call)
    finally:
        cloud.close()


def _wait_until_empty(find: Callable[[], set[int]]) -> set[int]:
    deadline = time.monotonic() + LEFTOVER_GRACE
    found = find()
    while found and time.monotonic() < deadline:
        time.sleep(0.05)
        found = find()
    return found


def settings(**overrides: Any) -> DaytonaSettings:
    return DaytonaSettings(python=PY, **overrides)


def assert_clean(cloud: FakeDaytonaCloud) -> None:
    """No sandbox left, nothing of any still running."""
    assert cloud.live() == [], f"sandboxes left: {[s.name for s in cloud.live()]}"
    leftovers = _wait_until_empty(cloud.processes)
    assert not leftovers, f"processes left: {leftovers}"


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def read_pids(path: Path) -> list[int]:
    try:
        return [int(p) for p in path.read_text().split()]
    except (FileNotFoundError, ValueError):
        return []


async def wait_for_pids(path: Path, count: int, timeout: float = 15.0) -> list[int]:
    with anyio.fail_after(timeout):  # another process writes it: nothing to wait on
        while True:
            pids = read_pids(path)
            if len(pids) >= count:
                return pids
            await anyio.sleep(0.02)


async def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    alive = [p for p in pids if not gone(p)]
    while alive and time.monotonic() < deadline:
        await anyio.sleep(0.05)
        alive = [p for p in alive if not gone(p)]
    return alive


def run_daytona(code: str, tmp_path: Path, **options: Any) -> ExecutionResult:
    options.setdefault("timeout", 30)
    options.setdefault("spill_dir", str(tmp_path / "spill"))
    backend_options = {"python": PY, **options.pop("backend_options", {})}
    return execute_code(
        textwrap.dedent(code), backend="daytona", backend_options=backend_options, **options
    )


# -- conformance -----------------------------------------------------------------------------


async def _every_call_site(cloud: FakeDaytonaCloud, tmp_path: Path) -> None:
    """Drive the backend through every path that reaches the SDK."""
    base = {"api_url": "https://daytona.invalid/api", "target": "eu"}
    name = f"conf-{uuid.uuid4().hex[:6]}"
    # A named sandbox that is not there yet: looked up, then made from the default snapshot.
    env = DaytonaEnvironment(settings(name=name, persist=True, **base), env={"A": "1"})
    await env.start()
    try:
        assert (await env.execute("echo $A")).output == "1\n"
        home = env.home
        assert home is not None
        await env.write_bytes(f"{home}/f.bin", b"\0\1\2")
        assert await env.read_bytes(f"{home}/f.bin") == b"\0\1\2"
        await env.rename(f"{home}/f.bin", f"{home}/g.bin")
        assert "g.bin" in await env.list_dir(home)
        await env.remove(f"{home}/g.bin")
        stream = await env.open_exec_stream([PY, "-c", "import time; time.sleep(60)"])
        await stream.send(b"")
        await stream.aclose()  # still running: the session is deleted
    finally:
        await env.aclose()
    sandbox = cloud.find(name)
    assert sandbox is not None
    # Found by name: resumed as it is, stopped (started again), or still starting.
    for prepare in (
        lambda: None,
        lambda: cloud.stop(sandbox.id),
        lambda: setattr(sandbox, "state", real.SandboxState.STARTING),
    ):
        prepare()
        async with DaytonaEnvironment(settings(name=name)) as again:
            assert again.resumed
    # An interpreter that is not there: the exit code comes from the daemon.
    missing = DaytonaEnvironment(DaytonaSettings(name=name, python="/nonexistent/python3"))
    async with missing:
        with pytest.raises(EnvironmentFailure, match="nonexistent/python3"):
            await missing.execute("true")
    cloud.destroy(sandbox.id)
    # Persistent by task: looked for by labels, made, then found again.
    for _ in range(2):
        async with DaytonaEnvironment(settings(persist=True, task_id="conf-task")):
            pass
    # From an image, with resources.
    async with DaytonaEnvironment(settings(image="python:3.12-slim", cpu=2, memory=2, disk=5)):
        pass
    # A creation that fails after the sandbox was made: the half-made one is deleted.
    cloud.error_after_create = real.DaytonaTimeoutError("Sandbox failed to start in time")
    with pytest.raises(EnvironmentFailure):
        await DaytonaEnvironment(settings()).start()
    # A sandbox that goes away under a command: asked about, found gone.
    doomed = DaytonaEnvironment(settings())
    async with doomed:

        async def delete_soon() -> None:
            await anyio.sleep(0.5)
            assert doomed.sandbox_id is not None
            cloud.destroy(doomed.sandbox_id)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(delete_soon)
            with pytest.raises(EnvironmentFailure, match="gone"):
                await doomed.execute("sleep 60")


@pytest.mark.anyio
async def test_every_sdk_call_the_backend_makes_fits_the_installed_sdk(
    cloud: FakeDaytonaCloud, tmp_path: Path
) -> None:
    await _every_call_site(cloud, tmp_path)
    recorded = {call.name for call in cloud.calls}
    for call in cloud.calls:
        bind_to_sdk(call)
    # Every SDK method the backend's source names was reached above.
    source = BACKEND_SOURCE.replace(daytona_backend.CODEC_SOURCE, "")
    methods = {
        name
        for owner in ("AsyncDaytona", "AsyncSandbox", "AsyncProcess", "AsyncFileSystem")
        for name, member in inspect.getmembers(REAL_CLASSES[owner])
        if not name.startswith("_") and inspect.isroutine(member)
    }
    named = set(re.findall(r"\.([A-Za-z_]\w*)\b", source)) & methods
    reached = {name.partition(".")[2] for name in recorded}
    assert named, "found no SDK method names in the backend's source"
    assert not named - reached, f"SDK methods the backend names but no test reached: {named}"
    # Every name the backend takes from the SDK module exists there.
    from_module = set(re.findall(r"\bsdk\.([A-Za-z_]\w*)", source))
    assert from_module, "found no SDK module names in the backend's source"
    assert all(hasattr(real, name) for name in from_module), from_module
    for name in ("AsyncDaytona", "DaytonaConfig", "SessionExecuteRequest", "Resources"):
        assert name in recorded, f"{name} was never constructed"


@pytest.mark.parametrize("owner", sorted(FAKE_CLASSES))
def test_the_fakes_have_the_sdk_signatures(owner: str) -> None:
    fake, real_class = FAKE_CLASSES[owner], REAL_CLASSES[owner]
    compared = 0
    for name, member in vars(fake).items():
        if isinstance(member, property) and not name.startswith("_"):
            assert isinstance(getattr(real_class, name, None), property), f"{owner}.{name}"
            continue
        # Of the constructors only the client's is the backend's to call: the SDK makes
        # the sandbox, process and fs objects itself.
        constructor = name == "__init__" and owner == "AsyncDaytona"
        if not inspect.isfunction(member) or (name.startswith("_") and not constructor):
            continue
        real_member = getattr(real_class, name, None)
        assert real_member is not None, f"the SDK has no {owner}.{name}"
        assert _shape(member) == _shape(real_member), f"{owner}.{name}"
        compared += 1
    assert compared >= 3


def test_what_the_backend_reads_are_fields_of_the_sdk_models(cloud: FakeDaytonaCloud) -> None:
    from daytona_toolbox_api_client_async import Command, FileInfo

    sandbox = FakeSandbox(cloud, real.CreateSandboxFromSnapshotParams(name="fields"))
    public = {name for name in vars(sandbox) if not name.startswith("_")}
    assert public <= set(real.AsyncSandbox.model_fields), public - set(
        real.AsyncSandbox.model_fields
    )
    for model, names in (
        (real.AsyncSandbox, ("id", "name", "state", "labels")),
        (real.SessionExecuteResponse, ("cmd_id",)),
        (Command, ("exit_code",)),
        (FileInfo, ("name",)),
    ):
        for name in names:
            assert name in model.model_fields, f"{model.__name__}.{name}"
    states = {state.value for state in real.SandboxState}
    assert {"started", "stopped", "archived", "starting", "error", "destroyed"} <= states


def test_a_call_that_does_not_fit_the_sdk_fails_the_check() -> None:
    """The check itself can fail: wrong names, arity and types are caught."""
    bad = [
        Call("AsyncProcess.execute_session_command", ("s",), {"request": None}),
        Call("AsyncProcess.send_session_command_input", ("s", "c", b"bytes")),
        Call("AsyncProcess.create_session", ("s", 1, 2)),
        Call("AsyncDaytona.find_one", ({"a": "b"},)),
        Call("SessionExecuteRequest", (), {"cmd": "x"}),
    ]
    for call in bad:
        with pytest.raises(pytest.fail.Exception):
            bind_to_sdk(call)
    bind_to_sdk(Call("AsyncProcess.send_session_command_input", ("s", "c", "text")))


# -- settings ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"imagee": "x"}, "unknown daytona backend setting.*imagee.*known:.*image"),
        ({"api_key": "secret"}, "DAYTONA_API_KEY"),
        ({"image": "a", "snapshot": "b"}, "image or snapshot"),
        ({"cpu": 2}, "only to a sandbox made from an image"),
        ({"image": "a", "memory": 0}, "memory must be a whole number"),
        ({"image": "a", "disk": 1.5}, "disk=1.5.: expected a whole number"),
        ({"auto_stop_interval": -1}, "auto_stop_interval"),
        ({"network_block_all": "no"}, "network_block_all='no'.: expected true or false"),
        ({"persist": 1}, "persist=1.: expected true or false"),
        ({"workdir": "relative"}, "absolute"),
        ({"labels": {"hermes-sandbox.task": "x"}}, "reserved"),
        ({"create_timeout": 0}, "create_timeout"),
        ({"name": ""}, "name must be a non-empty string"),
    ],
)
def test_bad_settings_are_refused_with_what_to_do(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DaytonaSettings.from_mapping(data)


def test_for_run_builds_the_settings() -> None:
    cls = get_environment_class("daytona")
    assert cls is DaytonaEnvironment
    env = cls.for_run(
        {"image": "python:3.12-slim", "cpu": 2},
        env={"A": "1"},
        kill_grace=0.5,
        task_id="task-1",
        python="/usr/bin/python3.12",
    )
    assert isinstance(env, DaytonaEnvironment)
    assert env.settings.task_id == "task-1" and env.task_id == "task-1"
    assert env.python == "/usr/bin/python3.12" and env.kill_grace == 0.5
    assert env.settings.network_block_all is True  # no network unless asked
    with pytest.raises(ValueError, match="unknown"):
        cls.for_run({"bogus": 1}, env={}, kill_grace=1, task_id=None, python=None)


@pytest.mark.anyio
async def test_sandboxes_are_made_as_the_settings_say(cloud: FakeDaytonaCloud) -> None:
    async with DaytonaEnvironment(
        settings(
            image="python:3.12-slim",
            cpu=2,
            memory=4,
            disk=10,
            auto_stop_interval=5,
            labels={"team": "x"},
            target="eu",
        ),
        env={"SECRET_TOKEN": "s3cr3t-value"},
    ) as env:
        (call,) = cloud.called("CreateSandboxFromImageParams")
        assert call.kwargs["image"] == "python:3.12-slim"
        assert call.kwargs["network_block_all"] is True
        assert call.kwargs["auto_stop_interval"] == 5
        assert call.kwargs["ephemeral"] is True  # gone by itself once stopped, if leaked
        assert call.kwargs["target"] == "eu"
        labels = call.kwargs["labels"]
        assert labels["team"] == "x" and labels[LABEL_MANAGED] == "1"
        assert labels[LABEL_TASK] == env.task_id and LABEL_PERSIST not in labels
        assert "env_vars" not in call.kwargs  # variables travel with each command only
        (resources,) = cloud.called("Resources")
        assert resources.kwargs == {"cpu": 2, "memory": 4, "disk": 10}
        (sandbox,) = cloud.live()
        assert (sandbox.cpu, sandbox.memory, sandbox.disk) == (2, 4, 10)
        assert sandbox.auto_delete_interval == 0
        assert (await env.execute("echo $SECRET_TOKEN")).output == "s3cr3t-value\n"
        assert (await env.execute("true", cwd="/")).exit_code == 0
        await env.write_bytes(f"{env.home}/x", b"x")
    # Nothing of a command (argv, variables, cwd) is on a command line: every session
    # command is the same codec invocation; the rest travels as its input.
    commands = {call.kwargs["command"] for call in cloud.called("SessionExecuteRequest")}
    assert len(commands) == 1, commands
    for recorded in cloud.calls:
        text = repr(recorded.args) + repr(recorded.kwargs)
        assert "s3cr3t-value" not in text, recorded.name
        assert "echo $SECRET_TOKEN" not in text, recorded.name
    assert_clean(cloud)


@pytest.mark.anyio
async def test_without_an_image_the_default_or_named_snapshot_is_used(
    cloud: FakeDaytonaCloud,
) -> None:
    async with DaytonaEnvironment(settings()):
        pass
    async with DaytonaEnvironment(settings(snapshot="my-snap", persist=True)):
        pass
    first, second = cloud.called("CreateSandboxFromSnapshotParams")
    assert first.kwargs["snapshot"] is None and second.kwargs["snapshot"] == "my-snap"
    assert "ephemeral" not in second.kwargs  # a persistent sandbox is not ephemeral
    assert second.kwargs["labels"][LABEL_PERSIST] == "1"
    assert not cloud.called("CreateSandboxFromImageParams")


# -- commands ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_execute_output_exit_code_cwd_and_env(
    cloud: FakeDaytonaCloud, tmp_path: Path
) -> None:
    async with DaytonaEnvironment(settings(), env={"FOO": "bar baz"}) as env:
        (sandbox,) = cloud.live()
        assert env.default_cwd == str(sandbox._workdir)  # the SDK's work dir
        assert env.home == str(sandbox._home)
        result = await env.execute("echo $FOO; pwd; echo to-stderr >&2; exit 3")
        assert result.output == f"bar baz\n{sandbox._workdir}\nto-stderr\n"
        assert result.exit_code == 3 and not result.timed_out
        where = tmp_path / "elsewhere"
        where.mkdir()
        assert (await env.execute("pwd", cwd=str(where))).output == f"{where}\n"
        with pytest.raises(FileNotFoundError):
            await env.execute("true", cwd=str(tmp_path / "missing"))
        # It runs in the sandbox: under its session shells, with its tag.
        tagged = await env.execute(f"echo ${TAG_VAR}")
        assert tagged.output.strip() == sandbox._tag
        # Output that is not text, and the log's own markers, come back as they were.
        odd = await env.execute(r"printf 'a\001\001\001b\002\002\002c\000d\377\n\n\r\nlast'")
        assert odd.output == "a\x01\x01\x01b\x02\x02\x02c\x00d\ufffd\n\n\r\nlast"
    assert_clean(cloud)


@pytest.mark.anyio
async def test_execute_timeout_kills_the_whole_tree(
    cloud: FakeDaytonaCloud, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    async with DaytonaEnvironment(settings(), kill_grace=0.5) as env:
        started = time.monotonic()
        result = await env.execute(
            f"sleep 300 & echo $! >> {pids}; setsid sleep 300 & echo $! >> {pids}; "
            f"echo $$ >> {pids}; echo before; sleep 300",
            timeout=1.5,
        )
        assert result.timed_out and result.exit_code == 124
        assert "before" in result.output
        assert time.monotonic() - started < 60  # the sleeps last 300 s
        numbers = [int(p) for p in pids.read_text().split()]
        assert len(numbers) == 3
        assert await wait_gone(numbers) == []
        # The environment still works afterwards.
        assert (await env.execute("echo still")).output == "still\n"
    assert_clean(cloud)


@pytest.mark.anyio
async def test_a_cancelled_execute_kills_its_command(
    cloud: FakeDaytonaCloud, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    async with DaytonaEnvironment(settings(), kill_grace=0.5) as env:
        with anyio.move_on_after(2):
            await env.execute(f"setsid sleep 300 & echo $! >> {pids}; echo $$ >> {pids}; wait")
        numbers = await wait_for_pids(pids, 2)
        assert await wait_gone(numbers) == []
    assert_clean(cloud)


@pytest.mark.anyio
async def test_commands_run_at_once_and_sessions_are_reused(cloud: FakeDaytonaCloud) -> None:
    async with DaytonaEnvironment(settings()) as env:
        results: dict[int, str] = {}

        barrier = f"/tmp/hermes-test-overlap-{uuid.uuid4().hex}"

        # A barrier: each command arrives, then waits (up to 60 s) for all six. Run one
        # after another, each would see only itself: overlap observed, not timed.
        async def one(i: int) -> None:
            command = (
                f"mkdir -p {barrier} && touch {barrier}/{i}; for n in $(seq 600); do "
                f"[ $(ls {barrier} | wc -l) -ge 6 ] && break; sleep 0.1; done; "
                f"echo {i} $(ls {barrier} | wc -l)"
            )
            results[i] = (await env.execute(command, timeout=120)).output

        try:
            async with anyio.create_task_group() as tasks:
                for i in range(6):
                    tasks.start_soon(one, i)
        finally:
            await anyio.to_thread.run_sync(lambda: shutil.rmtree(barrier, ignore_errors=True))
        assert results == {i: f"{i} 6\n" for i in range(6)}
        sessions = len(cloud.called("AsyncProcess.create_session"))
        assert 1 <= sessions <= 6 + 1  # (+1: start's own command, if any)
        for i in range(4):
            assert (await env.execute(f"echo {i}")).output == f"{i}\n"
        assert len(cloud.called("AsyncProcess.create_session")) == sessions  # reused
    assert_clean(cloud)


# -- files ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_files_are_binary_clean(cloud: FakeDaytonaCloud, tmp_path: Path) -> None:
    data = (
        bytes(range(256)) * 2000
        + b"\x01\x01\x01\x02\x02\x02\n\n\r\n\0\0"
        + "é".encode()[:1]  # half a UTF-8 character
        + b"no newline at the end"
    )
    path = tmp_path / "sub" / "data.bin"
    async with DaytonaEnvironment(settings()) as env:
        await env.write_bytes(str(path), data, mode=0o600)
        assert path.read_bytes() == data  # the fake's sandbox is this disk
        assert path.stat().st_mode & 0o777 == 0o600
        assert await env.read_bytes(str(path)) == data
        assert await env.read_bytes(str(path), max_bytes=300) == data[:300]
        found = await env.stat(str(path))
        assert (found.kind, found.size, found.path) == ("file", len(data), str(path))
        assert (await env.stat(str(tmp_path))).kind == "directory"
        await env.write_bytes(str(path), b"")
        assert await env.read_bytes(str(path)) == b""
        with pytest.raises(FileNotFoundError):
            await env.read_bytes(str(tmp_path / "missing"))
        with pytest.raises(FileNotFoundError):
            await env.stat(str(tmp_path / "missing"))
        with pytest.raises(FileNotFoundError):
            await env.write_bytes(str(tmp_path / "no" / "dir" / "f"), b"x", make_parents=False)
        with pytest.raises(IsADirectoryError):
            await env.read_bytes(str(tmp_path))
    assert_clean(cloud)


@pytest.mark.anyio
async def test_private_dirs_home_and_workdir(cloud: FakeDaytonaCloud, tmp_path: Path) -> None:
    workdir = tmp_path / "work" / "deeper"
    async with DaytonaEnvironment(settings(workdir=str(workdir))) as env:
        (sandbox,) = cloud.live()
        assert workdir.is_dir() and env.default_cwd == str(workdir)
        assert (await env.execute("pwd")).output == f"{workdir}\n"
        made = await env.make_private_dir("hermes-test-")
        assert made.startswith("/tmp/hermes-test-")
        assert os.stat(made).st_mode & 0o777 == 0o700
        assert env.home == str(sandbox._home)
        inner = await env.make_private_dir("in-", parent=str(tmp_path))
        assert Path(inner).parent == tmp_path
        await env.write_bytes(f"{made}/a/b/c.txt", b"x")
        await env.remove_tree(made)
        await env.remove_tree(made)  # a missing path is not an error
        with pytest.raises(FileNotFoundError):
            await env.stat(made)
        # The SDK's file API, for a transport that polls a directory.
        await env.write_bytes(f"{inner}/.tmp-1", b"req")
        await env.rename(f"{inner}/.tmp-1", f"{inner}/1.req")
        assert await env.list_dir(inner) == ["1.req"]
        await env.remove(f"{inner}/1.req")
        assert await env.list_dir(inner) == []
        for attempt in (
            env.list_dir(str(tmp_path / "missing")),
            env.remove(str(tmp_path / "missing")),
            env.rename(str(tmp_path / "missing"), str(tmp_path / "x")),
        ):
            with pytest.raises(FileNotFoundError):
                await attempt
    assert_clean(cloud)


# -- the exec stream -----------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_exec_stream_is_binary_clean_both_ways(cloud: FakeDaytonaCloud) -> None:
    program = (
        "import sys; data = sys.stdin.buffer.read(); "
        "sys.stdout.buffer.write(data[::-1]); sys.stderr.write('the tail')"
    )
    data = bytes(range(256)) * 1500 + b"\x01\x01\x01\n\x02\x02\x02\r\n\0" + b"\n" * 5000
    async with DaytonaEnvironment(settings()) as env:
        stream = await env.open_exec_stream([PY, "-c", program])
        try:
            for start in range(0, len(data), 70001):
                await stream.send(data[start : start + 70001])
            await stream.send_eof()
            received = bytearray()
            async for chunk in stream:
                received += chunk
            assert bytes(received) == data[::-1]
            assert await stream.wait() == 0
            assert stream.stderr_tail.endswith(b"the tail")
        finally:
            await stream.aclose()
    assert_clean(cloud)


@pytest.mark.anyio
async def test_concurrent_sends_do_not_interleave(cloud: FakeDaytonaCloud) -> None:
    blocks = [bytes([i]) * 150_000 for i in range(1, 9)]
    async with DaytonaEnvironment(settings()) as env:
        stream = await env.open_exec_stream(["cat"])
        try:
            received = bytearray()

            async def read() -> None:
                async for chunk in stream:
                    received.extend(chunk)

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(read)
                async with anyio.create_task_group() as senders:
                    for block in blocks:
                        senders.start_soon(stream.send, block)
                await stream.send_eof()
            runs = [m.group(0) for m in re.finditer(rb"(.)\1*", bytes(received), re.DOTALL)]
            assert sorted(runs) == sorted(blocks)
            assert await stream.wait() == 0
        finally:
            await stream.aclose()
    assert_clean(cloud)


@pytest.mark.anyio
async def test_a_program_that_is_not_there(cloud: FakeDaytonaCloud, tmp_path: Path) -> None:
    async with DaytonaEnvironment(settings()) as env:
        stream = await env.open_exec_stream(["/nonexistent/program"])
        await stream.send_eof()
        assert await stream.wait() == 127
        assert b"/nonexistent/program" in stream.stderr_tail
        await stream.aclose()
        stream = await env.open_exec_stream(["true"], cwd=str(tmp_path / "missing"))
        await stream.send_eof()
        assert await stream.wait() in (126, 127)
        await stream.aclose()
    assert_clean(cloud)


@pytest.mark.anyio
async def test_closing_a_stream_kills_what_it_started(
    cloud: FakeDaytonaCloud, tmp_path: Path
) -> None:
    """Also what left the process tree: an orphan in a session of its own, which the
    daemon's ending of a session's process tree does not reach."""
    pids = tmp_path / "pids"
    orphan = (
        "import subprocess, sys; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], "
        "start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, "
        "stderr=subprocess.DEVNULL); print(p.pid)"
    )
    program = (
        "import os, subprocess, sys, time\n"
        f"middle = subprocess.run([sys.executable, '-c', {orphan!r}], stdout=subprocess.PIPE)\n"
        f"open({str(pids)!r}, 'w').write('%d %s' % (os.getpid(), middle.stdout.decode()))\n"
        "time.sleep(300)\n"
    )
    async with DaytonaEnvironment(settings(), kill_grace=0.3) as env:
        stream = await env.open_exec_stream([PY, "-c", program])
        await stream.send(b"")
        numbers = await wait_for_pids(pids, 2)
        started = time.monotonic()
        await stream.aclose()
        assert await wait_gone(numbers) == []
        assert time.monotonic() - started < 20  # bounded, not a hang
    assert_clean(cloud)


@pytest.mark.anyio
async def test_closing_a_stream_whose_output_nobody_reads(cloud: FakeDaytonaCloud) -> None:
    program = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n"
    async with DaytonaEnvironment(settings(), kill_grace=0.3) as env:
        stream = await env.open_exec_stream([PY, "-c", program])
        await stream.send(b"")
        assert await stream.receive()  # it runs; the rest piles up unread
        await anyio.sleep(1)
        started = time.monotonic()
        await stream.aclose()
        assert time.monotonic() - started < 20  # bounded, not a hang
    assert_clean(cloud)


@pytest.mark.anyio
async def test_a_silent_host_gets_its_command_killed(
    cloud: FakeDaytonaCloud, tmp_path: Path
) -> None:
    """The codec kills its command when the host stops talking (a host that died), and
    the keep-alive of a live stream prevents that."""
    pids = tmp_path / "pids"
    program = f"import os, time; open({str(pids)!r}, 'w').write(str(os.getpid())); time.sleep(300)"
    async with DaytonaEnvironment(settings(), kill_grace=0.3) as env:
        env.ping_interval, env.idle_timeout = 3600.0, 1.0
        stream = await env.open_exec_stream([PY, "-c", program])
        await stream.send(b"")
        numbers = await wait_for_pids(pids, 1)
        with anyio.fail_after(15):
            assert await stream.wait() != 0
        assert await wait_gone(numbers) == []
        await stream.aclose()
        env.ping_interval = 0.2
        result = await env.execute("sleep 2.5; echo survived")
        assert result.output == "survived\n"
    assert_clean(cloud)


@pytest.mark.anyio
async def test_an_older_daemon_that_echoes_input_is_harmless(
    cloud: FakeDaytonaCloud, tmp_path: Path
) -> None:
    cloud.echo_input_always = True
    async with DaytonaEnvironment(settings()) as env:
        data = bytes(range(256)) * 100
        await env.write_bytes(str(tmp_path / "f"), data)
        assert await env.read_bytes(str(tmp_path / "f")) == data
        assert (await env.execute("echo hi")).output == "hi\n"
    assert_clean(cloud)


# -- lifecycle and failures ------------------------------------------------------------------


@pytest.mark.anyio
async def test_resume_by_name_keeps_what_was_there(cloud: FakeDaytonaCloud) -> None:
    name = f"keep-{uuid.uuid4().hex[:6]}"
    async with DaytonaEnvironment(settings(name=name, persist=True)) as first:
        assert not first.resumed
        await first.write_bytes(f"{first.home}/state.txt", b"remembered")
    (sandbox,) = cloud.live()
    assert cloud.processes(sandbox.id) == set()  # kept, but nothing left running in it
    cloud.stop(sandbox.id)  # its auto-stop interval passed
    async with DaytonaEnvironment(settings(name=name)) as second:  # not persist: still kept
        assert second.resumed and second.sandbox_id == sandbox.id
        assert await second.read_bytes(f"{second.home}/state.txt") == b"remembered"
    assert len(cloud.called("AsyncDaytona.create")) == 1
    assert len(cloud.called("AsyncSandbox.start")) == 1
    assert cloud.live() == [sandbox]  # a sandbox that was there before is never deleted
    sandbox.state = real.SandboxState.ERROR
    with pytest.raises(EnvironmentFailure, match=r"is error.*delete it, or choose another"):
        await DaytonaEnvironment(settings(name=name)).start()


@pytest.mark.anyio
async def test_a_named_sandbox_made_by_the_run_is_deleted_unless_persistent(
    cloud: FakeDaytonaCloud,
) -> None:
    async with DaytonaEnvironment(settings(name="made-here")) as env:
        assert env.sandbox_name == "made-here"
    assert_clean(cloud)


@pytest.mark.anyio
async def test_without_the_sdk_it_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(daytona_backend, "_sdk", None)
    monkeypatch.setitem(sys.modules, "daytona", None)  # import daytona now fails
    with pytest.raises(
        BackendNotAvailable, match=re.escape("pip install 'hermes-sandbox[daytona]'")
    ):
        await DaytonaEnvironment(settings()).start()


def test_without_the_sdk_a_run_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(daytona_backend, "_sdk", None)
    monkeypatch.setitem(sys.modules, "daytona", None)
    with pytest.raises(BackendNotAvailable, match=re.escape("hermes-sandbox[daytona]")):
        run_daytona("print(1)", tmp_path)


@pytest.mark.anyio
async def test_without_credentials_the_real_sdk_refuses_and_it_says_which(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(daytona_backend, "_sdk", None)  # the real SDK
    for name in list(os.environ):
        if name.startswith("DAYTONA_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # the SDK also reads a .env here: there is none
    with pytest.raises(BackendNotAvailable, match="DAYTONA_API_KEY"):
        await DaytonaEnvironment(settings()).start()


@pytest.mark.anyio
async def test_rejected_credentials(cloud: FakeDaytonaCloud) -> None:
    cloud.accepted_key = "the-right-key"
    with pytest.raises(BackendNotAvailable, match="DAYTONA_API_KEY"):
        await DaytonaEnvironment(settings()).start()
    assert cloud.live() == []


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_trio_is_refused_with_the_reason(cloud: FakeDaytonaCloud) -> None:
    with pytest.raises(BackendNotAvailable, match="asyncio"):
        await DaytonaEnvironment(settings()).start()


@pytest.mark.anyio
async def test_a_platform_error_at_creation(cloud: FakeDaytonaCloud) -> None:
    cloud.create_error = real.DaytonaForbiddenError(
        "Failed to create sandbox: Total CPU limit exceeded", status_code=403
    )
    env = DaytonaEnvironment(settings(image="python:3.12-slim"))
    with pytest.raises(EnvironmentFailure, match=r"image 'python:3\.12-slim'.*CPU limit exceeded"):
        await env.start()
    await env.aclose()
    assert_clean(cloud)


@pytest.mark.anyio
async def test_a_creation_that_times_out_leaves_no_sandbox(cloud: FakeDaytonaCloud) -> None:
    cloud.error_after_create = real.DaytonaTimeoutError("Sandbox failed to start in time")
    with pytest.raises(EnvironmentFailure, match="failed to start in time"):
        await DaytonaEnvironment(settings()).start()
    assert len(cloud.sandboxes) == 1  # it was made, and is deleted
    assert_clean(cloud)


@pytest.mark.anyio
async def test_a_cancelled_creation_leaves_no_sandbox(cloud: FakeDaytonaCloud) -> None:
    cloud.create_delay = 60
    env = DaytonaEnvironment(settings())
    with anyio.move_on_after(0.5) as scope:
        await env.start()
    assert scope.cancelled_caught
    await env.aclose()
    assert len(cloud.sandboxes) == 1
    assert_clean(cloud)


@pytest.mark.anyio
async def test_a_failed_creation_never_deletes_someone_elses_sandbox(
    cloud: FakeDaytonaCloud,
) -> None:
    """Between the lookup and the creation another client made a sandbox of the name:
    the creation fails, and that sandbox is not taken for a half-made one of ours."""
    theirs: list[FakeSandbox] = []

    def someone_else(params: Any) -> None:
        other = FakeSandbox(cloud, real.CreateSandboxFromSnapshotParams(name=params.name))
        cloud.sandboxes[other.id] = other
        theirs.append(other)

    cloud.before_create = someone_else
    with pytest.raises(EnvironmentFailure, match="already exists"):
        await DaytonaEnvironment(settings(name="contested")).start()
    assert cloud.live() == theirs


@pytest.mark.anyio
@pytest.mark.parametrize(("how", "said"), [("destroy", "is gone"), ("stop", "is stopped")])
async def test_a_sandbox_that_goes_away_under_a_command(
    cloud: FakeDaytonaCloud, how: str, said: str
) -> None:
    async with DaytonaEnvironment(settings()) as env:
        assert env.sandbox_id is not None
        sandbox_id = env.sandbox_id

        async def go_away() -> None:
            await anyio.sleep(0.7)
            getattr(cloud, how)(sandbox_id)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(go_away)
            with anyio.fail_after(20), pytest.raises(EnvironmentFailure, match=said):
                await env.execute("sleep 300")
        with pytest.raises(EnvironmentFailure):
            await env.execute("true")
    assert cloud.processes(sandbox_id) == set()


# -- whole runs ------------------------------------------------------------------------------


def test_a_run_acts_in_the_sandbox(cloud: FakeDaytonaCloud, tmp_path: Path) -> None:
    result = run_daytona(
        f"""
        import os
        from hermes_tools import read_file, terminal, write_file
        print(write_file("notes/a.txt", "hello from the script")["bytes_written"])
        print(read_file("notes/a.txt")["content"])
        print(terminal("pwd; echo ${TAG_VAR}")["output"].split())
        print(os.getcwd())
        print(open("notes/a.txt").read())
        """,
        tmp_path,
        env={"GREETING": "hi"},
    )
    assert result.status == "success", result.output
    lines = result.output.splitlines()
    sandbox = next(iter(cloud.sandboxes.values()))
    assert lines[0] == "21" and lines[1] == "hello from the script"
    assert lines[2] == str([str(sandbox._workdir), sandbox._tag])
    assert lines[3] == str(sandbox._workdir)
    assert lines[4] == "hello from the script"
    assert result.tool_calls_made == 3
    assert_clean(cloud)
    assert not sandbox._dir.exists()


def test_a_run_output_that_is_not_text(cloud: FakeDaytonaCloud, tmp_path: Path) -> None:
    code = """
        import sys
        sys.stdout.buffer.write(b"a\\x01\\x01\\x01b\\x02\\x02\\x02c\\x00d\\xff\\n\\r\\nend")
        sys.stderr.write("problem\\n")
    """
    result = run_daytona(code, tmp_path)
    local = execute_code(textwrap.dedent(code), backend="local", spill_dir=str(tmp_path / "s"))
    assert result.output == local.output
    assert "\x01\x01\x01" in result.output and "problem" in result.output
    assert_clean(cloud)


def test_a_run_that_times_out_leaves_nothing(cloud: FakeDaytonaCloud, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    started = time.monotonic()
    result = run_daytona(
        f"""
        import os, subprocess, sys, time
        a = subprocess.Popen(["sleep", "300"])
        b = subprocess.Popen(["sleep", "300"], start_new_session=True)
        open({str(pids)!r}, "w").write("%d %d %d" % (os.getpid(), a.pid, b.pid))
        print("started", flush=True)
        time.sleep(300)
        """,
        tmp_path,
        timeout=3,
        kill_grace=0.5,
    )
    assert result.status == "timeout"
    assert "started" in result.output
    assert time.monotonic() - started < 20
    numbers = [int(p) for p in pids.read_text().split()]
    assert len(numbers) == 3
    assert [p for p in numbers if not gone(p)] == []
    assert_clean(cloud)


def test_a_run_keeps_to_its_budget_and_caps(cloud: FakeDaytonaCloud, tmp_path: Path) -> None:
    result = run_daytona(
        """
        from hermes_tools import terminal
        answers = [terminal("echo %d" % i) for i in range(3)]
        print([("error" in a) for a in answers])
        print("x" * 300000)
        """,
        tmp_path,
        max_tool_calls=2,
        max_stdout_bytes=2000,
    )
    assert result.status == "success"
    assert result.tool_calls_made == 2
    assert result.output.startswith("[False, False, True]")
    assert result.stdout_truncated
    assert len(result.output.encode()) < 10_000
    assert_clean(cloud)


def test_a_run_persistent_by_task_is_found_again(cloud: FakeDaytonaCloud, tmp_path: Path) -> None:
    code = """
        import os
        path = os.path.expanduser("~/count")
        count = int(open(path).read()) + 1 if os.path.exists(path) else 1
        open(path, "w").write(str(count))
        print(count)
    """
    options = {"task_id": "task-7", "backend_options": {"persist": True}}
    assert run_daytona(code, tmp_path, **options).output == "1\n"
    assert run_daytona(code, tmp_path, **options).output == "2\n"
    assert len(cloud.called("AsyncDaytona.create")) == 1
    (listed, *_) = cloud.called("ListSandboxesQuery")
    assert listed.kwargs["labels"][LABEL_TASK] == "task-7"
    (sandbox,) = cloud.live()
    assert cloud.processes(sandbox.id) == set()


def test_runs_resume_a_sandbox_by_name(cloud: FakeDaytonaCloud, tmp_path: Path) -> None:
    code = """
        import os
        path = os.path.expanduser("~/runs")
        open(path, "a").write("x")
        print(len(open(path).read()))
    """
    name = f"named-{uuid.uuid4().hex[:6]}"
    made = run_daytona(code, tmp_path, backend_options={"name": name, "persist": True})
    assert made.output == "1\n"
    (sandbox,) = cloud.live()
    cloud.stop(sandbox.id)
    again = run_daytona(code, tmp_path, backend_options={"name": name})
    assert again.status == "success" and again.output == "2\n"
    assert cloud.live() == [sandbox] and sandbox.state == real.SandboxState.STARTED
    assert len(cloud.called("AsyncDaytona.create")) == 1
    assert cloud.processes(sandbox.id) == set()


@pytest.mark.parametrize("failure", ["no credentials", "rejected key", "platform error"])
def test_runs_that_cannot_start_say_why(
    cloud: FakeDaytonaCloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    expected: tuple[type[Exception], str]
    if failure == "no credentials":
        monkeypatch.delenv("DAYTONA_API_KEY")
        expected = (BackendNotAvailable, "set DAYTONA_API_KEY")
    elif failure == "rejected key":
        cloud.accepted_key = "another-key"
        expected = (BackendNotAvailable, "refused.*DAYTONA_API_KEY|DAYTONA_API_KEY")
    else:
        cloud.create_error = real.DaytonaServiceUnavailableError(
            "Failed to create sandbox: no runner available in region eu", status_code=503
        )
        expected = (EnvironmentFailure, "default snapshot: .*no runner available")
    with pytest.raises(expected[0], match=expected[1]):
        run_daytona("print(1)", tmp_path)
    assert_clean(cloud)


def test_a_run_whose_sandbox_disappears(cloud: FakeDaytonaCloud, tmp_path: Path) -> None:
    ready = tmp_path / "ready"

    def delete_when_ready() -> None:
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        for sandbox in cloud.live():
            cloud.destroy(sandbox.id)

    deleter = threading.Thread(target=delete_when_ready)
    deleter.start()
    started = time.monotonic()
    try:
        with removing_stages_of_vanished_fake_sandboxes(str(ready)):
            result = run_daytona(
                f"import time; open({str(ready)!r}, 'w').close(); time.sleep(300)", tmp_path
            )
    finally:
        deleter.join()
    # The run ends with a result that says the sandbox went away, not an exception.
    assert result.status == "error"
    assert "lost" in (result.error or ""), result.error
    assert re.search(r"Daytona sandbox \S+ is gone", result.warning or ""), result.warning
    assert time.monotonic() - started < 25
    assert_clean(cloud)


def test_a_run_over_a_transport_it_cannot_have(cloud: FakeDaytonaCloud, tmp_path: Path) -> None:
    for transport in ("unix", "files"):
        with pytest.raises(RunError, match="relay"):
            run_daytona("print(1)", tmp_path, transport=transport)
    assert_clean(cloud)


# -- the real SDK against a stub API on this machine ---------------------------------------


class _StubDaytonaAPI:
    """Answers like a Daytona API that refuses to make sandboxes: a lookup by name is
    404, a creation gets ``status`` with ``message``, a wrong key 401."""

    def __init__(self, status: int, message: str, key: str = "stub-key") -> None:
        self.requests: list[tuple[str, str, bytes]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size) if size else b""
                stub.requests.append((self.command, self.path, body))
                if self.headers.get("Authorization") != f"Bearer {key}":
                    code, text = 401, "Invalid API key"
                elif self.command == "POST" and self.path.rstrip("/") == "/api/sandbox":
                    code, text = status, message
                else:
                    code, text = 404, "Sandbox not found"
                data = json.dumps({"statusCode": code, "message": text}).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/api"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def real_sdk_at(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """``real_sdk_at(status, message, key=...)``: the real SDK, talking to a stub API."""
    stubs: list[_StubDaytonaAPI] = []
    monkeypatch.setattr(daytona_backend, "_sdk", None)
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("DAYTONA_"):
            monkeypatch.delenv(name)

    def start(status: int, message: str, key: str = "stub-key") -> _StubDaytonaAPI:
        stub = _StubDaytonaAPI(status, message)
        stubs.append(stub)
        monkeypatch.setenv("DAYTONA_API_URL", stub.url)
        monkeypatch.setenv("DAYTONA_API_KEY", key)
        return stub

    yield start
    for stub in stubs:
        stub.close()


@pytest.mark.anyio
async def test_real_sdk_a_platform_error_at_creation(real_sdk_at: Any) -> None:
    stub = real_sdk_at(500, "quota exceeded")
    env = DaytonaEnvironment(settings(name="wanted", auto_stop_interval=7))
    with pytest.raises(EnvironmentFailure, match="quota exceeded"):
        await env.start()
    await env.aclose()
    (body,) = [json.loads(b) for method, path, b in stub.requests if method == "POST"]
    assert body["name"] == "wanted"
    assert body["networkBlockAll"] is True and body["autoStopInterval"] == 7
    assert body["autoDeleteInterval"] == 0  # ephemeral
    assert body["labels"][LABEL_MANAGED] == "1" and body["labels"][LABEL_TASK] == env.task_id
    assert "env" not in body or body["env"] == {}
    lookups = [path for method, path, _ in stub.requests if method == "GET" and "wanted" in path]
    assert len(lookups) >= 1  # by name first, then again for a half-made one


@pytest.mark.anyio
async def test_real_sdk_rejected_credentials(real_sdk_at: Any) -> None:
    real_sdk_at(500, "unused", key="the-wrong-key")
    with pytest.raises(BackendNotAvailable, match="DAYTONA_API_KEY"):
        await DaytonaEnvironment(settings()).start()
