"""Shared fixtures for the end-to-end tests: real scripts in real processes, no mocks.

- ``run``: run a script with :func:`sandbox.execute_code`, a short timeout and a private
  spill directory by default.
- ``no_leftover_processes`` (automatic): after each test, fail it if any process started
  by the test still runs, then kill them so the next test starts clean. Other suites
  may run sandboxes on this machine at the same time, so a test tags its own: it sets
  ``TAG_VAR`` to a fresh value in os.environ, a name the scrubber lets through, and only
  processes with that tag in their environment count (a test's own helper processes
  are started without it).
- ``gone``, ``assert_gone``, ``wait_for_pids`` and ``sandbox_processes``: by-pid checks
  of the processes a script started.
- ``tool_env``, ``workspace`` and ``tool_ctx`` (from tests/toolcalls.py): a tool's
  context on a real LocalEnvironment, for calling tools through the registry.
- The suite runs in several pytest-xdist workers (scripts/test), so a test's checks must
  be its own, never machine-wide counts; the tests that cannot tell their own apart
  (the ssh server's) are kept to one worker (``unit_of``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

# Fixtures for calling tools on a real LocalEnvironment (tool_env, workspace, tool_ctx).
from toolcalls import tool_ctx, tool_env, workspace  # noqa: F401

import hermes_sandbox.environments.docker.environment as docker_backend
import hermes_sandbox.environments.docker.settings as docker_settings
from hermes_sandbox import ExecutionResult, execute_code
from hermes_sandbox.environments.isolation import ISOLATION_VARIABLE, probe_bwrap
from hermes_sandbox.runner import SCRIPT_NAME

try:
    import docker
except ImportError:  # the engine tests skip (or fail under CI) with the reason
    docker = None

# The suite's local runs are not isolated unless a test asks (tests/test_isolation.py
# and the conformance suite's local-bwrap rows do): the default, auto, would put them
# under bubblewrap where it works, and change what they see (pids, /tmp, the network).
os.environ.setdefault(ISOLATION_VARIABLE, "none")

DEFAULT_TIMEOUT = 20.0
IMAGE = os.environ.get("HERMES_SANDBOX_TEST_IMAGE", "hermes-sandbox-python:bookworm")
TEST_LABEL = "hermes-sandbox-test"  # on every container a test makes, with RUN_ID
RUN_ID = uuid.uuid4().hex[:12]
TAG_VAR = "LC_HERMES_TEST_TAG"  # the LC_* family passes the scrubber's allowlist
# Processes that were SIGKILLed are gone within microseconds; this only absorbs the
# kernel's bookkeeping, it cannot hide a process that really stayed behind.
LEFTOVER_GRACE = 1.0


def marked_processes(tag: str | None = None) -> set[int]:
    """Live processes (other than this one) whose environment carries this test's tag
    (default: the one in os.environ)."""
    tag_entry = f"{TAG_VAR}={tag or os.environ.get(TAG_VAR, '')}".encode()
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                entries = f.read().split(b"\0")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if tag_entry not in entries or int(name) == os.getpid():
            continue
        if not is_gone(int(name)):
            found.add(int(name))
    return found


def is_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent, or a zombie waiting to be reaped)."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return True


# -- running the suite in several processes (pytest-xdist, scripts/test) ----------------
#
# Every check above is this test's own (its tag, its containers' RUN_ID, its tmp_path),
# so tests run side by side in several workers, but for two kinds, each kept to one
# worker, one test after another, as one unit of work for xdist's scheduler (its own
# ``xdist_group`` mark cannot do it with pytest 9.2, which ignores the node id xdist
# rewrites):
# - those that log in to the test sshd: one that must leave nothing behind there counts
#   the test user's processes and stage directories, and an orphan (a process whose ssh
#   client died, as a killed runner leaves one until its test ends it) cannot be told
#   from another test's. The benchmark's smoke test logs in too.
# - those that build this checkout's wheel and fresh venvs of it (session fixtures, made
#   once per worker: half a minute each).
SSH_UNIT, SSH_FILES = "ssh", ("tests/test_ssh_backend.py::", "tests/test_bench_smoke.py::")
VENV_UNIT, VENV_FILES = "venvs", ("tests/test_namespace.py::", "tests/test_hermes_agent_tools.py::")


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: ``ssh`` for a test of the ssh backend's file
    or the benchmark's, or one whose parameters name an ssh target (``[ssh]``,
    ``[ssh-relay]``, ``[ssh-relay-exit-code]``); ``venvs``; else its own."""
    _, bracket, params = nodeid.partition("[")
    if nodeid.startswith(SSH_FILES) or (bracket and "ssh" in params.rstrip("]").split("-")):
        return SSH_UNIT
    if nodeid.startswith(VENV_FILES):
        return VENV_UNIT
    return nodeid


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # pytest-xdist is a test dependency; without it the suite runs in one
    LoadScopeScheduling = None

if LoadScopeScheduling is not None:

    class SharedUnits(LoadScopeScheduling):
        """``--dist load`` (each test a unit of its own) but for the units above, handed
        out first, the largest first."""

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
        if config.getvalue("dist") != "load":
            return None  # another --dist the user asked for: xdist's own
        return SharedUnits(config, log)


@pytest.fixture(autouse=True, scope="session")
def _own_cache_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The suite's caches (the bwrap probe's, the tool scans') go to a directory of its
    own, not the user's ~/.cache: a run of the suite leaves nothing there, and an entry
    left by an earlier run can never decide what a test sees."""
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = saved


@pytest.fixture(autouse=True)
def no_leftover_processes(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Tag this test's sandboxes; afterwards fail on, and kill, any still alive."""
    tag = uuid.uuid4().hex
    monkeypatch.setenv(TAG_VAR, tag)
    yield
    deadline = time.monotonic() + LEFTOVER_GRACE
    leftovers = marked_processes(tag)
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.05)
        leftovers = marked_processes(tag)
    if not leftovers:
        return
    described = []
    for pid in sorted(leftovers):
        try:
            described.append(f"{pid} {psutil.Process(pid).cmdline()}")
        except psutil.Error:
            described.append(str(pid))
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    pytest.fail("sandbox processes left alive after the test: " + "; ".join(described))


# Script code defining ask(message): one raw request, sent over whichever transport the
# script was given (a socket, or a request file), and its decoded reply. For tests that
# speak the wire themselves, e.g. with a wrong token.
RAW_ASK = """
import os as _os, socket as _socket, struct as _struct, time as _time
import _hermes_msgpack as _codec

def ask(message, key=None):
    body = _codec.packb(message)
    frame = _struct.pack(">I", len(body)) + body
    directory = _os.environ.get("HERMES_RPC_DIR")
    if directory:
        key = key or "raw-%d-%d" % (_os.getpid(), _time.monotonic_ns())
        with open(_os.path.join(directory, "." + key), "wb") as f:
            f.write(frame)
        _os.rename(_os.path.join(directory, "." + key), _os.path.join(directory, key + ".req"))
        reply = _os.path.join(directory, key + ".rep")
        while not _os.path.exists(reply):
            _time.sleep(0.001)
        with open(reply, "rb") as f:
            data = f.read()
        _os.unlink(reply)
        return _codec.unpackb(data[4:])
    with _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM) as s:
        s.connect(_os.environ["HERMES_RPC_SOCKET"])
        s.sendall(frame)
        data = b""
        while len(data) < 4 or len(data) < 4 + _struct.unpack(">I", data[:4])[0]:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return _codec.unpackb(data[4:])
"""


@pytest.fixture(params=["unix", "relay", "files"])
def transport(request: pytest.FixtureRequest) -> str:
    """Each transport the local backend supports: tests that use ``run`` run over all."""
    return str(request.param)


@pytest.fixture
def run(tmp_path: Path, transport: str) -> Callable[..., ExecutionResult]:
    """``run(code, **options)``: dedent ``code`` and run it with execute_code.

    Defaults: ``timeout=DEFAULT_TIMEOUT``, ``spill_dir`` under ``tmp_path`` and the
    ``transport`` of the test's parameter; any execute_code keyword (tools, env, cwd,
    max_tool_calls, RunOptions fields) may be given.
    """

    def _run(code: str, **options: Any) -> ExecutionResult:
        options.setdefault("timeout", DEFAULT_TIMEOUT)
        options.setdefault("spill_dir", str(tmp_path / "spill"))
        options.setdefault("transport", transport)
        return execute_code(textwrap.dedent(code), **options)

    return _run


@pytest.fixture
def sandbox_processes() -> Callable[[], set[int]]:
    """``sandbox_processes()``: see :func:`marked_processes`."""
    return marked_processes


@pytest.fixture
def gone() -> Callable[[int], bool]:
    """``gone(pid)``: see :func:`is_gone`."""
    return is_gone


@pytest.fixture
def assert_gone() -> Callable[..., None]:
    """``assert_gone(pids, what)``: fail naming every pid still running, after killing
    them, so that one bug is reported once and later tests start clean."""

    def _assert_gone(pids: Iterable[int], what: str = "the run") -> None:
        pids = list(pids)
        survivors = [pid for pid in pids if not is_gone(pid)]
        for pid in survivors:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        assert not survivors, f"pids {survivors} of {pids} survived {what}"

    return _assert_gone


@pytest.fixture
def wait_for_pids() -> Callable[..., list[int]]:
    """``wait_for_pids(path, count, timeout=10)``: the pids a script wrote to ``path``
    (whitespace-separated), once ``count`` of them are there; fails on timeout."""

    def _wait(path: Path, count: int, timeout: float = 10.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                pids = [int(p) for p in Path(path).read_text().split()]
            except (FileNotFoundError, ValueError):
                pids = []
            if len(pids) >= count:
                return pids
            time.sleep(0.02)
        pytest.fail(f"the script did not write {count} pids to {path} within {timeout}s")

    return _wait


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A fresh private directory with a short path, under /tmp: a Unix socket made in it
    (or in a stage made in it) stays under the 107-byte limit of its path, which one
    under tmp_path can pass (more so in a pytest-xdist worker: .../popen-gwN/...)."""
    path = Path(tempfile.mkdtemp(prefix="hs-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def removing_stages_of_vanished_fake_sandboxes(marker: str) -> Iterator[None]:
    """For tests that make a fake cloud sandbox vanish mid-run: the fake's "sandbox" is
    this machine, so the run's stage directory outlives it (a real sandbox takes its
    files with it, and the runner can no longer remove them). Remove what such a run
    left in the temp directory: a new stage whose script holds ``marker`` (a path or
    token unique to the test). Another test run on this machine at the same time (a
    second pytest worker) makes stages here too, live ones: they are left alone."""
    pattern = os.path.join(tempfile.gettempdir(), "hermes-sandbox-[0-9a-f]*")
    before = set(glob.glob(pattern))
    try:
        yield
    finally:
        for path in set(glob.glob(pattern)) - before:
            try:
                script = Path(path, SCRIPT_NAME).read_text(errors="replace")
            except OSError:
                continue
            if marker in script:
                shutil.rmtree(path, ignore_errors=True)


# -- services a test needs -------------------------------------------------------------

SSHD_SERVICE = Path(__file__).resolve().parent.parent / "scripts" / "sshd-service"


def ssh_server_from_environment() -> dict[str, str] | None:
    names = ("HOST", "PORT", "USER", "KEY", "KNOWN_HOSTS", "PID")
    found = {name: os.environ.get(f"HERMES_TEST_SSH_{name}") for name in names}
    if not all(found.values()):
        return None
    values = {name: str(value) for name, value in found.items()}
    if os.environ.get("HERMES_TEST_SSH_LOG"):
        values["LOG"] = os.environ["HERMES_TEST_SSH_LOG"]
    return values


def ssh_server_from_service() -> tuple[dict[str, str] | None, str]:
    """Run scripts/sshd-service; its exports, or None and why not."""
    try:
        done = subprocess.run(
            [str(SSHD_SERVICE)],
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"running {SSHD_SERVICE} failed: {exc}"
    if done.returncode != 0:
        return (
            None,
            f"{SSHD_SERVICE} failed (exit {done.returncode}): {done.stderr.strip()[-1500:]}",
        )
    values = {}
    for line in done.stdout.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name, _, value = words[1].partition("=")
            if name.startswith("HERMES_TEST_SSH_"):
                values[name[len("HERMES_TEST_SSH_") :]] = value
    return values, f"{SSHD_SERVICE} printed no HERMES_TEST_SSH_* exports: {done.stdout!r}"


async def read_relay_slowly(session: Any) -> tuple[bytes, int]:
    """All of a relay session's stdout, read with a pause after each chunk (a slow
    reader: the channel must pause its reading), and the session's exit status; fails
    after 30 s."""
    got = b""
    with anyio.fail_after(30):
        async for chunk in session.stdout:
            got += chunk
            await anyio.sleep(0.001)
        return got, await session.wait()


def require(problem: str | None, what: str) -> None:
    """Skip the test, printing why, when ``problem`` says a service is missing; under
    CI (CI=true), where .ci/run starts every service, fail instead."""
    if problem is None:
        return
    message = f"{what}: {problem}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (CI=true: CI starts this service, so this is a failure)")
    print(f"\nSKIPPED: {message}", file=sys.stderr)
    pytest.skip(message)


def bwrap_problem() -> str | None:
    """Why bubblewrap cannot isolate local runs here, or None."""
    problem = probe_bwrap().problem
    return f"{problem} (apt-get install bubblewrap)" if problem else None


def engine_problem() -> str | None:
    """Why the container engine tests cannot run here, or None."""
    if docker is None:
        return "the docker SDK is not installed (pip install 'hermes-sandbox[docker]')"
    host = os.environ.get("DOCKER_HOST") or docker_settings.DEFAULT_DOCKER_SOCKET
    try:
        if host.startswith("unix://"):  # the SDK leaks its socket when this fails
            docker_settings.probe_unix_socket(host[len("unix://") :])
        client = docker.from_env()
    except (OSError, docker.errors.DockerException) as exc:
        return (
            f"no container engine answers at {host} ({exc}); run scripts/podman-service "
            "and export the DOCKER_HOST it prints"
        )
    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        return f"the image {IMAGE} is missing; scripts/podman-service builds it"
    finally:
        client.close()
    return None


@pytest.fixture(scope="session")
def engine() -> Iterator[Any]:
    """A docker SDK client for checking on containers; skips (fails under CI) when the
    engine or the image is missing. Removes this run's containers at the end."""
    require(engine_problem(), "docker backend tests need a container engine")
    client = docker.from_env()
    try:
        yield client
    finally:
        leftovers = client.api.containers(all=True, filters={"label": f"{TEST_LABEL}={RUN_ID}"})
        for entry in leftovers:
            try:
                client.api.remove_container(entry["Id"], force=True, v=True)
            except docker.errors.NotFound:
                pass
            docker_backend._remove_shared_dir(entry.get("Labels") or {})
        client.close()


# -- fresh virtual environments with this project's wheel ------------------------------

REPO = Path(__file__).resolve().parent.parent
HERMES_AGENT = "hermes-agent>=0.19,<0.20"


def pip_install(python: Path, *args: str, timeout: float = 600) -> None:
    """pip install into another environment; a missing index skips (fails under CI)."""
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    require(
        None if done.returncode == 0 else f"pip install {' '.join(args)} failed: {done.stderr}",
        "a package index",
    )


def fresh_venv(path: Path, wheel: Path, *neighbours: str) -> Path:
    """A new virtual environment holding ``neighbours`` from the index, then our wheel;
    its python."""
    import venv

    venv.create(path, with_pip=True)
    python = path / "bin" / "python"
    if neighbours:
        pip_install(python, *neighbours)
    pip_install(python, str(wheel))
    return python


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout built as a wheel, once per session."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (found,) = out.glob("hermes_sandbox-*.whl")
    return found


@pytest.fixture(scope="session")
def hermes_agent_python(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """The python of a fresh venv with hermes-agent from PyPI and our wheel beside it."""
    return fresh_venv(tmp_path_factory.mktemp("venv") / "hermes-agent", wheel, HERMES_AGENT)
