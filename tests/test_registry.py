"""The registry: registration, availability (check_fn cache), argument handling in
dispatch, result caps, and async handlers called from every kind of caller."""

from __future__ import annotations

import asyncio
import contextvars
import enum
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, Literal, Optional

import anyio
import anyio.lowlevel
import pytest

from hermes_sandbox.tools.capping import cap_result
from hermes_sandbox.tools.decorator import build_tool_schema, parse_docstring, tool
from hermes_sandbox.tools.registry import (
    CHECK_TTL_SECONDS,
    ToolContext,
    ToolRegistry,
    tool_error,
    tool_result,
)

SCHEMA = {
    "name": "echo",
    "description": "Echo the arguments.",
    "parameters": {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "limit": {"type": "integer", "minimum": 1},
            "flags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["path"],
    },
}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """A sync handler that records what it was called with."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, args: dict[str, Any]) -> str:
        self.calls.append(args)
        return tool_result(args)


def result(text: str) -> Any:
    return json.loads(text)


# ------------------------------------------------------------------- registration


def test_register_and_dispatch():
    reg = ToolRegistry()
    reg.register("echo", "test", SCHEMA, Recorder(), requires_env=["ECHO_KEY"])
    entry = reg.get("echo")
    assert entry.requires_env == ("ECHO_KEY",)
    assert entry.description == "Echo the arguments."
    assert entry.schema["type"] == "function"
    assert result(reg.dispatch("echo", {"path": "a"})) == {"path": "a"}
    assert reg.names() == ["echo"] and reg.names(toolset="test") == ["echo"]
    assert reg.toolsets() == ["test"]


def test_unknown_tool_and_failing_handler_become_errors():
    reg = ToolRegistry()

    def boom(args):
        raise ValueError("boom")

    reg.register("boom", "test", {"name": "boom"}, boom)
    assert result(reg.dispatch("nope", {})) == {"error": "Unknown tool: nope"}
    assert result(reg.dispatch("boom", {})) == {"error": "Tool execution failed: ValueError: boom"}


def test_a_name_from_another_toolset_needs_override():
    reg = ToolRegistry()
    reg.register("echo", "one", SCHEMA, Recorder())
    with pytest.raises(ValueError, match="already registered by toolset 'one'"):
        reg.register("echo", "two", SCHEMA, Recorder())
    reg.register("echo", "two", SCHEMA, Recorder(), override=True)
    assert reg.get("echo").toolset == "two"


def test_an_invalid_parameters_schema_is_refused():
    reg = ToolRegistry()
    bad = {"name": "bad", "parameters": {"type": "object", "properties": {"x": {"type": 5}}}}
    with pytest.raises(ValueError, match=r"'bad'.*invalid parameters schema"):
        reg.register("bad", "test", bad, Recorder())
    assert "bad" not in reg


# ---------------------------------------------------------------------- check_fn


def test_check_fn_results_are_cached_for_the_ttl():
    clock = FakeClock()
    reg = ToolRegistry(clock=clock)
    answers = iter([True, False])
    calls = []

    def check():
        calls.append(clock.now)
        return next(answers)

    reg.register("echo", "test", SCHEMA, Recorder(), check_fn=check)
    assert reg.is_available("echo")
    clock.now += CHECK_TTL_SECONDS - 0.1
    assert reg.is_available("echo")
    assert len(calls) == 1
    clock.now += 0.2
    assert not reg.is_available("echo")
    assert len(calls) == 2
    assert reg.get_definitions() == []


def test_a_check_fn_that_raises_means_unavailable():
    reg = ToolRegistry(clock=FakeClock())

    def check():
        raise RuntimeError("no service")

    reg.register("echo", "test", SCHEMA, Recorder(), check_fn=check)
    assert not reg.is_available("echo")
    assert reg.get_definitions(["echo"]) == []
    assert not reg.is_available("missing")


def test_registering_again_forgets_the_cached_answer():
    clock = FakeClock()
    reg = ToolRegistry(clock=clock)
    reg.register("echo", "test", SCHEMA, Recorder(), check_fn=lambda: False)
    assert not reg.is_available("echo")
    reg.register("echo", "test", SCHEMA, Recorder(), check_fn=lambda: True)
    assert reg.is_available("echo")  # same instant: not the cached False
    reg.deregister("echo")
    reg.register("echo", "test", SCHEMA, Recorder(), check_fn=lambda: False)
    assert not reg.is_available("echo")


def test_a_check_fn_shared_by_several_tools_runs_once_per_definitions_pass():
    clock = FakeClock()
    reg = ToolRegistry(clock=clock)
    calls = []

    def shared():
        calls.append(clock.now)
        return True

    def other():
        calls.append("other")
        return False

    for name in ("one", "two", "three"):
        reg.register(name, "test", {**SCHEMA, "name": name}, Recorder(), check_fn=shared)
    reg.register("four", "test", {**SCHEMA, "name": "four"}, Recorder(), check_fn=other)
    names = [d["function"]["name"] for d in reg.get_definitions()]
    assert names == ["one", "three", "two"]
    assert sorted(calls, key=str) == [1000.0, "other"]
    # the answer is kept by the function: asking about another tool of it runs nothing
    assert reg.is_available("two") and len(calls) == 2
    # once the kept answer is stale, the next pass runs the shared check once again
    clock.now += CHECK_TTL_SECONDS + 1
    assert len(reg.get_definitions(["one", "two", "three"])) == 3
    assert calls[2:] == [clock.now]


def test_the_registered_name_wins_over_the_schemas_name():
    reg = ToolRegistry()
    reg.register("t", "test", {**SCHEMA, "name": "other"}, Recorder())
    assert reg.get("t").schema["function"]["name"] == "t"
    assert [d["function"]["name"] for d in reg.get_definitions()] == ["t"]
    assert result(reg.dispatch("t", {"path": "a"})) == {"path": "a"}
    assert "other" not in reg
    # the wrapped OpenAI form too, and the caller's schema is left as it was
    wrapped = {"type": "function", "function": {**SCHEMA, "name": "other"}}
    reg.register("w", "test", wrapped, Recorder())
    assert reg.get("w").schema["function"]["name"] == "w"
    assert wrapped["function"]["name"] == "other"


# -------------------------------------------------------------- arguments in dispatch


@pytest.mark.parametrize("asynchronous", [False, True], ids=["dispatch", "adispatch"])
def test_arguments_are_coerced_before_the_handler(asynchronous):
    reg = ToolRegistry()
    handler = Recorder()
    reg.register("echo", "test", SCHEMA, handler)
    args = {"path": "a", "limit": "42", "flags": "x"}
    out = anyio.run(reg.adispatch, "echo", args) if asynchronous else reg.dispatch("echo", args)
    assert result(out) == {"path": "a", "limit": 42, "flags": ["x"]}
    assert handler.calls == [{"path": "a", "limit": 42, "flags": ["x"]}]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["dispatch", "adispatch"])
def test_a_bad_call_never_reaches_the_handler(asynchronous):
    reg = ToolRegistry()
    handler = Recorder()
    reg.register("echo", "test", SCHEMA, handler)
    args = {"limit": "abc", "flags": [1]}
    if asynchronous:
        out = result(anyio.run(reg.adispatch, "echo", args))
    else:
        out = result(reg.dispatch("echo", args))
    assert handler.calls == []
    assert out["error"] == (
        "Invalid arguments for echo: args.flags[0]: expected string, got 1; "
        "args.limit: expected integer, got 'abc'; args.path: required field missing"
    )
    assert out["problems"] == [
        "args.flags[0]: expected string, got 1",
        "args.limit: expected integer, got 'abc'",
        "args.path: required field missing",
    ]


def test_extra_fields_are_refused_only_when_the_schema_closes_the_object():
    reg = ToolRegistry()
    reg.register("open", "test", {**SCHEMA, "name": "open"}, Recorder())
    closed = json.loads(json.dumps(SCHEMA))
    closed["name"] = "closed"
    closed["parameters"]["additionalProperties"] = False
    reg.register("closed", "test", closed, Recorder())
    assert "error" not in result(reg.dispatch("open", {"path": "a", "extra": 1}))
    assert result(reg.dispatch("closed", {"path": "a", "extra": 1}))["problems"] == [
        "args.extra: unknown field (allowed: path, limit, flags)"
    ]


def test_arguments_as_json_text_or_none():
    reg = ToolRegistry()
    reg.register("echo", "test", SCHEMA, Recorder())
    assert result(reg.dispatch("echo", '{"path": "a", "limit": "2"}')) == {"path": "a", "limit": 2}
    assert "required field missing" in result(reg.dispatch("echo", None))["error"]
    assert "not JSON" in result(reg.dispatch("echo", "{oops"))["error"]
    assert "got list" in result(reg.dispatch("echo", ["a"]))["error"]


def test_validators_are_cached_per_tool_and_replaced_on_register():
    reg = ToolRegistry()
    first = reg.register("echo", "test", SCHEMA, Recorder())
    compiled = first.arguments
    reg.dispatch("echo", {"path": "a"})
    reg.dispatch("echo", {"path": "b"})
    assert reg.get("echo").arguments is compiled
    strict = json.loads(json.dumps(SCHEMA))
    strict["parameters"]["properties"]["limit"]["maximum"] = 5
    second = reg.register("echo", "test", strict, Recorder())
    assert second.arguments is not compiled
    assert "error" in result(reg.dispatch("echo", {"path": "a", "limit": 9}))


def test_validation_can_be_turned_off_for_a_tool_with_its_own_advice():
    reg = ToolRegistry()
    handler = Recorder()
    reg.register("echo", "test", SCHEMA, handler, validate_args=False)
    assert result(reg.dispatch("echo", {"limit": "7"})) == {"limit": 7}  # still coerced
    assert handler.calls == [{"limit": 7}]


def test_the_context_reaches_a_handler_that_takes_it():
    reg = ToolRegistry()
    seen = []

    def handler(args, ctx):
        seen.append(ctx)
        return "ok"

    reg.register("ctx", "test", {"name": "ctx"}, handler)
    ctx = ToolContext(task_id="t1", environment=None, cwd="/work")  # type: ignore[arg-type]
    assert reg.dispatch("ctx", {}, ctx) == "ok"
    assert seen == [ctx]


# -------------------------------------------------------------------- result caps


def long_object(**fields: Any) -> str:
    return json.dumps({"status": "ok", **fields})


def test_cap_keeps_a_json_object_valid():
    text = "".join(f"{i:05d}\n" for i in range(2000))  # 12,000 characters
    capped = cap_result(long_object(output=text, exit_code=0), 2000)
    assert len(capped) <= 2000
    data = json.loads(capped)
    assert data["truncated"] is True
    assert data["status"] == "ok" and data["exit_code"] == 0
    head, sep, rest = data["output"].partition("\n... [")
    assert sep
    omitted, _, tail = rest.partition(" characters omitted] ...\n")
    assert int(omitted.replace(",", "")) == len(text) - len(head) - len(tail)
    assert text.startswith(head) and text.endswith(tail)
    assert 0.3 < len(head) / (len(head) + len(tail)) < 0.5  # head 40%, tail 60%


def test_cap_cuts_the_longest_fields_first():
    data = {"small": "s" * 100, "big": "b" * 5000, "nested": {"list": ["n" * 3000, 1]}}
    capped = json.loads(cap_result(json.dumps(data), 4000))
    assert capped["small"] == "s" * 100
    assert "characters omitted" in capped["big"]
    assert len(json.dumps(capped)) <= 4000
    tighter = json.loads(cap_result(json.dumps(data), 1200))
    assert "characters omitted" in tighter["big"]
    assert "characters omitted" in tighter["nested"]["list"][0]
    assert tighter["nested"]["list"][1] == 1
    assert len(json.dumps(tighter, ensure_ascii=False)) <= 1200


def test_cap_counts_escaped_characters():
    text = '"\n\\' * 3000  # each character is escaped in JSON
    capped = cap_result(json.dumps({"out": text}), 1000)
    assert len(capped) <= 1000
    assert json.loads(capped)["truncated"] is True


def test_cap_falls_back_to_head_and_tail_text():
    plain = "x" * 600 + "y" * 400
    capped = cap_result(plain, 200)
    assert len(capped) <= 200
    assert capped.startswith("x") and capped.endswith("y")
    assert "characters omitted" in capped
    # JSON that is not an object, and an object of many small fields, cannot stay JSON
    as_list = json.dumps(["z" * 100] * 50)
    assert "characters omitted" in cap_result(as_list, 300)
    many = json.dumps({f"k{i}": i for i in range(500)})
    capped_many = cap_result(many, 300)
    assert len(capped_many) <= 300 and capped_many.startswith('{"k0"')


def test_short_results_are_untouched():
    assert cap_result("abc", 3) == "abc"
    assert cap_result("abc", None) == "abc"


def test_dispatch_applies_the_tools_cap():
    reg = ToolRegistry()
    reg.register(
        "big",
        "test",
        {"name": "big"},
        lambda args: {"content": "c" * 10_000, "lines": 3},
        max_result_size_chars=1000,
    )
    out = reg.dispatch("big", {})
    assert len(out) <= 1000
    assert json.loads(out)["lines"] == 3


def test_tool_error_and_tool_result():
    assert json.loads(tool_error("bad", code=3)) == {"error": "bad", "code": 3}
    assert json.loads(tool_result(a=1)) == {"a": 1}
    assert json.loads(tool_result([1, 2])) == [1, 2]


# ------------------------------------------------------------------ async handlers

CALLS = 50


def make_async_registry() -> ToolRegistry:
    """Tools whose handlers need a loop that stays the same from call to call."""
    reg = ToolRegistry()
    state: dict[str, Any] = {}

    async def sleeper(args):
        # Cache the loop like a client would (httpx.AsyncClient, a connection pool):
        # a fresh loop per call leaves this pointing at a closed one.
        loop = state.setdefault("loop", asyncio.get_running_loop())
        await asyncio.sleep(0.001)
        future = loop.create_future()
        loop.call_soon(future.set_result, args["n"])
        return {"n": await future}

    async def anyio_user(args):
        await anyio.sleep(0.001)
        doubled = await anyio.to_thread.run_sync(lambda: args["n"] * 2)
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.sleep, 0)
        return {"n": doubled}

    number = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    reg.register("sleeper", "test", {"name": "sleeper", "parameters": number}, sleeper)
    reg.register("anyio_user", "test", {"name": "anyio_user", "parameters": number}, anyio_user)
    return reg


def call_many(reg: ToolRegistry) -> list[Any]:
    out = []
    for i in range(CALLS):
        out.append(result(reg.dispatch("sleeper", {"n": i}))["n"])
        out.append(result(reg.dispatch("anyio_user", {"n": str(i)}))["n"])
    return out


EXPECTED = [v for i in range(CALLS) for v in (i, 2 * i)]


def test_sync_dispatch_of_async_handlers_from_plain_code():
    assert call_many(make_async_registry()) == EXPECTED


def test_sync_dispatch_from_worker_threads():
    reg = make_async_registry()
    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(lambda _: call_many(reg), range(4)))
    assert outcomes == [EXPECTED] * 4


def test_sync_dispatch_inside_a_running_asyncio_loop():
    reg = make_async_registry()

    async def main():
        return call_many(reg)  # blocks this loop, by design; must not deadlock or fail

    assert asyncio.run(main()) == EXPECTED


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_sync_dispatch_inside_anyio(backend):
    reg = make_async_registry()

    async def main():
        return call_many(reg)

    assert anyio.run(main, backend=backend) == EXPECTED


def test_adispatch_runs_async_handlers_in_the_callers_loop():
    reg = ToolRegistry()

    async def where(args):
        await asyncio.sleep(0)
        await anyio.lowlevel.checkpoint()
        return {"same_loop": asyncio.get_running_loop() is args_loop[0]}

    args_loop: list[Any] = []
    reg.register("where", "test", {"name": "where"}, where)

    async def main():
        args_loop.append(asyncio.get_running_loop())
        return [result(await reg.adispatch("where", {}))["same_loop"] for _ in range(CALLS)]

    assert asyncio.run(main()) == [True] * CALLS
    args_loop.clear()
    assert anyio.run(main) == [True] * CALLS


def test_adispatch_does_not_block_the_loop_on_a_slow_sync_handler():
    reg = ToolRegistry()
    reg.register("slow", "test", {"name": "slow"}, lambda args: time.sleep(0.5) or "done")
    ticks = []

    async def main():
        async def ticker():
            while True:
                ticks.append(time.monotonic())
                await anyio.sleep(0.01)

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            out = await reg.adispatch("slow", {})
            tg.cancel_scope.cancel()
        return out

    assert anyio.run(main) == "done"
    assert len(ticks) >= 10  # the ticker kept running while the handler slept


def test_adispatch_in_a_thread_for_sync_handlers():
    reg = ToolRegistry()
    reg.register("thread", "test", {"name": "thread"}, lambda a: threading.current_thread().name)

    async def main():
        return await reg.adispatch("thread", {})

    assert anyio.run(main) != threading.current_thread().name


def test_an_async_handler_may_dispatch_another_async_tool_synchronously():
    reg = make_async_registry()

    async def outer(args):
        inner = reg.dispatch("sleeper", {"n": 7})  # sync dispatch from the private loop
        return {"inner": result(inner)["n"]}

    reg.register("outer", "test", {"name": "outer"}, outer)
    for _ in range(5):
        assert result(reg.dispatch("outer", {})) == {"inner": 7}


def test_dispatch_gives_an_async_handler_the_callers_context_variables():
    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")
    reg = ToolRegistry()

    async def which(args):
        seen = request_id.get("unset")
        request_id.set("changed by the handler")
        return {"id": seen}

    reg.register("which", "test", {"name": "which"}, which)
    assert result(reg.dispatch("which", {}))["id"] == "unset"
    token = request_id.set("r-1")
    try:
        assert result(reg.dispatch("which", {}))["id"] == "r-1"
        assert request_id.get() == "r-1"  # the handler's change stays in its copy
    finally:
        request_id.reset(token)


FORKING_PROGRAM = """
import os, sys
import anyio
from hermes_sandbox.tools.registry import ToolRegistry

async def double(args):
    await anyio.sleep(0)
    return {"n": await anyio.to_thread.run_sync(lambda: args["n"] * 2)}

reg = ToolRegistry()
reg.register("double", "test", {"name": "double"}, double)
assert reg.dispatch("double", {"n": 1}) == '{"n": 2}'  # the parent's loop is up
children = []
for use_it in (True, False):
    pid = os.fork()
    if pid == 0:  # the parent's loop thread did not come along
        if use_it:
            assert reg.dispatch("double", {"n": 2}) == '{"n": 4}'
        sys.exit(0)  # a normal exit: atexit hooks, then finalization
    children.append(pid)
for pid in children:
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
assert reg.dispatch("double", {"n": 3}) == '{"n": 6}'  # and the parent's still is
print("ok")
"""


def test_a_forked_child_runs_async_tools_on_a_loop_of_its_own_and_exits():
    done = subprocess.run(
        [sys.executable, "-c", FORKING_PROGRAM], capture_output=True, text=True, timeout=30
    )
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr


def test_async_failures_and_non_string_results():
    reg = ToolRegistry()

    async def boom(args):
        await asyncio.sleep(0)
        raise KeyError("k")

    async def data(args):
        return {"a": 1}

    def returns_coroutine(args):  # a sync callable handing back an awaitable
        return data(args)

    reg.register("boom", "test", {"name": "boom"}, boom)
    reg.register("data", "test", {"name": "data"}, data)
    reg.register("lazy", "test", {"name": "lazy"}, returns_coroutine)
    assert result(reg.dispatch("boom", {})) == {"error": "Tool execution failed: KeyError: 'k'"}
    assert result(anyio.run(reg.adispatch, "boom", {}))["error"].startswith("Tool execution")
    assert result(reg.dispatch("data", {})) == {"a": 1}
    assert result(reg.dispatch("lazy", {})) == {"a": 1}
    assert result(anyio.run(reg.adispatch, "lazy", {})) == {"a": 1}


# ------------------------------------------------------------------- the decorator


def test_decorator_builds_the_schema_from_signature_and_docstring():
    reg = ToolRegistry()

    @tool(toolset="math", registry=reg)
    def add(a: int, b: int = 2) -> dict:
        """Add numbers.

        Args:
            a: first
            b: second
        """
        return {"sum": a + b}

    entry = reg.get("add")
    assert entry.toolset == "math"
    assert entry.schema["function"] == {
        "name": "add",
        "description": "Add numbers.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "description": "first"},
                "b": {"type": "integer", "description": "second", "default": 2},
            },
            "required": ["a"],
            "additionalProperties": False,
        },
    }
    assert add(1, 2) == {"sum": 3}  # still a plain function
    assert add.tool_entry is entry
    assert result(reg.dispatch("add", {"a": "40"})) == {"sum": 42}
    assert result(reg.dispatch("add", {"a": 1, "b": None})) == {"sum": 3}  # null: default
    assert "args.a: expected integer, got 'x'" in result(reg.dispatch("add", {"a": "x"}))["error"]


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


def test_decorator_types():
    def everything(
        text: str,
        ratio: float,
        flag: bool,
        numbers: list[int],
        weights: dict[str, float],
        maybe: Optional[int],  # noqa: UP045 - the old spelling must work too
        either: int | None,
        mode: Literal["fast", "slow"],
        colour: Colour,
        pair: tuple[int, str],
        tags: set[str],
        note: Annotated[str, "a note"] = "",
        anything=None,
        limit: int = None,  # type: ignore[assignment]  # noqa: RUF013 - implicit Optional, on purpose
    ) -> str:
        return "ok"

    schema, _ = build_tool_schema(everything)
    props = schema["parameters"]["properties"]
    assert props["text"] == {"type": "string"}
    assert props["ratio"] == {"type": "number"}
    assert props["flag"] == {"type": "boolean"}
    assert props["numbers"] == {"type": "array", "items": {"type": "integer"}}
    assert props["weights"] == {"type": "object", "additionalProperties": {"type": "number"}}
    assert props["maybe"] == {"type": ["integer", "null"]}
    assert props["either"] == {"type": ["integer", "null"]}
    assert props["mode"] == {"enum": ["fast", "slow"], "type": "string"}
    assert props["colour"] == {"enum": ["red", "blue"], "type": "string"}
    assert props["pair"] == {
        "type": "array",
        "prefixItems": [{"type": "integer"}, {"type": "string"}],
        "minItems": 2,
        "maxItems": 2,
    }
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["note"] == {"type": "string", "description": "a note", "default": ""}
    assert props["anything"] == {"default": None}
    assert props["limit"] == {"type": ["integer", "null"], "default": None}
    assert schema["parameters"]["required"] == [
        "text",
        "ratio",
        "flag",
        "numbers",
        "weights",
        "maybe",
        "either",
        "mode",
        "colour",
        "pair",
        "tags",
    ]


def test_decorator_converts_values_to_the_annotated_types():
    reg = ToolRegistry()
    seen = {}

    @tool(registry=reg)
    def paint(colour: Colour, pair: tuple[int, str], tags: frozenset[str] = frozenset()) -> str:
        seen.update(colour=colour, pair=pair, tags=tags)
        return "painted"

    assert reg.dispatch("paint", {"colour": "blue", "pair": '[1, "a"]', "tags": "x"}) == "painted"
    assert seen == {"colour": Colour.BLUE, "pair": (1, "a"), "tags": frozenset({"x"})}
    assert "expected one of 'red', 'blue'" in reg.dispatch(
        "paint", {"colour": "g", "pair": [1, "a"]}
    )


def test_rest_and_google_docstrings():
    assert parse_docstring(
        """Fetch a page.

        More detail here.

        :param url: where to go,
            over several lines
        :param int timeout: seconds
        :returns: the page
        """
    ) == (
        "Fetch a page.\n\nMore detail here.",
        {"url": "where to go, over several lines", "timeout": "seconds"},
    )
    assert parse_docstring(
        """Search.

        Args:
            query (str): what to look for,
                in any words
            limit: how many

        Returns:
            matches
        """
    ) == ("Search.", {"query": "what to look for, in any words", "limit": "how many"})
    assert parse_docstring(None) == ("", {})


def test_decorator_async_function_with_context_and_defaults():
    reg = ToolRegistry()

    @tool(registry=reg, name="where", description="Say where.", max_result_size_chars=500)
    async def where_am_i(ctx: ToolContext, suffix: str = "!") -> dict:
        await asyncio.sleep(0)
        return {"cwd": ctx.cwd + suffix, "x": "y" * 2000}

    entry = reg.get("where")
    assert entry.is_async and entry.takes_context
    assert "ctx" not in entry.parameters["properties"]
    assert entry.description == "Say where."
    ctx = ToolContext(task_id="t", environment=None, cwd="/w")  # type: ignore[arg-type]
    out = json.loads(reg.dispatch("where", {}, ctx))
    assert out["cwd"] == "/w!" and out["truncated"] is True
    assert json.loads(anyio.run(reg.adispatch, "where", {"suffix": "?"}, ctx))["cwd"] == "/w?"


def test_bare_decorator_on_the_global_registry_and_kwargs():
    from hermes_sandbox.tools.registry import registry as global_registry

    @tool
    def decorator_test_echo(word: str, **extra) -> str:
        return word + "".join(sorted(extra))

    try:
        entry = global_registry.get("decorator_test_echo")
        assert entry.toolset == "custom"
        assert "additionalProperties" not in entry.parameters
        assert global_registry.dispatch("decorator_test_echo", {"word": "a", "z": 1}) == "az"
    finally:
        global_registry.deregister("decorator_test_echo")


def test_decorator_refuses_star_args():
    with pytest.raises(TypeError, match=r"\*rest cannot take tool arguments"):

        @tool(registry=ToolRegistry())
        def bad(*rest: int) -> str:
            return ""


def test_decorator_results_pass_strings_through():
    reg = ToolRegistry()

    @tool(registry=reg)
    def text() -> str:
        return "plain text"

    @tool(registry=reg)
    def nothing() -> None:
        return None

    assert reg.dispatch("text", {}) == "plain text"
    assert reg.dispatch("nothing", {}) == "{}"
