"""Helpers for the patch tool's tests: calling it as a script would, and looking at files."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import hermes_sandbox.tools.patch_tool  # noqa: F401  (registers the patch tool)
from hermes_sandbox.tools.registry import ToolContext, registry


async def call(ctx: ToolContext, **args: Any) -> dict[str, Any]:
    """The patch tool's result, through ``registry.adispatch`` like a script's call."""
    return json.loads(await registry.adispatch("patch", args, ctx))


def v4a(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root, by relative path, with its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }
