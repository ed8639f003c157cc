"""Hermes Agent's own execute_code cases (tests/tools/test_code_execution.py in its
repository), run against this project's execute_code, over every transport.

The reference swaps its tool dispatcher for a mock that answers canned results; here
the same canned tools are registered in a private registry, and real scripts run in
real processes. The comment on each case names the reference test. Cases where this
project deliberately differs assert its own behaviour and end in ``_DIFFERENT``;
docs/compatibility.md lists each with the reason.
"""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from conftest import DEFAULT_TIMEOUT, RAW_ASK

from hermes_sandbox import ExecutionResult, execute_code_async, register_execute_code
from hermes_sandbox.execute_code_tool import build_schema, script_tools
from hermes_sandbox.runner import RunError
from hermes_sandbox.tools import ToolRegistry, load_builtin_tools, registry
from hermes_sandbox.tools.toolsets import SANDBOX_TOOLS

Run = Callable[..., ExecutionResult]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def canned_tools() -> ToolRegistry:
    """The reference's mock dispatcher as tools: the built-in tools' schemas (so a
    script calls them as it would the real ones), each answering a canned result."""
    load_builtin_tools()
    reg = ToolRegistry()

    async def terminal(args: dict[str, Any]) -> dict[str, Any]:
        command = args.get("command", "")
        if command.startswith("echo TAG-"):
            await anyio.sleep(0.05)  # the reference's slow mock: calls overlap
            return {"output": command[5:], "exit_code": 0}
        return {"output": f"mock output for: {command}", "exit_code": 0}

    canned = {
        "terminal": terminal,
        "web_search": lambda args: {
            "results": [{"url": "https://example.com", "title": "Example"}]
        },
        "read_file": lambda args: {"content": "line 1\nline 2\nline 3\n", "total_lines": 3},
        "write_file": lambda args: {"status": "ok", "path": args.get("path", "")},
        "search_files": lambda args: {"matches": [{"file": "test.py", "line": 1, "text": "match"}]},
        "patch": lambda args: {"status": "ok", "replacements": 1},
        "web_extract": lambda args: "# Extracted content\nSome text from the page.",
    }
    for name, handler in canned.items():
        reg.register(name=name, toolset="mock", schema=registry.get(name).schema, handler=handler)
    return reg


@pytest.fixture
def run_mocked(run: Run) -> Run:
    """``run`` with the canned tools, all of them callable."""
    reg = canned_tools()

    def _run(code: str, **options: Any) -> ExecutionResult:
        options.setdefault("registry", reg)
        options.setdefault("tools", list(SANDBOX_TOOLS))
        return run(code, **options)

    return _run


# TestSandboxRequirements.test_schema_is_valid, TestBuildExecuteCodeSchema.test_schema_structure
def test_schema_is_valid() -> None:
    load_builtin_tools()
    schema = build_schema(script_tools(registry, None), registry=registry)
    assert schema["name"] == "execute_code"
    assert "code" in schema["parameters"]["properties"]
    assert schema["parameters"]["required"] == ["code"]


# TestExecuteCode.test_basic_print
def test_basic_print(run_mocked: Run) -> None:
    result = run_mocked('print("hello world")')
    assert result.status == "success"
    assert "hello world" in result.output
    assert result.tool_calls_made == 0


# TestExecuteCode.test_single_tool_call
def test_single_tool_call(run_mocked: Run) -> None:
    result = run_mocked(
        """
        from hermes_tools import terminal
        result = terminal("echo hello")
        print(result.get("output", ""))
        """
    )
    assert result.status == "success", result.output
    assert "mock output for: echo hello" in result.output
    assert result.tool_calls_made == 1


# TestExecuteCode.test_concurrent_tool_calls_match_responses
def test_concurrent_tool_calls_match_responses(run_mocked: Run) -> None:
    result = run_mocked(
        """
        from concurrent.futures import ThreadPoolExecutor
        from hermes_tools import terminal

        N = 10

        def call(i):
            return i, terminal(f"echo TAG-{i}").get("output", "")

        with ThreadPoolExecutor(max_workers=N) as ex:
            results = list(ex.map(call, range(N)))
        mismatches = [(i, out) for i, out in results if f"TAG-{i}" != out]
        print(f"MISMATCH {mismatches}" if mismatches else f"OK {N}/{N}")
        """
    )
    assert result.status == "success", result.output
    assert "OK 10/10" in result.output
    assert result.tool_calls_made == 10


# TestExecuteCode.test_stderr_on_error
def test_stderr_on_error(run_mocked: Run) -> None:
    result = run_mocked(
        """
        print("before error")
        raise RuntimeError("deliberate crash")
        """
    )
    assert result.status == "error"
    assert "before error" in result.output
    assert "RuntimeError" in (result.error or "") + result.output


# TestExecuteCode.test_shell_quote_helper
def test_shell_quote_helper(run_mocked: Run) -> None:
    result = run_mocked(
        """
        from hermes_tools import shell_quote
        dangerous = '`rm -rf /` && $(whoami) "hello"'
        escaped = shell_quote(dangerous)
        print(escaped)
        assert "rm -rf" in escaped
        assert escaped.startswith("'")
        """
    )
    assert result.status == "success", result.error


# TestExecuteCode.test_json_parse_helper_bom
def test_json_parse_helper_bom(run_mocked: Run) -> None:
    result = run_mocked(
        """
        from hermes_tools import json_parse
        bom_result = json_parse("\\ufeff" + '{"body": "bom-ok"}')
        assert bom_result == {"body": "bom-ok"}, bom_result
        print("bom:" + bom_result["body"])
        """
    )
    assert result.status == "success", result.error
    assert "bom:bom-ok" in result.output


# TestExecuteCode.test_retry_helper_all_fail
def test_retry_helper_all_fail(run_mocked: Run) -> None:
    result = run_mocked(
        """
        from hermes_tools import retry
        def always_fail():
            raise ValueError("nope")
        try:
            retry(always_fail, max_attempts=2, delay=0.01)
            print("should not reach here")
        except ValueError as e:
            print(f"caught: {e}")
        """
    )
    assert result.status == "success", result.error
    assert "caught: nope" in result.output


# -- TestBuildExecuteCodeSchema --------------------------------------------------------


# TestBuildExecuteCodeSchema.test_default_includes_all_tools
def test_default_schema_lists_every_sandbox_tool() -> None:
    load_builtin_tools()
    description = build_schema(script_tools(registry, None), registry=registry)["description"]
    for name in SANDBOX_TOOLS:
        if registry.is_available(name):
            assert f"{name}(" in description


# TestBuildExecuteCodeSchema.test_subset_only_lists_enabled_tools
def test_subset_lists_only_the_enabled_tools() -> None:
    load_builtin_tools()
    tools = script_tools(registry, ["terminal", "read_file"])
    description = build_schema(tools, registry=registry)["description"]
    assert "terminal(" in description and "read_file(" in description
    for absent in ("web_search(", "web_extract(", "write_file("):
        assert absent not in description


# TestBuildExecuteCodeSchema.test_none_defaults_to_all_tools
def test_no_tool_list_means_every_sandbox_tool() -> None:
    load_builtin_tools()
    every = [name for name in SANDBOX_TOOLS if name in registry]
    assert build_schema(script_tools(registry, None), registry=registry) == build_schema(
        script_tools(registry, every), registry=registry
    )


# -- TestEnvVarFiltering -----------------------------------------------------------------

DUMP_ENV = "import os, json\nprint(json.dumps(dict(os.environ)))\n"


def child_env(run: Run, monkeypatch: pytest.MonkeyPatch, **host: str) -> dict[str, str]:
    for name, value in host.items():
        monkeypatch.setenv(name, value)
    result = run(DUMP_ENV)
    assert result.status == "success", result.error
    return json.loads(result.output)  # type: ignore[no-any-return]


# TestEnvVarFiltering.test_api_keys_excluded and test_tokens_excluded
@pytest.mark.parametrize(
    "names",
    [
        pytest.param(
            ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "FIRECRAWL_API_KEY"),
            id="test_api_keys_excluded",
        ),
        pytest.param(
            ("GITHUB_TOKEN", "MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"), id="test_tokens_excluded"
        ),
    ],
)
def test_secrets_are_not_passed(
    run: Run, monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...]
) -> None:
    seen = child_env(run, monkeypatch, **{name: f"secret-{name.lower()}" for name in names})
    for name in names:
        assert name not in seen


# TestEnvVarFiltering.test_hermes_rpc_socket_injected: the script learns where its tools
# are (a socket, or a directory on the files transport) and the run's token.
def test_rpc_endpoint_injected(run: Run, monkeypatch: pytest.MonkeyPatch, transport: str) -> None:
    seen = child_env(run, monkeypatch)
    assert ("HERMES_RPC_DIR" if transport == "files" else "HERMES_RPC_SOCKET") in seen
    assert seen.get("HERMES_RPC_TOKEN")


# TestEnvVarFiltering.test_timezone_injected_when_set
def test_timezone_injected_when_set(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    assert (
        child_env(run, monkeypatch, HERMES_TIMEZONE="America/New_York").get("TZ")
        == "America/New_York"
    )


# TestEnvVarFiltering.test_timezone_not_set_when_empty
def test_timezone_not_set_when_empty(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HERMES_TIMEZONE", raising=False)
    seen = child_env(run, monkeypatch)
    assert seen.get("TZ", "unset") != ""


# TestExecuteCodeRemoteTempDir.test_timezone_shell_quoted_in_remote_execution: a time zone
# holding shell syntax reaches the script as text and runs nothing.
def test_timezone_is_never_run_as_shell(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = child_env(run, monkeypatch, HERMES_TIMEZONE="US/Eastern; echo PWNED")
    assert seen["TZ"] == "US/Eastern; echo PWNED"


# -- TestExecuteCodeEdgeCases ------------------------------------------------------------


@pytest.fixture
def session() -> ToolRegistry:
    """A private registry with the built-in tools and execute_code."""
    load_builtin_tools()
    private = ToolRegistry()
    for name in registry.names():
        entry = registry.get(name)
        private.register(
            name=name, toolset=entry.toolset, schema=entry.schema, handler=entry.handler
        )
    register_execute_code(private, enabled_tools=["terminal", "read_file"])
    return private


def dispatch(reg: ToolRegistry, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return json.loads(reg.dispatch(name, args))  # type: ignore[no-any-return]


# TestExecuteCodeEdgeCases.test_command_argument_points_to_terminal
def test_command_argument_points_to_terminal(session: ToolRegistry) -> None:
    error = dispatch(session, "execute_code", {"command": "git status"})["error"]
    assert "terminal" in error and "`command`" in error and "`code`" in error


# TestExecuteCodeEdgeCases.test_empty_code_explains_required_parameter
@pytest.mark.parametrize("code", ["", None, "   \n"])
def test_empty_code_explains_the_parameter(session: ToolRegistry, code: Any) -> None:
    error = dispatch(session, "execute_code", {"code": code})["error"]
    assert "`code`" in error and "Python script" in error
    assert "terminal" in error and "`command`" in error


# TestExecuteCodeEdgeCases.test_non_string_code_redirects_instead_of_attributeerror
@pytest.mark.parametrize(
    "code", [123, {"code": "print(1)"}, ["print(1)"]], ids=["int", "dict", "list"]
)
def test_non_string_code_is_explained(session: ToolRegistry, code: Any) -> None:
    error = dispatch(session, "execute_code", {"code": code})["error"]
    assert type(code).__name__ in error and "string" in error
    assert "AttributeError" not in error


# TestExecuteCodeEdgeCases.test_nonoverlapping_tools_fallback: DIFFERENT. There a session
# whose enabled tools include no sandbox tool falls back to every sandbox tool. Here no
# privilege is widened: the script gets exactly the session's tools (so terminal is not
# importable), and a name that is not registered is an error naming it.
def test_no_fallback_when_the_tools_do_not_overlap_DIFFERENT(run: Run) -> None:
    reg = canned_tools()
    for name in ("vision_analyze", "browser_snapshot"):
        reg.register(
            name=name, toolset="other", schema={"description": name}, handler=lambda args: {}
        )
    assert script_tools(reg, ["vision_analyze", "browser_snapshot"]) == [
        "vision_analyze",
        "browser_snapshot",
    ]
    result = run(
        "from hermes_tools import terminal\nprint('fallback ok')\n",
        registry=reg,
        tools=["vision_analyze", "browser_snapshot"],
    )
    assert result.status == "error"
    assert "terminal" in (result.error or "") + result.output
    assert "fallback ok" not in result.output
    with pytest.raises(RunError, match="vision_analyze"):
        script_tools(ToolRegistry(), ["vision_analyze", "browser_snapshot"])


# -- TestInterruptHandling, TestHeadTailTruncation, TestRpcTokenAuthorization -----------


# TestInterruptHandling.test_interrupt_event_stops_execution, and
# TestInterruptedOutput.test_unknown_interrupt_source_is_neutral: a script that printed
# nothing says only "[execution interrupted]".
@pytest.mark.anyio
async def test_interrupt_stops_execution(tmp_path: Any, transport: str) -> None:
    interrupt = anyio.Event()

    async def interrupt_soon() -> None:
        await anyio.sleep(1)
        interrupt.set()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(interrupt_soon)
        result = await execute_code_async(
            "import time; time.sleep(60); print('should not reach')",
            timeout=DEFAULT_TIMEOUT + 40,
            interrupt=interrupt,
            transport=transport,
            spill_dir=str(tmp_path / "spill"),
        )
    assert result.status == "interrupted"
    assert result.output == "[execution interrupted]"


# TestHeadTailTruncation.test_short_output_not_truncated
def test_short_output_not_truncated(run_mocked: Run) -> None:
    result = run_mocked('print("small output")')
    assert result.status == "success"
    assert "small output" in result.output
    assert "TRUNCATED" not in result.output.upper()
    assert result.stdout_truncated is False


# TestHeadTailTruncation.test_remote_large_output_gets_truncation_metadata (its remote
# path; every backend shares this one output path here)
def test_large_output_gets_truncation_metadata(run_mocked: Run) -> None:
    result = run_mocked('print("HEAD\\n" + "x" * 80_000 + "\\nTAIL")')
    assert result.status == "success"
    assert result.exit_code == 0
    assert result.stdout_truncated is True
    assert "HEAD" in result.output and "TAIL" in result.output
    assert result.stdout_bytes_total > result.stdout_bytes_captured
    assert result.stdout_bytes_omitted > 0
    assert "stdout was truncated" in (result.warning or "")


# TestRpcTokenAuthorization.test_missing_token_rejected (and a wrong one): refused as
# unauthorized, before any tool runs, and not counted.
def test_missing_or_wrong_token_rejected(run_mocked: Run) -> None:
    result = run_mocked(
        textwrap.dedent(RAW_ASK)
        + textwrap.dedent(
            """
            import json
            request = {"id": 1, "tool": "terminal", "args": {"command": "echo hi"}}
            print(json.dumps([ask(request), ask({**request, "token": "secret-token"})]))
            """
        )
    )
    assert result.status == "success", result.error
    replies = json.loads(result.output)
    assert [r["error"]["kind"] for r in replies] == ["unauthorized", "unauthorized"]
    assert all("Unauthorized" in r["error"]["message"] and "result" not in r for r in replies)
    assert result.tool_calls_made == 0


def test_reference_mock_tools_all_callable(run_mocked: Run) -> None:
    """The canned tools answer as the reference's mock does (a guard on this file)."""
    result = run_mocked(
        """
        import json
        from hermes_tools import read_file, write_file, search_files, patch, web_search
        print(json.dumps([read_file("a")["total_lines"], write_file("p", "c")["path"],
                          search_files("x")["matches"][0]["file"], patch(path="p")["replacements"],
                          web_search("q")["results"][0]["title"]]))
        """
    )
    assert result.status == "success", result.error
    assert json.loads(result.output) == [3, "p", "test.py", 1, "Example"]


assert os.sep == "/"  # POSIX only, as the reference's UDS cases
