"""One-line hints for the common ways a script fails, read off its stderr.

The first rule that matches wins; the scan is bounded and never raises.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence

HELPERS = ("json_parse", "shell_quote", "retry")
_SCAN_CHARS = 8000

HintRule = tuple[re.Pattern[str], Callable[[re.Match[str], Sequence[str]], str]]
_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


def _missing_import(match: re.Match[str], tools: Sequence[str]) -> str:
    name = match.group(1)
    if name in HELPERS:
        return f"Import the helper as `from hermes_tools import {name}`; it exists in every run."
    available = ", ".join(tools) if tools else "none"
    return (
        f"'{name}' cannot be called from a script in this run. Tools you can import from "
        f"hermes_tools here: {available}. Call anything else as a normal tool call."
    )


BWRAP_FAILED = (
    "bubblewrap (bwrap) could not start the script here. If it worked here before, the "
    "cached result of its probe was dropped: the next run probes bwrap again (and under "
    "--isolation auto runs without it if it no longer works). --isolation none runs "
    "without bwrap."
)
# bwrap's own failure, before the script started (environments/local.py drops the
# cached probe result when it sees one).
_BWRAP_FAILED = re.compile(r"\Abwrap: ")


def bwrap_failure_hint(stderr: str) -> str | None:
    """:data:`BWRAP_FAILED` if ``stderr`` is bwrap's failure to start a program."""
    return BWRAP_FAILED if _BWRAP_FAILED.match(stderr.lstrip()) else None


_RULES: tuple[HintRule, ...] = (
    (_BWRAP_FAILED, lambda m, _: BWRAP_FAILED),
    (re.compile(r"cannot import name '(\w+)' from 'hermes_tools'"), _missing_import),
    (re.compile(r"module 'hermes_tools' has no attribute '(\w+)'"), _missing_import),
    (
        re.compile(r"NameError: name '(json_parse|shell_quote|retry)' is not defined"),
        lambda m, _: f"Import it first: from hermes_tools import {m.group(1)}",
    ),
    (
        re.compile(r"NameError: name '(\w+)' is not defined"),
        lambda m, tools: (
            f"Import the tool first: from hermes_tools import {m.group(1)}"
            if m.group(1) in tools
            else ""
        ),
    ),
    (
        _MISSING_MODULE,
        lambda m, _: (
            f"No module named '{m.group(1)}' where the script runs: it is neither beside "
            "the script nor installed for the sandbox's Python. If it is your own module, "
            "put it beside the script; else use the standard library, or run a program "
            "that has it through terminal()."
        ),
    ),
    (
        re.compile(
            r"TypeError: string indices must be integers"
            r"|AttributeError: 'str' object has no attribute 'get'"
            r"|TypeError: the JSON object must be str, bytes or bytearray, not dict"
        ),
        lambda m, _: (
            "Tool functions return parsed values (a dict for the built-in tools): do not "
            "json.loads() them or index them like strings, e.g. read_file(path)['content']."
        ),
    ),
    (
        re.compile(r"hermes_tools\.ToolCallError: (\w+)\(\): lost the connection"),
        lambda m, _: (
            f"The connection to the host broke during {m.group(1)}(); the run was probably "
            "ending (timeout or interrupt). Make the script do less per run."
        ),
    ),
)


def _unstaged_module(name: str) -> str:
    return (
        f"'{name}' is beside the script on this host, but only the one-file modules "
        "beside it that the script imports by name are copied into this sandbox: make it "
        "one .py file, or mount its directory into the sandbox (e.g. the docker "
        "backend's volumes)."
    )


def failure_hint(
    stderr: str, tools: Sequence[str] = (), *, beside: Collection[str] = ()
) -> str | None:
    """A one-line hint for a failed script's stderr, or None. ``beside``: the modules
    beside the script on this host that the sandbox may not see."""
    if not stderr:
        return None
    window = stderr[-_SCAN_CHARS:]
    try:
        missing = _MISSING_MODULE.search(window)
        if missing and missing.group(1).split(".")[0] in beside:
            return _unstaged_module(missing.group(1).split(".")[0])
        for pattern, make_hint in _RULES:
            match = pattern.search(window)
            if match:
                return make_hint(match, tools) or None
    except Exception:  # a hint is a nicety: never let it break a result
        return None
    return None
