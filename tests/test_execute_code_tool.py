"""The execute_code tool: its schema lists the session's tools from the registry, with the
signatures the stub declares, and the run's limits; its handler guards input and runs
scripts that call exactly the listed tools."""

from __future__ import annotations

import json

import pytest

from hermes_sandbox import register_execute_code, tool
from hermes_sandbox.execute_code_tool import (
    SUMMARY_CHARS,
    build_schema,
    limits_text,
    script_tools,
    summary,
    tool_definition,
)
from hermes_sandbox.runner import RunError, RunOptions
from hermes_sandbox.stubs import StubError, generate_stub, tool_signature
from hermes_sandbox.tools import ToolRegistry, load_builtin_tools, registry, tool_result

WEATHER_SCHEMA = {
    "name": "get_weather",
    "description": (
        "Today's weather in a city. Returns {city, forecast, high_c}.\n\n"
        "A second paragraph that the listing leaves out."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "the city's name"},
            "units": {"type": "string", "enum": ["C", "F"]},
        },
        "required": ["city"],
    },
}


def get_weather(args):
    return tool_result(city=args["city"], forecast="sunny", high_c=24)


@pytest.fixture
def session_registry():
    """A private registry holding the built-in tools (copied from the global one)."""
    load_builtin_tools()
    private = ToolRegistry()
    for name in registry.names():
        entry = registry.get(name)
        if entry.name == "execute_code":
            continue
        private.register(
            name=entry.name,
            toolset=entry.toolset,
            schema=entry.schema,
            handler=entry.handler,
            check_fn=entry.check_fn,
        )
    return private


def description_of(reg: ToolRegistry) -> str:
    return reg.get("execute_code").schema["function"]["description"]


def listing_of(reg: ToolRegistry) -> list[str]:
    """The "- name(...): summary" lines of execute_code's description."""
    return [line for line in description_of(reg).splitlines() if line.startswith("- ")]


def test_schema_names_only_the_enabled_tools(session_registry):
    register_execute_code(session_registry, enabled_tools=["read_file"])
    schema = session_registry.get("execute_code").schema
    text = json.dumps(schema)
    assert "read_file" in text
    for disabled in ("write_file", "terminal", "web_search", "patch"):
        assert disabled not in text
    assert schema["function"]["parameters"]["required"] == ["code"]
    assert set(schema["function"]["parameters"]["properties"]) == {"code", "reset"}


def test_schema_without_tools_says_so(session_registry):
    text = build_schema([], registry=session_registry)["description"]
    assert "No tools can be called" in text
    assert "hermes_tools import" not in text


def test_a_custom_tool_is_listed_with_its_signature_and_description(session_registry):
    session_registry.register(
        name="get_weather", toolset="weather", schema=WEATHER_SCHEMA, handler=get_weather
    )
    entry = register_execute_code(
        session_registry, enabled_tools=["terminal", "read_file", "get_weather"]
    )
    assert entry is session_registry.get("execute_code")
    description = description_of(session_registry)
    assert "from hermes_tools import terminal, read_file, get_weather" in description
    weather = next(line for line in listing_of(session_registry) if "get_weather(" in line)
    assert weather == (
        "- get_weather(city: str, units: str = None): "
        "Today's weather in a city. Returns {city, forecast, high_c}."
    )
    assert "second paragraph" not in description
    # the built-in ones come from the registry the same way (no hand-kept summaries)
    terminal = next(line for line in listing_of(session_registry) if "terminal(" in line)
    signature = "terminal(command: str, timeout: int = None, workdir: str = None)"
    assert terminal.startswith(f"- {signature}: ")
    assert "Returns {output, exit_code}" in terminal


def test_each_listed_signature_is_the_one_the_stub_declares(session_registry):
    session_registry.register(
        name="get_weather", toolset="weather", schema=WEATHER_SCHEMA, handler=get_weather
    )
    enabled = ["read_file", "write_file", "patch", "search_files", "terminal", "get_weather"]
    register_execute_code(session_registry, enabled_tools=enabled)
    stub = generate_stub(session_registry.get_definitions(enabled))
    listing = listing_of(session_registry)
    assert len(listing) == len(enabled)
    for line, name in zip(listing, enabled, strict=True):
        signature = line[2:].split("):", 1)[0] + ")"
        assert signature.startswith(name + "(")
        assert f"\ndef {signature}:\n" in stub


def test_a_custom_tool_listed_is_callable_from_a_script(session_registry):
    session_registry.register(
        name="get_weather", toolset="weather", schema=WEATHER_SCHEMA, handler=get_weather
    )

    @tool(registry=session_registry, toolset="math")
    def add(a: int, b: int = 2) -> dict:
        """Add two numbers.

        Args:
            a: the first
            b: the second
        """
        return {"sum": a + b}

    register_execute_code(
        session_registry,
        enabled_tools=["terminal", "read_file", "get_weather", "add"],
        options=RunOptions(timeout=30, max_tool_calls=5),
    )
    listing = "\n".join(listing_of(session_registry))
    assert "- add(a: int, b: int = None): Add two numbers." in listing
    code = (
        "from hermes_tools import get_weather, add\n"
        "print(get_weather('Lyon')['forecast'], add(40)['sum'], add(1, b=1)['sum'])\n"
    )
    result = json.loads(session_registry.dispatch("execute_code", {"code": code}))
    assert result["status"] == "success", result
    assert result["output"] == "sunny 42 2\n"
    assert result["tool_calls_made"] == 3


def test_the_script_gets_exactly_the_listed_tools(session_registry):
    session_registry.register(
        name="get_weather", toolset="weather", schema=WEATHER_SCHEMA, handler=get_weather
    )
    session_registry.register(
        name="offline",
        toolset="weather",
        schema={"name": "offline", "description": "Never available here."},
        handler=get_weather,
        check_fn=lambda: False,
    )
    register_execute_code(
        session_registry, enabled_tools=["get_weather", "offline", "terminal", "execute_code"]
    )
    listed = [line[2:].split("(", 1)[0] for line in listing_of(session_registry)]
    assert listed == ["get_weather", "terminal"]
    code = (
        "import hermes_tools\n"
        "print(sorted(n for n in hermes_tools.__all__ if n in "
        "('get_weather', 'offline', 'terminal', 'read_file', 'execute_code')))\n"
    )
    result = json.loads(session_registry.dispatch("execute_code", {"code": code}))
    assert result["status"] == "success", result
    assert result["output"] == "['get_weather', 'terminal']\n"


def test_blocked_tools_are_never_listed(session_registry):
    session_registry.register(
        name="delegate_task",
        toolset="delegation",
        schema={"name": "delegate_task", "description": "Hand a task to a subagent."},
        handler=get_weather,
    )
    register_execute_code(
        session_registry, enabled_tools=["execute_code", "delegate_task", "terminal"]
    )
    assert script_tools(session_registry, ["execute_code", "delegate_task", "terminal"]) == [
        "terminal"
    ]
    description = description_of(session_registry)
    assert "delegate_task" not in description
    assert "execute_code(" not in description


def test_an_unregistered_enabled_tool_is_an_error_that_says_what_to_do(session_registry):
    with pytest.raises(RunError, match=r"not registered: get_weather\. Register each"):
        register_execute_code(session_registry, enabled_tools=["terminal", "get_weather"])
    with pytest.raises(RunError, match="not a string"):
        register_execute_code(session_registry, enabled_tools="terminal")
    with pytest.raises(RunError, match="holds None, not a tool name"):
        register_execute_code(session_registry, enabled_tools=["terminal", None])
    with pytest.raises(RunError, match=r"holds \['read_file'\], not a tool name"):
        register_execute_code(session_registry, enabled_tools=["terminal", ["read_file"]])


def test_a_tool_a_script_cannot_import_is_refused_at_registration(session_registry):
    session_registry.register(
        name="get-weather",
        toolset="weather",
        schema={**WEATHER_SCHEMA, "name": "get-weather"},
        handler=get_weather,
    )
    with pytest.raises(StubError, match=r"get-weather.*rename"):
        register_execute_code(session_registry, enabled_tools=["get-weather"])


def test_run_options_tools_narrow_the_session_list(session_registry):
    register_execute_code(
        session_registry,
        enabled_tools=["terminal", "read_file", "write_file"],
        options=RunOptions(tools=("read_file", "patch")),
    )
    listed = [line[2:].split("(", 1)[0] for line in listing_of(session_registry)]
    assert listed == ["read_file"]


def test_without_a_session_list_the_run_default_is_listed(session_registry):
    session_registry.register(
        name="get_weather", toolset="weather", schema=WEATHER_SCHEMA, handler=get_weather
    )
    register_execute_code(session_registry)
    listed = {line[2:].split("(", 1)[0] for line in listing_of(session_registry)}
    assert {"read_file", "write_file", "terminal", "patch", "search_files"} <= listed
    assert "get_weather" not in listed  # a run without a tools list cannot call it either


def test_the_default_limits_are_stated_as_the_reference_states_them(session_registry):
    register_execute_code(session_registry, enabled_tools=["terminal"])
    description = description_of(session_registry)
    assert "5-minute timeout" in description
    assert "at most 50 tool calls" in description
    assert "stdout capped at 50KB" in description
    assert "stderr at 10KB" in description


@pytest.mark.parametrize(
    ("options", "phrases"),
    [
        (RunOptions(timeout=90, max_tool_calls=7), ["90-second timeout", "at most 7 tool calls"]),
        (RunOptions(timeout=3600, max_tool_calls=1), ["1-hour timeout", "at most 1 tool call "]),
        (RunOptions(timeout=0.5, max_tool_calls=0), ["0.5-second timeout", "no tool calls"]),
        (
            RunOptions(max_stdout_bytes=2_000_000, max_stderr_bytes=1234),
            ["stdout capped at 2MB", "stderr at 1,234 bytes"],
        ),
    ],
)
def test_limits_follow_the_options(options, phrases):
    text = limits_text(options)
    for phrase in phrases:
        assert phrase in text


def test_the_stated_limits_are_the_ones_enforced(session_registry, tmp_path):
    register_execute_code(
        session_registry,
        enabled_tools=["read_file"],
        options=RunOptions(
            timeout=1, max_tool_calls=1, max_stdout_bytes=1000, spill_dir=str(tmp_path)
        ),
    )
    description = description_of(session_registry)
    assert "1-second timeout" in description
    assert "at most 1 tool call per script" in description
    assert "stdout capped at 1KB" in description

    over_budget = (
        "from hermes_tools import read_file\n"
        "print('error' in read_file(__file__), 'error' in read_file(__file__))\n"
        "print('x' * 5000)\n"
    )
    result = json.loads(session_registry.dispatch("execute_code", {"code": over_budget}))
    assert result["output"].startswith("False True\n"), result
    assert result["stdout_truncated"] is True
    assert result["stdout_bytes_captured"] == 1000

    too_slow = "import time\ntime.sleep(30)\n"
    result = json.loads(session_registry.dispatch("execute_code", {"code": too_slow}))
    assert result["status"] == "timeout"
    assert result["duration_seconds"] < 10


def test_bad_options_are_refused_at_registration(session_registry):
    with pytest.raises(RunError, match="timeout must be a positive"):
        register_execute_code(session_registry, options=RunOptions(timeout=0))


@pytest.mark.parametrize(
    ("description", "expected"),
    [
        ("Short.", "Short."),
        ("First line.\nSecond line.", "First line."),
        (
            "One. " + "Two words here. " * 20,
            "One. " + " ".join(["Two words here."] * 12),
        ),
        ("x" * 50 + " " + "y" * 300, "x" * 50 + "..."),
        (
            "Edit files. Two modes.\nLong text.\nReturns {status, path}. More.",
            "Edit files. Two modes. Returns {status, path}.",
        ),
        ("", ""),
    ],
)
def test_summary_keeps_the_start_short(description, expected):
    assert summary(description) == expected
    assert len(summary(description)) <= 2 * SUMMARY_CHARS + 1


def test_tool_definition_formats(session_registry):
    schema = build_schema(["read_file"], registry=session_registry)
    openai = tool_definition(schema, "openai")
    assert openai == {"type": "function", "function": schema}
    anthropic = tool_definition(schema, "anthropic")
    assert anthropic == {
        "name": "execute_code",
        "description": schema["description"],
        "input_schema": schema["parameters"],
    }
    assert tool_definition(openai, "anthropic") == anthropic  # the wrapper is accepted too
    with pytest.raises(ValueError, match="choose one of: openai, anthropic"):
        tool_definition(schema, "xml")


def test_tool_signature_matches_the_stub_for_awkward_parameters():
    schema = {
        "name": "odd",
        "parameters": {
            "type": "object",
            "properties": {"class": {"type": "string"}, "n": {"type": "integer"}, "x": {}},
            "required": ["n"],
        },
    }
    assert tool_signature(schema) == "odd(n: int, x=None, **kwargs)"
    assert "\ndef odd(n: int, x=None, **kwargs):\n" in generate_stub([schema])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"command": "ls -la"}, "not a shell command"),
        ({}, "needs `code`"),
        ({"code": ""}, "is empty"),
        ({"code": "   \n"}, "is empty"),
        ({"code": ["print(1)"]}, "must be a string"),
        ({"code": 42}, "must be a string"),
    ],
)
def test_bad_input_gets_advice(session_registry, args, message):
    register_execute_code(session_registry, enabled_tools=["terminal"])
    result = json.loads(session_registry.dispatch("execute_code", args))
    assert message in result["error"]


def test_runs_a_script_and_returns_the_result_json(session_registry, tmp_path):
    register_execute_code(
        session_registry,
        enabled_tools=["read_file", "write_file"],
        options=RunOptions(timeout=30, max_tool_calls=5),
    )
    # A path the test removes: the file tools write on the host, where a directory the
    # script made in its own /tmp (a tmpfs under bwrap) would be left behind.
    code = (
        "from hermes_tools import write_file, read_file\n"
        f"p = {str(tmp_path / 'x.txt')!r}\n"
        "write_file(p, 'abc')\n"
        "print(read_file(p)['content'])\n"
    )
    result = json.loads(session_registry.dispatch("execute_code", {"code": code}))
    assert result["status"] == "success", result
    assert result["output"] == "abc\n"
    assert result["tool_calls_made"] == 2
    assert list(result)[:5] == [
        "status",
        "output",
        "exit_code",
        "tool_calls_made",
        "duration_seconds",
    ]


def test_a_script_cannot_call_execute_code(session_registry):
    register_execute_code(session_registry, enabled_tools=["terminal", "execute_code"])
    code = (
        "import hermes_tools\n"
        "print(hasattr(hermes_tools, 'execute_code'))\n"
        "print(hermes_tools._call('execute_code', {'code': 'print(1)'}))\n"
    )
    result = json.loads(session_registry.dispatch("execute_code", {"code": code}))
    assert result["status"] == "success", result
    first, second = result["output"].splitlines()
    assert first == "False"
    assert "not allowed" in second
    assert result["tool_calls_made"] == 0
