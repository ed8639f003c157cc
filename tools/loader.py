"""Loading tools: the built-in modules, and a user's module named on the command line.

Which built-in modules register tools is found by :mod:`tools.discovery` (no fixed list
to keep up to date); a user's module is imported by dotted name or by file path.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

from hermes_sandbox.errors import ToolModuleError


def load_builtin_tools() -> list[str]:
    """Import the built-in tool modules (each registers its tools once); their names.

    Cheap to call again: discovery runs once per process.
    """
    from hermes_sandbox.tools.discovery import discover_builtin_tools

    return discover_builtin_tools()


def import_file(path: str | os.PathLike[str], name: str) -> ModuleType:
    """Import the Python file at ``path`` as module ``name`` (registered in sys.modules).

    Raises :class:`ToolModuleError` when it cannot be loaded or fails while importing
    (the original exception is its ``__cause__``).
    """
    path = os.fspath(path)
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ToolModuleError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise ToolModuleError(
            f"tools module {path} failed to import: {type(exc).__name__}: {exc}"
        ) from exc
    return module


def load_tools_module(spec: str) -> ModuleType:
    """Import a module that registers tools, by dotted name or by file path.

    A package named by its dotted name also has its submodules that register tools
    imported (see :func:`tools.discovery.discover_package`).

    Raises :class:`ToolModuleError` with the reason when it cannot be imported.
    """
    looks_like_path = spec.endswith(".py") or os.sep in spec or spec.startswith(".")
    if looks_like_path:
        path = os.path.abspath(spec)
        if not os.path.isfile(path):
            raise ToolModuleError(f"tools module file not found: {spec}")
        name = "hermes_sandbox_user_tools_" + os.path.splitext(os.path.basename(path))[0]
        try:
            return import_file(path, name)
        except ToolModuleError as exc:
            cause = exc.__cause__
            if cause is None:
                raise ToolModuleError(f"cannot load {spec} as a Python module") from None
            raise ToolModuleError(
                f"tools module {spec} failed to import: {type(cause).__name__}: {cause}"
            ) from cause
    try:
        module = importlib.import_module(spec)
    except ModuleNotFoundError as exc:
        raise ToolModuleError(
            f"tools module {spec!r} not found ({exc}); give a dotted module name on "
            "sys.path or a path to a .py file"
        ) from exc
    except Exception as exc:
        raise ToolModuleError(
            f"tools module {spec} failed to import: {type(exc).__name__}: {exc}"
        ) from exc
    if getattr(module, "__path__", None):
        from hermes_sandbox.tools.discovery import discover_package

        discover_package(module)
    return module


def load_tools(spec: str) -> list[ModuleType]:
    """What ``--tools-module`` names: a directory of tool files (each module in it that
    registers tools), or one module by dotted name or file path (:func:`load_tools_module`).

    Raises :class:`ToolModuleError` with the reason when it cannot be loaded.
    """
    if os.path.isdir(spec):
        from hermes_sandbox.tools.discovery import discover_tools_directory

        return discover_tools_directory(spec)
    return [load_tools_module(spec)]
