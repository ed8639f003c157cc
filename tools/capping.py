"""Fitting an over-long tool result in its tool's size cap (``max_result_size_chars``).

A JSON object stays valid JSON: its longest string fields are cut, each keeping its
head and tail around the omission marker of :mod:`hermes_sandbox.truncation`, and
``"truncated": true`` is set. Any other text, or an object that cannot be made to fit
that way, keeps its own head and tail around the marker.
"""

from __future__ import annotations

import json
from typing import Any

from hermes_sandbox.truncation import cut_middle, keep_ends, omission_marker

_MAX_JSON_ROUNDS = 32
# A string shorter than this gains nothing from a marker in its middle.
_MIN_CUTTABLE = 64


def cap_result(result: str, limit: int | None) -> str:
    """``result`` in at most ``limit`` characters (no cap when ``limit`` is None)."""
    if limit is None or len(result) <= limit:
        return result
    capped = _cap_json_object(result, limit)
    return capped if capped is not None else cut_middle(result, limit)


def _string_leaves(node: Any, found: list[tuple[Any, Any, str]]) -> list[tuple[Any, Any, str]]:
    """Every string value inside ``node``, as (container, key, text), added to ``found``."""
    items: Any
    if isinstance(node, dict):
        items = node.items()
    elif isinstance(node, list):
        items = enumerate(node)
    else:
        return found
    for key, value in items:
        if isinstance(value, str):
            found.append((node, key, value))
        else:
            _string_leaves(value, found)
    return found


def _json_cost(text: str) -> int:
    """Characters ``text`` takes inside JSON, quotes excluded (escapes count)."""
    return len(json.dumps(text, ensure_ascii=False)) - 2


def _cap_json_object(text: str, limit: int) -> str | None:
    """Cut the longest string fields of a JSON object until its text fits, or None."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    data["truncated"] = True
    leaves = [leaf for leaf in _string_leaves(data, []) if len(leaf[2]) >= _MIN_CUTTABLE]
    kept = [len(leaf[2]) for leaf in leaves]
    costs = [_json_cost(leaf[2]) for leaf in leaves]
    for _ in range(_MAX_JSON_ROUNDS):
        out = json.dumps(data, ensure_ascii=False)
        excess = len(out) - limit
        if excess <= 0:
            return out
        shrinkable = [j for j in range(len(leaves)) if kept[j] > 0]
        if not shrinkable:
            return None
        i = max(shrinkable, key=costs.__getitem__)
        container, key, original = leaves[i]
        budget = costs[i] - excess  # what this field may take for the whole to fit
        # The most characters to keep with the cut field within budget: every character
        # costs at least one (escapes more), so search below budget - marker.
        marker = len(omission_marker(len(original)))
        low, high = 0, max(min(kept[i] - 1, budget - marker), 0)
        while low < high:
            middle = (low + high + 1) // 2
            if _json_cost(keep_ends(original, middle)) <= budget:
                low = middle
            else:
                high = middle - 1
        kept[i] = low
        container[key] = keep_ends(original, low)
        costs[i] = _json_cost(container[key])
    return None


__all__ = ["cap_result"]
