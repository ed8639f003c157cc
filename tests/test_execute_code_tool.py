"""The execute_code tool: its schema follows the session's tools; its handler guards input."""

from __future__ import annotations

import json

import pytest

from hermes_sandbox.execute_code_tool import build_schema, register_execute_code, sandbox_tools_for
from hermes_sandbox.runner import RunOptions
from hermes_sandbox.tools import ToolRegistry, load_builtin_tools, registry


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


def test_schema_names_only_the_enabled_tools(session_registry):
    register_execute_code(session_registry, enabled_tools=["read_file"])
    schema = session_registry.get("execute_code").schema
    text = json.dumps(schema)
    assert "read_file" in text
    for disabled in ("write_file", "terminal", "web_search", "patch"):
        assert disabled not in text
    assert schema["function"]["parameters"]["required"] == ["code"]
    assert set(schema["function"]["parameters"]["properties"]) == {"code", "reset"}


def test_schema_without_tools_says_so():
    text = build_schema([])["description"]
    assert "No tools can be called" in text
    assert "hermes_tools import" not in text


def test_execute_code_is_never_a_sandbox_tool(session_registry):
    register_execute_code(session_registry, enabled_tools=["execute_code", "terminal"])
    assert sandbox_tools_for(session_registry, ["execute_code", "terminal"]) == ["terminal"]


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


def test_runs_a_script_and_returns_the_result_json(session_registry):
    register_execute_code(
        session_registry,
        enabled_tools=["read_file", "write_file"],
        options=RunOptions(timeout=30, max_tool_calls=5),
    )
    code = (
        "from hermes_tools import write_file, read_file\n"
        "import os, tempfile\n"
        "p = os.path.join(tempfile.mkdtemp(), 'x.txt')\n"
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
