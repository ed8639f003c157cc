"""Calling registered tools the way a script's call reaches them: through the registry's
``adispatch``, with a :class:`ToolContext` on a real :class:`LocalEnvironment` whose
working directory is a fresh workspace. conftest imports the fixtures, so every test
file gets them; the ``*_hermes_cases`` files use them for the reference's tool cases.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from hermes_sandbox.environments.local import LocalEnvironment
from hermes_sandbox.tools import load_builtin_tools
from hermes_sandbox.tools.registry import ToolContext, ToolRegistry, registry

CALL_DEADLINE = 60.0  # generous: a hung tool fails the test instead of the whole run


@pytest.fixture
async def tool_env() -> AsyncIterator[LocalEnvironment]:
    """A started LocalEnvironment (this host), closed after the test."""
    async with LocalEnvironment() as environment:
        yield environment


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """An empty directory, the tools' working directory (resolved: no symlinks)."""
    directory = tmp_path.resolve() / "ws"
    directory.mkdir()
    return directory


@pytest.fixture
def tool_ctx(tool_env: LocalEnvironment, workspace: Path) -> ToolContext:
    """The context dispatch hands a tool: task "t", ``workspace`` as its cwd."""
    load_builtin_tools()
    return ToolContext(task_id="t", environment=tool_env, cwd=str(workspace))


async def call_tool(
    ctx: ToolContext, name: str, reg: ToolRegistry | None = None, /, **args: Any
) -> Any:
    """``name(**args)`` through ``reg`` (default: the global registry); its parsed result."""
    with anyio.fail_after(CALL_DEADLINE):
        text = await (registry if reg is None else reg).adispatch(name, args, ctx)
    return json.loads(text)
