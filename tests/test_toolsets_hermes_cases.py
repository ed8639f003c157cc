"""Hermes Agent's own toolset cases (tests/test_toolsets.py in hermes-agent 0.19.0),
run against tools.toolsets.

The comment on each case names the reference test. The reference's functions map to
these: ``get_toolset`` to :func:`get_toolset` (a :class:`Toolset`, not a dict),
``resolve_multiple_toolsets`` to :func:`resolve_toolsets`, ``validate_toolset`` to
:func:`is_known_toolset`, ``create_custom_toolset`` to :func:`create_toolset`, and
``get_toolset_info`` to the toolset's definition plus its resolution. Its composite
"debugging" toolset (terminal + web + file) is this project's "sandbox". Instead of
monkeypatching a global registry, each function here takes the registry to consult.
"""

from __future__ import annotations

import pytest

import hermes_sandbox.tools.toolsets as toolsets
from hermes_sandbox.tools import load_builtin_tools
from hermes_sandbox.tools.registry import ToolRegistry, registry
from hermes_sandbox.tools.toolsets import (
    BUILTIN_TOOLSETS,
    create_toolset,
    get_toolset,
    is_known_toolset,
    resolve_toolset,
    resolve_toolsets,
    toolset_names,
)


@pytest.fixture(autouse=True)
def private_toolsets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Toolsets a case defines vanish after it."""
    monkeypatch.setattr(toolsets, "_toolsets", dict(BUILTIN_TOOLSETS))


def registry_with(*specs: tuple[str, str]) -> ToolRegistry:
    """A private registry holding tools named and grouped as ``(name, toolset)``."""
    reg = ToolRegistry()
    for name, toolset in specs:
        reg.register(name=name, toolset=toolset, schema={"name": name}, handler=lambda args: "{}")
    return reg


# TestGetToolset.test_known_toolset
def test_known_toolset() -> None:
    web = get_toolset("web")
    assert web is not None and "web_search" in web.tools


# TestGetToolset.test_merges_registry_tools_into_builtin_toolset
def test_registered_tools_join_a_builtin_toolset() -> None:
    reg = registry_with(("web_search_plus", "web"))
    assert set(resolve_toolset("web", reg)) == {"web_search", "web_extract", "web_search_plus"}


# TestGetToolset.test_unknown_returns_none
def test_unknown_toolset_definition_is_none() -> None:
    assert get_toolset("nonexistent") is None


# TestResolveToolset.test_leaf_toolset
def test_leaf_toolset() -> None:
    load_builtin_tools()
    assert set(resolve_toolset("web")) == {"web_search", "web_extract"}


# TestResolveToolset.test_composite_toolset ("debugging" there, "sandbox" here)
def test_composite_toolset() -> None:
    tools = resolve_toolset("sandbox", ToolRegistry())
    assert {"terminal", "web_search", "web_extract", "read_file"} <= set(tools)


# TestResolveToolset.test_cycle_detection
def test_cycle_is_expanded_once() -> None:
    create_toolset("_cycle_a", tools=["t1"], includes=["_cycle_b"])
    create_toolset("_cycle_b", tools=["t2"], includes=["_cycle_a"])
    assert resolve_toolset("_cycle_a", ToolRegistry()) == ["t1", "t2"]


# TestResolveToolset.test_unknown_toolset_returns_empty
def test_unknown_toolset_resolves_to_nothing() -> None:
    assert resolve_toolset("nonexistent", ToolRegistry()) == []


# TestResolveToolset.test_plugin_toolset_uses_registry_snapshot
def test_plugin_toolset_from_the_registry() -> None:
    reg = registry_with(("plugin_b", "plugin_example"), ("plugin_a", "plugin_example"))
    assert resolve_toolset("plugin_example", reg) == ["plugin_a", "plugin_b"]


# TestResolveToolset.test_all_alias and test_star_alias: every registered tool (the
# reference checks "more than 10", its own count; this registry's count is its own).
@pytest.mark.parametrize("alias", ["all", "*"])
def test_all_aliases(alias: str) -> None:
    load_builtin_tools()
    assert resolve_toolset(alias) == registry.names()
    reg = registry_with(*((f"t{n:02}", f"s{n % 3}") for n in range(12)))
    assert len(resolve_toolset(alias, reg)) == 12


# TestResolveMultipleToolsets.test_combines_and_deduplicates
def test_several_toolsets_combined_once() -> None:
    tools = resolve_toolsets(["web", "terminal", "web"], ToolRegistry())
    assert {"web_search", "web_extract", "terminal"} <= set(tools)
    assert len(tools) == len(set(tools))


# TestResolveMultipleToolsets.test_empty_list
def test_no_toolsets_resolve_to_nothing() -> None:
    assert resolve_toolsets([]) == []


# TestValidateToolset.test_valid, test_all_alias_valid, test_invalid
@pytest.mark.parametrize(
    ("name", "known"),
    [
        pytest.param("web", True, id="test_valid[web]"),
        pytest.param("terminal", True, id="test_valid[terminal]"),
        pytest.param("all", True, id="test_all_alias_valid[all]"),
        pytest.param("*", True, id="test_all_alias_valid[*]"),
        pytest.param("nonexistent", False, id="test_invalid"),
    ],
)
def test_validate_toolset(name: str, known: bool) -> None:
    assert is_known_toolset(name, ToolRegistry()) is known


# TestGetToolsetInfo.test_leaf
def test_leaf_toolset_info() -> None:
    web = get_toolset("web")
    assert web is not None and web.name == "web" and web.includes == ()
    assert len(resolve_toolset("web", ToolRegistry())) == 2


# TestGetToolsetInfo.test_composite
def test_composite_toolset_info() -> None:
    sandbox = get_toolset("sandbox")
    assert sandbox is not None and sandbox.includes
    assert len(resolve_toolset("sandbox", ToolRegistry())) > len(sandbox.tools)


# TestGetToolsetInfo.test_unknown_returns_none
def test_unknown_toolset_info_is_none() -> None:
    assert get_toolset("nonexistent") is None


# TestCreateCustomToolset.test_runtime_creation
def test_toolset_created_at_run_time() -> None:
    create_toolset(
        "_test_custom", tools=["web_search"], includes=["terminal"], description="Test toolset"
    )
    tools = resolve_toolset("_test_custom", ToolRegistry())
    assert "web_search" in tools and "terminal" in tools
    assert is_known_toolset("_test_custom") is True


# TestRegistryOwnedToolsets.test_registry_membership_is_live
def test_registry_membership_is_live() -> None:
    reg = registry_with(("test_live_toolset_tool", "test-live-toolset"))
    assert is_known_toolset("test-live-toolset", reg) is True
    assert resolve_toolset("test-live-toolset", reg) == ["test_live_toolset_tool"]
    reg.register(
        name="second", toolset="test-live-toolset", schema={"name": "second"}, handler=dict
    )
    assert resolve_toolset("test-live-toolset", reg) == ["second", "test_live_toolset_tool"]


# TestToolsetConsistency.test_all_toolsets_have_required_keys
def test_builtin_toolsets_are_complete() -> None:
    for name, toolset in BUILTIN_TOOLSETS.items():
        assert toolset.name == name
        assert isinstance(toolset.description, str) and toolset.description
        assert isinstance(toolset.tools, tuple) and isinstance(toolset.includes, tuple)


# TestToolsetConsistency.test_all_includes_reference_existing_toolsets
def test_builtin_includes_name_builtin_toolsets() -> None:
    for name, toolset in BUILTIN_TOOLSETS.items():
        for included in toolset.includes:
            assert included in BUILTIN_TOOLSETS, f"{name} includes unknown toolset {included!r}"


# TestPluginToolsets.test_get_all_toolsets_includes_plugin_toolset
def test_all_toolsets_include_a_plugin_toolset() -> None:
    reg = registry_with(("plugin_tool", "plugin_bundle"))
    assert "plugin_bundle" in toolset_names(reg)
    assert resolve_toolset("plugin_bundle", reg) == ["plugin_tool"]
