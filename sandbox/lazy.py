"""Names a package exports but imports at first use (PEP 562): a run on one backend
does not import the others, nor the command line the agent loops."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    package: str, names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` for the package named ``package`` (its
    ``__name__``): each of ``names`` (name -> the module that defines it) is imported at
    its first lookup and is a plain global of the package from then on."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # the next lookup is a plain global
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__
