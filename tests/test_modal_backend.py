"""The modal backend, against a fake of the modal SDK. These tests never touch the
live Modal service: it cannot be reached from where they run.

Two halves hold the backend to the real thing:

- Conformance. A representative set of operations (create, resume by name, exec
  with stdin, file operations, kills, terminate, detach) runs through the fake
  (tests/fakes/modal_fake.py), which records every SDK call the backend makes. Each
  recorded call is then bound, with ``inspect.signature(...).bind``, against the
  *installed* modal SDK's object of the same qualified name (``.aio`` forms and the
  blocking wrappers both), simple argument types are checked against its annotations,
  and every property and attribute read must exist there. The fake's own functions
  must have the real signatures. So a change in the SDK's API fails here.
- Behaviour. The fake runs each exec as a real local process with real pipes, so the
  helper program, the relay and whole runs (execute_code) work for real: tools act in
  the "sandbox", timeouts kill process trees (checked by pid), budgets and output
  caps hold, calls overlap, named sandboxes are resumed, and a sandbox that dies
  mid-run ends the run with a result that says so. Errors are checked for what they
  tell the user: a missing SDK, missing credentials, Modal refusing the token or out
  of reach, a platform error at creation, an image without Python. Two of them also
  run against the real SDK in a subprocess: missing credentials (found without a
  network call) and an unreachable service (a port nothing listens on; the SDK told
  to try twice, not for its minute of retries).

What only the fake shows, not the live service: exec and stream semantics (a
process's stdout ending when it exits, what an exec on an ended sandbox raises, how an
exec of a missing program fails), the exit codes Modal reports, that
``Sandbox.create`` honours cpu, memory, timeout and block_network, and that a
sandbox's processes all end with it.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import types
import typing
import uuid
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import removing_stages_of_vanished_fake_sandboxes
from fakes.modal_fake import (
    FAKE_FUNCTIONS,
    FAKE_PROPERTIES,
    MARK,
    Call,
    FakeModal,
    exception,
    pids_alive,
    wait_until,
)

import hermes_sandbox.environments.modal.environment as modal_backend
from hermes_sandbox import ExecutionResult, SettingError, execute_code
from hermes_sandbox.environments import (
    BackendNotAvailable,
    EnvironmentFailure,
    get_environment_class,
)
from hermes_sandbox.environments.errors import SpawnNotAvailable
from hermes_sandbox.environments.modal import ModalEnvironment, ModalSettings, SandboxGone
from hermes_sandbox.rpc.relay import LOST_EXIT_CODE

pytestmark = pytest.mark.not_live

REPO = Path(__file__).resolve().parent.parent

try:
    import modal as real_modal
except ImportError:  # the conformance tests skip (or fail under CI) with the reason
    real_modal = None


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModal]:
    """The fake SDK in place of modal; at the end no process of its sandboxes may live."""
    world = FakeModal(str(tmp_path / "home"))
    monkeypatch.setattr(modal_backend, "_sdk", world)
    yield world
    leftovers = {pid: _cmdline(pid) for pid in world.live_processes()}
    world.shutdown()
    assert not leftovers, f"processes of fake sandboxes left running: {leftovers}"


@pytest.fixture
def options(tmp_path: Path) -> dict[str, Any]:
    """backend_options for runs in the fake: this Python, a workdir under tmp_path."""
    return {
        "python": sys.executable,
        "workdir": str(tmp_path / "workspace"),
        "app_name": "hermes-tests",
    }


@pytest.fixture
def real_sdk() -> Any:
    """The installed modal SDK; skips (fails under CI) when it is missing."""
    if real_modal is None:
        message = "the modal SDK is not installed (pip install 'hermes-sandbox[modal]')"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; CI installs it, so this is a failure")
        print(f"\nSKIPPED: {message}", file=sys.stderr)
        pytest.skip(message)
    return real_modal


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


def make_env(options: Mapping[str, Any], **changes: Any) -> ModalEnvironment:
    settings = {**options, **changes}
    return ModalEnvironment.for_run(
        settings,
        env={"HERMES_TEST_VAR": "from-the-caller"},
        kill_grace=0.5,
        task_id=None,
        python=None,
    )


def modal_run(code: str, backend_options: Mapping[str, Any], **options: Any) -> ExecutionResult:
    options.setdefault("timeout", 30)
    return execute_code(
        textwrap.dedent(code), backend="modal", backend_options=dict(backend_options), **options
    )


def the_sandbox(fake: FakeModal) -> Any:
    (state,) = fake.sandboxes.values()
    return state


# -- conformance with the installed SDK ---------------------------------------------------


def resolve(name: str) -> Any:
    """The installed SDK's object for a qualified name (modal.Sandbox.exec.aio)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                raise AssertionError(f"the installed modal SDK has no {name} (no {attribute!r})")
            found = getattr(found, attribute)
        return found
    raise AssertionError(f"no module for {name}")


_SIMPLE_TYPES: dict[Any, tuple[type, ...]] = {
    int: (int,),
    float: (int, float),
    str: (str,),
    bool: (bool,),
    bytes: (bytes,),
    type(None): (type(None),),
    dict: (dict,),
    list: (list,),
    tuple: (tuple,),
    Sequence: (Sequence,),
    Collection: (Collection,),
    Mapping: (Mapping,),
}


def fits(value: Any, annotation: Any) -> bool:
    """Whether ``value`` can be what ``annotation`` says, for annotations made of
    builtins, unions, Literal and generic containers; anything else (the SDK's own
    classes, which the fake stands in for, or unevaluated strings) is taken as fitting."""
    if annotation is inspect.Parameter.empty or annotation is Any or isinstance(annotation, str):
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, member) for member in typing.get_args(annotation))
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    if origin is not None:
        if origin not in _SIMPLE_TYPES:
            return True
        if not isinstance(value, _SIMPLE_TYPES[origin]):
            return False
        args = typing.get_args(annotation)
        if origin is dict and len(args) == 2:
            return all(fits(k, args[0]) and fits(v, args[1]) for k, v in value.items())
        if origin in (list, Sequence, Collection) and len(args) == 1:
            return all(fits(item, args[0]) for item in value)
        return True
    if annotation in _SIMPLE_TYPES:
        kinds = _SIMPLE_TYPES[annotation]
        if annotation in (int, float) and isinstance(value, bool):
            return False
        return isinstance(value, kinds)
    return True  # a class of the SDK's own: the fake passes its stand-ins


def check_call(call: Call) -> None:
    """Fail unless ``call`` is valid against the installed SDK."""
    real = resolve(call.name)
    if call.kind == "property":
        owner_name, _, attribute = call.name.rpartition(".")
        static = inspect.getattr_static(resolve(owner_name), attribute)
        assert isinstance(static, property), f"{call.name} is not a property in the real SDK"
        return
    if call.kind == "attribute":
        if call.name.startswith("modal.exception."):
            assert isinstance(real, type) and issubclass(real, BaseException), call.name
        return
    targets = [real]
    if call.name.endswith(".aio"):
        blocking = resolve(call.name[: -len(".aio")])
        assert inspect.iscoroutinefunction(real), f"{call.name} is not a coroutine function"
        targets.append(blocking)
    for target in targets:
        signature = inspect.signature(target)
        args = (object(), *call.args) if call.method else call.args
        try:
            bound = signature.bind(*args, **call.kwargs)
        except TypeError as exc:
            raise AssertionError(
                f"the installed SDK refuses {call.name}(*{call.args!r}, **{call.kwargs!r}): "
                f"{exc}; its signature is {signature}"
            ) from None
        for name, value in bound.arguments.items():
            parameter = signature.parameters[name]
            if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
                values = list(value)
            elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
                values = list(value.values())
            else:
                values = [value]
            if call.method and name == next(iter(signature.parameters)):
                continue  # self
            for item in values:
                assert fits(item, parameter.annotation), (
                    f"{call.name}: {name}={item!r} does not fit {parameter.annotation!r}"
                )


async def representative_operations(fake: FakeModal, options: Mapping[str, Any]) -> None:
    """Everything the backend does with the SDK, once or more."""
    name = f"conf-{uuid.uuid4().hex[:8]}"
    first = make_env(
        options,
        sandbox_name=name,
        persist=True,
        cpu=0.5,
        memory=512,
        timeout=600,
        idle_timeout=120,
        region=["us-east", "us-west"],
        cloud="aws",
        modal_environment="main",
    )
    await first.start()
    workdir = options["workdir"]
    assert (await first.execute("echo hi")).output == "hi\n"
    assert (await first.execute("sleep 30", timeout=0.5)).timed_out  # the kill verb
    await first.write_bytes(f"{workdir}/a.txt", b"data")  # exec with stdin
    assert await first.read_bytes(f"{workdir}/a.txt") == b"data"
    assert (await first.stat(f"{workdir}/a.txt")).size == 4
    scratch = await first.make_private_dir("conf-")
    await first.remove_tree(scratch)
    stream = await first.open_exec_stream(["cat"], env={"X": "1"}, cwd=workdir)
    await stream.send(b"ping")
    await stream.send_eof()
    assert await stream.receive() == b"ping"
    assert await stream.wait() == 0
    await stream.aclose()
    stubborn = await first.open_exec_stream(
        [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"]
    )
    await stubborn.aclose()  # never exits on EOF: killed by its marker
    resumed = make_env(options, sandbox_name=name, persist=True)
    await resumed.start()
    assert resumed.resumed and resumed.sandbox_id == first.sandbox_id
    await resumed.aclose()
    await first.aclose()
    last = make_env(options, sandbox_name=name)  # not persistent: terminated at the end
    await last.start()
    await last.aclose()
    doomed = make_env(options)
    await doomed.start()
    assert doomed.sandbox_id is not None
    fake.vanish(doomed.sandbox_id)
    with pytest.raises(SandboxGone):
        await doomed.stat(workdir)
    await doomed.aclose()


EXPECTED_CALLS = {
    "modal.config.Config.get",
    "modal.App.lookup.aio",
    "modal.Image.from_registry",
    "modal.Sandbox.create.aio",
    "modal.Sandbox.from_name.aio",
    "modal.Sandbox.exec.aio",
    "modal.Sandbox.poll.aio",
    "modal.Sandbox.terminate.aio",
    "modal.Sandbox.detach.aio",
    "modal.Sandbox.object_id",
    "modal.container_process.ContainerProcess.stdin",
    "modal.container_process.ContainerProcess.stdout",
    "modal.container_process.ContainerProcess.stderr",
    "modal.container_process.ContainerProcess.wait.aio",
    "modal.io_streams.StreamReader.__aiter__",
    "modal.io_streams.StreamWriter.write",
    "modal.io_streams.StreamWriter.write_eof",
    "modal.io_streams.StreamWriter.drain.aio",
    "modal.exception.Error",
    "modal.exception.NotFoundError",
    "modal.exception.AlreadyExistsError",
    "modal.exception.AuthError",
    "modal.exception.ConnectionError",
}


@pytest.mark.anyio
async def test_every_sdk_call_binds_against_the_installed_sdk(
    fake: FakeModal, options: dict[str, Any], real_sdk: Any
) -> None:
    await representative_operations(fake, options)
    made = {call.name for call in fake.calls}
    assert made >= EXPECTED_CALLS, f"not exercised: {sorted(EXPECTED_CALLS - made)}"
    problems = []
    for call in {repr(c): c for c in fake.calls}.values():
        try:
            check_call(call)
        except AssertionError as exc:
            problems.append(str(exc))
    assert not problems, "\n".join(problems)
    (created, *_) = fake.calls_named("modal.Sandbox.create.aio")
    assert created.kwargs["block_network"] is True
    assert created.kwargs["cpu"] == 0.5 and created.kwargs["memory"] == 512
    assert created.kwargs["timeout"] == 600 and created.kwargs["idle_timeout"] == 120
    assert created.kwargs["region"] == ("us-east", "us-west") and created.kwargs["cloud"] == "aws"


def test_the_conformance_check_catches_a_drifted_call(real_sdk: Any) -> None:
    check_call(Call("modal.Sandbox.exec.aio", ("ls",), {"workdir": "/", "text": False}, True))
    drifted = [
        Call("modal.Sandbox.exec.aio", ("ls",), {"cwd": "/"}, True),  # no such parameter
        Call("modal.Sandbox.exec.aio", ("ls", 3), {}, True),  # argv must be strings
        Call("modal.Sandbox.create.aio", (), {"timeout": "long"}),  # an int or None
        Call("modal.Sandbox.from_name.aio", ("app",), {}),  # the name is required
        Call("modal.Sandbox.open.aio", ("/etc/hosts",), {}, True),  # not in this SDK
        Call("modal.Sandbox.object_id", kind="property"),  # is one: fine
        Call("modal.exception.NoSuchError", kind="attribute"),
    ]
    failed = []
    for call in drifted:
        try:
            check_call(call)
        except AssertionError:
            failed.append(call.name)
    assert failed == [c.name for c in drifted if c.kind != "property"]


def test_the_fakes_signatures_are_the_real_ones(real_sdk: Any) -> None:
    assert FAKE_FUNCTIONS, "the fake declares no SDK functions"
    for fake_function in FAKE_FUNCTIONS.values():
        real = resolve(fake_function.name)
        if fake_function.aio:
            assert hasattr(real, "aio"), f"{fake_function.name} has no .aio in the real SDK"
            real = real.aio
        real_parameters = list(inspect.signature(real).parameters.values())
        if fake_function.method:
            real_parameters = real_parameters[1:]
        fake_parameters = list(inspect.signature(fake_function.func).parameters.values())[1:]
        by_name = {p.name: p for p in real_parameters}
        where = fake_function.name
        for parameter in fake_parameters:
            assert parameter.name in by_name, f"{where}: the real one has no {parameter.name!r}"
            counterpart = by_name[parameter.name]
            assert parameter.kind == counterpart.kind, f"{where}: {parameter.name} differs in kind"
            assert parameter.default == counterpart.default, (
                f"{where}: {parameter.name} defaults to {parameter.default!r}, "
                f"the real one to {counterpart.default!r}"
            )
        required = {
            p.name
            for p in real_parameters
            if p.default is inspect.Parameter.empty
            and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        }
        assert required <= {p.name for p in fake_parameters}, f"{where}: lacks {required}"
        positional = [
            p.name
            for p in real_parameters
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        fake_positional = [
            p.name
            for p in fake_parameters
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        assert fake_positional == positional[: len(fake_positional)], f"{where}: positional order"
    for name in FAKE_PROPERTIES:
        owner_name, _, attribute = name.rpartition(".")
        static = inspect.getattr_static(resolve(owner_name), attribute)
        assert isinstance(static, property), f"{name} is not a property in the real SDK"


# -- configuration and loading -------------------------------------------------------------


def test_the_backend_is_registered() -> None:
    assert get_environment_class("modal") is ModalEnvironment


def test_config_refuses_unknown_keys_and_bad_values() -> None:
    with pytest.raises(ValueError, match=r"unknown modal backend setting.*gpus") as caught:
        ModalSettings.from_mapping({"gpus": 1})
    assert "block_network" in str(caught.value)  # the known keys are listed
    bad: list[tuple[dict[str, Any], str]] = [
        ({"cpu": 0}, "cpu must be a number > 0"),
        ({"cpu": "two"}, r"ModalSettings\(cpu='two'\): expected a number"),
        ({"memory": 1.5}, r"memory=1.5\): expected a whole number"),
        ({"memory": True}, "memory"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": 10**6}, "at most 86400"),
        ({"idle_timeout": -1}, "idle_timeout"),
        ({"block_network": "no"}, "block_network='no'.: expected true or false"),
        ({"persist": True}, "persist needs a sandbox_name"),
        ({"sandbox_name": "has space"}, "sandbox_name may hold only"),
        ({"app_name": ""}, "app_name must be a non-empty string"),
        ({"workdir": "relative"}, "workdir must be an absolute path"),
    ]
    for data, message in bad:
        with pytest.raises(ValueError, match=message):
            ModalSettings.from_mapping(data)


def test_config_defaults_and_settings_from_a_run() -> None:
    config = ModalSettings()
    assert config.block_network is True and config.persist is False
    assert config.image == "python:3.12-slim" and config.python == "python3"
    assert config.sandbox_name is None and config.timeout == 900
    env = ModalEnvironment.for_run(
        {"image": "my/img:1", "region": ["eu-west"]},
        env={},
        kill_grace=1.0,
        task_id="t",
        python="/opt/py/bin/python3",
    )
    assert env.python == "/opt/py/bin/python3" and env.settings.image == "my/img:1"
    assert env.settings.region == ("eu-west",)
    assert env.default_cwd == "/workspace" and env.shared_directory is None


def test_the_module_imports_without_modal_and_says_what_to_install() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["modal"] = None  # as if not installed
        import anyio
        from hermes_sandbox.environments import BackendNotAvailable
        from hermes_sandbox.environments.modal import ModalSettings, ModalEnvironment
        from hermes_sandbox import execute_code
        env = ModalEnvironment(ModalSettings(sandbox_name="x"))
        try:
            anyio.run(env.start)
        except BackendNotAvailable as exc:
            print("start:", exc)
        try:
            execute_code("print(1)", backend="modal")
        except BackendNotAvailable as exc:
            print("run:", exc)
        print("availability:", ModalSettings().availability())
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3, result.stdout
    for line in lines:
        assert "pip install 'hermes-sandbox[modal]'" in line


def test_importing_the_backend_does_not_import_modal() -> None:
    code = "import sys, environments.modal\nprint('modal' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_missing_credentials_with_the_real_sdk(tmp_path: Path, real_sdk: Any) -> None:
    """The installed SDK, no token anywhere: a clear error at once, no network used."""
    code = textwrap.dedent(
        """
        import time, anyio
        from hermes_sandbox.environments import BackendNotAvailable
        from hermes_sandbox.environments.modal import ModalEnvironment
        started = time.monotonic()
        try:
            anyio.run(ModalEnvironment().start)
        except BackendNotAvailable as exc:
            print(exc)
        print(round(time.monotonic() - started, 1))
        """
    )
    home = tmp_path / "home"
    home.mkdir()
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_real_sdk_environment(home),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    message, seconds = result.stdout.rsplit("\n", 2)[:2]
    assert "MODAL_TOKEN_ID and MODAL_TOKEN_SECRET" in message
    assert "modal token new" in message and str(home / "none.toml") in message
    assert float(seconds) < 10


def _real_sdk_environment(home: Path, **variables: str) -> dict[str, str]:
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("MODAL_") and key not in ("HOME", "PYTHONPATH")
    }
    environment.update(HOME=str(home), MODAL_CONFIG_PATH=str(home / "none.toml"), **variables)
    return environment


# The SDK's own knob for how often its @retry functions try (its tests set it): the
# connection is otherwise retried 18 times over about a minute.
SDK_RETRY_OVERRIDE = "RETRY_N_ATTEMPTS_OVERRIDE"


def test_an_unreachable_service_with_the_real_sdk(tmp_path: Path, real_sdk: Any) -> None:
    """The installed SDK with a token, pointed at a port nothing listens on: its own
    ConnectionError (after its retries, two tries here) becomes BackendNotAvailable."""
    import modal._utils.async_utils as sdk_retries

    assert hasattr(sdk_retries, SDK_RETRY_OVERRIDE), (
        f"the SDK no longer has {SDK_RETRY_OVERRIDE}: find its new retry knob (without "
        "one this test waits out a minute of retries)"
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # free now, and nothing will listen there
    code = textwrap.dedent(
        f"""
        import anyio
        import modal._utils.async_utils
        from hermes_sandbox.environments import BackendNotAvailable
        from hermes_sandbox.environments.modal import ModalEnvironment
        modal._utils.async_utils.{SDK_RETRY_OVERRIDE} = 2
        try:
            anyio.run(ModalEnvironment().start)
        except BackendNotAvailable as exc:
            print(exc)
        """
    )
    home = tmp_path / "home"
    home.mkdir()
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_real_sdk_environment(
            home,
            MODAL_TOKEN_ID="ak-test",
            MODAL_TOKEN_SECRET="as-test",
            MODAL_SERVER_URL=f"http://127.0.0.1:{port}",
        ),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "looking up the Modal app 'hermes-sandbox': could not reach Modal" in result.stdout
    assert "Check this host's network" in result.stdout


# -- the environment against the fake --------------------------------------------------


@pytest.mark.anyio
async def test_start_creates_a_locked_down_sandbox_and_close_terminates_it(
    fake: FakeModal, options: dict[str, Any]
) -> None:
    env = make_env(options, image="registry.example/py:3", cpu=2, memory=2048, timeout=1200)
    await env.start()
    state = the_sandbox(fake)
    assert env.sandbox_id == state.sandbox_id and not env.resumed
    assert state.options["block_network"] is True
    assert (state.options["cpu"], state.options["memory"], state.options["timeout"]) == (
        2,
        2048,
        1200,
    )
    assert state.options["image"].tag == "registry.example/py:3"
    (lookup,) = fake.calls_named("modal.App.lookup.aio")
    assert lookup.args == ("hermes-tests",) and lookup.kwargs["create_if_missing"] is True
    assert await anyio.Path(options["workdir"]).is_dir()  # made at start
    await env.aclose()
    await env.aclose()  # idempotent
    assert state.ended_by == "terminate"
    assert fake.calls_named("modal.Sandbox.detach.aio")
    with pytest.raises(EnvironmentFailure, match="closed"):
        await env.start()


@pytest.mark.anyio
async def test_commands_run_in_the_sandbox_with_the_callers_env(
    fake: FakeModal, options: dict[str, Any]
) -> None:
    async with make_env(options) as env:
        result = await env.execute(f'pwd; echo "$HERMES_TEST_VAR ${MARK}"; exit 3')
        assert result.exit_code == 3
        cwd, variables = result.output.splitlines()
        assert cwd == options["workdir"]
        assert variables == f"from-the-caller {the_sandbox(fake).marker}"
        elsewhere = await env.execute("pwd", cwd="/")
        assert elsewhere.output == "/\n"
        with pytest.raises(FileNotFoundError):
            await env.execute("true", cwd="/no/such/dir")


@pytest.mark.anyio
async def test_a_command_gets_end_of_input_at_once(
    fake: FakeModal, options: dict[str, Any]
) -> None:
    async with make_env(options) as env:
        started = time.monotonic()
        result = await env.execute("cat; echo read-to-the-end", timeout=20)
        assert result.output == "read-to-the-end\n" and not result.timed_out
        assert time.monotonic() - started < 18  # the command's own timeout is 20 s


@pytest.mark.anyio
async def test_a_command_timeout_kills_its_processes_inside(
    fake: FakeModal, options: dict[str, Any], tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    async with make_env(options) as env:
        result = await env.execute(
            f"sleep 300 & echo $! > {pids}; setsid sleep 301 & echo $! >> {pids}; sleep 302",
            timeout=1,
        )
        assert result.timed_out and result.exit_code == 124
        started = [int(p) for p in pids.read_text().split()]
        assert len(started) == 2
        assert wait_until(lambda: not pids_alive(started), 5), pids_alive(started)


@pytest.mark.anyio
async def test_cancelling_a_command_kills_it(
    fake: FakeModal, options: dict[str, Any], tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    async with make_env(options) as env:
        with anyio.move_on_after(1.5):
            await env.execute(f"sleep 300 & echo $! > {pid_file}; wait")
        pid = int(pid_file.read_text())
        assert wait_until(lambda: not pids_alive([pid]), 5)


@pytest.mark.anyio
async def test_command_output_is_capped(fake: FakeModal, options: dict[str, Any]) -> None:
    async with make_env(options) as env:
        result = await env.execute("seq 1 200000", max_output_bytes=10_000)
        assert result.exit_code == 0
        assert result.output.startswith("1\n2\n") and result.output.endswith("199999\n200000\n")
        assert "bytes omitted] ..." in result.output and len(result.output) < 12_000


@pytest.mark.anyio
async def test_files_and_private_dirs(fake: FakeModal, options: dict[str, Any]) -> None:
    workdir = options["workdir"]
    async with make_env(options) as env:
        payload = os.urandom(3 * 1024 * 1024 + 7)  # more than one stdin chunk
        await env.write_bytes(f"{workdir}/deep/er/blob", payload, mode=0o600)
        assert await env.read_bytes(f"{workdir}/deep/er/blob") == payload
        assert await env.read_bytes(f"{workdir}/deep/er/blob", max_bytes=5) == payload[:5]
        assert os.stat(f"{workdir}/deep/er/blob").st_mode & 0o777 == 0o600
        info = await env.stat(f"{workdir}/deep")
        assert info.kind == "directory"
        with pytest.raises(FileNotFoundError):
            await env.read_bytes(f"{workdir}/missing")
        with pytest.raises(FileNotFoundError):
            await env.write_bytes(f"{workdir}/nowhere/x", b"", make_parents=False)
        scratch = await env.make_private_dir("hs-test-", parent=workdir)
        assert os.stat(scratch).st_mode & 0o777 == 0o700
        assert env.home == fake.home
        await env.remove_tree(scratch)
        assert not await anyio.Path(scratch).exists()
        await env.remove_tree(f"{workdir}/never-was")


@pytest.mark.anyio
async def test_an_exec_stream_carries_data_stderr_and_exit_code(
    fake: FakeModal, options: dict[str, Any]
) -> None:
    code = (
        "import os, sys\n"
        "data = sys.stdin.buffer.read()\n"
        "tail = '|%s|%s' % (os.getcwd(), os.environ['X'])\n"
        "sys.stdout.buffer.write(data[::-1] + tail.encode())\n"
        "sys.stderr.write('e' * 20000 + 'END')\n"
        "sys.exit(5)\n"
    )
    async with make_env(options) as env:
        stream = await env.open_exec_stream(
            [sys.executable, "-c", code], env={"X": "set"}, cwd=fake.home
        )
        payload = os.urandom(2 * 1024 * 1024)
        async with anyio.create_task_group() as tasks:

            async def feed() -> None:
                await stream.send(payload)
                await stream.send_eof()

            tasks.start_soon(feed)
            received = bytearray()
            async for chunk in stream:
                assert len(chunk) <= 65536
                received += chunk
        assert bytes(received) == payload[::-1] + f"|{fake.home}|set".encode()
        assert await stream.wait() == 5
        assert stream.stderr_tail.endswith(b"eeeEND") and len(stream.stderr_tail) == 8192
        await stream.aclose()
        with pytest.raises(anyio.ClosedResourceError):
            await stream.receive()


@pytest.mark.anyio
async def test_closing_a_stream_kills_an_exec_that_ignores_end_of_input(
    fake: FakeModal, options: dict[str, Any], tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    code = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        f"open({str(pids)!r}, 'w').write('%d %d' % (__import__('os').getpid(), child.pid))\n"
        "while True: time.sleep(1)\n"
    )
    async with make_env(options) as env:
        stream = await env.open_exec_stream([sys.executable, "-c", code])
        assert wait_until(lambda: pids.exists() and len(pids.read_text().split()) == 2)
        started = [int(p) for p in pids.read_text().split()]
        await stream.aclose()
        assert not pids_alive(started)
        assert the_sandbox(fake).running  # only the exec went, not the sandbox


@pytest.mark.anyio
async def test_spawn_is_not_available(fake: FakeModal, options: dict[str, Any]) -> None:
    async with make_env(options) as env:
        with pytest.raises(SpawnNotAvailable):
            await env.spawn(["true"], env={})


@pytest.mark.anyio
async def test_a_named_sandbox_is_resumed_and_kept_only_if_persistent(
    fake: FakeModal, options: dict[str, Any]
) -> None:
    name = "named-box"
    first = make_env(options, sandbox_name=name, persist=True)
    await first.start()
    await first.aclose()
    state = the_sandbox(fake)
    assert state.running and state.name == name
    second = make_env(options, sandbox_name=name, persist=True)
    await second.start()
    assert second.resumed and second.sandbox_id == first.sandbox_id
    # A non-persistent user of the same sandbox in this process does not end it
    # while the persistent one still uses it.
    third = make_env(options, sandbox_name=name)
    await third.start()
    await third.aclose()
    assert state.running
    await second.aclose()
    assert state.running
    assert len(fake.calls_named("modal.Sandbox.create.aio")) == 1
    last = make_env(options, sandbox_name=name)
    await last.start()
    assert last.resumed
    await last.aclose()
    assert state.ended_by == "terminate"


@pytest.mark.anyio
async def test_a_name_taken_meanwhile_is_resumed(fake: FakeModal, options: dict[str, Any]) -> None:
    """Two starts race for one name: the loser of the create uses the winner's."""
    name = "raced"
    first, second = make_env(options, sandbox_name=name), make_env(options, sandbox_name=name)
    await first.start()
    # The second looks before the first's sandbox is known, then loses the create.
    fake.fail_once("modal.Sandbox.from_name", exception.NotFoundError("not found"))
    calls_before = len(fake.calls)
    await second.start()
    assert second.resumed and second.sandbox_id == first.sandbox_id
    names = [c.name for c in fake.calls[calls_before:] if c.name.startswith("modal.Sandbox.")]
    assert names[:3] == [
        "modal.Sandbox.from_name.aio",
        "modal.Sandbox.create.aio",
        "modal.Sandbox.from_name.aio",
    ]
    assert len(fake.sandboxes) == 1
    await second.aclose()
    await first.aclose()
    assert the_sandbox(fake).ended_by == "terminate"


@pytest.mark.anyio
async def test_a_sandbox_that_stops_in_use_is_reported(
    fake: FakeModal, options: dict[str, Any]
) -> None:
    env = make_env(options)
    await env.start()
    assert env.sandbox_id is not None
    watcher = threading.Timer(1.0, fake.vanish, args=(env.sandbox_id,))
    watcher.start()
    with pytest.raises(SandboxGone, match="stopped while in use") as caught:
        await env.execute("sleep 30")
    watcher.join()
    assert env.sandbox_id in str(caught.value) and "timeout=900s" in str(caught.value)
    assert env.lost == str(caught.value)
    with pytest.raises(SandboxGone):
        await env.write_bytes(f"{options['workdir']}/x", b"x")
    await env.remove_tree(options["workdir"])  # nothing to remove: not an error
    await env.aclose()


@pytest.mark.anyio
async def test_an_image_without_the_python_fails_start_and_leaves_nothing(
    fake: FakeModal, options: dict[str, Any]
) -> None:
    env = make_env(options, python="/no/such/python3")
    with pytest.raises(EnvironmentFailure, match=r"is '/no/such/python3' installed there\?"):
        await env.start()
    assert the_sandbox(fake).ended_by == "terminate"


@pytest.mark.anyio
async def test_missing_credentials_are_named(fake: FakeModal, options: dict[str, Any]) -> None:
    fake.settings = {}
    with pytest.raises(BackendNotAvailable) as caught:
        await make_env(options).start()
    message = str(caught.value)
    assert "MODAL_TOKEN_ID and MODAL_TOKEN_SECRET" in message
    assert "modal token new" in message and fake.config.user_config_path in message
    fake.settings = {"token_id": "ak-only"}
    with pytest.raises(BackendNotAvailable, match="MODAL_TOKEN_SECRET is missing"):
        await make_env(options).start()
    fake.settings = {"oauth_refresh_token": "r", "oauth_client_id": "c", "oauth_jwt_key": "k"}
    async with make_env(options):
        pass  # an OAuth setup is the SDK's to check
    assert len(fake.calls_named("modal.Sandbox.create.aio")) == 1


def test_availability_needs_no_sandbox_and_names_what_is_missing(
    fake: FakeModal, options: dict[str, Any]
) -> None:
    assert ModalSettings.from_mapping(options).availability() is None
    with pytest.raises(SettingError, match="unknown modal backend setting gpus"):
        ModalSettings.from_mapping({"gpus": 1})
    fake.settings = {}
    assert "MODAL_TOKEN_ID and MODAL_TOKEN_SECRET" in str(ModalSettings().availability())
    assert not fake.calls_named("modal.App.lookup.aio") and not fake.sandboxes


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("failure", "expected", "message"),
    [
        (exception.AuthError("Token is invalid"), BackendNotAvailable, "refused the credentials"),
        (exception.ConnectionError("no route"), BackendNotAvailable, "could not reach Modal"),
    ],
)
async def test_modal_refusing_or_unreachable_is_not_available(
    fake: FakeModal, options: dict[str, Any], failure: Exception, expected: type, message: str
) -> None:
    fake.failures["modal.App.lookup"] = failure
    with pytest.raises(expected, match=message) as caught:
        await make_env(options).start()
    assert str(failure) in str(caught.value)
    assert not fake.sandboxes


@pytest.mark.anyio
@pytest.mark.parametrize(
    "failure",
    [
        exception.ResourceExhaustedError("no capacity for 64 CPUs in eu-west"),
        exception.InvalidError("Invalid region 'mars-1'"),
        exception.ImageBuildError("pulling registry.example/nope: manifest unknown", "im-1"),
    ],
)
async def test_a_platform_error_at_creation_is_a_clear_failure(
    fake: FakeModal, options: dict[str, Any], failure: Exception
) -> None:
    fake.failures["modal.Sandbox.create"] = failure
    with pytest.raises(EnvironmentFailure) as caught:
        await make_env(options).start()
    text = str(caught.value)
    assert "creating a Modal sandbox from the image 'python:3.12-slim'" in text
    assert type(failure).__name__ in text and str(failure) in text
    assert not fake.sandboxes


def test_the_backend_refuses_trio_clearly(fake: FakeModal, options: dict[str, Any]) -> None:
    env = make_env(options)
    with pytest.raises(BackendNotAvailable, match="runs on asyncio"):
        anyio.run(env.start, backend="trio")
    assert not fake.sandboxes


# -- whole runs through the fake -----------------------------------------------------------


def test_a_script_runs_in_the_sandbox_and_its_tools_act_there(
    fake: FakeModal, options: dict[str, Any]
) -> None:
    result = modal_run(
        f"""
        import os
        from hermes_tools import read_file, write_file, terminal
        print(os.getcwd())
        print(os.environ["{MARK}"])
        print(write_file("notes.txt", "inside")["path"])
        print(read_file("notes.txt")["content"])
        print(terminal("echo ${MARK}; pwd")["output"].split())
        print(os.path.dirname(os.path.abspath(__file__)))
        """,
        options,
        env={"GREETING": "hi"},
    )
    assert result.status == "success", result.to_dict()
    cwd, marker, written, content, terminal, stage = result.output.splitlines()
    state = the_sandbox(fake)
    assert cwd == options["workdir"] and marker == state.marker
    assert written == f"{options['workdir']}/notes.txt"
    assert content == "inside"
    assert terminal == str([state.marker, options["workdir"]])
    assert result.tool_calls_made == 3
    assert not os.path.exists(stage)  # the stage is removed
    assert state.ended_by == "terminate"
    assert not fake.calls_named("modal.Sandbox.poll.aio")  # only asked after a failure


def test_a_timeout_kills_the_script_tree_and_the_sandbox(
    fake: FakeModal, options: dict[str, Any], tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    result = modal_run(
        f"""
        import os, subprocess, time
        a = subprocess.Popen(["sleep", "300"])
        b = subprocess.Popen(["sleep", "301"], start_new_session=True)
        open({str(pids)!r}, "w").write("%d %d %d" % (os.getpid(), a.pid, b.pid))
        print("started", flush=True)
        time.sleep(300)
        """,
        options,
        timeout=3,
        kill_grace=0.5,
    )
    assert result.status == "timeout" and result.exit_code == 124
    assert result.output.startswith("started")
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) == 3 and not pids_alive(started)
    assert the_sandbox(fake).ended_by == "terminate"
    assert not fake.live_processes()


def test_the_tool_budget_holds(fake: FakeModal, options: dict[str, Any]) -> None:
    result = modal_run(
        """
        import json
        from hermes_tools import terminal
        for i in range(5):
            print(json.dumps(terminal(f"echo {i}")))
        print("after the calls")
        """,
        options,
        max_tool_calls=3,
    )
    assert result.status == "success", result.to_dict()
    assert result.tool_calls_made == 3
    *replies, last = result.output.splitlines()
    assert last == "after the calls"
    decoded = [json.loads(line) for line in replies]
    assert [r.get("output") for r in decoded[:3]] == ["0\n", "1\n", "2\n"]
    assert all(r.get("error_kind") == "budget_exhausted" for r in decoded[3:])


def test_output_caps_and_exit_codes_hold(
    fake: FakeModal, options: dict[str, Any], tmp_path: Path
) -> None:
    result = modal_run(
        """
        import sys
        for i in range(20000):
            print(f"line {i:06d} " + "x" * 40)
        print("boom", file=sys.stderr)
        sys.exit(3)
        """,
        options,
        spill_dir=str(tmp_path / "spill"),
    )
    assert result.status == "error" and result.exit_code == 3
    assert result.stdout_truncated
    assert result.stdout_bytes_total == 20000 * 53
    assert result.output.startswith("line 000000 ")
    assert "line 019999 " in result.output
    assert result.output.endswith("--- stderr ---\nboom\n")


def test_ten_threads_of_tool_calls_overlap(fake: FakeModal, options: dict[str, Any]) -> None:
    result = modal_run(
        """
        import threading
        from hermes_tools import read_file, terminal, write_file
        out = [None] * 10
        # Each command arrives at a barrier and waits (up to 60 s) for all ten: served
        # one after another, each would see only itself. Overlap observed, not timed.
        def work(i):
            write_file(f"t{i}.txt", f"value {i}")
            text = read_file(f"t{i}.txt")["content"]
            shell = terminal(
                f"mkdir -p overlap && touch overlap/{i}; "
                "for n in $(seq 600); do [ $(ls overlap | wc -l) -ge 10 ] && break; "
                f"sleep 0.1; done; cat t{i}.txt; printf ' %s' $(ls overlap | wc -l)",
                timeout=120,
            )["output"]
            out[i] = (text, shell)
        threads = [threading.Thread(target=work, args=(i,)) for i in range(10)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print(out == [(f"value {i}", f"value {i} 10") for i in range(10)] or out)
        """,
        options,
    )
    assert result.status == "success", result.to_dict()
    assert result.output.strip() == "True"
    assert result.tool_calls_made == 30


def test_a_named_sandbox_is_resumed_across_runs(fake: FakeModal, options: dict[str, Any]) -> None:
    named = {**options, "sandbox_name": "resumed-box", "persist": True}
    code = f"import os\nprint(os.environ['{MARK}'])"
    first = modal_run(code, named)
    second = modal_run(code, named)
    assert first.status == second.status == "success"
    state = the_sandbox(fake)
    assert first.output == second.output == f"{state.marker}\n"
    assert state.running  # persistent: kept
    assert len(fake.calls_named("modal.Sandbox.create.aio")) == 1
    assert len(fake.calls_named("modal.Sandbox.from_name.aio")) == 2  # a miss, then a hit
    last = modal_run(code, {**options, "sandbox_name": "resumed-box"})
    assert last.output == first.output
    assert state.ended_by == "terminate"  # not persistent this time


def test_runs_fail_clearly_without_credentials_or_with_a_platform_error(
    fake: FakeModal, options: dict[str, Any]
) -> None:
    fake.settings = {}
    with pytest.raises(BackendNotAvailable, match="MODAL_TOKEN_ID and MODAL_TOKEN_SECRET"):
        modal_run("print(1)", options)
    fake.settings = {"token_id": "ak", "token_secret": "as"}
    fake.failures["modal.Sandbox.create"] = exception.ResourceExhaustedError("out of capacity")
    with pytest.raises(EnvironmentFailure, match="out of capacity"):
        modal_run("print(1)", options)
    assert not fake.sandboxes


def _vanish_when_started(fake: FakeModal, flag: Path) -> threading.Thread:
    def watch() -> None:
        if wait_until(flag.exists, 20):
            (state,) = fake.sandboxes.values()
            fake.vanish(state.sandbox_id)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_sandbox_dying_mid_run_ends_the_run_with_a_result_that_says_so(
    fake: FakeModal, options: dict[str, Any], tmp_path: Path
) -> None:
    flag = tmp_path / "started"
    watcher = _vanish_when_started(fake, flag)
    started = time.monotonic()
    with removing_stages_of_vanished_fake_sandboxes(str(flag)):
        result = modal_run(
            f"""
            import os, subprocess, time
            child = subprocess.Popen(["sleep", "300"])
            open({str(flag)!r} + ".pids", "w").write("%d %d" % (os.getpid(), child.pid))
            open({str(flag)!r}, "w").write("x")
            print("running", flush=True)
            time.sleep(300)
            """,
            options,
            timeout=60,
        )
        watcher.join()
    assert time.monotonic() - started < 30
    state = the_sandbox(fake)
    assert state.ended_by == "vanish"
    assert result.status == "error" and result.exit_code == LOST_EXIT_CODE, result.to_dict()
    assert result.output.startswith("running\n")
    assert result.error is not None
    assert f"the Modal sandbox {state.sandbox_id} stopped while in use" in result.error
    assert "terminated from outside, or its lifetime (timeout=900s) ran out" in result.error
    pids = [int(p) for p in Path(f"{flag}.pids").read_text().split()]
    assert not pids_alive(pids)
    assert not fake.live_processes()
