"""Failure hints: one line of advice for the common ways a script fails."""

from __future__ import annotations

import pytest

from hermes_sandbox import execute_code
from hermes_sandbox.hints import failure_hint


@pytest.mark.parametrize(
    ("stderr", "expected"),
    [
        (
            "ImportError: cannot import name 'web_search' from 'hermes_tools' (/x)",
            "Tools you can import from hermes_tools here: read_file, terminal",
        ),
        (
            "ImportError: cannot import name 'retry' from 'hermes_tools'",
            "from hermes_tools import retry",
        ),
        ("NameError: name 'json_parse' is not defined", "from hermes_tools import json_parse"),
        ("NameError: name 'terminal' is not defined", "from hermes_tools import terminal"),
        (
            "ModuleNotFoundError: No module named 'pandas'",
            "neither beside the script nor installed for the sandbox's Python",
        ),
        ("TypeError: string indices must be integers, not 'str'", "return parsed values"),
        ("AttributeError: 'str' object has no attribute 'get'", "return parsed values"),
        (
            "TypeError: the JSON object must be str, bytes or bytearray, not dict",
            "do not json.loads()",
        ),
    ],
)
def test_rules(stderr, expected):
    hint = failure_hint("Traceback (most recent call last):\n" + stderr, ["read_file", "terminal"])
    assert hint is not None and expected in hint


@pytest.mark.parametrize(
    "stderr",
    ["", "ValueError: boom", "NameError: name 'undefined_thing' is not defined"],
)
def test_no_hint_for_ordinary_errors(stderr):
    assert failure_hint(stderr, ["read_file"]) is None


def test_a_failed_run_carries_its_hint():
    result = execute_code("from hermes_tools import web_search\n", tools=["read_file"], timeout=30)
    assert result.status == "error"
    assert "Tools you can import from hermes_tools here: read_file" in result.hint
    assert result.to_dict()["hint"] == result.hint


def test_a_successful_run_has_no_hint():
    result = execute_code("print('fine')\n", timeout=30)
    assert result.hint is None
    assert "hint" not in result.to_dict()


def test_a_missing_module_is_not_blamed_on_the_sandbox():
    """The hint for a missing module says it may be the script's own, not only that the
    sandbox lacks a package; one that is beside the script on the host but was not
    copied into the sandbox is named as such."""
    stderr = "Traceback (most recent call last):\nModuleNotFoundError: No module named 'helpers'"
    hint = failure_hint(stderr, [])
    assert hint is not None and "put it beside the script" in hint
    assert "is not installed" not in hint
    hint = failure_hint(stderr.replace("'helpers'", "'pkg.sub'"), [], beside={"pkg"})
    assert hint is not None and "'pkg' is beside the script on this host" in hint
