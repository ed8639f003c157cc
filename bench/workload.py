"""The tools every round trip calls, on our side and the baselines', and their answers.

``echo`` returns its arguments; ``blob`` returns ``{"data": "x" * size}``, for the
large-payload rows. Both return JSON text, as every tool does, and ``blob`` builds each
size once, so the round trip measures moving the result, not making it.
"""

from __future__ import annotations

import functools
import json
from typing import Any

ECHO_MESSAGE = "0123456789abcdef"  # 16 bytes, the payload the reference's figure used
MiB = 1 << 20


def echo_tool(args: dict[str, Any]) -> str:
    return json.dumps(args)


@functools.lru_cache(maxsize=8)
def _blob(size: int) -> str:
    return json.dumps({"data": "x" * size})


def blob_tool(args: dict[str, Any]) -> str:
    return _blob(int(args["size"]))


HOST_TOOLS = {"echo": echo_tool, "blob": blob_tool}

ECHO_SCHEMA = {
    "name": "echo",
    "description": "Return the arguments unchanged.",
    "parameters": {
        "type": "object",
        "properties": {"msg": {"type": "string"}},
        "required": ["msg"],
    },
}
BLOB_SCHEMA = {
    "name": "blob",
    "description": "Return {'data': 'x' * size}.",
    "parameters": {
        "type": "object",
        "properties": {"size": {"type": "integer"}},
        "required": ["size"],
    },
}


def call_spec(tool: str, size: int = 0) -> tuple[dict[str, Any], Any]:
    """The arguments of one call and a cheap check of its answer: for ``echo`` the
    whole answer, for ``blob`` the length of its data."""
    if tool in ("echo", "pecho"):
        return {"msg": ECHO_MESSAGE}, {"msg": ECHO_MESSAGE}
    if tool == "blob":
        return {"size": size}, size
    raise ValueError(f"no such benchmark tool: {tool}")
