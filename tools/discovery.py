"""Finding tool modules: read each file's syntax tree and import only the modules that
register tools when imported.

A module counts as a tool module when, at module level (not inside a function body),
it calls ``registry.register(...)`` or uses the :func:`hermes_sandbox.tool` decorator.
The registry may be spelled as imported (``from hermes_sandbox import registry``,
``from hermes_sandbox import registry as r``, ``import hermes_sandbox``) or by its
conventional bare name ``registry``. Helper modules that register nothing are never imported, so a
helper with side effects or heavy imports costs nothing. A module that fails to import
is logged (a warning naming the module and the exception) and skipped: one broken tool
never takes the others down.

Three places are searched: the built-in ``tools`` package (:func:`discover_builtin_tools`,
once per process, from :data:`BUILTIN_TOOL_MODULES`, which the test suite checks against
a scan of the package), a user's directory of tool files (:func:`discover_tools_directory`),
and the submodules of a plugin package (:func:`discover_package`).
"""

from __future__ import annotations

import ast
import importlib
import logging
import os
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType

from hermes_sandbox.tools.arguments import schemas_checked_elsewhere
from hermes_sandbox.tools.loader import ToolModuleError, import_file

log = logging.getLogger(__name__)

# The tools package's own machinery: never a tool module, never imported by discovery.
BUILTIN_EXCLUDED = frozenset(
    {"registry.py", "async_bridge.py", "capping.py", "loader.py", "discovery.py"}
)

# The modules of the tools package that register tools, as a scan finds them
# (tests/test_registry_hermes_cases.py holds the two equal): start-up imports these
# without parsing the package's ~20 files. Their schemas are checked by the test suite
# too, so they register without the jsonschema check (tools/arguments.py).
BUILTIN_TOOL_MODULES = ("file_tools", "patch_tool", "search_tool", "terminal_tool", "web_tools")

# Every spelling of the default registry and of ``@tool``: the public top-level names,
# and where they are defined.
_REGISTRY_PATHS = frozenset(
    {
        "hermes_sandbox.registry",
        "hermes_sandbox.tools.registry",
        "hermes_sandbox.tools.registry.registry",
    }
)
_DECORATOR_PATHS = frozenset(
    {"hermes_sandbox.tool", "hermes_sandbox.tools.tool", "hermes_sandbox.tools.decorator.tool"}
)
# What ``from X import *`` binds, for the modules that export the registry or decorator.
_STAR_EXPORTS = {
    "hermes_sandbox": {"registry": "hermes_sandbox.registry", "tool": "hermes_sandbox.tool"},
    "hermes_sandbox.tools": {
        "registry": "hermes_sandbox.tools.registry",
        "tool": "hermes_sandbox.tools.tool",
    },
    "hermes_sandbox.tools.registry": {"registry": "hermes_sandbox.tools.registry.registry"},
    "hermes_sandbox.tools.decorator": {"tool": "hermes_sandbox.tools.decorator.tool"},
}


class _RegistrationFinder:
    """Decides whether a parsed module registers tools at import time."""

    def __init__(self, package: str | None) -> None:
        self.package = package
        self.aliases: dict[str, str] = {}

    # -- names

    def _absolute(self, module: str | None, level: int) -> str:
        module = module or ""
        if level == 0 or not self.package:
            return module
        parts = self.package.split(".")
        base = parts[: len(parts) - (level - 1)] if level > 1 else parts
        return ".".join([*base, module] if module else base)

    def _collect_imports(self, tree: ast.Module) -> None:
        for node in _import_time_nodes(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.aliases[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        self.aliases[top] = top
            elif isinstance(node, ast.ImportFrom):
                source = self._absolute(node.module, node.level)
                for alias in node.names:
                    if alias.name == "*":
                        self.aliases.update(_STAR_EXPORTS.get(source, {}))
                    else:
                        target = f"{source}.{alias.name}" if source else alias.name
                        self.aliases[alias.asname or alias.name] = target

    def _dotted(self, node: ast.expr) -> str | None:
        """The dotted path an expression names, through the module's imports."""
        attrs: list[str] = []
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        base = self.aliases.get(node.id, node.id)
        return ".".join([base, *reversed(attrs)])

    def _is_registry(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name) and node.id == "registry":
            return True  # the conventional name, however it was bound
        return self._dotted(node) in _REGISTRY_PATHS

    def _is_decorator(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Call):  # @tool(...) or tool(...)(fn)
            node = node.func
            if isinstance(node, ast.Call):
                node = node.func
        return self._dotted(node) in _DECORATOR_PATHS

    # -- the scan

    def registers(self, tree: ast.Module) -> bool:
        self._collect_imports(tree)
        for node in _import_time_nodes(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if any(self._is_decorator(d) for d in node.decorator_list):
                    return True
            elif isinstance(node, ast.Call):
                func = node.func
                if (
                    isinstance(func, ast.Attribute)
                    and func.attr == "register"
                    and self._is_registry(func.value)
                ):
                    return True
                if self._is_decorator(func):
                    return True
        return False


def _import_time_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Nodes whose code runs when the module is imported: not function or lambda bodies.

    A function's decorators and defaults run at import time, and so does a class body.
    """
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            stack.extend(node.decorator_list)
            stack.extend(node.args.defaults)
            stack.extend(d for d in node.args.kw_defaults if d is not None)
        elif isinstance(node, ast.Lambda):
            stack.extend(node.args.defaults)
        else:
            stack.extend(reversed(list(ast.iter_child_nodes(node))))


def source_registers_tools(
    source: str, filename: str = "<source>", package: str | None = None
) -> bool:
    """Whether module source registers tools at import time.

    ``package`` resolves relative imports. Raises SyntaxError for source that does not parse.
    """
    tree = ast.parse(source, filename)
    return _RegistrationFinder(package).registers(tree)


def module_registers_tools(path: str | os.PathLike[str], package: str | None = None) -> bool:
    """Whether the .py file at ``path`` registers tools. Raises OSError, SyntaxError."""
    path = Path(path)
    return source_registers_tools(path.read_text(encoding="utf-8"), str(path), package)


def find_tool_files(
    directory: str | os.PathLike[str],
    *,
    package: str | None = None,
    exclude: Iterable[str] = (),
) -> list[Path]:
    """The .py files directly in ``directory`` that register tools, sorted by name.

    Files whose name starts with "_" and names in ``exclude`` are skipped; so is a file
    that cannot be read or parsed, with a warning.
    """
    excluded = set(exclude)
    found = []
    for path in sorted(Path(directory).glob("*.py")):
        if path.name.startswith("_") or path.name in excluded or not path.is_file():
            continue
        try:
            registers = module_registers_tools(path, package)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError) as exc:
            log.warning("skipping tool module %s: %s: %s", path, type(exc).__name__, exc)
            continue
        if registers:
            found.append(path)
    return found


def _import_or_warn(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except Exception as exc:
        log.warning("skipping tool module %s: %s: %s", name, type(exc).__name__, exc)
        log.debug("import of %s failed", name, exc_info=True)
        return None


_builtin_lock = threading.Lock()
_builtin_modules: list[str] | None = None


def discover_builtin_tools(*, refresh: bool = False) -> list[str]:
    """Import the modules of the ``tools`` package that register tools; their names.

    Runs once per process, from :data:`BUILTIN_TOOL_MODULES`; later calls return the
    first answer (``refresh`` scans the package, importing modules that are new since).
    """
    global _builtin_modules
    with _builtin_lock:
        if _builtin_modules is not None and not refresh:
            return list(_builtin_modules)
        from hermes_sandbox import tools

        package = tools.__name__
        if refresh:
            directory = Path(tools.__file__).parent
            found = find_tool_files(directory, package=package, exclude=BUILTIN_EXCLUDED)
            stems = [path.stem for path in found]
        else:
            stems = list(BUILTIN_TOOL_MODULES)
        imported = []
        for stem in stems:
            name = f"{package}.{stem}"
            if stem in BUILTIN_TOOL_MODULES:
                with schemas_checked_elsewhere():
                    module = _import_or_warn(name)
            else:
                module = _import_or_warn(name)
            if module is not None:
                imported.append(name)
        _builtin_modules = imported
        return list(imported)


def discover_tools_directory(directory: str | os.PathLike[str]) -> list[ModuleType]:
    """Import the tool modules in a user's ``directory``; the modules imported.

    Each file is imported under a private name (``hermes_sandbox_user_tools_*``); a
    file already imported from the same path is not run again. While they import, the
    directory is on ``sys.path``, so tool files can import helper modules beside them.
    Raises :class:`ToolModuleError` when ``directory`` is not a directory.
    """
    root = Path(directory).resolve()
    if not root.is_dir():
        raise ToolModuleError(f"tools directory not found: {directory}")
    import hashlib  # not at import: every run discovers the built-in tools, few a directory

    tag = hashlib.sha1(str(root).encode()).hexdigest()[:8]
    modules = []
    on_path = str(root) in sys.path
    if not on_path:
        sys.path.insert(0, str(root))
    try:
        for path in find_tool_files(root):
            name = f"hermes_sandbox_user_tools_{tag}_{path.stem}"
            loaded = sys.modules.get(name)
            if loaded is not None and getattr(loaded, "__file__", None) == str(path):
                modules.append(loaded)
                continue
            try:
                modules.append(import_file(path, name))
            except ToolModuleError as exc:
                cause = exc.__cause__ or exc
                log.warning("skipping tool module %s: %s: %s", path, type(cause).__name__, cause)
                log.debug("import of %s failed", path, exc_info=True)
    finally:
        if not on_path:
            try:
                sys.path.remove(str(root))
            except ValueError:
                pass
    return modules


def discover_package(package: ModuleType | str) -> list[ModuleType]:
    """Import the submodules of a plugin package that register tools; the modules.

    Raises :class:`ToolModuleError` when ``package`` (a name) cannot be imported.
    """
    if isinstance(package, str):
        try:
            package = importlib.import_module(package)
        except Exception as exc:
            raise ToolModuleError(
                f"tools package {package} failed to import: {type(exc).__name__}: {exc}"
            ) from exc
    paths = getattr(package, "__path__", None)
    if not paths:
        return []
    modules = []
    for directory in paths:
        for path in find_tool_files(directory, package=package.__name__):
            module = _import_or_warn(f"{package.__name__}.{path.stem}")
            if module is not None:
                modules.append(module)
    return modules


__all__ = [
    "BUILTIN_EXCLUDED",
    "BUILTIN_TOOL_MODULES",
    "discover_builtin_tools",
    "discover_package",
    "discover_tools_directory",
    "find_tool_files",
    "module_registers_tools",
    "source_registers_tools",
]
