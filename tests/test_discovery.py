"""Discovery: real modules written to disk; only those that register tools are imported,
one that fails is logged and skipped."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hermes_sandbox.tools.discovery as discovery
from hermes_sandbox.tools import load_tools_module, registry
from hermes_sandbox.tools.decorator import tool
from hermes_sandbox.tools.discovery import (
    discover_builtin_tools,
    discover_package,
    discover_tools_directory,
    find_tool_files,
    source_registers_tools,
)
from hermes_sandbox.tools.loader import ToolModuleError, load_builtin_tools


@pytest.fixture(autouse=True)
def restore_global_registry():
    """Tools and modules a test adds to the process vanish after it.

    The built-in tools load first, so they are part of what stays (discovery caches
    them: once gone, they would not come back for later tests).
    """
    load_builtin_tools()
    names = set(registry.names())
    modules = set(sys.modules)
    yield
    for name in set(registry.names()) - names:
        registry.deregister(name)
    for name in set(sys.modules) - modules:
        del sys.modules[name]


def write(directory: Path, name: str, source: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(source))
    return path


def registering_module(tool_name: str, marker: Path | None = None) -> str:
    note = f"with open({str(marker)!r}, 'a') as f:\n    f.write('imported\\n')\n" if marker else ""
    return (
        "from hermes_sandbox import registry, tool_result\n"
        f"{note}"
        "def handle(args):\n"
        "    return tool_result(ok=True)\n"
        f"registry.register(name={tool_name!r}, toolset='disc_test', "
        f"schema={{'name': {tool_name!r}}}, handler=handle)\n"
    )


def test_directory_imports_only_modules_that_register(tmp_path, caplog):
    marker = tmp_path / "helper_was_imported"
    write(tmp_path, "good_tool.py", registering_module("disc_good"))
    write(
        tmp_path,
        "helper.py",
        f"""
        with open({str(marker)!r}, "w") as f:
            f.write("imported")
        raise RuntimeError("a helper must never be imported by discovery")

        def register_later():
            from hermes_sandbox.tools.registry import registry
            registry.register(name="never", toolset="x", schema={{}}, handler=print)
        """,
    )
    write(
        tmp_path,
        "broken_tool.py",
        """
        from hermes_sandbox.tools.registry import registry
        raise ImportError("needs an optional dependency")
        registry.register(name="disc_broken", toolset="x", schema={}, handler=print)
        """,
    )
    write(tmp_path, "bad_syntax.py", "registry.register(\n")
    write(tmp_path, "_private.py", registering_module("disc_private"))
    with caplog.at_level(logging.WARNING, logger="hermes_sandbox.tools.discovery"):
        modules = discover_tools_directory(tmp_path)
    assert [m.__name__.rsplit("_", 2)[-2:] for m in modules] == [["good", "tool"]]
    assert "disc_good" in registry
    assert "disc_broken" not in registry and "disc_private" not in registry
    assert not marker.exists()  # the helper never ran
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        "broken_tool.py" in w and "ImportError: needs an optional dependency" in w for w in warnings
    )
    assert any("bad_syntax.py" in w and "SyntaxError" in w for w in warnings)
    assert all(str(tmp_path) != p for p in sys.path)  # the directory left sys.path again


def test_directory_discovery_does_not_run_a_module_twice(tmp_path):
    marker = tmp_path / "runs"
    write(tmp_path, "counted_tool.py", registering_module("disc_counted", marker))
    first = discover_tools_directory(tmp_path)
    second = discover_tools_directory(tmp_path)
    assert first == second
    assert marker.read_text() == "imported\n"


def test_tool_files_may_import_helpers_beside_them(tmp_path):
    write(tmp_path, "shared_bits.py", "PREFIX = 'disc_'\n")
    write(
        tmp_path,
        "uses_helper.py",
        """
        from shared_bits import PREFIX
        from hermes_sandbox.tools import registry
        registry.register(name=PREFIX + "helped", toolset="disc_test", schema={}, handler=print)
        """,
    )
    discover_tools_directory(tmp_path)
    assert "disc_helped" in registry


def test_a_missing_directory_is_an_error(tmp_path):
    with pytest.raises(ToolModuleError, match="tools directory not found"):
        discover_tools_directory(tmp_path / "absent")


def test_decorated_modules_are_discovered(tmp_path):
    write(
        tmp_path,
        "decorated.py",
        '''
        from hermes_sandbox.tools import tool

        @tool(toolset="disc_test")
        def disc_shout(text: str) -> str:
            """Shout.

            Args:
                text: what to shout
            """
            return text.upper()
        ''',
    )
    discover_tools_directory(tmp_path)
    assert registry.dispatch("disc_shout", {"text": "hi"}) == "HI"


@pytest.mark.parametrize(
    "source",
    [
        "from hermes_sandbox import registry\nregistry.register(name='x')",
        "from hermes_sandbox.tools.registry import registry\nregistry.register(name='x')",
        "from hermes_sandbox.tools import registry\nregistry.register(name='x')",
        "from hermes_sandbox import registry as reg\nreg.register(name='x')",
        "from hermes_sandbox import registry as r\nentry = r.register(name='x')",
        "import hermes_sandbox\nhermes_sandbox.registry.register(name='x')",
        "import hermes_sandbox.tools.registry\n"
        "hermes_sandbox.tools.registry.registry.register(name='x')",
        "from hermes_sandbox import *\nregistry.register(name='x')",
        "from hermes_sandbox.tools.registry import *\nregistry.register(name='x')",
        "registry.register(name='x')",
        "if True:\n    try:\n        registry.register(name='x')\n"
        "    except ValueError:\n        pass",
        "from hermes_sandbox import tool\n@tool\ndef f(): pass",
        "from hermes_sandbox import tool\n@tool(toolset='m')\ndef f(): pass",
        "from hermes_sandbox.tools.decorator import tool as make\n"
        "@make(toolset='m')\nasync def f(): pass",
        "import hermes_sandbox\n@hermes_sandbox.tool()\ndef f(): pass",
        "from hermes_sandbox import tool\ndef f(): pass\ntool(toolset='m')(f)",
        "from hermes_sandbox import tool\nclass Box:\n    @tool\n    def f(): pass",
    ],
)
def test_registration_spellings_are_recognised(source):
    assert source_registers_tools(source)


@pytest.mark.parametrize(
    "source",
    [
        "def setup():\n    registry.register(name='x')",
        "async def setup():\n    registry.register(name='x')",
        "class Tools:\n    def setup(self):\n        registry.register(name='x')",
        "setup = lambda: registry.register(name='x')",
        "from other import registry as registry2\nregistry2.register(name='x')",
        "from langchain import tool\n@tool\ndef f(): pass",
        "registry.lookup('x')",
        "import json\nVALUE = 3",
    ],
)
def test_helpers_are_not_mistaken_for_tool_modules(source):
    assert not source_registers_tools(source)


def test_relative_imports_resolve_against_the_package():
    source = "from .registry import registry as r\nr.register(name='x')"
    assert source_registers_tools(source, package="hermes_sandbox.tools")
    assert source_registers_tools(
        "from . import tool\n@tool\ndef f(): pass", package="hermes_sandbox.tools"
    )


def test_builtin_discovery_finds_the_tool_modules_and_no_helpers():
    found = load_builtin_tools()
    assert {"hermes_sandbox.tools.file_tools", "hermes_sandbox.tools.terminal_tool"} <= set(found)
    for helper in ("registry", "loader", "discovery", "arguments", "toolsets", "decorator"):
        assert f"hermes_sandbox.tools.{helper}" not in found
    assert {"read_file", "write_file", "terminal"} <= set(registry.names())
    on_disk = find_tool_files(Path(discovery.__file__).parent, package="hermes_sandbox.tools")
    assert found == sorted(found)
    assert set(found) <= {f"hermes_sandbox.tools.{p.stem}" for p in on_disk}  # less any that failed


def test_builtin_discovery_registers_the_web_tools_once_and_leaves_their_machinery_lazy():
    """In a fresh interpreter: web_tools is the one module that registers web_search and
    web_extract, each exactly once; the tools/web/ package is reached only through it,
    and the ``web`` extra's libraries are not imported at all."""
    program = textwrap.dedent(
        """
        import json, sys
        from hermes_sandbox.tools.registry import ToolRegistry

        calls = []
        register = ToolRegistry.register

        def counting(self, name, *args, **kwargs):
            calls.append(name)
            return register(self, name, *args, **kwargs)

        ToolRegistry.register = counting
        from hermes_sandbox.tools.discovery import discover_builtin_tools

        found = discover_builtin_tools()
        extra = sorted(m for m in ("httpx", "httpcore", "bs4", "markdownify") if m in sys.modules)
        print(json.dumps({"found": found, "calls": calls, "extra": extra}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    report = json.loads(done.stdout)
    assert "hermes_sandbox.tools.web_tools" in report["found"]
    assert not [m for m in report["found"] if m.startswith("hermes_sandbox.tools.web.")]
    assert report["calls"].count("web_search") == 1
    assert report["calls"].count("web_extract") == 1
    assert report["extra"] == []


def test_builtin_discovery_is_cached(monkeypatch):
    first = discover_builtin_tools()

    def no_scan(*args, **kwargs):
        raise AssertionError("scanned again")

    monkeypatch.setattr(discovery, "find_tool_files", no_scan)
    assert load_builtin_tools() == first
    assert discover_builtin_tools() == first


def make_package(root: Path, name: str, marker: Path) -> None:
    package = root / name
    package.mkdir()
    write(package, "__init__.py", "")
    write(package, "alpha.py", registering_module("disc_pkg_alpha"))
    write(package, "plain.py", f"with open({str(marker)!r}, 'w') as f:\n    f.write('x')\n")


def test_plugin_package_submodules_are_discovered(tmp_path, monkeypatch):
    marker = tmp_path / "plain_was_imported"
    make_package(tmp_path, "disc_plugin", marker)
    monkeypatch.syspath_prepend(str(tmp_path))
    modules = discover_package("disc_plugin")
    assert [m.__name__ for m in modules] == ["disc_plugin.alpha"]
    assert "disc_pkg_alpha" in registry
    assert not marker.exists()
    with pytest.raises(ToolModuleError, match="failed to import"):
        discover_package("disc_plugin_that_does_not_exist")


def test_load_tools_module_of_a_package_discovers_its_submodules(tmp_path, monkeypatch):
    make_package(tmp_path, "disc_plugin2", tmp_path / "marker2")
    monkeypatch.syspath_prepend(str(tmp_path))
    load_tools_module("disc_plugin2")
    assert "disc_pkg_alpha" in registry


def test_load_tools_module_by_path_still_works(tmp_path):
    path = write(tmp_path, "by_path.py", registering_module("disc_by_path"))
    load_tools_module(str(path))
    assert "disc_by_path" in registry
    broken = write(tmp_path, "raises.py", "raise ValueError('nope')\n")
    with pytest.raises(ToolModuleError, match=r"raises\.py failed to import: ValueError: nope"):
        load_tools_module(str(broken))


def test_the_decorator_is_importable_from_tools():
    assert tool.__module__ == "hermes_sandbox.tools.decorator"
