"""Loading tools: the built-in modules, and a user's module named on the command line."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

BUILTIN_MODULES = ("tools.file_tools", "tools.terminal_tool")


class ToolModuleError(Exception):
    """A tools module that could not be found or imported; the message says why."""


def load_builtin_tools() -> None:
    """Import the built-in tool modules (each registers its tools once)."""
    for name in BUILTIN_MODULES:
        importlib.import_module(name)


def load_tools_module(spec: str) -> ModuleType:
    """Import a module that registers tools, by dotted name or by file path.

    Raises :class:`ToolModuleError` with the reason when it cannot be imported.
    """
    looks_like_path = spec.endswith(".py") or os.sep in spec or spec.startswith(".")
    if looks_like_path:
        path = os.path.abspath(spec)
        if not os.path.isfile(path):
            raise ToolModuleError(f"tools module file not found: {spec}")
        name = "hermes_sandbox_user_tools_" + os.path.splitext(os.path.basename(path))[0]
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise ToolModuleError(f"cannot load {spec} as a Python module")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise ToolModuleError(
                f"tools module {spec} failed to import: {type(exc).__name__}: {exc}"
            ) from exc
        return module
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as exc:
        raise ToolModuleError(
            f"tools module {spec!r} not found ({exc}); give a dotted module name on "
            "sys.path or a path to a .py file"
        ) from exc
    except Exception as exc:
        raise ToolModuleError(
            f"tools module {spec} failed to import: {type(exc).__name__}: {exc}"
        ) from exc
