"""Argument coercion and validation (tools.arguments): the rules one by one, the problem
messages, and the fast path (fastjsonschema) agreeing with jsonschema on generated instances."""

from __future__ import annotations

import functools
from typing import Any

import fastjsonschema
import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_sandbox.tools.arguments import ToolArguments, fast_validator

READ_FILE = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "offset": {"type": "integer", "minimum": 1, "default": 1},
        "limit": {"type": "integer", "minimum": 1, "default": 500},
    },
    "required": ["path"],
}


def coerce(schema: dict[str, Any], value: Any) -> Any:
    """Coerce ``value`` for a one-field object schema whose field ``x`` has ``schema``."""
    args = ToolArguments({"type": "object", "properties": {"x": schema}, "required": ["x"]})
    return args.coerce({"x": value})["x"]


@pytest.mark.parametrize(
    ("schema", "value", "expected"),
    [
        ({"type": "integer"}, "42", 42),
        ({"type": "integer"}, " -7 ", -7),
        ({"type": "integer"}, "4.0", 4),
        ({"type": "integer"}, 4.0, 4),
        ({"type": "number"}, "4.5", 4.5),
        ({"type": "number"}, "42", 42),
        ({"type": "number"}, "1e3", 1000.0),
        ({"type": "boolean"}, "true", True),
        ({"type": "boolean"}, "FALSE", False),
        ({"type": "boolean"}, "True", True),
        ({"type": "array"}, "[1, 2]", [1, 2]),
        ({"type": "array", "items": {"type": "string"}}, "['a', 'b']", ["a", "b"]),
        ({"type": "object"}, '{"a": 1}', {"a": 1}),
        ({"type": "array", "items": {"type": "string"}}, "https://a.com", ["https://a.com"]),
        ({"type": "array", "items": {"type": "integer"}}, "5", [5]),
        ({"type": "array", "items": {"type": "integer"}}, 5, [5]),
        ({"type": "array"}, ("a", "b"), ["a", "b"]),
        ({"type": ["integer", "null"]}, "null", None),
        ({"type": ["integer", "null"]}, "NULL", None),
        ({"type": ["integer", "null"]}, "12", 12),
        ({"type": ["string", "integer"]}, "42", "42"),  # already fits: kept
        ({"enum": [1, 2, 3]}, "2", 2),
        ({"type": "integer", "enum": [1, 2, 3]}, "2", 2),
    ],
)
def test_coercion_rules(schema, value, expected):
    result = coerce(schema, value)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        ({"type": "integer"}, "abc"),
        ({"type": "integer"}, "4.5"),
        ({"type": "integer"}, "1_000"),
        ({"type": "integer"}, True),
        ({"type": "number"}, "nan"),
        ({"type": "number"}, "inf"),
        ({"type": "boolean"}, "yes"),
        ({"type": "boolean"}, 1),
        ({"type": "object"}, "[1]"),
        ({"type": "object"}, "not json"),
        ({"type": "string"}, 42),
        ({"type": "integer"}, None),
    ],
)
def test_nothing_fits_keeps_the_original(schema, value):
    result = coerce(schema, value)
    assert result == value
    assert type(result) is type(value)


def test_any_of_branches_are_tried_in_order():
    first_integer = {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}
    assert coerce(first_integer, "5") == 5
    assert coerce(first_integer, "true") is True
    first_array = {"anyOf": [{"type": "array", "items": {"type": "integer"}}, {"type": "integer"}]}
    assert coerce(first_array, "5") == [5]  # the first branch that fits after coercion wins
    assert coerce(first_array, 5) == 5  # a value that already fits a branch is kept
    one_of = {"oneOf": [{"type": "null"}, {"type": "number"}]}
    assert coerce(one_of, "2.5") == 2.5
    assert coerce(one_of, "null") is None
    assert coerce(one_of, "zzz") == "zzz"


def test_any_of_object_branches_coerce_inside():
    schema = {
        "anyOf": [
            {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
            {"type": "integer"},
        ]
    }
    assert coerce(schema, {"n": "3"}) == {"n": 3}
    assert coerce(schema, '{"n": "3"}') == {"n": 3}
    assert coerce(schema, "7") == 7
    with_text = {"anyOf": [*schema["anyOf"], {"type": "string"}]}
    assert coerce(with_text, '{"n": "3"}') == '{"n": "3"}'  # it fits the string branch


def test_nested_objects_and_array_items_are_coerced_recursively():
    args = ToolArguments(
        {
            "type": "object",
            "properties": {
                "jobs": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": {"type": "integer"},
                            "tags": {"type": "array", "items": {"type": "string"}},
                            "opts": {
                                "type": "object",
                                "additionalProperties": {"type": "boolean"},
                            },
                        },
                    },
                },
                "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "number"}]},
            },
        }
    )
    given_args = {
        "jobs": '[{"id": "1", "tags": "x", "opts": {"a": "true"}}, {"id": 2}]',
        "pair": ["1", "2.5"],
    }
    coerced = args.coerce(given_args)
    assert coerced == {
        "jobs": [{"id": 1, "tags": ["x"], "opts": {"a": True}}, {"id": 2}],
        "pair": [1, 2.5],
    }
    assert given_args["pair"] == ["1", "2.5"]  # the input is never modified
    assert args.problems(coerced) == []


def test_ref_to_defs_is_followed():
    args = ToolArguments(
        {
            "type": "object",
            "$defs": {"count": {"type": "integer", "minimum": 0}},
            "properties": {"n": {"$ref": "#/$defs/count"}},
        }
    )
    assert args.coerce({"n": "3"}) == {"n": 3}
    assert [str(p) for p in args.problems({"n": -1})] == ["args.n: expected a number >= 0, got -1"]


def test_null_for_an_optional_field_means_not_given():
    args = ToolArguments(READ_FILE)
    assert args.coerce({"path": "a", "limit": "null"}) == {"path": "a"}
    assert args.coerce({"path": "a", "limit": None}) == {"path": "a"}
    # a string field keeps the text "null"; a required field keeps null for validation
    assert args.coerce({"path": "null"}) == {"path": "null"}
    required = ToolArguments(
        {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    )
    assert required.coerce({"n": "null"}) == {"n": "null"}
    assert [str(p) for p in required.problems({"n": None})] == [
        "args.n: expected integer, got None"
    ]


def test_null_text_for_an_optional_array_is_dropped_not_wrapped():
    args = ToolArguments(
        {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "paths": {"type": "array", "items": {"type": "string"}},
                "maybe": {"type": ["array", "null"], "items": {"type": "string"}},
                "names": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["names"],
        }
    )
    # optional, null not allowed: "null" in any case means "not given", as None does
    assert args.coerce({"names": [], "paths": "null"}) == {"names": []}
    assert args.coerce({"names": [], "paths": " NULL "}) == {"names": []}
    assert args.coerce({"names": [], "paths": None}) == {"names": []}
    # null allowed: "null" is None; a required array still wraps the bare value
    assert args.coerce({"names": [], "maybe": "null"}) == {"names": [], "maybe": None}
    assert args.coerce({"names": "null"}) == {"names": ["null"]}
    # other bare text is still wrapped, and JSON text still parsed
    assert args.coerce({"names": [], "paths": "a.txt"}) == {"names": [], "paths": ["a.txt"]}
    assert args.coerce({"names": [], "paths": '["a", "b"]'}) == {"names": [], "paths": ["a", "b"]}


def test_any_of_branches_that_refer_elsewhere_are_fitted_exactly():
    args = ToolArguments(
        {
            "type": "object",
            "$defs": {"n": {"type": "integer"}},
            "properties": {"x": {"anyOf": [{"$ref": "#/$defs/n"}, {"type": "boolean"}]}},
        }
    )
    assert args.coerce({"x": "5"}) == {"x": 5}
    assert args.coerce({"x": "true"}) == {"x": True}
    assert args.coerce({"x": 5}) == {"x": 5}


def test_coercion_returns_the_same_object_when_nothing_changes():
    args = ToolArguments(READ_FILE)
    given_args = {"path": "a", "offset": 2}
    assert args.coerce(given_args) is given_args


# ---------------------------------------------------------------------- validation


def messages(schema: dict[str, Any], value: Any) -> list[str]:
    args = ToolArguments(schema)
    return [str(p) for p in args.problems(args.coerce(value))]


def test_problem_names_the_field_and_what_was_expected():
    assert messages(READ_FILE, {"path": "a", "limit": "abc"}) == [
        "args.limit: expected integer, got 'abc'"
    ]


def test_missing_required_fields_are_named():
    schema = {**READ_FILE, "required": ["path", "mode"]}
    assert messages(schema, {"limit": 3}) == [
        "args.mode: required field missing",
        "args.path: required field missing",
    ]


def test_all_problems_are_listed_up_to_five():
    schema = {
        "type": "object",
        "properties": {f"f{i}": {"type": "integer"} for i in range(8)},
    }
    found = messages(schema, {f"f{i}": "x" for i in range(8)})
    assert len(found) == 6
    assert found[:5] == [f"args.f{i}: expected integer, got 'x'" for i in range(5)]
    assert found[5] == "...: and 3 more problems"


def test_unknown_fields_are_refused_only_when_the_schema_says_so():
    assert messages(READ_FILE, {"path": "a", "colour": "red"}) == []
    closed = {**READ_FILE, "additionalProperties": False}
    assert messages(closed, {"path": "a", "colour": "red"}) == [
        "args.colour: unknown field (allowed: path, offset, limit)"
    ]


def test_nested_paths_and_keyword_messages():
    schema = {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "minLength": 2},
                        "kind": {"enum": ["a", "b"]},
                    },
                    "required": ["name"],
                },
                "maxItems": 3,
            },
            "code": {"type": "string", "pattern": "^[A-Z]+$"},
            "ratio": {"type": "number", "exclusiveMaximum": 1},
            "either": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "odd key": {"type": "integer"},
        },
    }
    found = messages(
        schema,
        {
            "items": [{"name": "ok"}, {"name": "x", "kind": "c"}, {}],
            "code": "abc",
            "either": "zz",
        },
    )
    assert found == [
        "args.code: expected text matching /^[A-Z]+$/, got 'abc'",
        "args.either: expected integer or null, got 'zz'",
        "args.items[1].kind: expected one of 'a', 'b'; got 'c'",
        "args.items[1].name: expected at least 2 characters, got 1",
        "args.items[2].name: required field missing",
    ]
    assert "args[\"odd key\"]: expected integer, got 'q'" in messages(schema, {"odd key": "q"})
    assert messages(schema, {"ratio": 1}) == ["args.ratio: expected a number < 1, got 1"]


def test_long_values_are_shortened_in_messages():
    (message,) = messages(READ_FILE, {"path": "a", "limit": "x" * 500})
    assert len(message) < 100
    assert message.endswith("...")


def test_an_invalid_schema_is_refused_at_once():
    with pytest.raises(ValueError, match="invalid parameters schema"):
        ToolArguments({"type": "object", "properties": {"x": {"type": "integr"}}})
    with pytest.raises(ValueError, match="invalid parameters schema"):
        ToolArguments({"type": "object", "minProperties": -1})


def test_schemas_beyond_the_fast_subset_use_jsonschema():
    schema = {
        "type": "object",
        "patternProperties": {"^n_": {"type": "integer"}},
        "additionalProperties": False,
    }
    args = ToolArguments(schema)
    assert args.problems({"n_a": 1}) == []
    assert args.problems({"n_a": "x"}) != []
    assert args.problems({"other": 1}) != []


def test_validation_fills_in_no_defaults_and_checks_no_formats():
    args = ToolArguments(READ_FILE)
    given_args = {"path": "a"}
    assert args.prepare(given_args) == ({"path": "a"}, [])
    assert given_args == {"path": "a"}
    email = {"type": "object", "properties": {"to": {"type": "string", "format": "email"}}}
    assert messages(email, {"to": "not an address"}) == []


# Schemas that fastjsonschema (draft 7) reads differently from jsonschema's Draft 2020-12, each
# with a value the two judge differently.
READ_DIFFERENTLY = [
    ({"type": "array", "prefixItems": [{"type": "integer"}]}, ["x"]),
    ({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n", "minimum": 3}, 1),
    ({"type": "number", "multipleOf": 0.01}, 19.01),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, {"a": 1}),
    ({"properties": {"a": {}}, "unevaluatedProperties": False}, {"a": 1, "b": 2}),
    ({"type": "array", "contains": {"type": "integer"}, "minContains": 2}, [1, "a"]),
    ({"type": "string", "contentEncoding": "base64"}, "not base64!"),
    ({"type": "object", "dependencies": {"a": ["b"]}}, {"a": 1}),
    ({"type": "object", "properties": {"n": {"anyOf": [{"prefixItems": [False]}]}}}, {"n": [1]}),
]


def fastjsonschema_alone(schema: Any, value: Any) -> bool:
    try:
        fastjsonschema.compile(schema, use_default=False, use_formats=False)(value)
    except fastjsonschema.JsonSchemaValueException:
        return False
    return True


@pytest.mark.parametrize(("schema", "value"), READ_DIFFERENTLY, ids=range(len(READ_DIFFERENTLY)))
def test_what_draft_7_reads_differently_is_left_to_jsonschema(schema, value):
    valid = jsonschema.Draft202012Validator(schema).is_valid(value)
    assert fastjsonschema_alone(schema, value) != valid
    assert fast_validator(schema) is None
    args = ToolArguments(schema)
    assert args.is_valid(value) == valid
    assert (args.problems(value) == []) == valid


def test_the_fast_path_takes_only_drafts_it_reads_alike():
    draft = "http://json-schema.org/draft-{}/schema#"
    assert fast_validator({"$schema": draft.format("07"), "type": "integer"}) is not None
    assert fast_validator({"$schema": draft.format("04"), "type": "integer"}) is None
    assert fast_validator({"$schema": draft.format("03"), "type": "integer"}) is None


def test_where_the_fast_path_is_stricter_jsonschema_has_the_last_word():
    schema = {"type": "string", "pattern": "^[a-z]+$"}
    fast = fast_validator(schema)
    assert fast is not None
    assert not fast("abc\n")  # fastjsonschema's "$" does not match before a final newline
    args = ToolArguments(schema)
    assert args.is_valid("abc\n")
    assert args.problems("abc\n") == []


# --------------------------------------------------- the fast path equals jsonschema

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(-5, 5, allow_nan=False)
    | st.sampled_from(["", "a", "abc", "ABC", "42", "true", "x" * 12]),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(["a", "b", "c", "path", "n"]), children, max_size=4)
    ),
    max_leaves=12,
)

FAST_SCHEMAS = [
    READ_FILE,
    {**READ_FILE, "additionalProperties": False},
    {"type": ["integer", "null"], "minimum": 0, "maximum": 3},
    {"type": "number", "exclusiveMinimum": -1, "exclusiveMaximum": 1},
    {"enum": [1, True, "a", None, [1], {"a": 1}]},
    {"const": 1},
    {"const": [1, {"a": True}]},
    {"type": "string", "minLength": 1, "maxLength": 3, "pattern": "^[a-z]"},
    {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
    {"type": "array", "uniqueItems": True},
    {"type": "array", "contains": {"type": "boolean"}},
    {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "string"}}]},
    {"oneOf": [{"type": "number"}, {"type": "integer"}]},
    {"allOf": [{"type": "object"}, {"required": ["a"]}], "not": {"required": ["b"]}},
    {"if": {"type": "integer"}, "then": {"minimum": 0}, "else": {"type": "string"}},
    {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"b": {"type": "boolean"}}}},
        "additionalProperties": {"type": "integer"},
        "minProperties": 1,
        "maxProperties": 3,
    },
    {
        "type": "object",
        "patternProperties": {"^[ab]$": {"type": "integer"}},
        "propertyNames": {"pattern": "^[a-c]"},
        "additionalProperties": False,
    },
    {
        "type": "object",
        "$defs": {"n": {"type": "integer", "minimum": 0}},
        "properties": {
            "a": {"$ref": "#/$defs/n", "description": "annotations beside a $ref are fine"},
            "b": {"type": "array", "items": {"$ref": "#/$defs/n"}},
            "c": {"$ref": "#"},
        },
    },
    {"items": False},
    True,
    False,
    {},
]


@functools.cache
def compiled(index: int) -> tuple[Any, ToolArguments, Any]:
    """The fast path alone, the whole argument handling, and jsonschema, for one schema."""
    schema = FAST_SCHEMAS[index]
    return fast_validator(schema), ToolArguments(schema), jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("index", range(len(FAST_SCHEMAS)))
@settings(max_examples=300, deadline=None)
@given(value=json_values)
def test_fast_path_agrees_with_jsonschema(index, value):
    fast, args, reference = compiled(index)
    assert fast is not None
    assert fast(value) == reference.is_valid(value)
    assert args.is_valid(value) == reference.is_valid(value)
