"""examples/agent_loop.py, run as it is documented: a real process, its model a scripted
stand-in chat completions server on 127.0.0.1 (no network). The loop hands the model the
execute_code tool, runs the script the model writes (it calls the example's own
get_weather tool) and sends the result JSON back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from httpserver import LocalHTTPServer, Reply, Request

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "agent_loop.py"
SCRIPT = """\
from hermes_tools import get_weather
for city in ("Lyon", "Oslo"):
    weather = get_weather(city)
    print(city, weather["forecast"], weather["high_c"])
"""


def scripted_model(request: Request) -> Reply:
    """Turn 1: call execute_code, and a tool that was never offered. Turn 2: answer with
    what the script printed."""
    messages = request.json()["messages"]
    results = [m for m in messages if m["role"] == "tool"]
    if not results:
        calls = [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "execute_code", "arguments": json.dumps({"code": SCRIPT})},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "terminal", "arguments": '{"command": "ls"}'},
            },
        ]
        message = {"role": "assistant", "content": None, "tool_calls": calls}
    else:
        output = json.loads(results[0]["content"])["output"]
        message = {"role": "assistant", "content": "Warmer in Lyon.\n" + output}
    return Reply.json({"choices": [{"index": 0, "message": message}]})


def run_example(base_url: str, *args: str, key: str | None = "test-key"):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "MODEL"))}
    env.pop("HERMES_SANDBOX_CONFIG", None)
    env.update(OPENAI_BASE_URL=base_url, MODEL="scripted")
    if key is not None:
        env["OPENAI_API_KEY"] = key
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_the_agent_loop_runs_a_model_tool_call_and_returns_the_result_json(tmp_path):
    with LocalHTTPServer() as server:
        server.route("/v1/chat/completions", scripted_model)
        done = run_example(server.url("/v1"), "Is it warmer in Lyon or Oslo?")
        requests = list(server.requests)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Warmer in Lyon.\nLyon sunny 24\nOslo rain 11\n\n"

    first, second = (r.json() for r in requests)
    assert requests[0].headers["authorization"] == "Bearer test-key"
    assert first["model"] == "scripted"
    assert first["messages"] == [{"role": "user", "content": "Is it warmer in Lyon or Oslo?"}]
    (definition,) = first["tools"]
    assert definition["type"] == "function"
    assert definition["function"]["name"] == "execute_code"
    description = definition["function"]["description"]
    assert "- get_weather(city: str): Today's weather in a city." in description
    assert "5-minute timeout" in description

    tool_messages = [m for m in second["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["call_1", "call_2"]
    result = json.loads(tool_messages[0]["content"])
    assert result["status"] == "success", result
    assert result["tool_calls_made"] == 2
    assert result["output"] == "Lyon sunny 24\nOslo rain 11\n"
    refused = json.loads(tool_messages[1]["content"])
    assert "no tool 'terminal' here" in refused["error"]


def test_without_a_key_it_says_what_to_set(tmp_path):
    done = run_example("http://127.0.0.1:9", key=None)
    assert done.returncode == 1
    assert "set OPENAI_API_KEY" in done.stderr
    assert "Traceback" not in done.stderr


README = EXAMPLE.parent.parent / "README.md"
README_MODEL = '''

def model(messages, tools):
    """A scripted stand-in: call execute_code once, then answer with its output."""
    import json

    done = [m for m in messages if m["role"] == "tool"]
    if done:
        return {"role": "assistant", "content": json.loads(done[0]["content"])["output"]}
    code = "from hermes_tools import get_weather\\nprint(get_weather('Lyon')['forecast'])"
    call = {"name": "execute_code", "arguments": json.dumps({"code": code})}
    return {"role": "assistant", "tool_calls": [{"id": "c1", "function": call}]}


print(agent_loop(model, "Weather in Lyon?"), end="")
'''


def readme_agent_loop() -> str:
    """The Python block of the README's "An agent loop" section."""
    section = README.read_text().split("### An agent loop", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def function_source(text: str, name: str) -> str:
    """The source of top-level function ``name`` in ``text``, up to the next blank line
    followed by an unindented line."""
    start = text.index(f"\ndef {name}(") + 1
    lines = text[start:].splitlines(keepends=True)
    end = next(
        (i for i in range(1, len(lines)) if lines[i].strip() and not lines[i][0].isspace()),
        len(lines),
    )
    return "".join(lines[:end]).rstrip()


def test_the_readme_loop_is_the_example_loop():
    readme = readme_agent_loop()
    assert function_source(readme, "agent_loop") == function_source(
        EXAMPLE.read_text(), "agent_loop"
    )
    assert len(readme.splitlines()) <= 30


def test_the_readme_loop_runs_as_written(tmp_path):
    script = tmp_path / "readme_loop.py"
    script.write_text(readme_agent_loop() + README_MODEL)
    env = {k: v for k, v in os.environ.items() if k != "HERMES_SANDBOX_CONFIG"}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "sunny\n"
