"""Toolsets: built-in groups, recursive includes, custom toolsets, and --toolsets."""

from __future__ import annotations

import logging

import pytest

import hermes_sandbox.tools.toolsets as toolsets
from hermes_sandbox import cli
from hermes_sandbox.tools import load_builtin_tools
from hermes_sandbox.tools.registry import ToolRegistry
from hermes_sandbox.tools.toolsets import (
    BUILTIN_TOOLSETS,
    Toolset,
    ToolsetError,
    create_toolset,
    delete_toolset,
    get_toolset,
    resolve_toolset,
    resolve_toolsets,
    tools_for_run,
)


@pytest.fixture(autouse=True)
def private_toolsets(monkeypatch):
    """Custom toolsets made by a test vanish after it."""
    monkeypatch.setattr(toolsets, "_toolsets", dict(BUILTIN_TOOLSETS))


def make_registry(*specs: tuple[str, str], unavailable: tuple[str, ...] = ()) -> ToolRegistry:
    reg = ToolRegistry()
    for name, toolset in specs:
        check = (lambda: False) if name in unavailable else None
        reg.register(name, toolset, {"name": name}, lambda args: "ok", check_fn=check)
    return reg


EMPTY = ToolRegistry()


def test_builtin_toolsets():
    assert resolve_toolset("file", EMPTY) == ["read_file", "write_file", "patch", "search_files"]
    assert resolve_toolset("terminal", EMPTY) == ["terminal"]
    assert resolve_toolset("web", EMPTY) == ["web_search", "web_extract"]
    assert resolve_toolset("sandbox", EMPTY) == [
        "read_file",
        "write_file",
        "patch",
        "search_files",
        "terminal",
        "web_search",
        "web_extract",
    ]
    assert set(resolve_toolset("sandbox", EMPTY)) == set(toolsets.SANDBOX_TOOLS)
    assert get_toolset("sandbox") == Toolset(
        "sandbox", "Everything a sandboxed script may call", includes=("file", "terminal", "web")
    )


def test_all_and_star_mean_every_registered_tool():
    reg = make_registry(("b_tool", "x"), ("a_tool", "y"))
    assert resolve_toolset("all", reg) == ["a_tool", "b_tool"]
    assert resolve_toolset("*", reg) == ["a_tool", "b_tool"]
    create_toolset("everything", includes=["all"])
    assert resolve_toolset("everything", reg) == ["a_tool", "b_tool"]


def test_unknown_toolset_is_empty_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="hermes_sandbox.tools.toolsets"):
        assert resolve_toolset("nope", EMPTY) == []
    assert "unknown toolset 'nope'" in caplog.text


def test_cycles_and_diamonds_resolve_each_tool_once():
    create_toolset("a", tools=["t1"], includes=["b", "c"])
    create_toolset("b", tools=["t2", "t1"], includes=["d"])
    create_toolset("c", tools=["t3"], includes=["d", "a"])  # cycle back to a
    create_toolset("d", tools=["t4", "t2"], includes=["b"])  # cycle b <-> d; diamond at d
    assert resolve_toolset("a", EMPTY) == ["t1", "t2", "t4", "t3"]
    assert resolve_toolset("c", EMPTY) == ["t3", "t4", "t2", "t1"]
    create_toolset("self", tools=["s"], includes=["self"])
    assert resolve_toolset("self", EMPTY) == ["s"]


def test_unknown_include_is_skipped_with_a_warning(caplog):
    create_toolset("mixed", tools=["t"], includes=["missing", "terminal"])
    with caplog.at_level(logging.WARNING, logger="hermes_sandbox.tools.toolsets"):
        assert resolve_toolset("mixed", EMPTY) == ["t", "terminal"]
    assert "'missing'" in caplog.text


def test_registered_tools_join_the_toolset_they_name():
    reg = make_registry(("add", "math"), ("mul", "math"), ("list_dir", "file"))
    assert resolve_toolset("math", reg) == ["add", "mul"]
    assert resolve_toolset("file", reg)[-1] == "list_dir"
    create_toolset("calc", includes=["math"], tools=["extra"])
    assert resolve_toolset("calc", reg) == ["extra", "add", "mul"]


def test_create_toolset_refuses_to_replace_a_builtin_silently():
    with pytest.raises(ToolsetError, match="built-in"):
        create_toolset("file", tools=["read_file"])
    assert resolve_toolset("file", EMPTY)[0:2] == ["read_file", "write_file"]
    create_toolset("file", tools=["read_file"], override=True)
    assert resolve_toolset("file", EMPTY) == ["read_file"]
    assert delete_toolset("file") is True  # the built-in one comes back
    assert resolve_toolset("file", EMPTY) == ["read_file", "write_file", "patch", "search_files"]
    for reserved in ("all", "*"):
        with pytest.raises(ToolsetError, match="reserved"):
            create_toolset(reserved, tools=["x"], override=True)
    with pytest.raises(ToolsetError):
        create_toolset("", tools=["x"])


def test_custom_toolsets_can_be_redefined_and_deleted():
    created = create_toolset("mine", tools=("a", "b", "a"), description="mine")
    assert created == Toolset("mine", "mine", ("a", "b"), ())
    create_toolset("mine", tools=["c"])
    assert resolve_toolset("mine", EMPTY) == ["c"]
    assert delete_toolset("mine") is True
    assert delete_toolset("mine") is False
    assert get_toolset("mine") is None


def test_resolve_toolsets_is_the_ordered_union():
    assert resolve_toolsets(["terminal", "file", "terminal"], EMPTY) == [
        "terminal",
        "read_file",
        "write_file",
        "patch",
        "search_files",
    ]


# ------------------------------------------------------------ tools for a run


def test_tools_for_run_default_and_union():
    reg = make_registry(("read_file", "file"), ("terminal", "terminal"), ("add", "math"))
    assert tools_for_run(None, None, reg) is None
    assert tools_for_run(["add"], ["terminal"], reg) == ["add", "terminal"]
    # listed but unregistered tools (patch, search_files) are left out of a toolset
    assert tools_for_run(None, ["file", "terminal"], reg) == ["read_file", "terminal"]
    assert tools_for_run([], [], reg) == []


def test_tools_for_run_leaves_out_blocked_and_unavailable_tools():
    reg = make_registry(
        ("terminal", "terminal"),
        ("execute_code", "code"),
        ("web_search", "web"),
        unavailable=("web_search",),
    )
    assert tools_for_run(None, ["all"], reg) == ["terminal"]
    with pytest.raises(ToolsetError, match=r"no tool available.*web_search: unavailable"):
        tools_for_run(None, ["web"], reg)


def test_tools_for_run_refuses_unknown_toolsets():
    with pytest.raises(ToolsetError, match=r"unknown toolsets: nope, nada\. Known toolsets: "):
        tools_for_run(None, ["terminal", "nope", "nada"], EMPTY)


# -------------------------------------------------------------- the command line


def test_cli_stub_with_toolsets(capsys):
    load_builtin_tools()
    assert cli.main(["stub", "--toolsets", "terminal", "--tools", "write_file"]) == 0
    stub = capsys.readouterr().out
    assert "def terminal(" in stub and "def write_file(" in stub
    assert "def read_file(" not in stub


def test_cli_unknown_toolset_is_a_one_line_error(capsys):
    assert cli.main(["stub", "--toolsets", "file,nope"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("hermes-sandbox: error: unknown toolset: nope. Known toolsets:")
    assert "Traceback" not in captured.err


def test_cli_run_with_toolsets(tmp_path, capsys):
    script = tmp_path / "probe.py"
    script.write_text(
        "import hermes_tools\n"
        "print(hasattr(hermes_tools, 'terminal'), hasattr(hermes_tools, 'read_file'))\n"
        "print(hermes_tools.terminal('echo hi')['output'].strip())\n"
    )
    assert cli.main(["run", "--toolsets", "terminal", "--timeout", "30", str(script)]) == 0
    assert capsys.readouterr().out == "True False\nhi\n"
    assert cli.main(["run", "--toolsets", "nope", str(script)]) == 2
    assert "unknown toolset: nope" in capsys.readouterr().err
