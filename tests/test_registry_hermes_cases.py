"""Hermes Agent's own registry cases (tests/tools/test_registry.py in its repository),
run against tools.registry, tools.toolsets and tools.discovery.

The comment on each case names the reference test. Where the reference calls a method
this registry does not have, the case asks the same question through the interface that
answers it here: ``get_all_tool_names`` is :meth:`ToolRegistry.names`,
``get_tool_names_for_toolset(t)`` is ``names(t)``, ``get_registered_toolset_names`` is
:meth:`ToolRegistry.toolsets`, ``get_entry`` is :meth:`ToolRegistry.get`, and whether a
toolset is available (``is_toolset_available``, ``check_toolset_requirements``,
``check_tool_availability``) is what :func:`tools_for_run` decides when a run asks for
the toolset: its available tools, or a ToolsetError when it has none. Cases where this
project deliberately differs assert its own behaviour and end in ``_DIFFERENT``;
docs/compatibility.md lists each with the reason.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

import hermes_sandbox.tools as tools_package
from hermes_sandbox.errors import ToolsetError
from hermes_sandbox.tools.discovery import (
    BUILTIN_EXCLUDED,
    BUILTIN_TOOL_MODULES,
    discover_builtin_tools,
    discover_tools_directory,
    module_registers_tools,
)
from hermes_sandbox.tools.registry import ToolRegistry
from hermes_sandbox.tools.toolsets import tools_for_run


def ok_handler(args: dict[str, Any]) -> str:
    return json.dumps({"ok": True})


def schema(name: str = "test_tool") -> dict[str, Any]:
    return {
        "name": name,
        "description": f"A {name}",
        "parameters": {"type": "object", "properties": {}},
    }


def raising(exc: BaseException) -> Any:
    def check() -> bool:
        raise exc

    return check


def registry_of(*tools: tuple[Any, ...]) -> ToolRegistry:
    """A registry of ``(name, toolset)`` or ``(name, toolset, check_fn)`` tools."""
    reg = ToolRegistry()
    for name, toolset, *check in tools:
        reg.register(
            name=name,
            toolset=toolset,
            schema=schema(name),
            handler=ok_handler,
            check_fn=check[0] if check else None,
        )
    return reg


def toolset_available(reg: ToolRegistry, toolset: str) -> bool:
    """Whether a run may use ``toolset``: it has a tool available here."""
    try:
        return bool(tools_for_run(None, [toolset], reg))
    except ToolsetError:
        return False


# -- TestRegisterAndDispatch -----------------------------------------------------------


# TestRegisterAndDispatch.test_register_and_dispatch
def test_register_and_dispatch() -> None:
    reg = ToolRegistry()
    reg.register(name="alpha", toolset="core", schema=schema("alpha"), handler=ok_handler)
    assert json.loads(reg.dispatch("alpha", {})) == {"ok": True}


# TestRegisterAndDispatch.test_dispatch_passes_args
def test_dispatch_passes_args() -> None:
    reg = ToolRegistry()
    reg.register(name="echo", toolset="core", schema=schema("echo"), handler=json.dumps)
    assert json.loads(reg.dispatch("echo", {"msg": "hi"})) == {"msg": "hi"}


# TestRegisterAndDispatch.test_dispatch_preserves_supported_multimodal_result and
# test_dispatch_rejects_unsupported_handler_results_with_structured_error: DIFFERENT.
# There a handler must return a string (or a multimodal dict, handed back as the same
# object) and anything else is a "tool_result_contract" error. Here dispatch always
# returns JSON text, and a handler may return any JSON-serialisable value, which is
# serialised: tools written with @tool return dicts, and a script gets parsed JSON back.
@pytest.mark.parametrize(
    ("returned", "sent"),
    [
        pytest.param({"ok": True}, {"ok": True}, id="dict"),
        pytest.param(42, 42, id="int"),
        pytest.param(None, {}, id="None"),
        pytest.param(b"bytes", "b'bytes'", id="bytes"),
        pytest.param(
            {"_multimodal": True, "content": [{"type": "text", "text": "captured"}]},
            {"_multimodal": True, "content": [{"type": "text", "text": "captured"}]},
            id="multimodal",
        ),
    ],
)
def test_non_string_results_are_serialised_DIFFERENT(returned: Any, sent: Any) -> None:
    reg = ToolRegistry()
    reg.register(name="r", toolset="core", schema=schema("r"), handler=lambda args: returned)
    raw = reg.dispatch("r", {})
    assert isinstance(raw, str)
    assert json.loads(raw) == sent


# -- TestGetDefinitions ----------------------------------------------------------------


# TestGetDefinitions.test_returns_openai_format
def test_definitions_in_openai_format() -> None:
    reg = ToolRegistry()
    reg.register(name="t1", toolset="s1", schema=schema("t1"), handler=ok_handler)
    reg.register(name="t2", toolset="s1", schema=schema("t2"), handler=ok_handler)
    defs = reg.get_definitions({"t1", "t2"})
    assert len(defs) == 2
    assert all(d["type"] == "function" for d in defs)
    assert {d["function"]["name"] for d in defs} == {"t1", "t2"}


# TestGetDefinitions.test_skips_unavailable_tools
def test_definitions_skip_unavailable_tools() -> None:
    reg = registry_of(("available", "s", lambda: True), ("unavailable", "s", lambda: False))
    defs = reg.get_definitions({"available", "unavailable"})
    assert [d["function"]["name"] for d in defs] == ["available"]


# TestGetDefinitions.test_reuses_shared_check_fn_once_per_call
def test_shared_check_fn_runs_once_per_call() -> None:
    reg = ToolRegistry()
    calls = []

    def shared_check() -> bool:
        calls.append(1)
        return True

    for name in ("first", "second"):
        reg.register(
            name=name,
            toolset="shared",
            schema=schema(name),
            handler=ok_handler,
            check_fn=shared_check,
        )
    assert len(reg.get_definitions({"first", "second"})) == 2
    assert len(calls) == 1


# TestUnknownToolDispatch.test_returns_error_json
def test_unknown_tool_dispatch_is_an_error() -> None:
    result = json.loads(ToolRegistry().dispatch("nonexistent", {}))
    assert "Unknown tool" in result["error"]


# -- TestToolsetAvailability -----------------------------------------------------------


# TestToolsetAvailability.test_no_check_fn_is_available
def test_toolset_without_check_is_available() -> None:
    assert toolset_available(registry_of(("t", "free")), "free") is True


# TestToolsetAvailability.test_check_fn_controls_availability
def test_check_fn_controls_toolset_availability() -> None:
    reg = registry_of(("t", "locked", lambda: False))
    assert toolset_available(reg, "locked") is False
    with pytest.raises(ToolsetError, match="no tool available"):
        tools_for_run(None, ["locked"], reg)


# TestToolsetAvailability.test_check_toolset_requirements
def test_toolset_requirements_per_toolset() -> None:
    reg = registry_of(("a", "ok", lambda: True), ("b", "nope", lambda: False))
    assert {t: toolset_available(reg, t) for t in reg.toolsets()} == {"ok": True, "nope": False}


# TestToolsetAvailability.test_get_all_tool_names
def test_all_tool_names_sorted() -> None:
    assert registry_of(("z_tool", "s"), ("a_tool", "s")).names() == ["a_tool", "z_tool"]


# TestToolsetAvailability.test_get_registered_toolset_names
def test_registered_toolset_names_sorted() -> None:
    reg = registry_of(("first", "zeta"), ("second", "alpha"), ("third", "alpha"))
    assert reg.toolsets() == ["alpha", "zeta"]


# TestToolsetAvailability.test_get_tool_names_for_toolset
def test_tool_names_of_a_toolset_sorted() -> None:
    reg = registry_of(("z_tool", "grouped"), ("a_tool", "grouped"), ("other_tool", "other"))
    assert reg.names("grouped") == ["a_tool", "z_tool"]


# TestToolsetAvailability.test_handler_exception_returns_error
def test_handler_exception_is_an_error_result() -> None:
    reg = ToolRegistry()

    def bad_handler(args: dict[str, Any]) -> str:
        raise RuntimeError("boom")

    reg.register(name="bad", toolset="s", schema=schema(), handler=bad_handler)
    result = json.loads(reg.dispatch("bad", {}))
    assert "RuntimeError" in result["error"] and "boom" in result["error"]


# -- TestCheckFnExceptionHandling ------------------------------------------------------


# TestCheckFnExceptionHandling.test_is_toolset_available_catches_exception
def test_raising_check_makes_toolset_unavailable() -> None:
    reg = registry_of(("t", "broken", raising(ZeroDivisionError("division by zero"))))
    assert toolset_available(reg, "broken") is False
    assert reg.is_available("t") is False


# TestCheckFnExceptionHandling.test_check_toolset_requirements_survives_raising_check
def test_requirements_survive_a_raising_check() -> None:
    reg = registry_of(("a", "good", lambda: True), ("b", "bad", raising(ImportError("no module"))))
    assert {t: toolset_available(reg, t) for t in reg.toolsets()} == {"good": True, "bad": False}


# TestCheckFnExceptionHandling.test_get_definitions_skips_raising_check
def test_definitions_skip_a_raising_check() -> None:
    reg = registry_of(("ok_tool", "s", lambda: True), ("bad_tool", "s2", raising(OSError("down"))))
    defs = reg.get_definitions({"ok_tool", "bad_tool"})
    assert [d["function"]["name"] for d in defs] == ["ok_tool"]


# TestCheckFnExceptionHandling.test_check_tool_availability_survives_raising_check
def test_availability_survives_a_raising_check() -> None:
    reg = registry_of(("a", "works", lambda: True), ("b", "crashes", raising(ZeroDivisionError())))
    assert tools_for_run(None, ["works"], reg) == ["a"]
    with pytest.raises(ToolsetError, match="crashes"):
        tools_for_run(None, ["crashes"], reg)


# -- TestBuiltinDiscovery --------------------------------------------------------------


# TestBuiltinDiscovery.test_discovers_all_real_self_registering_builtin_tool_modules
def test_discovers_every_builtin_tool_module() -> None:
    directory = Path(tools_package.__file__).parent
    expected = [
        f"hermes_sandbox.tools.{path.stem}"
        for path in sorted(directory.glob("*.py"))
        if not path.name.startswith("_")
        and path.name not in BUILTIN_EXCLUDED
        and module_registers_tools(path, "hermes_sandbox.tools")
    ]
    assert discover_builtin_tools() == expected
    assert [f"hermes_sandbox.tools.{stem}" for stem in BUILTIN_TOOL_MODULES] == expected
    for module in ("file_tools", "terminal_tool", "search_tool", "patch_tool", "web_tools"):
        assert f"hermes_sandbox.tools.{module}" in expected


# TestBuiltinDiscovery.test_imports_only_self_registering_modules
def test_imports_only_modules_that_register(tmp_path: Path) -> None:
    directory = tmp_path / "user_tools"
    directory.mkdir()
    imported_marker = tmp_path / "beta-was-imported"
    (directory / "alpha.py").write_text(
        "from hermes_sandbox.tools.registry import ToolRegistry\n"
        "registry = ToolRegistry()\n"
        "registry.register(name='alpha', toolset='x', schema={}, handler=lambda args: '{}')\n"
    )
    (directory / "beta.py").write_text(f"open({str(imported_marker)!r}, 'w').close()\nVALUE = 1\n")
    modules = discover_tools_directory(directory)
    assert [Path(m.__file__).name for m in modules] == ["alpha.py"]
    assert modules[0].registry.names() == ["alpha"]
    assert not imported_marker.exists()


# -- TestEmojiMetadata, TestEntryLookup ------------------------------------------------


# TestEmojiMetadata.test_emoji_stored_on_entry
def test_emoji_stored_on_entry() -> None:
    reg = ToolRegistry()
    reg.register(name="t", toolset="s", schema=schema(), handler=ok_handler, emoji="🔥")
    assert reg.get("t").emoji == "🔥"


# TestEntryLookup.test_get_entry_returns_registered_entry
def test_entry_lookup() -> None:
    reg = ToolRegistry()
    reg.register(name="alpha", toolset="core", schema=schema("alpha"), handler=ok_handler)
    entry = reg.get("alpha")
    assert entry is not None and entry.name == "alpha" and entry.toolset == "core"


# TestEntryLookup.test_get_entry_returns_none_for_unknown_tool
def test_entry_lookup_of_unknown_tool() -> None:
    assert ToolRegistry().get("missing") is None


# -- TestThreadSafety ------------------------------------------------------------------


def _read_while_writing(reg: ToolRegistry, write: Any) -> list[dict[str, Any]]:
    """get_definitions() in one thread while ``write()`` runs in another, during a
    check_fn: the read must finish without error and the write must not wait for it."""
    check_started = threading.Event()
    writer_done = threading.Event()
    seen: dict[str, Any] = {}

    def blocking_check() -> bool:
        check_started.set()
        seen["writer_finished_during_check"] = writer_done.wait(timeout=10)
        return True

    reg.register(
        name="alpha",
        toolset="gated",
        schema=schema("alpha"),
        handler=ok_handler,
        check_fn=blocking_check,
    )
    reg.register(name="beta", toolset="plain", schema=schema("beta"), handler=ok_handler)

    def reader() -> None:
        try:
            seen["defs"] = reg.get_definitions()
        except Exception as exc:  # reported by the assertion below
            seen["error"] = exc

    def writer() -> None:
        assert check_started.wait(timeout=10)
        write()
        writer_done.set()

    threads = [threading.Thread(target=reader), threading.Thread(target=writer)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    assert "error" not in seen
    assert seen["writer_finished_during_check"] is True
    return seen["defs"]  # type: ignore[no-any-return]


# TestThreadSafety.test_check_tool_availability_tolerates_concurrent_register
def test_reading_tolerates_a_concurrent_register() -> None:
    reg = ToolRegistry()

    def register() -> None:
        reg.register(name="gamma", toolset="new", schema=schema("gamma"), handler=ok_handler)

    defs = _read_while_writing(reg, register)
    assert {"alpha", "beta"} <= {d["function"]["name"] for d in defs}
    assert reg.names() == ["alpha", "beta", "gamma"]


# TestThreadSafety.test_get_available_toolsets_tolerates_concurrent_deregister
def test_reading_tolerates_a_concurrent_deregister() -> None:
    reg = ToolRegistry()
    defs = _read_while_writing(reg, lambda: reg.deregister("beta"))
    assert "alpha" in {d["function"]["name"] for d in defs}
    assert reg.names() == ["alpha"]


# -- TestToolsetAvailabilityAggregation ------------------------------------------------


# TestToolsetAvailabilityAggregation.test_mixed_toolset_available_when_general_tool_passes
def test_mixed_toolset_available_when_one_tool_passes() -> None:
    reg = registry_of(
        ("read_terminal", "terminal", lambda: False),
        ("terminal", "terminal", lambda: True),
        ("process", "terminal"),
    )
    assert toolset_available(reg, "terminal") is True
    assert sorted(tools_for_run(None, ["terminal"], reg) or []) == ["process", "terminal"]


# TestToolsetAvailabilityAggregation.test_mixed_toolset_unavailable_when_every_tool_is_gated
def test_mixed_toolset_unavailable_when_every_tool_is_gated() -> None:
    reg = registry_of(
        ("read_terminal", "terminal", lambda: False), ("terminal", "terminal", lambda: False)
    )
    assert toolset_available(reg, "terminal") is False
