"""Tests for the script side: stubs/generate.py and the client it copies into hermes_tools.py.

The client is exercised the way a sandboxed script uses it: the generated module and the
fallback codec are staged in a directory, a real ``python`` runs a script there with
HERMES_RPC_SOCKET and HERMES_RPC_TOKEN set, and a real RPCServer behind the real
ToolGate answers on a Unix socket in the test's event loop. Each script prints one JSON
line as its last output, which the test reads.
"""

from __future__ import annotations

import ast
import json
import marshal
import os
import re
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import psutil
import pytest

from hermes_sandbox import stubs
from hermes_sandbox.gate import ToolCallBudget, ToolGate
from hermes_sandbox.rpc import files as files_transport
from hermes_sandbox.rpc.files import FileChannel
from hermes_sandbox.rpc.server import RPCServer
from hermes_sandbox.rpc.unix import serve_unix_socket
from hermes_sandbox.stubs.generate import (
    StubError,
    client_source,
    generate_stub,
    tool_function_source,
)
from hermes_sandbox.tools.registry import ToolContext, ToolRegistry

TOKEN = "stub-test-token"
PYTHON38 = "/root/.pyenv/versions/3.8.18/bin/python3.8"
SCRIPT_TIMEOUT = 20.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def socket_dir(short_dir: Path) -> str:
    return str(short_dir)  # a socket's path in it stays under the 107-byte limit


def schema(name: str, properties: Mapping[str, Any], required: list[str], doc: str = "") -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": doc,
            "parameters": {"type": "object", "properties": dict(properties), "required": required},
        },
    }


SCHEMAS = [
    schema(
        "echo",
        {"text": {"type": "string"}, "tag": {"type": "integer"}, "extra": {"type": "string"}},
        ["text"],
        "Return the arguments it was given.",
    ),
    schema("slow", {"seconds": {"type": "number"}, "tag": {"type": "integer"}}, ["seconds"]),
    schema("move", {"from": {"type": "string"}, "to": {"type": "string"}}, ["from", "to"]),
    schema("dial", {"_call": {"type": "string"}}, []),
    schema("forbidden", {}, [], "Registered on the host, not allowed in this run."),
    schema("ghost", {}, [], "Not registered on the host at all."),
]
ALLOWED = ["echo", "slow", "move", "dial"]


# -- the host -----------------------------------------------------------------------


class Host:
    """The tools behind the gate, recording what each call received."""

    def __init__(self, budget: int = 100) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.slow_started = anyio.Event()
        registry = ToolRegistry()
        for entry in SCHEMAS:
            name = entry["function"]["name"]
            if name == "ghost":
                continue
            handler = self.slow if name == "slow" else self.echo_as(name)
            registry.register(name, "test", entry, handler)
        context = ToolContext(task_id="stub-test", environment=None, cwd="/")  # type: ignore[arg-type]
        self.gate = ToolGate(registry, ALLOWED, ToolCallBudget(budget), context)

    def echo_as(self, name: str) -> Any:
        async def echo(args: dict[str, Any]) -> str:
            self.calls.append((name, dict(args)))
            return json.dumps(args)

        return echo

    async def slow(self, args: dict[str, Any]) -> str:
        self.calls.append(("slow", dict(args)))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.slow_started.set()
        try:
            await anyio.sleep(float(args["seconds"]))
        finally:
            self.in_flight -= 1
        return json.dumps(args)


class CountingServer(RPCServer):
    """An RPCServer that counts the connections it was handed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.accepted = 0

    def admit_connection(self) -> bool:
        self.accepted += 1
        return super().admit_connection()


@asynccontextmanager
async def serving(socket_dir: str, host: Host) -> AsyncIterator[tuple[str, CountingServer]]:
    server = CountingServer(host.gate, token=TOKEN)
    async with serve_unix_socket(server, os.path.join(socket_dir, "rpc.sock")) as path:
        yield path, server


# -- the script side ----------------------------------------------------------------


def stage(directory: Path, schemas: list[dict[str, Any]] = SCHEMAS) -> Path:
    """Write hermes_tools.py, the client, its compiled code and the fallback codec, as
    the runtime stages them for a script run by this Python (another Python, such as
    PYTHON38, compiles the client's source instead)."""
    directory.mkdir(parents=True, exist_ok=True)
    code_name, code = stubs.client_code_file()
    for name, data in {**stubs.stub_files(schemas), code_name: code}.items():
        (directory / name).write_bytes(data)
    return directory


def script_env(socket_path: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "PYTHON"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if socket_path is not None:
        env["HERMES_RPC_SOCKET"] = socket_path
    env["HERMES_RPC_TOKEN"] = TOKEN
    env.update(extra)
    return env


@dataclass
class Completed:
    returncode: int
    stdout: str
    stderr: str

    def result(self) -> Any:
        """The JSON the script printed last; fails the test with stderr if it crashed."""
        assert self.returncode == 0, f"script failed ({self.returncode}):\n{self.stderr}"
        lines = self.stdout.strip().splitlines()
        assert lines, f"script printed nothing; stderr:\n{self.stderr}"
        return json.loads(lines[-1])


async def _drain(stream: Any, into: bytearray) -> None:
    async for chunk in stream:
        into += chunk


async def run_python(
    directory: Path,
    code: str,
    env: dict[str, str],
    *,
    python: str = sys.executable,
    timeout: float = SCRIPT_TIMEOUT,
) -> Completed:
    """Run ``code`` as a script in ``directory``; kill it if it outlives ``timeout``."""
    script = directory / "script.py"
    script.write_text(textwrap.dedent(code), encoding="utf-8")
    out, err = bytearray(), bytearray()
    async with await anyio.open_process([python, str(script)], cwd=directory, env=env) as process:
        pid = process.pid
        try:
            with anyio.fail_after(timeout):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(_drain, process.stdout, out)
                    tasks.start_soon(_drain, process.stderr, err)
                returncode = await process.wait()
        finally:
            if process.returncode is None:
                try:
                    process.kill()
                except ProcessLookupError:
                    pass
    # Leaving the context reaped it: nothing of the script is left behind.
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    return Completed(returncode, out.decode(), err.decode())


# -- concurrency --------------------------------------------------------------------


@pytest.mark.anyio
async def test_ten_threads_each_get_their_own_answer(tmp_path: Path, socket_dir: str) -> None:
    host = Host()
    directory = stage(tmp_path / "stage")
    code = """
        import json, threading, time
        import hermes_tools

        results = {}

        def work(i):
            results[i] = hermes_tools.slow(0.5, tag=i)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(10)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - started
        print(json.dumps({"elapsed": elapsed, "results": results}))
    """
    async with serving(socket_dir, host) as (path, server):
        out = (await run_python(directory, code, script_env(path))).result()
    assert out["results"] == {str(i): {"seconds": 0.5, "tag": i} for i in range(10)}
    assert out["elapsed"] < 2.5, f"10 calls of 0.5 s took {out['elapsed']:.2f} s"
    assert host.max_in_flight == 10  # they overlapped on the host
    assert server.accepted == 1  # over the one shared connection
    assert host.gate.calls_made == 10


@pytest.mark.anyio
async def test_ten_asyncio_tasks_each_get_their_own_answer(tmp_path: Path, socket_dir: str) -> None:
    host = Host()
    directory = stage(tmp_path / "stage")
    code = """
        import asyncio, json, time
        from concurrent.futures import ThreadPoolExecutor
        import hermes_tools

        async def main():
            # Ten workers whatever the CPU count: the default pool may be smaller.
            asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(10))
            started = time.monotonic()
            results = await asyncio.gather(
                *(asyncio.to_thread(hermes_tools.slow, 0.5, tag=i) for i in range(10))
            )
            return time.monotonic() - started, results

        elapsed, results = asyncio.run(main())
        print(json.dumps({"elapsed": elapsed, "results": results}))
    """
    async with serving(socket_dir, host) as (path, server):
        out = (await run_python(directory, code, script_env(path))).result()
    assert out["results"] == [{"seconds": 0.5, "tag": i} for i in range(10)]
    assert out["elapsed"] < 2.5, f"10 calls of 0.5 s took {out['elapsed']:.2f} s"
    assert host.max_in_flight == 10
    assert server.accepted == 1


# -- errors -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_error_replies_are_returned_not_raised(tmp_path: Path, socket_dir: str) -> None:
    host = Host(budget=2)
    directory = stage(tmp_path / "stage")
    code = """
        import json, os
        import hermes_tools

        out = {
            "forbidden": hermes_tools.forbidden(),
            "ghost": hermes_tools.ghost(),
            "first": hermes_tools.echo("one"),
            "second": hermes_tools.echo("two"),
            "spent": hermes_tools.echo("three"),
        }
        hermes_tools._connection._token = "not-the-token"  # read once, at connect
        out["bad_token"] = hermes_tools.echo("four")
        print(json.dumps(out))
    """
    async with serving(socket_dir, host) as (path, _):
        out = (await run_python(directory, code, script_env(path))).result()
    assert out["first"] == {"text": "one"}
    assert out["second"] == {"text": "two"}
    for key, kind in [
        ("forbidden", "not_allowed"),
        ("ghost", "unknown_tool"),
        ("spent", "budget_exhausted"),
        ("bad_token", "unauthorized"),
    ]:
        reply = out[key]
        assert set(reply) == {"error", "error_kind"}, (key, reply)
        assert reply["error_kind"] == kind, (key, reply)
        assert isinstance(reply["error"], str) and reply["error"], (key, reply)
    assert "forbidden" in out["forbidden"]["error"]
    assert "echo" in out["forbidden"]["error"]  # lists the tools that are allowed
    assert [name for name, _ in host.calls] == ["echo", "echo"]


@pytest.mark.anyio
async def test_server_going_away_mid_call_raises_tool_call_error(
    tmp_path: Path, socket_dir: str
) -> None:
    host = Host()
    directory = stage(tmp_path / "stage")
    code = """
        import json
        import hermes_tools

        try:
            result = hermes_tools.slow(30, tag=1)
        except hermes_tools.ToolCallError as exc:
            print(json.dumps({"raised": type(exc).__name__, "message": str(exc)}))
        else:
            print(json.dumps({"returned": result}))
    """
    completed: list[Completed] = []

    async def run(path: str) -> None:
        # The server waits up to TOOL_CALL_DRAIN_SECONDS (10 s) for the call in flight
        # before it goes: the script must outlive that wait.
        completed.append(await run_python(directory, code, script_env(path), timeout=40))

    # The task group outlives the server: the script is still running when it goes.
    async with anyio.create_task_group() as tasks, serving(socket_dir, host) as (path, _):
        tasks.start_soon(run, path)
        with anyio.fail_after(SCRIPT_TIMEOUT):
            await host.slow_started.wait()
    out = completed[0].result()
    assert out.get("raised") == "ToolCallError", out
    assert out["message"].startswith("slow(): "), out
    assert "connection" in out["message"]


@pytest.mark.anyio
async def test_socket_variable_unset(tmp_path: Path) -> None:
    directory = stage(tmp_path / "stage")
    code = """
        import json
        import hermes_tools

        try:
            hermes_tools.echo("x")
        except hermes_tools.ToolCallError as exc:
            print(json.dumps({"message": str(exc), "runtime": isinstance(exc, RuntimeError)}))
    """
    out = (await run_python(directory, code, script_env(None))).result()
    assert out["message"].startswith("echo(): ")
    assert "HERMES_RPC_SOCKET is not set" in out["message"]
    assert out["runtime"] is True


@pytest.mark.anyio
async def test_nothing_listening_on_the_socket(tmp_path: Path, socket_dir: str) -> None:
    directory = stage(tmp_path / "stage")
    missing = os.path.join(socket_dir, "nobody-here.sock")
    code = """
        import json
        import hermes_tools

        try:
            hermes_tools.echo("x")
        except hermes_tools.ToolCallError as exc:
            print(json.dumps({"message": str(exc)}))
    """
    out = (await run_python(directory, code, script_env(missing))).result()
    assert out["message"].startswith("echo(): cannot reach the host")
    assert missing in out["message"]


@pytest.mark.anyio
async def test_child_after_fork_uses_its_own_connection(tmp_path: Path, socket_dir: str) -> None:
    host = Host()
    directory = stage(tmp_path / "stage")
    code = """
        import json, os
        import hermes_tools

        before = hermes_tools.echo("parent-before")
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read_end)
                got = hermes_tools.echo("child")
                report = {"got": got}
            except BaseException as exc:
                report = {"error": repr(exc)}
            os.write(write_end, json.dumps(report).encode())
            os._exit(0)
        os.close(write_end)
        data = b""
        while True:
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            data += chunk
        _, status = os.waitpid(pid, 0)
        after = hermes_tools.echo("parent-after")
        print(json.dumps({
            "before": before, "after": after, "child": json.loads(data.decode()),
            "child_status": status,
        }))
    """
    async with serving(socket_dir, host) as (path, server):
        out = (await run_python(directory, code, script_env(path))).result()
    assert out["child_status"] == 0
    assert out["child"].get("got") == {"text": "child"}, out["child"]
    assert out["before"] == {"text": "parent-before"}
    assert out["after"] == {"text": "parent-after"}
    # One connection for the parent, kept across the fork, and one of the child's own.
    assert server.accepted == 2
    assert [args["text"] for _, args in host.calls] == ["parent-before", "child", "parent-after"]


# -- without msgpack ----------------------------------------------------------------

NO_MSGPACK_SCRIPT = """
    import json, sys, threading
    import hermes_tools

    assert hermes_tools._pack.__module__ == "_hermes_msgpack", hermes_tools._pack.__module__
    assert hermes_tools._unpack.__module__ == "_hermes_msgpack", hermes_tools._unpack.__module__
    try:
        import msgpack  # noqa: F401
        has_msgpack = True
    except ImportError:
        has_msgpack = False

    results = {}

    def work(i):
        results[i] = hermes_tools.echo("snow ☃ %d" % i, tag=2 ** 40 + i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    refused = hermes_tools.forbidden()
    print(json.dumps({
        "version": list(sys.version_info[:2]), "has_msgpack": has_msgpack,
        "results": results, "refused": refused,
    }))
"""


def check_no_msgpack_run(out: dict[str, Any]) -> None:
    assert out["has_msgpack"] is False
    assert out["results"] == {str(i): {"text": f"snow ☃ {i}", "tag": 2**40 + i} for i in range(4)}
    assert out["refused"]["error_kind"] == "not_allowed"


@pytest.mark.anyio
async def test_stub_on_python38_without_msgpack(tmp_path: Path, socket_dir: str) -> None:
    if not os.access(PYTHON38, os.X_OK):
        pytest.skip(f"no Python 3.8 interpreter at {PYTHON38}")
    host = Host()
    directory = stage(tmp_path / "stage")
    async with serving(socket_dir, host) as (path, _):
        completed = await run_python(
            directory, NO_MSGPACK_SCRIPT, script_env(path), python=PYTHON38
        )
    out = completed.result()
    assert out["version"] == [3, 8]
    check_no_msgpack_run(out)


@pytest.mark.anyio
async def test_stub_falls_back_when_msgpack_cannot_be_imported(
    tmp_path: Path, socket_dir: str
) -> None:
    host = Host()
    directory = stage(tmp_path / "stage")
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "msgpack.py").write_text('raise ImportError("msgpack is hidden by this test")\n')
    async with serving(socket_dir, host) as (path, _):
        env = script_env(path, PYTHONPATH=str(shadow))
        completed = await run_python(directory, NO_MSGPACK_SCRIPT, env)
    check_no_msgpack_run(completed.result())


# -- arguments as sent --------------------------------------------------------------


@pytest.mark.anyio
async def test_only_the_arguments_passed_are_sent(tmp_path: Path, socket_dir: str) -> None:
    host = Host()
    directory = stage(tmp_path / "stage")
    code = """
        import json
        import hermes_tools

        hermes_tools.echo("a")
        hermes_tools.echo("b", tag=None)
        hermes_tools.echo("c", tag=0, extra="")
        hermes_tools.echo(text="d", extra="x")
        hermes_tools.move(to="there", **{"from": "here"})
        print(json.dumps("done"))
    """
    async with serving(socket_dir, host) as (path, _):
        assert (await run_python(directory, code, script_env(path))).result() == "done"
    assert host.calls == [
        ("echo", {"text": "a"}),
        ("echo", {"text": "b"}),
        ("echo", {"text": "c", "tag": 0, "extra": ""}),  # falsy is not None: sent
        ("echo", {"text": "d", "extra": "x"}),
        ("move", {"from": "here", "to": "there"}),
    ]


@pytest.mark.anyio
async def test_parameter_named_like_a_client_internal(tmp_path: Path, socket_dir: str) -> None:
    # A schema parameter called "_call" must still reach the host, however the stub
    # chooses to accept it.
    host = Host()
    directory = stage(tmp_path / "stage")
    code = """
        import json
        import hermes_tools

        try:
            print(json.dumps({"returned": hermes_tools.dial(**{"_call": "555"})}))
        except Exception as exc:
            print(json.dumps({"raised": repr(exc)}))
    """
    async with serving(socket_dir, host) as (path, _):
        out = (await run_python(directory, code, script_env(path))).result()
    assert out == {"returned": {"_call": "555"}}
    assert host.calls == [("dial", {"_call": "555"})]


# -- the compiled client ------------------------------------------------------------------

WHICH_CLIENT = """
import json, hermes_tools
print(json.dumps({"compiled": getattr(hermes_tools, "_MARK", None)}))
"""


def mark_compiled_client(directory: Path) -> None:
    """Replace the staged compiled client with one that sets ``_MARK``, so that a script
    can tell the compiled code from the source (which does not set it)."""
    code_name, _ = stubs.client_code_file()
    marked = client_source() + "\n_MARK = 'compiled'\n"
    code = compile(marked, stubs.CLIENT_MODULE, "exec", dont_inherit=True)
    (directory / code_name).write_bytes(marshal.dumps(code))


@pytest.mark.anyio
async def test_a_python_with_the_hosts_magic_runs_the_compiled_client(tmp_path: Path) -> None:
    directory = stage(tmp_path / "stage")
    mark_compiled_client(directory)
    completed = await run_python(directory, WHICH_CLIENT, script_env(None))
    assert completed.result() == {"compiled": "compiled"}


@pytest.mark.anyio
async def test_another_python_compiles_the_clients_source(tmp_path: Path) -> None:
    """Python 3.8 has another bytecode magic: it finds no code file of its own and
    compiles the client's source, the marked code beside it left alone."""
    if not os.access(PYTHON38, os.X_OK):
        pytest.skip(f"no Python 3.8 interpreter at {PYTHON38}")
    directory = stage(tmp_path / "stage")
    mark_compiled_client(directory)
    completed = await run_python(directory, WHICH_CLIENT, script_env(None), python=PYTHON38)
    assert completed.result() == {"compiled": None}


@pytest.mark.anyio
@pytest.mark.parametrize("damage", ["missing", "garbage", "truncated"])
async def test_a_missing_or_damaged_compiled_client_falls_back_to_the_source(
    tmp_path: Path, damage: str
) -> None:
    directory = stage(tmp_path / "stage")
    mark_compiled_client(directory)
    code_file = directory / stubs.client_code_file()[0]
    if damage == "missing":
        code_file.unlink()
    elif damage == "garbage":
        code_file.write_bytes(b"\xff" * 64)
    else:
        code_file.write_bytes(code_file.read_bytes()[:100])
    completed = await run_python(directory, WHICH_CLIENT, script_env(None))
    assert completed.result() == {"compiled": None}


@pytest.mark.anyio
async def test_a_traceback_through_the_compiled_client_shows_its_source(tmp_path: Path) -> None:
    """The compiled client's file name is the staged source's, relative: the traceback
    of an error raised in it names the file and shows the line, found through
    sys.path (the script's directory, the stage), wherever the script's cwd is."""
    directory = stage(tmp_path / "stage")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = f"import os, hermes_tools\nos.chdir({str(elsewhere)!r})\nhermes_tools.json_parse(None)\n"
    completed = await run_python(directory, code, script_env(None))
    assert completed.returncode == 1
    assert f'File "{stubs.CLIENT_MODULE}", line ' in completed.stderr, completed.stderr
    assert "in json_parse\n    if text.startswith(" in completed.stderr, completed.stderr


STAGED = """
import json, os, sys, hermes_tools
here = os.path.dirname(hermes_tools.__file__)
print(json.dumps({"files": sorted(os.listdir(here)), "echo": hermes_tools.echo(text="hi")}))
"""


@pytest.mark.parametrize("python", ["this", "3.8"])
def test_a_run_stages_the_compiled_client_only_for_this_python(python: str) -> None:
    """A local run with this process's interpreter gets the compiled client beside the
    stub; one with another Python (3.8: another magic) only the source, and works."""
    from hermes_sandbox import execute_code
    from hermes_sandbox.environments import LocalSettings

    if python == "3.8" and not os.access(PYTHON38, os.X_OK):
        pytest.skip(f"no Python 3.8 interpreter at {PYTHON38}")
    registry = ToolRegistry()
    text = {"text": {"type": "string"}}
    schema = {"name": "echo", "parameters": {"type": "object", "properties": text}}
    registry.register("echo", "test", schema, lambda args, **_: json.dumps(args))
    settings = LocalSettings(python=PYTHON38 if python == "3.8" else None)
    result = execute_code(STAGED, registry=registry, tools=["echo"], backend=settings)
    assert result.status == "success", result.to_dict()
    out = json.loads(result.output)
    assert out["echo"] == {"text": "hi"}
    code_name, _ = stubs.client_code_file()
    assert {stubs.STUB_MODULE, stubs.CLIENT_MODULE, stubs.CODEC_MODULE} <= set(out["files"])
    assert (code_name in out["files"]) == (python == "this"), out["files"]


# -- generate_stub --------------------------------------------------------------------


def function_def(source: str, name: str) -> ast.FunctionDef:
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"no function {name} in the stub")


def test_signature_required_first_then_optional_defaulting_to_none() -> None:
    entry = schema(
        "plan",
        {
            "a": {"type": "string"},
            "b": {"type": "integer"},
            "c": {},
            "d": {"type": "boolean"},
        },
        ["b", "d"],
    )
    func = function_def(generate_stub([entry]), "plan")
    names = [a.arg for a in func.args.args]
    assert names == ["b", "d", "a", "c"]
    # Defaults line up with the tail: the two optional ones, both None.
    assert [ast.literal_eval(d) for d in func.args.defaults] == [None, None]
    assert func.args.vararg is None and func.args.kwarg is None
    assert [ast.unparse(a.annotation) if a.annotation else None for a in func.args.args] == [
        "int",
        "bool",
        "str",
        None,
    ]


def test_keyword_parameter_goes_through_kwargs() -> None:
    source = generate_stub([SCHEMAS[2]])  # move(from, to)
    func = function_def(source, "move")
    assert [a.arg for a in func.args.args] == ["to"]
    assert func.args.kwarg is not None and func.args.kwarg.arg == "kwargs"
    doc = ast.get_docstring(func) or ""
    assert "from (string, required)" in doc
    assert "Pass from as keyword arguments" in doc


@pytest.mark.parametrize(
    "name",
    [
        *["class", "from", "None", "_x", "_call", "kwargs", "retry", "json_parse"],
        *["ToolCallError", "1abc", "has space", "dash-ed", "", None, 5],
    ],
)
def test_unusable_tool_name_raises_stub_error(name: Any) -> None:
    with pytest.raises(StubError):
        generate_stub([{"name": name, "parameters": {}}])
    with pytest.raises(StubError):
        tool_function_source({"type": "function", "function": {"name": name}})


DOC = (
    "Quotes \"\"\"inside\"\"\" and '''these''', a backslash \\ ,"
    " a \\n that is not a newline, C:\\dir\\"
)


def test_docstring_with_quotes_and_backslashes_survives() -> None:
    entry = schema("odd", {"p": {"type": "string", "description": 'say """hi""" \\o/'}}, [], DOC)
    source = generate_stub([entry])
    doc = ast.get_docstring(function_def(source, "odd"))
    assert doc is not None
    assert doc.splitlines()[0] == DOC
    assert 'p (string, optional): say """hi""" \\o/' in doc
    namespace: dict[str, Any] = {}
    exec(compile(tool_function_source(entry), "<stub>", "exec"), namespace)  # defines odd()
    assert namespace["odd"].__doc__.splitlines()[0] == DOC


def test_stub_parses_as_python_38() -> None:
    source = generate_stub(SCHEMAS)
    tree = ast.parse(source, feature_version=(3, 8))
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert {entry["function"]["name"] for entry in SCHEMAS} <= defined
    client = ast.parse(client_source(), feature_version=(3, 8))  # the stub runs it
    assert {"json_parse", "shell_quote", "retry", "_call"} <= {
        n.name for n in client.body if isinstance(n, ast.FunctionDef)
    }
    exported = next(
        n.value
        for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "__all__"
    )
    assert ast.literal_eval(exported)[: len(SCHEMAS)] == [e["function"]["name"] for e in SCHEMAS]


def test_empty_stub_parses() -> None:
    source = generate_stub([])
    ast.parse(source, feature_version=(3, 8))
    assert "Tools: (none)." in source


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param(schema("nul", {}, [], "a NUL \x00 in the description"), id="nul-in-doc"),
        pytest.param(
            schema("dup", {"a": {"type": "string"}}, ["a", "a"]), id="required-listed-twice"
        ),
        pytest.param(
            schema("many", {"x": {"type": ["string", "null"], "enum": ["a", None]}}, []),
            id="type-list-and-enum",
        ),
    ],
)
def test_odd_schemas_compile_or_are_refused(entry: dict[str, Any]) -> None:
    # A schema may be refused with StubError, but it must never produce a module that
    # does not compile: that would break every script of the run at import.
    try:
        source = generate_stub([entry])
    except StubError:
        return
    compile(source, "hermes_tools.py", "exec")
    ast.parse(source, feature_version=(3, 8))


# -- over request files (the files transport) ------------------------------------------

FILES_SCRIPT = """
    import json, os, threading
    import hermes_tools

    results = {}

    def work(i):
        results[i] = [hermes_tools.echo("t%d-%d" % (i, k), tag=k) for k in range(5)]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.write(write_end, json.dumps(hermes_tools.echo("child")).encode())
        os._exit(0)
    os.close(write_end)
    child = json.loads(os.read(read_end, 65536).decode())
    os.waitpid(pid, 0)
    watching = hermes_tools._connection._watch is not None
    print(json.dumps({"results": results, "child": child, "watching": watching}))
"""


async def over_files(tmp_path: Path, host: Host, directory: Path, script: str) -> tuple[Any, Path]:
    """``script`` run in ``directory`` with its calls over the files transport to
    ``host``: its printed JSON, and the calls directory."""
    calls = tmp_path / "calls"
    calls.mkdir(mode=0o700)
    server = RPCServer(host.gate, token=TOKEN)
    async with files_transport.serve_files(server, str(calls)):
        env = script_env(None, HERMES_RPC_DIR=str(calls))
        return (await run_python(directory, script, env)).result(), calls


class LinkingChannel(FileChannel):
    """A host whose replies land by link(), which inotify's rename watch does not
    report: what a shared filesystem that reports nothing looks like to the client."""

    def _write_reply(self, key: str, frame: bytes) -> None:
        temporary = f".{key}.linked"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=self._fd)
        try:
            os.write(fd, frame)
        finally:
            os.close(fd)
        os.link(temporary, key + ".rep", src_dir_fd=self._fd, dst_dir_fd=self._fd)
        os.unlink(temporary, dir_fd=self._fd)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["inotify", "no ctypes", "renames not reported"])
async def test_files_threads_and_a_forked_child_each_get_their_own_answer(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = Host()
    directory = stage(tmp_path / "stage")
    if mode == "no ctypes":  # shadows the stdlib module: the client must poll
        (directory / "ctypes.py").write_text("raise ImportError('no ctypes here')\n")
    if mode == "renames not reported":
        monkeypatch.setattr(files_transport, "FileChannel", LinkingChannel)
    out, calls = await over_files(tmp_path, host, directory, FILES_SCRIPT)
    assert out["results"] == {
        str(i): [{"text": f"t{i}-{k}", "tag": k} for k in range(5)] for i in range(10)
    }
    assert out["child"] == {"text": "child"}
    assert host.gate.calls_made == 51
    assert out["watching"] is (mode == "inotify")
    # Every reply collected: nothing left but the replies kept to be written again.
    assert [name for name in os.listdir(calls) if not SPARE_NAME.match(name)] == []


# A reply kept, under its own name, to be written again.
SPARE_NAME = re.compile(r"^\d+-[0-9a-f]{12}-\d+\.rep$")

REUSE_SCRIPT = """
    import json, os
    import hermes_tools

    held, inodes, renamed = [], [], []
    rename = os.rename

    def recording_rename(src, dst):
        renamed.append(os.path.basename(dst))
        if dst.endswith(".req"):  # a request sent: hold its file open, note its inode
            fd = os.open(src, os.O_RDONLY)
            held.append(fd)
            inodes.append(os.fstat(fd).st_ino)
        rename(src, dst)

    os.rename = recording_rename
    answers = [hermes_tools.echo("r%d" % k) for k in range(10)]
    print(json.dumps({"answers": answers, "inodes": inodes, "renamed": renamed}))
"""


@pytest.mark.anyio
async def test_files_calls_write_their_requests_into_the_replies_files(tmp_path: Path) -> None:
    """One caller's calls in turn make no new file after the first: the host writes
    each reply into its request's file and the client writes its next request into
    the reply's. The script holds every request file open, so an inode seen twice is
    the same file, not a freed one the kernel gave out again."""
    host = Host()
    directory = stage(tmp_path / "stage")
    out, _ = await over_files(tmp_path, host, directory, REUSE_SCRIPT)
    assert out["answers"] == [{"text": f"r{k}"} for k in range(10)]
    assert len(out["inodes"]) == 10
    assert len(set(out["inodes"])) == 1, out["inodes"]
    # A reply read is kept under its own name: each rename wakes both sides' watches,
    # so a call's only one here is its request's.
    assert [name.endswith(".req") for name in out["renamed"]] == [True] * 10, out["renamed"]


# -- how the socket client reads replies ----------------------------------------------


class RawHost:
    """A host that speaks frames by hand on a real Unix socket, in a thread: it reads
    ``expect`` requests, then hands them to ``answer(requests, sock)`` to write what it
    likes, and closes. What the stub does with odd replies is then under the test's
    control, byte by byte."""

    def __init__(self, path: str, expect: int, answer: Any) -> None:
        import socket
        import threading

        self.path = path
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(1)
        self._expect = expect
        self._answer = answer
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        import msgpack

        try:
            conn, _ = self._listener.accept()
            with conn:
                requests: list[dict[str, Any]] = []
                buffer = b""
                while len(requests) < self._expect:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                    while len(buffer) >= 4:
                        size = int.from_bytes(buffer[:4], "big")
                        if len(buffer) < 4 + size:
                            break
                        requests.append(msgpack.unpackb(buffer[4 : 4 + size]))
                        buffer = buffer[4 + size :]
                self._answer(requests, conn)
        except BaseException as exc:  # reported by close()
            self.failure = exc

    def close(self) -> None:
        self._listener.close()
        self._thread.join(SCRIPT_TIMEOUT)
        assert not self._thread.is_alive()
        if self.failure is not None:
            raise self.failure


def reply_frame(request_id: int, result: str) -> bytes:
    import msgpack

    body = msgpack.packb({"id": request_id, "result": result}, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


# Around the client's 256 KiB read buffer, a long one, and small ones.
REPLY_SIZES = [1, 1000, 256 * 1024 - 80, 256 * 1024 + 7, 200 * 1024, 100 * 1024, 5 << 20, 7]

READ_SCRIPT = """
import json, sys, threading
import hermes_tools

results = {}

def work(i):
    reply = hermes_tools.echo("t", tag=i)
    data = reply["data"]
    results[i] = [reply["tag"], len(data), data[:1] + data[-1:], data.count("x")]

threads = [threading.Thread(target=work, args=(i,)) for i in range(%d)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"version": list(sys.version_info[:2]), "results": results}))
"""


@pytest.mark.anyio
@pytest.mark.parametrize("python", ["current", "3.8 without msgpack"])
async def test_replies_of_every_length_reach_their_callers_whole(
    tmp_path: Path, socket_dir: str, python: str
) -> None:
    """Replies written back to back, out of order, in pieces that cut headers and
    bodies anywhere, some over the read buffer: each
    thread gets its own, whole."""
    import random
    import time

    interpreter = sys.executable
    if python != "current":
        if not os.access(PYTHON38, os.X_OK):
            pytest.skip(f"no Python 3.8 interpreter at {PYTHON38}")
        interpreter = PYTHON38
    pieces = random.Random(12)

    def answer(requests: list[dict[str, Any]], conn: Any) -> None:
        stream = b""
        for request in reversed(requests):
            tag = request["args"]["tag"]
            data = "<" + "x" * (REPLY_SIZES[tag] - 2) + ">" if REPLY_SIZES[tag] > 1 else "<"
            stream += reply_frame(request["id"], json.dumps({"tag": tag, "data": data}))
        at = 0
        while at < len(stream):
            step = pieces.choice([1, 3, 4, 5, 4096, 65536, 300_000, 1 << 20])
            conn.sendall(stream[at : at + step])
            at += step
            if pieces.random() < 0.2:
                time.sleep(0.002)  # let the client read what is there so far

    host = RawHost(os.path.join(socket_dir, "raw.sock"), len(REPLY_SIZES), answer)
    directory = stage(tmp_path / "stage")
    try:
        completed = await run_python(
            directory, READ_SCRIPT % len(REPLY_SIZES), script_env(host.path), python=interpreter
        )
    finally:
        host.close()
    out = completed.result()
    assert out["results"] == {
        str(tag): [tag, size, "<>" if size > 1 else "<<", max(size - 2, 0)]
        for tag, size in enumerate(REPLY_SIZES)
    }


LYING_SCRIPT = """
import json, threading, tracemalloc
import hermes_tools

tracemalloc.start()
raised = {}

def work(i):
    try:
        hermes_tools.echo("t", tag=i)
    except hermes_tools.ToolCallError as exc:
        raised[i] = str(exc)

threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
_, peak = tracemalloc.get_traced_memory()
print(json.dumps({"raised": raised, "peak": peak}))
"""


@pytest.mark.anyio
async def test_a_reply_header_overstating_its_length_costs_only_what_came(
    tmp_path: Path, socket_dir: str
) -> None:
    """A header announcing 4 GiB, then 1,000 bytes and the end: the client allocates
    no more than what came, and every waiting caller (not only the one
    reading) gets ToolCallError."""

    def answer(requests: list[dict[str, Any]], conn: Any) -> None:
        conn.sendall((0xFFFF_FFF0).to_bytes(4, "big") + b"\x82" + b"x" * 999)

    host = RawHost(os.path.join(socket_dir, "raw.sock"), 4, answer)
    directory = stage(tmp_path / "stage")
    try:
        completed = await run_python(directory, LYING_SCRIPT, script_env(host.path))
    finally:
        host.close()
    out = completed.result()
    assert sorted(out["raised"]) == ["0", "1", "2", "3"]
    for message in out["raised"].values():
        assert message.startswith("echo(): ") and "connection" in message, message
    assert out["peak"] < 6 << 20, out["peak"]  # what came, not the 4 GiB announced


def load_client() -> Any:
    """The stub's client code as a module of its own, to drive in this process."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "stub_client_under_test", Path(stubs.__file__).with_name("_client.py")
    )
    assert spec is not None and spec.loader is not None
    client = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(client)
    return client


def test_read_frame_across_the_buffer_ends() -> None:
    """The client's reader alone, over a socketpair: a frame whose end would pass the
    buffer's (moved down), a header cut by the buffer's end, a frame longer than the
    buffer and a much longer one (grown as it comes)."""
    import socket
    import threading

    client = load_client()
    capacity = client._Connection._BUFFER

    def frame_of_length(request_id: int, length: int) -> bytes:
        """A reply frame exactly ``length`` bytes long, header included."""
        for overhead in range(17, 32):  # the map, the id and the string's own header
            frame = reply_frame(request_id, "y" * (length - overhead))
            if len(frame) == length:
                return frame
        raise AssertionError(f"no frame is {length} bytes long")

    sizes = [
        100 * 1024,  # read first, with part of the next one
        200 * 1024,  # its end passes the buffer's: moved down first
        capacity - 2,  # fills the buffer but for the next header's first 2 bytes
        50,
        capacity + 1,  # longer than the buffer: its own
        (4 << 20) + 12345,  # much longer
        20,
    ]
    frames = [frame_of_length(i, size) for i, size in enumerate(sizes)]
    assert [len(f) for f in frames] == sizes
    ours, theirs = socket.socketpair()
    writer = threading.Thread(target=theirs.sendall, args=(b"".join(frames),))
    writer.start()
    try:
        connection = client._Connection(ours, TOKEN)
        for frame in frames:
            reply = connection._read_frame()
            assert reply_frame(reply["id"], reply["result"]) == frame
    finally:
        writer.join()
        ours.close()
        theirs.close()


def test_a_thread_keeps_its_packer_for_small_requests_and_lets_a_large_ones_go() -> None:
    """Packing reuses the thread's Packer (packb builds one a call); after a request
    over the bound, that packer and its grown buffer are let go."""
    client = load_client()
    assert client._unpack(client._pack({"a": 1})) == {"a": 1}
    kept = client._packers.pack
    assert client._unpack(client._pack({"b": "x" * 16})) == {"b": "x" * 16}
    assert client._packers.pack is kept
    large = {"c": "y" * (client._KEEP_PACKER_UP_TO + 1)}
    assert client._unpack(client._pack(large)) == large
    assert not hasattr(client._packers, "pack")


# -- the read turn both clients pass between their callers (_ReplyBoard) -------------
#
# In this process, with real threads: a peer plays the host by hand, over a socketpair
# or in a directory, and answers each request only when the test says so.


class SocketPeer:
    """The host's end of a socketpair whose other end is a client ``_Connection``."""

    def __init__(self, client: Any, directory: Path) -> None:
        import socket

        ours, self.sock = socket.socketpair()
        self.sock.settimeout(SCRIPT_TIMEOUT)
        self.connection = client._Connection(ours, TOKEN)
        self.requests: list[dict[str, Any]] = []
        self._buffer = b""

    def wait_requests(self, count: int) -> None:
        import msgpack

        while len(self.requests) < count:
            while len(self._buffer) >= 4 + int.from_bytes(self._buffer[:4], "big"):
                size = int.from_bytes(self._buffer[:4], "big")
                self.requests.append(msgpack.unpackb(self._buffer[4 : 4 + size]))
                self._buffer = self._buffer[4 + size :]
            if len(self.requests) < count:
                chunk = self.sock.recv(65536)
                assert chunk, "the client closed the connection"
                self._buffer += chunk

    def answer(self, tag: int) -> None:
        (request,) = [r for r in self.requests if r["args"]["tag"] == tag]
        self.sock.sendall(reply_frame(request["id"], json.dumps({"tag": tag})))

    def close(self) -> None:
        self.sock.close()
        self.connection.close()


class DirectoryPeer:
    """The host's side of a call directory whose client is a ``_FileConnection``."""

    def __init__(self, client: Any, directory: Path) -> None:
        self.directory = directory
        self.connection = client._FileConnection(str(directory), TOKEN)
        self.requests: list[dict[str, Any]] = []
        self._keys: dict[int, str] = {}  # tag -> the request's file key

    def wait_requests(self, count: int) -> None:
        import msgpack

        def arrived() -> bool:
            for name in os.listdir(self.directory):
                key = name[: -len(".req")]
                if name.endswith(".req") and key not in self._keys.values():
                    request = msgpack.unpackb((self.directory / name).read_bytes()[4:])
                    (self.directory / name).unlink()
                    self._keys[request["args"]["tag"]] = key
                    self.requests.append(request)
            return len(self.requests) >= count

        eventually(arrived, f"{count} requests in {self.directory}")

    def answer(self, tag: int) -> None:
        (request,) = [r for r in self.requests if r["args"]["tag"] == tag]
        temporary = self.directory / f".{tag}.rep.tmp"
        temporary.write_bytes(reply_frame(request["id"], json.dumps({"tag": tag})))
        os.rename(temporary, self.directory / (self._keys[tag] + ".rep"))

    def close(self) -> None:
        self.connection.close()


PEERS = {"socket": SocketPeer, "files": DirectoryPeer}


def eventually(condition: Any, what: str) -> None:
    """Wait (bounded) until ``condition()`` holds; fail the test naming ``what`` if not."""
    import time

    deadline = time.monotonic() + SCRIPT_TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.001)


def calling(connection: Any, tag: int, results: dict[int, Any]) -> Any:
    """A thread making one call tagged ``tag``; its reply or error lands in ``results``."""
    import threading

    def call() -> None:
        try:
            results[tag] = connection.call("echo", {"tag": tag})
        except BaseException as exc:
            results[tag] = exc

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


def answered(results: dict[int, Any], tag: int) -> bool:
    reply = results.get(tag)
    return isinstance(reply, dict) and reply.get("result") == json.dumps({"tag": tag})


def settle() -> None:
    """A moment for the callers just started to go to sleep on their waiters: without
    it a test may pass without testing a hand-off, never fail."""
    import time

    time.sleep(0.05)


class Interrupted(Exception):
    """What the test's signal handler raises in the main thread (a Ctrl-C, say)."""


@contextmanager
def interrupted_by_sigusr1() -> Iterator[None]:
    import signal

    def interrupt(signum: int, frame: Any) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous)


def interrupt_main_thread() -> None:
    import signal

    os.kill(os.getpid(), signal.SIGUSR1)


@pytest.mark.parametrize("transport", sorted(PEERS))
def test_the_read_turn_passes_on_when_the_readers_own_reply_comes_first(
    tmp_path: Path, transport: str
) -> None:
    """The caller holding the read turn gets its reply while three others wait: it
    leaves, and one of them takes the turn and reads the others' replies."""
    peer = PEERS[transport](load_client(), tmp_path)
    board = peer.connection._board
    results: dict[int, Any] = {}
    try:
        reader = calling(peer.connection, 0, results)
        peer.wait_requests(1)
        eventually(lambda: board._reading, "the first caller takes the read turn")
        waiting = [calling(peer.connection, tag, results) for tag in (1, 2, 3)]
        peer.wait_requests(4)
        settle()
        peer.answer(0)
        reader.join(SCRIPT_TIMEOUT)
        assert answered(results, 0), results
        eventually(lambda: board._reading, "a waiting caller takes the turn on")
        for tag in (3, 1, 2):
            peer.answer(tag)
        for thread in waiting:
            thread.join(SCRIPT_TIMEOUT)
        assert all(answered(results, tag) for tag in (1, 2, 3)), results
        assert not board._reading and not board._waiting and not board._arrived
    finally:
        peer.close()


def test_a_lone_caller_never_sleeps(tmp_path: Path) -> None:
    """One caller at a time always finds the read turn free: it reads its own reply and
    makes no waiter (a lock) to sleep on, the common case's cost."""
    client = load_client()
    made: list[object] = []
    waiter_class = client._Waiter

    def counted_waiter() -> Any:
        made.append(None)
        return waiter_class()

    client._Waiter = counted_waiter
    peer = SocketPeer(client, tmp_path)
    results: dict[int, Any] = {}
    try:
        for tag in range(3):
            caller = calling(peer.connection, tag, results)
            peer.wait_requests(tag + 1)
            peer.answer(tag)
            caller.join(SCRIPT_TIMEOUT)
            assert answered(results, tag), results
        assert made == []
        board = peer.connection._board
        assert not board._reading and not board._waiting and not board._arrived
    finally:
        peer.close()


def test_a_failure_while_callers_wait_reaches_each_and_every_later_call(
    tmp_path: Path,
) -> None:
    """The host answers one of three waiting calls and closes: that call gets its
    reply, the reader and the other waiting call ToolCallError, and a later call
    raises at once, sending nothing."""
    client = load_client()
    peer = SocketPeer(client, tmp_path)
    board = peer.connection._board
    results: dict[int, Any] = {}
    try:
        threads = [calling(peer.connection, 0, results)]
        peer.wait_requests(1)
        eventually(lambda: board._reading, "the first caller takes the read turn")
        threads += [calling(peer.connection, tag, results) for tag in (1, 2)]
        peer.wait_requests(3)
        settle()
        peer.answer(1)
        peer.sock.close()
        for thread in threads:
            thread.join(SCRIPT_TIMEOUT)
        assert answered(results, 1), results
        for tag in (0, 2):
            assert isinstance(results[tag], client.ToolCallError), results
            assert "connection" in str(results[tag])
        with pytest.raises(client.ToolCallError) as later:
            peer.connection.call("echo", {"tag": 3})
        assert later.value is results[0]
        assert not board._reading and not board._waiting and not board._arrived
    finally:
        peer.close()


@pytest.mark.parametrize("transport", sorted(PEERS))
def test_a_reader_interrupted_by_an_exception_passes_the_turn_on(
    tmp_path: Path, transport: str
) -> None:
    """The main thread holds the read turn when a signal's handler raises in it (a
    Ctrl-C that the script catches): the call raises, and the caller waiting behind
    it takes the turn and gets its reply."""
    import threading

    peer = PEERS[transport](load_client(), tmp_path)
    board = peer.connection._board
    results: dict[int, Any] = {}
    waiting = []

    def direct() -> None:
        try:
            peer.wait_requests(1)
            eventually(lambda: board._reading, "the main thread takes the read turn")
            waiting.append(calling(peer.connection, 1, results))
            peer.wait_requests(2)
            settle()
        finally:
            interrupt_main_thread()

    try:
        with interrupted_by_sigusr1():
            director = threading.Thread(target=direct, daemon=True)
            director.start()
            with pytest.raises(Interrupted):
                peer.connection.call("echo", {"tag": 0})
            director.join(SCRIPT_TIMEOUT)
        eventually(lambda: board._reading, "the waiting caller takes the turn on")
        peer.answer(1)
        waiting[0].join(SCRIPT_TIMEOUT)
        assert answered(results, 1), results
    finally:
        peer.close()


@pytest.mark.parametrize("transport", sorted(PEERS))
def test_a_waiting_caller_interrupted_by_an_exception_passes_the_turn_on(
    tmp_path: Path, transport: str
) -> None:
    """The main thread waits behind the reader, before another caller, when a signal's
    handler raises in it: its call raises; when the reader leaves, the turn goes to the
    caller still waiting (not to the main thread's spent waiter), which gets its reply."""
    import threading

    peer = PEERS[transport](load_client(), tmp_path)
    board = peer.connection._board
    results: dict[int, Any] = {}
    threads = []
    main_waits = threading.Event()

    def direct() -> None:
        try:
            threads.append(calling(peer.connection, 0, results))
            peer.wait_requests(1)
            eventually(lambda: board._reading, "the first caller takes the read turn")
            main_waits.set()
            peer.wait_requests(2)  # the main thread's
            threads.append(calling(peer.connection, 2, results))
            peer.wait_requests(3)
            settle()
        finally:
            main_waits.set()
            interrupt_main_thread()

    try:
        with interrupted_by_sigusr1():
            director = threading.Thread(target=direct, daemon=True)
            director.start()
            assert main_waits.wait(SCRIPT_TIMEOUT)
            with pytest.raises(Interrupted):
                peer.connection.call("echo", {"tag": 1})
            director.join(SCRIPT_TIMEOUT)
        peer.answer(0)
        threads[0].join(SCRIPT_TIMEOUT)
        assert answered(results, 0), results
        eventually(lambda: board._reading, "the caller still waiting takes the turn on")
        peer.answer(2)
        threads[1].join(SCRIPT_TIMEOUT)
        assert answered(results, 2), results
        assert not board._reading and not board._waiting and not board._arrived
    finally:
        peer.close()


def test_a_caller_interrupted_in_its_send_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    """A signal's handler raises in the main thread while its large request is being
    sent (the host not reading): the call raises and its entry on the board goes with
    it (it will never wait), and when the reader leaves, the caller sleeping behind it
    takes the turn and gets its reply."""
    import threading

    peer = SocketPeer(load_client(), tmp_path)
    board = peer.connection._board
    results: dict[int, Any] = {}
    threads = []
    main_calls = threading.Event()

    def direct() -> None:
        try:
            threads.append(calling(peer.connection, 0, results))
            peer.wait_requests(1)
            eventually(lambda: board._reading, "the first caller takes the read turn")
            threads.append(calling(peer.connection, 1, results))
            peer.wait_requests(2)
            eventually(lambda: board._waiting.get(2) is not None, "the second caller sleeps")
            main_calls.set()
            eventually(lambda: len(board._waiting) == 3, "the main thread registers")
            settle()  # its send stuck on the full socket
        finally:
            main_calls.set()
            interrupt_main_thread()

    try:
        with interrupted_by_sigusr1():
            director = threading.Thread(target=direct, daemon=True)
            director.start()
            assert main_calls.wait(SCRIPT_TIMEOUT)
            with pytest.raises(Interrupted):
                peer.connection.call("echo", {"tag": 2, "data": "x" * (32 << 20)})
            director.join(SCRIPT_TIMEOUT)
        assert 3 not in board._waiting
        peer.answer(0)
        threads[0].join(SCRIPT_TIMEOUT)
        assert answered(results, 0), results
        eventually(lambda: board._reading, "the sleeping caller takes the turn on")
        peer.answer(1)
        threads[1].join(SCRIPT_TIMEOUT)
        assert answered(results, 1), results
    finally:
        peer.close()


def test_a_send_cut_by_an_exception_retires_the_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal's handler raises while the main thread's large request is half sent (the
    host not reading): the host would read the next request's bytes as the rest of that
    frame and never answer it. The connection is retired instead: the call already sent
    gets its reply on it, the next call goes on a new connection, and the old socket is
    closed once no call is left on it (the host sees its end)."""
    import socket
    import threading

    import msgpack

    client = load_client()
    peer = SocketPeer(client, tmp_path)
    board = peer.connection._board
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "s"))
    listener.listen(1)
    listener.settimeout(SCRIPT_TIMEOUT)
    monkeypatch.setenv("HERMES_RPC_SOCKET", str(tmp_path / "s"))
    monkeypatch.setenv("HERMES_RPC_TOKEN", TOKEN)
    monkeypatch.delenv("HERMES_RPC_DIR", raising=False)
    client._connection = peer.connection
    results: dict[int, Any] = {}
    module_calls = SimpleNamespace(call=client._call)  # whichever connection is current

    def call(tag: int) -> threading.Thread:
        return calling(module_calls, tag, results)

    def direct() -> None:
        try:
            eventually(lambda: len(board._waiting) == 2, "the main thread registers")
            settle()  # its send stuck on the full socket
        finally:
            interrupt_main_thread()

    try:
        first = call(0)
        peer.wait_requests(1)
        eventually(lambda: board._reading, "the first caller takes the read turn")
        with interrupted_by_sigusr1():
            director = threading.Thread(target=direct, daemon=True)
            director.start()
            with pytest.raises(Interrupted):
                client._call("echo", {"tag": 1, "data": "x" * (32 << 20)})
            director.join(SCRIPT_TIMEOUT)
        assert peer.connection.retired

        later = call(2)  # on a new connection
        fresh, _ = listener.accept()
        with fresh:
            fresh.settimeout(SCRIPT_TIMEOUT)
            header = fresh.recv(4, socket.MSG_WAITALL)
            request = msgpack.unpackb(fresh.recv(int.from_bytes(header, "big"), socket.MSG_WAITALL))
            assert request["args"] == {"tag": 2}, request
            fresh.sendall(reply_frame(request["id"], json.dumps({"tag": 2})))
            later.join(SCRIPT_TIMEOUT)
        assert results[2] == {"tag": 2}, results

        assert peer.connection._sock.fileno() >= 0, "closed under the call still waiting"
        peer.answer(0)  # the call sent before the cut still gets its reply
        first.join(SCRIPT_TIMEOUT)
        assert results[0] == {"tag": 0}, results
        eventually(lambda: peer.connection._sock.fileno() < 0, "the retired socket closes")
        received = 0
        while chunk := peer.sock.recv(1 << 20):  # the cut frame's part, then the end
            received += len(chunk)
        assert 0 < received < 32 << 20
    finally:
        listener.close()
        peer.close()
