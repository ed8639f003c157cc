"""``hermes-sandbox schema``, run as a real subprocess: it prints the execute_code tool
definition a run with the same flags and config file would match: the same tools, the
same limits."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import yaml
from test_cli import assert_usage_error, cli

WEATHER_MODULE = """\
from hermes_sandbox import registry, tool_result

registry.register(
    name="get_weather",
    toolset="weather",
    schema={
        "name": "get_weather",
        "description": "Today's weather in a city. Returns {city, forecast}.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
    handler=lambda args: tool_result(city=args["city"], forecast="sunny"),
)
"""

DECORATED_MODULE = """\
from hermes_sandbox import tool


@tool(toolset="math")
def add(a: int, b: int = 2) -> dict:
    \"\"\"Add two numbers.

    Args:
        a: the first
        b: the second
    \"\"\"
    return {"sum": a + b}
"""


def schema(*args: str, cwd: Path) -> dict:
    done = cli("schema", *args, cwd=cwd)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return json.loads(done.stdout)


def listed(description: str) -> list[str]:
    """The tool names of the "- name(...): ..." lines."""
    return [line[2:].split("(", 1)[0] for line in description.splitlines() if line.startswith("- ")]


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def test_prints_the_openai_definition_by_default(tmp_path):
    definition = schema(cwd=tmp_path)
    assert set(definition) == {"type", "function"}
    assert definition["type"] == "function"
    function = definition["function"]
    assert set(function) == {"name", "description", "parameters"}
    assert function["name"] == "execute_code"
    assert function["parameters"]["required"] == ["code"]
    description = function["description"]
    assert {"read_file", "write_file", "patch", "search_files", "terminal"} <= set(
        listed(description)
    )
    assert "- read_file(path: str, offset: int = None, limit: int = None): " in description
    for limit in ("5-minute timeout", "at most 50 tool calls", "stdout capped at 50KB"):
        assert limit in description


def test_anthropic_format(tmp_path):
    openai = schema("--tools", "read_file", cwd=tmp_path)["function"]
    anthropic = schema("--tools", "read_file", "--format", "anthropic", cwd=tmp_path)
    assert anthropic == {
        "name": "execute_code",
        "description": openai["description"],
        "input_schema": openai["parameters"],
    }


def test_tools_and_toolsets_choose_the_listing(tmp_path):
    only = schema("--tools", "terminal,read_file", cwd=tmp_path)["function"]["description"]
    assert listed(only) == ["terminal", "read_file"]
    assert "write_file" not in only
    files = schema("--toolsets", "file", cwd=tmp_path)["function"]["description"]
    assert set(listed(files)) == {"read_file", "write_file", "patch", "search_files"}


def test_a_tools_module_tool_is_listed_and_a_run_with_the_same_flags_can_call_it(tmp_path):
    write(tmp_path / "weather.py", WEATHER_MODULE)
    write(tmp_path / "mathtools.py", DECORATED_MODULE)
    flags = [
        "--tools-module", "weather.py", "--tools-module", "mathtools.py",
        "--tools", "get_weather,add,read_file",
    ]  # fmt: skip
    description = schema(*flags, cwd=tmp_path)["function"]["description"]
    assert listed(description) == ["get_weather", "add", "read_file"]
    assert (
        "- get_weather(city: str, days: int = None): "
        "Today's weather in a city. Returns {city, forecast}." in description
    )
    assert "- add(a: int, b: int = None): Add two numbers." in description
    assert "from hermes_tools import get_weather, add, read_file" in description

    write(
        tmp_path / "script.py",
        "from hermes_tools import get_weather, add\n"
        "print(get_weather('Lyon')['forecast'], add(40)['sum'])\n",
    )
    done = cli("run", "script.py", *flags, "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["output"] == "sunny 42\n"
    assert result["tool_calls_made"] == 2


def test_a_tools_module_tool_is_not_listed_unless_chosen(tmp_path):
    write(tmp_path / "weather.py", WEATHER_MODULE)
    description = schema("--tools-module", "weather.py", cwd=tmp_path)["function"]["description"]
    assert "get_weather" not in description  # as a run without --tools could not call it


def test_limits_come_from_the_config_file_then_the_flags(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "tools": ["read_file"],
                "limits": {"timeout": 90, "max_tool_calls": 7, "max_stdout_bytes": 20000},
            }
        )
    )
    from_file = schema("--config", str(config), cwd=tmp_path)["function"]["description"]
    assert listed(from_file) == ["read_file"]
    assert "90-second timeout" in from_file
    assert "at most 7 tool calls" in from_file
    assert "stdout capped at 20KB" in from_file

    flagged = schema(
        "--config", str(config), "--timeout", "600", "--max-tool-calls", "1", cwd=tmp_path
    )["function"]["description"]
    assert "10-minute timeout" in flagged
    assert "at most 1 tool call per script" in flagged
    assert "stdout capped at 20KB" in flagged


def test_the_stated_timeout_is_the_one_a_run_enforces(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"limits": {"timeout": 1}}))
    description = schema("--config", str(config), cwd=tmp_path)["function"]["description"]
    assert "1-second timeout" in description
    write(tmp_path / "slow.py", "import time\ntime.sleep(30)\n")
    done = cli("run", "slow.py", "--config", str(config), "--json", cwd=tmp_path)
    assert json.loads(done.stdout)["status"] == "timeout"


def test_bad_input_is_one_line(tmp_path):
    assert_usage_error(cli("schema", "--tools", "nope", cwd=tmp_path), "unknown tool", "nope")
    assert_usage_error(
        cli("schema", "--tools", "execute_code", cwd=tmp_path), "execute_code", "never"
    )
    assert_usage_error(cli("schema", "--toolsets", "nope", cwd=tmp_path), "toolset", "nope")
    assert_usage_error(cli("schema", "--timeout", "0", cwd=tmp_path), "timeout", "positive")
    assert_usage_error(
        cli("schema", "--tools-module", "missing_tools.py", cwd=tmp_path), "missing_tools.py"
    )


def test_unknown_format_is_refused_by_the_parser(tmp_path):
    done = cli("schema", "--format", "xml", cwd=tmp_path)
    assert done.returncode == 2
    assert "invalid choice: 'xml'" in done.stderr
    assert done.stdout == ""
