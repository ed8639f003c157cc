"""Hermes Agent's own argument-coercion cases, run against tools.arguments.

Each case comes from hermes-agent's coercion tests (tests/tools/test_tool_arg_coercion.py
in its repository: TestCoerceNumber, TestCoerceBoolean, TestCoerceValue, TestCoerceToolArgs)
or from tests/test_model_tools.py::TestCoerceNumberInfNan; the comment on each names it.
Their helpers ``_coerce_number(text)``, ``_coerce_boolean(text)`` and
``_coerce_value(text, type)`` become a one-field schema of that type here; their
``coerce_tool_args(tool, args)`` becomes a registered tool's own argument handling.
Cases where this project deliberately differs assert its own behaviour and are marked
``DIFFERENT``; docs/compatibility.md lists each with the reason.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from hermes_sandbox.tools import load_builtin_tools
from hermes_sandbox.tools.arguments import ToolArguments
from hermes_sandbox.tools.registry import ToolRegistry, registry


def coerce(schema: dict[str, Any], value: Any) -> Any:
    """``value`` coerced for a field whose schema is ``schema``."""
    arguments = ToolArguments({"type": "object", "properties": {"x": schema}})
    return arguments.coerce({"x": value})["x"]


NUMBER = {"type": "number"}
INTEGER = {"type": "integer"}
BOOLEAN = {"type": "boolean"}

# (reference case, schema, text, expected value, expected type)
SCALAR_CASES = [
    ("TestCoerceNumber.test_integer_string", NUMBER, "42", 42, int),
    ("TestCoerceNumber.test_negative_integer", NUMBER, "-7", -7, int),
    ("TestCoerceNumber.test_zero", NUMBER, "0", 0, int),
    ("TestCoerceNumber.test_float_string", NUMBER, "3.14", 3.14, float),
    ("TestCoerceNumber.test_integer_only_rejects_float", INTEGER, "3.14", "3.14", str),
    ("TestCoerceNumber.test_integer_only_accepts_whole", INTEGER, "42", 42, int),
    ("TestCoerceNumber.test_not_a_number", NUMBER, "hello", "hello", str),
    ("TestCoerceNumber.test_empty_string", NUMBER, "", "", str),
    ("TestCoerceNumber.test_large_number", NUMBER, "1000000", 1000000, int),
    ("TestCoerceNumber.test_scientific_notation", NUMBER, "1e5", 100000, None),
    ("TestCoerceNumber.test_negative_float", NUMBER, "-2.5", -2.5, float),
    ("TestCoerceNumberInfNan.test_inf_returns_original_string", NUMBER, "inf", "inf", str),
    (
        "TestCoerceNumberInfNan.test_negative_inf_returns_original_string",
        NUMBER,
        "-inf",
        "-inf",
        str,
    ),
    ("TestCoerceNumberInfNan.test_nan_returns_original_string", NUMBER, "nan", "nan", str),
    (
        "TestCoerceNumberInfNan.test_infinity_spelling_returns_original_string",
        NUMBER,
        "Infinity",
        "Infinity",
        str,
    ),
    ("TestCoerceNumberInfNan.test_normal_numbers_still_coerce[42]", NUMBER, "42", 42, int),
    ("TestCoerceNumberInfNan.test_normal_numbers_still_coerce[3.14]", NUMBER, "3.14", 3.14, float),
    ("TestCoerceNumberInfNan.test_normal_numbers_still_coerce[1e3]", NUMBER, "1e3", 1000, None),
    ("TestCoerceBoolean.test_true_lowercase", BOOLEAN, "true", True, bool),
    ("TestCoerceBoolean.test_false_lowercase", BOOLEAN, "false", False, bool),
    ("TestCoerceBoolean.test_true_mixed_case", BOOLEAN, "True", True, bool),
    ("TestCoerceBoolean.test_false_mixed_case", BOOLEAN, "False", False, bool),
    ("TestCoerceBoolean.test_true_with_whitespace", BOOLEAN, "  true  ", True, bool),
    ("TestCoerceBoolean.test_not_a_boolean", BOOLEAN, "yes", "yes", str),
    ("TestCoerceBoolean.test_one_zero_not_coerced[1]", BOOLEAN, "1", "1", str),
    ("TestCoerceBoolean.test_one_zero_not_coerced[0]", BOOLEAN, "0", "0", str),
    ("TestCoerceBoolean.test_empty_string", BOOLEAN, "", "", str),
    ("TestCoerceValue.test_integer_type", INTEGER, "5", 5, int),
    ("TestCoerceValue.test_number_type", NUMBER, "3.14", 3.14, float),
    ("TestCoerceValue.test_boolean_type", BOOLEAN, "true", True, bool),
    ("TestCoerceValue.test_string_type_passthrough", {"type": "string"}, "hello", "hello", str),
    ("TestCoerceValue.test_unknown_type_passthrough", {"type": "object"}, "stuff", "stuff", str),
    (
        "TestCoerceValue.test_union_type_falls_through",
        {"type": ["integer", "boolean"]},
        "hello",
        "hello",
        str,
    ),
    (
        "TestCoerceValue.test_union_with_string_preserves_original",
        {"type": ["number", "string"]},
        "hello",
        "hello",
        str,
    ),
]


@pytest.mark.parametrize(
    ("schema", "text", "expected", "kind"),
    [pytest.param(*case[1:], id=case[0]) for case in SCALAR_CASES],
)
def test_scalar_coercion(
    schema: dict[str, Any], text: str, expected: Any, kind: type | None
) -> None:
    value = coerce(schema, text)
    assert value == expected
    if kind is not None:
        assert type(value) is kind


# TestCoerceNumberInfNan.test_coerced_result_is_strict_json_safe
@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "Infinity"])
def test_coerced_number_is_strict_json(text: str) -> None:
    json.dumps({"x": coerce(NUMBER, text)}, allow_nan=False)


# DIFFERENT from TestCoerceNumber.test_float_with_zero_fractional, which wants "3.0" to
# become int 3: here a number field gets what the JSON text 3.0 parses to, a float, so a
# quoted and an unquoted number reach the handler alike (3.0 == 3 all the same).
def test_whole_float_text_stays_a_float_DIFFERENT() -> None:
    value = coerce(NUMBER, "3.0")
    assert value == 3 and type(value) is float
    assert value == json.loads("3.0") and type(value) is type(json.loads("3.0"))
    assert type(coerce(INTEGER, "3.0")) is int  # an integer field still gets an int


# DIFFERENT from TestCoerceValue.test_union_type_prefers_first_match, which turns "42" into
# 42 for type [integer, string]: here text that the schema already accepts as a string is
# left alone, so an id such as "007" is not changed into 7.
@pytest.mark.parametrize("text", ["42", "007"])
def test_text_a_union_accepts_is_kept_DIFFERENT(text: str) -> None:
    assert coerce({"type": ["integer", "string"]}, text) == text
    assert coerce({"type": ["integer", "null"]}, text) == int(text)  # no string: converted


# -- coerce_tool_args: a registered tool's own argument handling -----------------------

SCHEMA_CASES = [
    # (reference case, properties, args sent, args the handler gets)
    (
        "TestCoerceToolArgs.test_coerces_integer_arg",
        {"limit": INTEGER},
        {"limit": "10"},
        {"limit": 10},
    ),
    (
        "TestCoerceToolArgs.test_coerces_boolean_arg",
        {"merge": BOOLEAN},
        {"merge": "true"},
        {"merge": True},
    ),
    (
        "TestCoerceToolArgs.test_coerces_number_arg",
        {"temperature": NUMBER},
        {"temperature": "0.7"},
        {"temperature": 0.7},
    ),
    (
        "TestCoerceToolArgs.test_leaves_string_args_alone",
        {"path": {"type": "string"}},
        {"path": "/tmp/file.txt"},
        {"path": "/tmp/file.txt"},
    ),
    (
        "TestCoerceToolArgs.test_leaves_already_correct_types",
        {"limit": INTEGER},
        {"limit": 10},
        {"limit": 10},
    ),
    ("TestCoerceToolArgs.test_empty_args", {}, {}, {}),
    (
        "TestCoerceToolArgs.test_preserves_non_string_values",
        {"items": {"type": "array"}, "config": {"type": "object"}},
        {"items": [1, 2, 3], "config": {"key": "val"}},
        {"items": [1, 2, 3], "config": {"key": "val"}},
    ),
    (
        "TestCoerceToolArgs.test_extra_args_without_schema_left_alone",
        {"limit": INTEGER},
        {"limit": "10", "extra": "42"},
        {"limit": 10, "extra": "42"},
    ),
    (
        "TestCoerceToolArgs.test_mixed_coercion",
        {"offset": INTEGER, "limit": INTEGER, "full": BOOLEAN, "path": {"type": "string"}},
        {"offset": "1", "limit": "500", "full": "false", "path": "readme.md"},
        {"offset": 1, "limit": 500, "full": False, "path": "readme.md"},
    ),
]


def echo_tool(properties: dict[str, Any]) -> ToolRegistry:
    """A registry holding ``echo``, which returns the arguments it was handed."""
    reg = ToolRegistry()
    schema = {
        "name": "echo",
        "description": "Return the arguments.",
        "parameters": {"type": "object", "properties": properties},
    }
    reg.register(name="echo", toolset="test", schema=schema, handler=lambda args: dict(args))
    return reg


@pytest.mark.parametrize(
    ("properties", "sent", "received"),
    [pytest.param(*case[1:], id=case[0]) for case in SCHEMA_CASES],
)
def test_tool_arguments_coerced(
    properties: dict[str, Any], sent: dict[str, Any], received: dict[str, Any]
) -> None:
    got = json.loads(echo_tool(properties).dispatch("echo", sent))
    assert got == received
    assert [type(v) for v in got.values()] == [type(v) for v in received.values()]


# TestCoerceToolArgs.test_none_args: no arguments at all are no arguments, not an error.
def test_no_arguments() -> None:
    assert ToolArguments({"type": "object", "properties": {}}).coerce(None) is None
    assert json.loads(echo_tool({}).dispatch("echo", None)) == {}  # type: ignore[arg-type]


# TestCoerceToolArgs.test_failed_coercion_preserves_original: the text is kept as sent;
# validation then refuses the call, naming the field (the handler never sees it).
def test_failed_coercion_keeps_the_text() -> None:
    schema = {"type": "object", "properties": {"limit": INTEGER}}
    assert ToolArguments(schema).coerce({"limit": "not_a_number"}) == {"limit": "not_a_number"}
    refused = json.loads(echo_tool({"limit": INTEGER}).dispatch("echo", {"limit": "not_a_number"}))
    assert "args.limit" in refused["error"] and "not_a_number" in refused["error"]


# TestCoerceToolArgs.test_real_read_file_schema
def test_real_read_file_schema() -> None:
    load_builtin_tools()
    arguments = registry.get("read_file").arguments
    assert arguments is not None
    got = arguments.coerce({"path": "foo.py", "offset": "10", "limit": "100"})
    assert got == {"path": "foo.py", "offset": 10, "limit": 100}
    assert type(got["offset"]) is int and type(got["limit"]) is int


# TestCoerceToolArgs.test_unknown_tool_returns_args_unchanged: a tool with no schema gets
# nothing coerced; the call itself is "Unknown tool", as Hermes's own dispatch answers it.
def test_unknown_tool_is_not_coerced() -> None:
    result = json.loads(ToolRegistry().dispatch("unknown_tool", {"limit": "10"}))
    assert result == {"error": "Unknown tool: unknown_tool"}


# -- the newer reference module, tests/tools/test_arg_coercion.py ------------------------

OBJECTS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"id": {"type": "string"}, "content": {"type": "string"}},
    },
}

NESTED_CASES = [
    # (reference case, field schema, value sent, value the handler gets)
    (
        "TestCoerceValue.test_array_type_parsed_from_json_string[strings]",
        {"type": "array"},
        '["a", "b"]',
        ["a", "b"],
    ),
    (
        "TestCoerceValue.test_array_type_parsed_from_json_string[ints]",
        {"type": "array"},
        "[1, 2, 3]",
        [1, 2, 3],
    ),
    (
        "TestNormalizeJsonStringsForSchema.test_parses_json_string_array_when_schema_expects_array",
        {"type": "array", "items": {"type": "string"}},
        '["git status", "bun test"]',
        ["git status", "bun test"],
    ),
    (
        "TestNormalizeJsonStringsForSchema.test_native_list_preserved_identity",
        {"type": "array", "items": {"type": "object", "properties": {}}},
        [{"id": "1"}],
        [{"id": "1"}],
    ),
    (
        "TestCoerceToolArgsNested.test_array_elements_as_json_strings_are_parsed",
        OBJECTS,
        ['{"id": "1", "content": "x"}'],
        [{"id": "1", "content": "x"}],
    ),
    (
        "TestCoerceToolArgsNested.test_string_subfield_with_json_content_preserved",
        OBJECTS,
        [{"id": "1", "content": '{"not": "parsed"}'}],
        [{"id": "1", "content": '{"not": "parsed"}'}],
    ),
]


@pytest.mark.parametrize(
    ("schema", "sent", "received"),
    [pytest.param(*case[1:], id=case[0]) for case in NESTED_CASES],
)
def test_nested_json_text_coerced(schema: dict[str, Any], sent: Any, received: Any) -> None:
    assert coerce(schema, sent) == received


def strict_echo(properties: dict[str, Any], additional: bool | None) -> ToolRegistry:
    reg = ToolRegistry()
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if additional is not None:
        parameters["additionalProperties"] = additional
    reg.register(
        name="echo",
        toolset="test",
        schema={"parameters": parameters},
        handler=lambda args: dict(args),
    )
    return reg


PROJECTION_CASES = [
    # (reference case, properties, additionalProperties, args sent, args the handler gets)
    (
        "TestProjectToolArgs.test_preserves_declared_args",
        {"command": {"type": "string"}, "timeout": INTEGER},
        None,
        {"command": "ls", "timeout": 30},
        {"command": "ls", "timeout": 30},
    ),
    (
        "TestProjectToolArgs.test_additional_properties_true_keeps_unknown",
        {"method": {"type": "string"}},
        True,
        {"method": "Page.navigate", "extra": "kept"},
        {"method": "Page.navigate", "extra": "kept"},
    ),
    ("TestProjectToolArgs.test_empty_args", {}, None, {}, {}),
    (
        "TestProjectToolArgs.test_no_properties_returns_args",
        {},
        None,
        {"command": "ls"},
        {"command": "ls"},
    ),
]


@pytest.mark.parametrize(
    ("properties", "additional", "sent", "received"),
    [pytest.param(*case[1:], id=case[0]) for case in PROJECTION_CASES],
)
def test_declared_arguments_reach_the_handler(
    properties: dict[str, Any],
    additional: bool | None,
    sent: dict[str, Any],
    received: dict[str, Any],
) -> None:
    assert json.loads(strict_echo(properties, additional).dispatch("echo", sent)) == received


# TestProjectToolArgs.test_strips_unknown_arg and
# test_additional_properties_false_strips_unknown: DIFFERENT. There an argument that a
# schema with additionalProperties false does not declare is silently dropped; here the
# call is refused naming the field and the allowed ones, so the model sees its mistake.
# Either way the handler never sees the argument.
@pytest.mark.parametrize(
    ("properties", "sent", "unknown"),
    [
        pytest.param(
            {"command": {"type": "string"}},
            {"command": "ls", "force": True},
            "force",
            id="strips_unknown_arg",
        ),
        pytest.param(
            {"prompt": {"type": "string"}},
            {"prompt": "hello", "sneaky": True},
            "sneaky",
            id="additional_properties_false_strips_unknown",
        ),
    ],
)
def test_undeclared_argument_is_refused_DIFFERENT(
    properties: dict[str, Any], sent: dict[str, Any], unknown: str
) -> None:
    seen: list[dict[str, Any]] = []
    reg = ToolRegistry()
    parameters = {"type": "object", "properties": properties, "additionalProperties": False}
    reg.register(name="t", toolset="test", schema={"parameters": parameters}, handler=seen.append)
    result = json.loads(reg.dispatch("t", sent))
    assert f"args.{unknown}" in result["error"] and "unknown field" in result["error"]
    assert seen == []
