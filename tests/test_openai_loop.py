"""The OpenAI-compatible agent loop, the delegate command and examples/delegate.py against
a stand-in chat-completions server on 127.0.0.1 (tests/httpserver.py) with scripted
replies. The children are real: their scripts run on the local backend.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from httpserver import LocalHTTPServer, Reply, Request

from hermes_sandbox import (
    AsyncDelegationHost,
    DelegationResult,
    OpenAIChatLoop,
    RunOptions,
    ToolRegistry,
)

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "delegate.py"
PATH = "/v1/chat/completions"

Step = dict[str, Any] | Reply


def answer(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def calls(*pairs: tuple[str, Any]) -> dict[str, Any]:
    """An assistant message calling tools: (name, arguments) pairs; arguments that are
    not a string are sent as JSON."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
            for i, (name, args) in enumerate(pairs)
        ],
    }


def completion(message: dict[str, Any]) -> Reply:
    return Reply.json({"choices": [{"index": 0, "message": message}]})


class ScriptedModel:
    """Answers each conversation (told apart by a word of its goal) with its script of
    steps, one per request: a message, or a whole Reply (an error, garbage, a delay)."""

    def __init__(self, scripts: dict[str, list[Step | Callable[[Request], Step]]]) -> None:
        self.scripts = {key: list(steps) for key, steps in scripts.items()}
        self.seen: dict[str, list[Request]] = {key: [] for key in scripts}

    def __call__(self, request: Request) -> Reply:
        body = request.json()
        prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
        key = next(k for k in self.scripts if k in prompt)
        self.seen[key].append(request)
        step = self.scripts[key].pop(0) if self.scripts[key] else answer("(script ran out)")
        if callable(step):
            step = step(request)
        return step if isinstance(step, Reply) else completion(step)


def tool_results(request: Request) -> list[dict[str, Any]]:
    return [m for m in request.json()["messages"] if m["role"] == "tool"]


def probe_registry() -> tuple[ToolRegistry, list[dict[str, Any]]]:
    registry = ToolRegistry()
    seen: list[dict[str, Any]] = []

    def probe(args: dict[str, Any]) -> str:
        seen.append(args)
        return json.dumps({"echo": args.get("tag")})

    schema = {
        "name": "probe",
        "description": "Echo a tag.",
        "parameters": {"type": "object", "properties": {"tag": {"type": "string"}}},
    }
    registry.register("probe", "test", schema, probe)
    return registry, seen


def delegate(server: LocalHTTPServer, goal: str, **loop_options: Any) -> DelegationResult:
    registry, _ = probe_registry()
    loop_options.setdefault("backoff", 0.01)
    loop = OpenAIChatLoop(base_url=server.url("/v1"), model="scripted", **loop_options)

    async def main() -> DelegationResult:
        host = AsyncDelegationHost(
            loop, options=RunOptions(timeout=60), registry=registry, tools=["probe"]
        )
        return await host.delegate(goal)

    return anyio.run(main)


def test_the_loop_runs_tool_calls_and_scripts_and_returns_the_answer() -> None:
    code = "from hermes_tools import probe\nprint(probe(tag='from script')['echo'])"
    model = ScriptedModel(
        {
            "weather": [
                calls(("execute_code", {"code": code}), ("probe", {"tag": "direct"})),
                lambda request: answer("summary: " + tool_results(request)[1]["content"]),
            ]
        }
    )
    with LocalHTTPServer() as server:
        server.route(PATH, model)
        result = delegate(server, "weather today", api_key="sk-test")
    assert result.ok, result
    assert result.summary == 'summary: {"echo": "direct"}'
    assert result.tool_calls_made == 2  # one from the script, one direct
    first, second = model.seen["weather"]
    assert first.headers["authorization"] == "Bearer sk-test"
    body = first.json()
    assert body["model"] == "scripted"
    assert [t["function"]["name"] for t in body["tools"]] == [
        "execute_code",
        "probe",
        "delegate_task",
    ]
    script_result, direct = tool_results(second)
    assert script_result["tool_call_id"] == "call_0" and direct["tool_call_id"] == "call_1"
    assert json.loads(script_result["content"])["output"] == "from script\n"
    assistant = [m for m in second.json()["messages"] if m["role"] == "assistant"]
    assert assistant[0]["tool_calls"][0]["function"]["name"] == "execute_code"


def test_malformed_replies_are_retried_and_bad_arguments_go_back_to_the_model() -> None:
    model = ScriptedModel(
        {
            "task": [
                Reply.text("this is not json"),
                Reply.json({"id": "x", "object": "chat.completion"}),  # no choices
                calls(("probe", "{not json"), ("", {})),
                lambda request: answer(
                    " | ".join(json.loads(r["content"])["error"] for r in tool_results(request))
                ),
            ]
        }
    )
    with LocalHTTPServer() as server:
        server.route(PATH, model)
        result = delegate(server, "a task")
    assert result.ok, result
    bad_json, no_name = result.summary.split(" | ")
    assert "not JSON" in bad_json
    assert "no function name" in no_name or "Unknown tool" in no_name
    assert len(model.seen["task"]) == 4


def test_http_errors_are_retried_and_then_give_up() -> None:
    model = ScriptedModel(
        {
            "flaky": [
                Reply.text("overloaded", status=503),
                Reply(429, b"slow down", {"Retry-After": "0"}),
                answer("made it"),
            ],
            "down": [Reply.text("boom", status=500)] * 5,
            "refused": [Reply.text("bad key", status=401)],
        }
    )
    with LocalHTTPServer() as server:
        server.route(PATH, model)
        flaky = delegate(server, "flaky task")
        down = delegate(server, "down task", max_retries=2)
        refused = delegate(server, "refused task")
    assert flaky.ok and flaky.summary == "made it"
    assert len(model.seen["flaky"]) == 3
    assert down.status == "error" and "failed 3 times" in (down.error or "")
    assert "HTTP 500" in (down.error or "") and len(model.seen["down"]) == 3
    assert refused.status == "error" and "HTTP 401" in (refused.error or "")
    assert len(model.seen["refused"]) == 1  # not retried


def test_a_slow_answer_times_out_and_is_retried() -> None:
    model = ScriptedModel(
        {
            "once": [Reply.json({}, delay=30), answer("second try")],
            "always": [Reply.json({}, delay=30)] * 3,
        }
    )
    with LocalHTTPServer() as server:
        server.route(PATH, model)
        once = delegate(server, "slow once", request_timeout=3, max_retries=1)
        always = delegate(server, "slow always", request_timeout=3, max_retries=1)
    assert once.ok and once.summary == "second try"
    assert always.status == "error" and "no answer within 3 s" in (always.error or "")
    assert len(model.seen["always"]) == 2


def test_a_model_that_never_answers_runs_out_of_turns() -> None:
    model = ScriptedModel({"loop": [calls(("probe", {"tag": "again"}))] * 5})
    with LocalHTTPServer() as server:
        server.route(PATH, model)
        result = delegate(server, "loop forever", max_turns=3)
    assert result.status == "error" and "after 3 turns" in (result.error or "")
    assert result.tool_calls_made == 3


def test_without_httpx_the_child_fails_saying_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "httpx", None)  # import httpx raises ImportError
    with LocalHTTPServer() as server:
        result = delegate(server, "anything")
    assert result.status == "error" and "pip install" in (result.error or "")


def test_importing_the_package_does_not_import_httpx() -> None:
    code = "import sys, hermes_sandbox, hermes_sandbox.openai_loop; print('httpx' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


# -- the command line and the example ------------------------------------------------------------


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "MODEL"))}
    env.pop("HERMES_SANDBOX_CONFIG", None)
    env.update(extra)
    return env


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hermes_sandbox", "delegate", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_the_delegate_command_prints_the_parent_and_its_children_as_json() -> None:
    model = ScriptedModel(
        {
            "parent": [
                calls(
                    ("delegate_task", {"goal": "child: say hello", "context": "be brief"}),
                    (
                        "execute_code",
                        {
                            "code": "from hermes_tools import terminal\n"
                            "print(terminal('echo parent')['output'])"
                        },
                    ),
                ),
                lambda request: answer(
                    "parent done; child said "
                    + json.loads(tool_results(request)[0]["content"])["results"][0]["summary"]
                ),
            ],
            "child": [
                calls(("terminal", {"command": "echo hello"})),
                lambda request: answer(json.loads(tool_results(request)[0]["content"])["output"]),
            ],
        }
    )
    env = clean_env(MY_KEY="sk-mine")
    with LocalHTTPServer() as server:
        server.route(PATH, model)
        done = cli(
            "--goal", "parent task", "--model", "scripted", "--base-url", server.url("/v1"),
            "--tools", "terminal", "--max-tool-calls", "10", "--api-key-env", "MY_KEY",
            "--json",
            env=env,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert {"status", "summary", "tool_calls_made", "duration_seconds", "children"} <= set(result)
    assert result["status"] == "success"
    assert result["summary"] == "parent done; child said hello\n"
    (child,) = result["children"]
    assert child["status"] == "success" and child["summary"] == "hello\n"
    assert child["tool_calls_made"] == 1
    assert result["tool_calls_made"] == 2  # its own script's call and the child's
    assert set(child) == set(result)
    assert model.seen["parent"][0].headers["authorization"] == "Bearer sk-mine"
    tools = [t["function"]["name"] for t in model.seen["child"][0].json()["tools"]]
    assert tools == ["execute_code", "terminal"]  # depth 2 of 2: no delegate_task


def test_the_delegate_command_says_what_is_wrong() -> None:
    env = clean_env()
    with socket.socket() as sock:  # a port nothing listens on once it is closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    base = ["--goal", "x", "--model", "m", "--base-url", f"http://127.0.0.1:{port}/v1"]
    missing_key = cli(*base, "--api-key-env", "NO_SUCH_KEY_VAR", env=env)
    assert missing_key.returncode == 2
    assert "NO_SUCH_KEY_VAR" in missing_key.stderr
    no_url = cli("--goal", "x", "--model", "m", env=env)
    assert no_url.returncode == 2 and "--base-url" in no_url.stderr
    # Nothing listens there: the child fails, the command says so and exits 1.
    unreachable = cli(*base, "--request-timeout", "5", env=env)
    assert unreachable.returncode == 1
    assert "hermes-sandbox: error:" in unreachable.stderr


def test_the_example_delegates_a_batch_against_a_stand_in_server() -> None:
    version = "from hermes_tools import terminal\nprint(terminal('python3 -V')['output'])"
    model = ScriptedModel(
        {
            "Python version": [
                calls(("execute_code", {"code": version})),
                lambda r: answer(json.loads(tool_results(r)[0]["content"])["output"].split()[1]),
            ],
            "PATH": [
                calls(("terminal", {"command": "echo $PATH | tr ':' '\\n' | wc -l"})),
                lambda r: answer(json.loads(tool_results(r)[0]["content"])["output"].strip()),
            ],
        }
    )
    with LocalHTTPServer() as server:
        server.route(PATH, model)
        done = subprocess.run(
            [sys.executable, str(EXAMPLE)],
            capture_output=True,
            text=True,
            env=clean_env(OPENAI_BASE_URL=server.url("/v1"), MODEL="scripted"),
            timeout=120,
        )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].startswith("  [success] 3.")
    assert lines[3].startswith("  [success] ") and lines[3].split()[-1].isdigit()
    assert lines[4] == "tool calls charged to the parent: 2"


def test_ctrl_c_cancels_the_delegation() -> None:
    model = ScriptedModel({"wait": [Reply.json({}, delay=60)]})
    with LocalHTTPServer() as server:
        server.route(PATH, model)
        process = subprocess.Popen(
            [sys.executable, "-m", "hermes_sandbox", "delegate", "--goal", "wait here",
             "--model", "m", "--base-url", server.url("/v1"), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(),
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while not model.seen["wait"] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert model.seen["wait"], "the child never asked the model"
            process.send_signal(signal.SIGINT)
            stdout, stderr = process.communicate(timeout=30)
        finally:
            process.kill()
            process.wait()
    assert process.returncode == 1, stderr
    assert json.loads(stdout)["status"] == "interrupted"
