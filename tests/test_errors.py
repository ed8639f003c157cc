"""One exception root: every error class the package defines derives from SandboxError,
and the tree in hermes_sandbox/errors.py names each public one."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import hermes_sandbox
from hermes_sandbox import SandboxError, errors


def _package_modules():
    yield hermes_sandbox
    for info in pkgutil.walk_packages(hermes_sandbox.__path__, "hermes_sandbox."):
        name = info.name
        if name.rsplit(".", 1)[-1].startswith("_") or name.endswith("__main__"):
            continue  # programs shipped into the sandbox, and the CLI entry point
        yield importlib.import_module(name)


def _defined_exceptions():
    for module in _package_modules():
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
                and not name.startswith("_")
            ):
                yield value


def test_every_public_error_derives_from_the_root():
    found = list(_defined_exceptions())
    assert len(found) > 15
    strays = [f"{cls.__module__}.{cls.__qualname__}" for cls in found]
    strays = [s for s, cls in zip(strays, found, strict=True) if not issubclass(cls, SandboxError)]
    assert strays == []


def test_the_tree_is_drawn_with_every_public_error():
    drawing = errors.__doc__ or ""
    missing = [cls.__name__ for cls in _defined_exceptions() if cls.__name__ not in drawing]
    assert missing == []


def test_builtins_are_mixed_in_where_they_fit():
    assert issubclass(errors.ConnectionClosed, ConnectionError)
    assert issubclass(errors.SpawnNotAvailable, NotImplementedError)
    assert issubclass(errors.ToolsetError, ValueError)
