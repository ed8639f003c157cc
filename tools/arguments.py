"""Argument handling before dispatch: coerce what a model sent toward the tool's schema,
then validate it, so a handler only ever sees a call that fits its schema.

Models often send ``"42"`` for an integer, ``"true"`` for a boolean, an array as JSON
text, or one bare value where a list is expected. :class:`ToolArguments` compiles a
tool's ``parameters`` schema once and then, per call:

1. coerces each value toward its schema (see :meth:`ToolArguments.coerce` for the rules),
   keeping the original wherever no conversion fits;
2. validates the result. JSON Schema validation is the ``jsonschema`` library's; because
   it costs ~20 µs a call and ~80 ms to import, a schema made only of the common keywords
   is also compiled into a small checker that decides the valid case in a few
   microseconds. ``jsonschema`` is imported and consulted when that checker says no (to
   word the problems) or when the schema uses anything else. The two agree on every
   instance for the keywords the checker accepts (tests/test_arguments.py checks this
   with generated instances).

Problems come back as :class:`Problem` values naming the field by its path
(``args.limit``) and what was expected (``expected integer, got 'abc'``).
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_PROBLEMS = 5
# Longest text that is parsed as a Python literal ("['a', 'b']"); literal_eval is
# recursive and has no size limit of its own.
_LITERAL_EVAL_LIMIT = 20_000

_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")
_NUMBER_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NULL_TEXT = frozenset({"null", "none"})

_TYPE_NAMES = ("null", "boolean", "integer", "number", "string", "array", "object")

# Keywords the fast checker implements exactly as jsonschema's Draft 2020-12 validator
# does, and keywords that assert nothing. Any other keyword sends the schema to jsonschema.
_ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "format",  # an annotation unless a format checker is asked for; none is
        "contentMediaType",
        "contentEncoding",
        "$defs",
        "definitions",
    }
)


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a call: where (``args.limit``) and what (``expected ...``)."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SchemaUnsupported(Exception):
    """Raised while compiling the fast checker: this schema needs jsonschema."""


# --------------------------------------------------------------------------- types


def _is_type(value: Any, name: str) -> bool:
    """jsonschema's Draft 2020-12 type semantics (bool is not a number; 1.0 is an integer)."""
    if name == "string":
        return isinstance(value, str)
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if name == "integer":
        if isinstance(value, bool):
            return False
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if name == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if name == "boolean":
        return isinstance(value, bool)
    if name == "null":
        return value is None
    return False


def _is_integer(value: Any) -> bool:
    if isinstance(value, int):
        return not isinstance(value, bool)
    return isinstance(value, float) and value.is_integer()


_NUMERIC = (int, float)


def _is_number(value: Any) -> bool:
    return isinstance(value, _NUMERIC) and not isinstance(value, bool)


_TYPE_TESTS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "integer": _is_integer,
    "number": _is_number,
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def _type_test(names: Sequence[str]) -> Callable[[Any], bool]:
    """One predicate for "has one of these JSON types"."""
    tests = [_TYPE_TESTS[n] for n in names if n in _TYPE_TESTS]
    if not tests:
        return lambda v: False
    if len(tests) == 1:
        return tests[0]
    if len(tests) == 2:
        first, second = tests
        return lambda v: first(v) or second(v)

    def any_of(v: Any) -> bool:
        for test in tests:  # noqa: SIM110 - a plain loop: this runs on every call
            if test(v):
                return True
        return False

    return any_of


def _json_equal(one: Any, two: Any) -> bool:
    """Equality as JSON Schema means it (``True`` is not ``1``), like jsonschema's."""
    if one is two:
        return True
    if isinstance(one, str) or isinstance(two, str):
        return bool(one == two)
    if isinstance(one, Sequence) and isinstance(two, Sequence):
        return len(one) == len(two) and all(
            _json_equal(a, b) for a, b in zip(one, two, strict=True)
        )
    if isinstance(one, Mapping) and isinstance(two, Mapping):
        return len(one) == len(two) and all(
            key in two and _json_equal(value, two[key]) for key, value in one.items()
        )
    if isinstance(one, bool) or isinstance(two, bool):
        return one is two
    return bool(one == two)


def _types_of(schema: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The schema's types in declared order; inferred from its keywords when it has none."""
    declared = schema.get("type")
    if isinstance(declared, str):
        return (declared,)
    if isinstance(declared, list) and all(isinstance(t, str) for t in declared):
        return tuple(declared)
    if "properties" in schema or "additionalProperties" in schema or "required" in schema:
        return ("object",)
    if "items" in schema or "prefixItems" in schema:
        return ("array",)
    return None


def _allows_null(schema: Any) -> bool:
    if not isinstance(schema, Mapping):
        return schema is not False
    types = _types_of(schema)
    if types is not None and "null" in types:
        return True
    if "enum" in schema and any(v is None for v in schema["enum"] or ()):
        return True
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list):
        return any(_allows_null(b) for b in branches)
    return types is None and "enum" not in schema and "const" not in schema


def _accepts_text(schema: Any) -> bool:
    """Whether a string can be valid here (so "null" is text, not a null)."""
    if not isinstance(schema, Mapping):
        return schema is not False
    types = _types_of(schema)
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list) and any(_accepts_text(b) for b in branches):
        return True
    if types is None:
        return not isinstance(branches, list) and "enum" not in schema
    return "string" in types


# ---------------------------------------------------------------------- fast checker

Check = Callable[[Any], bool]


def _always(_: Any) -> bool:
    return True


def _never(_: Any) -> bool:
    return False


_number = _is_number


def _all(checks: list[Check]) -> Check:
    if not checks:
        return _always
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:
        first, second = checks
        return lambda value: first(value) and second(value)

    def every(value: Any) -> bool:
        for check in checks:  # noqa: SIM110 - a plain loop: this runs on every call
            if not check(value):
                return False
        return True

    return every


def compile_check(schema: Any) -> Check:
    """A predicate deciding whether an instance is valid under ``schema``.

    Raises :class:`SchemaUnsupported` when the schema uses a keyword (or a keyword value)
    outside the subset implemented here; the caller then uses jsonschema.
    """
    if schema is True:
        return _always
    if schema is False:
        return _never
    if not isinstance(schema, Mapping):
        raise SchemaUnsupported(f"a schema must be an object or a boolean, not {schema!r}")
    if "$schema" in schema or "$ref" in schema or "$id" in schema:
        raise SchemaUnsupported("$schema/$ref/$id")
    checks: list[Check] = []
    for key, value in schema.items():
        if key in _ANNOTATIONS:
            continue
        build = _KEYWORDS.get(key)
        if build is None:
            raise SchemaUnsupported(f"keyword {key!r}")
        checks.append(build(value, schema))
    return _all(checks)


def _kw_type(value: Any, schema: Mapping[str, Any]) -> Check:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(n in _TYPE_NAMES for n in names):
        raise SchemaUnsupported(f"type {value!r}")
    if len(set(names)) != len(names):
        raise SchemaUnsupported("repeated type names")
    return _type_test(names)


def _kw_enum(value: Any, schema: Mapping[str, Any]) -> Check:
    if not isinstance(value, list):
        raise SchemaUnsupported("enum must be an array")
    members = list(value)
    return lambda v: any(_json_equal(m, v) for m in members)


def _kw_const(value: Any, schema: Mapping[str, Any]) -> Check:
    return lambda v: _json_equal(value, v)


def _numeric_bound(value: Any) -> float:
    if not _number(value):
        raise SchemaUnsupported(f"a numeric bound must be a number, not {value!r}")
    return value  # type: ignore[no-any-return]


def _kw_minimum(value: Any, schema: Mapping[str, Any]) -> Check:
    bound = _numeric_bound(value)
    return lambda v: not isinstance(v, _NUMERIC) or isinstance(v, bool) or not v < bound


def _kw_maximum(value: Any, schema: Mapping[str, Any]) -> Check:
    bound = _numeric_bound(value)
    return lambda v: not isinstance(v, _NUMERIC) or isinstance(v, bool) or not v > bound


def _kw_exclusive_minimum(value: Any, schema: Mapping[str, Any]) -> Check:
    bound = _numeric_bound(value)
    return lambda v: not isinstance(v, _NUMERIC) or isinstance(v, bool) or not v <= bound


def _kw_exclusive_maximum(value: Any, schema: Mapping[str, Any]) -> Check:
    bound = _numeric_bound(value)
    return lambda v: not isinstance(v, _NUMERIC) or isinstance(v, bool) or not v >= bound


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaUnsupported(f"a length bound must be a non-negative integer, not {value!r}")
    return value


def _kw_min_length(value: Any, schema: Mapping[str, Any]) -> Check:
    n = _count(value)
    return lambda v: not isinstance(v, str) or len(v) >= n


def _kw_max_length(value: Any, schema: Mapping[str, Any]) -> Check:
    n = _count(value)
    return lambda v: not isinstance(v, str) or len(v) <= n


def _kw_pattern(value: Any, schema: Mapping[str, Any]) -> Check:
    if not isinstance(value, str):
        raise SchemaUnsupported("pattern must be a string")
    try:
        compiled = re.compile(value)
    except re.error as exc:
        raise SchemaUnsupported(f"pattern {value!r}: {exc}") from exc
    return lambda v: not isinstance(v, str) or compiled.search(v) is not None


def _kw_min_items(value: Any, schema: Mapping[str, Any]) -> Check:
    n = _count(value)
    return lambda v: not isinstance(v, list) or len(v) >= n


def _kw_max_items(value: Any, schema: Mapping[str, Any]) -> Check:
    n = _count(value)
    return lambda v: not isinstance(v, list) or len(v) <= n


def _kw_min_properties(value: Any, schema: Mapping[str, Any]) -> Check:
    n = _count(value)
    return lambda v: not isinstance(v, dict) or len(v) >= n


def _kw_max_properties(value: Any, schema: Mapping[str, Any]) -> Check:
    n = _count(value)
    return lambda v: not isinstance(v, dict) or len(v) <= n


def _kw_items(value: Any, schema: Mapping[str, Any]) -> Check:
    if not isinstance(value, Mapping | bool):
        raise SchemaUnsupported("items must be a schema")
    item = compile_check(value)
    return lambda v: not isinstance(v, list) or all(item(x) for x in v)


def _kw_properties(value: Any, schema: Mapping[str, Any]) -> Check:
    if not isinstance(value, Mapping):
        raise SchemaUnsupported("properties must be an object")
    props = {name: compile_check(sub) for name, sub in value.items()}

    def check(v: Any) -> bool:
        if not isinstance(v, dict):
            return True
        for name, item in v.items():
            sub = props.get(name)
            if sub is not None and not sub(item):
                return False
        return True

    return check


def _kw_required(value: Any, schema: Mapping[str, Any]) -> Check:
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise SchemaUnsupported("required must be an array of strings")
    names = frozenset(value)
    return lambda v: not isinstance(v, dict) or names <= v.keys()


def _kw_additional_properties(value: Any, schema: Mapping[str, Any]) -> Check:
    if "patternProperties" in schema:
        raise SchemaUnsupported("patternProperties")
    if not isinstance(value, Mapping | bool):
        raise SchemaUnsupported("additionalProperties must be a schema")
    known = frozenset(schema.get("properties") or ())
    if value is True:
        return _always
    if value is False:
        return lambda v: not isinstance(v, dict) or all(k in known for k in v)
    extra = compile_check(value)
    return lambda v: (
        not isinstance(v, dict) or all(extra(item) for k, item in v.items() if k not in known)
    )


def _branches(value: Any) -> list[Check]:
    if not isinstance(value, list) or not value:
        raise SchemaUnsupported("anyOf/oneOf/allOf must be a non-empty array")
    return [compile_check(b) for b in value]


def _kw_any_of(value: Any, schema: Mapping[str, Any]) -> Check:
    branches = _branches(value)
    return lambda v: any(b(v) for b in branches)


def _kw_all_of(value: Any, schema: Mapping[str, Any]) -> Check:
    branches = _branches(value)
    return lambda v: all(b(v) for b in branches)


def _kw_one_of(value: Any, schema: Mapping[str, Any]) -> Check:
    branches = _branches(value)
    return lambda v: sum(1 for b in branches if b(v)) == 1


def _kw_not(value: Any, schema: Mapping[str, Any]) -> Check:
    inner = compile_check(value)
    return lambda v: not inner(v)


_KEYWORDS: dict[str, Callable[[Any, Mapping[str, Any]], Check]] = {
    "type": _kw_type,
    "enum": _kw_enum,
    "const": _kw_const,
    "minimum": _kw_minimum,
    "maximum": _kw_maximum,
    "exclusiveMinimum": _kw_exclusive_minimum,
    "exclusiveMaximum": _kw_exclusive_maximum,
    "minLength": _kw_min_length,
    "maxLength": _kw_max_length,
    "pattern": _kw_pattern,
    "minItems": _kw_min_items,
    "maxItems": _kw_max_items,
    "minProperties": _kw_min_properties,
    "maxProperties": _kw_max_properties,
    "items": _kw_items,
    "properties": _kw_properties,
    "required": _kw_required,
    "additionalProperties": _kw_additional_properties,
    "anyOf": _kw_any_of,
    "allOf": _kw_all_of,
    "oneOf": _kw_one_of,
    "not": _kw_not,
}


# -------------------------------------------------------------------------- coercion

Coerce = Callable[[Any], Any]
_MISSING = object()


def _identity(value: Any) -> Any:
    return value


def _parse_container(text: str, kind: type) -> Any:
    """``text`` as a list or dict (JSON, else a Python literal), or _MISSING."""
    stripped = text.strip()
    opener = "[" if kind is list else "{"
    if not stripped.startswith(opener):
        return _MISSING
    try:
        parsed = json.loads(stripped)
    except ValueError:
        parsed = _MISSING
        if len(stripped) <= _LITERAL_EVAL_LIMIT:
            try:
                parsed = ast.literal_eval(stripped)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                return _MISSING
            if isinstance(parsed, tuple) and kind is list:
                parsed = list(parsed)
    return parsed if isinstance(parsed, kind) else _MISSING


def _from_text(text: str, target: str) -> Any:
    """``text`` converted to JSON type ``target``, or _MISSING."""
    if target == "integer":
        stripped = text.strip()
        if _INTEGER_TEXT.fullmatch(stripped):
            return int(stripped)
        if _NUMBER_TEXT.fullmatch(stripped):
            number = float(stripped)
            if math.isfinite(number) and number.is_integer():
                return int(number)
        return _MISSING
    if target == "number":
        stripped = text.strip()
        if _INTEGER_TEXT.fullmatch(stripped):
            return int(stripped)
        if _NUMBER_TEXT.fullmatch(stripped):
            number = float(stripped)
            return number if math.isfinite(number) else _MISSING
        return _MISSING
    if target == "boolean":
        lowered = text.strip().lower()
        if lowered == "true":
            return True
        if lowered == "false":
            return False
        return _MISSING
    if target == "null":
        return None if text.strip().lower() in _NULL_TEXT else _MISSING
    if target == "array":
        return _parse_container(text, list)
    if target == "object":
        return _parse_container(text, dict)
    return _MISSING


class _CoercerBuilder:
    """Compiles a schema into a coercion function; follows local ``$ref``s."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self._by_id: dict[int, list[Coerce]] = {}

    def build(self, schema: Any) -> Coerce:
        if not isinstance(schema, Mapping):
            return _identity
        key = id(schema)
        if key in self._by_id:  # a recursive schema: call through a cell filled below
            cell = self._by_id[key]
            return lambda value: cell[0](value)
        cell = [_identity]
        self._by_id[key] = cell
        cell[0] = self._build(schema)
        return cell[0]

    def _resolve(self, ref: Any) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            return None
        node = self.root
        for part in ref[1:].split("/")[1:] if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
        return node

    def _build(self, schema: Mapping[str, Any]) -> Coerce:
        steps: list[Coerce] = []
        if "$ref" in schema:
            target = self._resolve(schema["$ref"])
            if isinstance(target, Mapping):
                steps.append(self.build(target))
        for sub in schema.get("allOf") or ():
            steps.append(self.build(sub))
        branches = schema.get("anyOf") or schema.get("oneOf")
        if isinstance(branches, list) and branches:
            steps.append(self._branches(branches))
        types = _types_of(schema)
        if types is not None or "enum" in schema:
            steps.append(self._typed(schema, types))
        if not steps:
            return _identity
        if len(steps) == 1:
            return steps[0]

        def chain(value: Any) -> Any:
            for step in steps:
                value = step(value)
            return value

        return chain

    def _branches(self, branches: list[Any]) -> Coerce:
        compiled = []
        for branch in branches:
            try:
                fits = compile_check(branch)
            except SchemaUnsupported:
                fits = _loose_fit(branch)
            compiled.append((fits, self.build(branch)))

        def coerce(value: Any) -> Any:
            if any(fits(value) for fits, _ in compiled):
                return value
            for fits, convert in compiled:
                candidate = convert(value)
                if fits(candidate):
                    return candidate
            return value

        return coerce

    def _typed(self, schema: Mapping[str, Any], types: tuple[str, ...] | None) -> Coerce:
        into_object = self._object(schema) if types is None or "object" in types else None
        into_array = self._array(schema) if types is None or "array" in types else None
        enum = schema.get("enum") if isinstance(schema.get("enum"), list) else None
        want = types or ()
        fits_type = _type_test(want) if want else _always
        integer_only = "integer" in want and "number" not in want

        def descend(value: Any) -> Any:
            if into_object is not None and isinstance(value, dict):
                return into_object(value)
            if into_array is not None and isinstance(value, list):
                return into_array(value)
            return value

        if into_object is None and into_array is None and enum is None and want:
            convert = self._convert

            if integer_only:

                def coerce_scalar(value: Any) -> Any:
                    if fits_type(value):
                        return int(value) if isinstance(value, float) else value
                    return convert(value, want)

                return coerce_scalar

            return lambda value: value if fits_type(value) else convert(value, want)

        def coerce(value: Any) -> Any:
            if fits_type(value):
                if integer_only and isinstance(value, float) and value.is_integer():
                    value = int(value)
                value = descend(value)
            else:
                value = descend(self._convert(value, want))
            if (
                enum is not None
                and isinstance(value, str)
                and not any(_json_equal(m, value) for m in enum)
            ):
                try:
                    parsed = json.loads(value)
                except ValueError:
                    return value
                for member in enum:
                    if _json_equal(member, parsed):
                        return member
            return value

        return coerce

    @staticmethod
    def _convert(value: Any, types: tuple[str, ...]) -> Any:
        if isinstance(value, str):
            for target in types:
                converted = _from_text(value, target)
                if converted is not _MISSING:
                    return converted
            if "array" in types:
                return [value]  # a bare value where a list is expected
            return value
        if "array" in types and value is not None:
            return list(value) if isinstance(value, tuple) else [value]
        if "integer" in types and isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    def _object(self, schema: Mapping[str, Any]) -> Callable[[dict[str, Any]], Any] | None:
        raw_props = schema.get("properties")
        props: dict[str, tuple[Coerce, bool, bool]] = {}
        required = set(schema.get("required") or ())
        if isinstance(raw_props, Mapping):
            for name, sub in raw_props.items():
                # An optional field sent as null means "not given" unless null is allowed.
                drop_null = name not in required and not _allows_null(sub)
                props[name] = (self.build(sub), drop_null, _accepts_text(sub))
        extra_schema = schema.get("additionalProperties")
        extra = self.build(extra_schema) if isinstance(extra_schema, Mapping) else None
        if not props and extra is None:
            return None

        def coerce(value: dict[str, Any]) -> dict[str, Any]:
            out: dict[str, Any] | None = None
            for key, item in value.items():
                spec = props.get(key)
                if spec is None:
                    if extra is None:
                        continue
                    new = extra(item)
                else:
                    convert, drop_null, takes_text = spec
                    new = convert(item)
                    if drop_null and (
                        new is None
                        or (
                            not takes_text
                            and isinstance(new, str)
                            and new.strip().lower() in _NULL_TEXT
                        )
                    ):
                        if out is None:
                            out = dict(value)
                        del out[key]
                        continue
                if new is not item:
                    if out is None:
                        out = dict(value)
                    out[key] = new
            return value if out is None else out

        return coerce

    def _array(self, schema: Mapping[str, Any]) -> Callable[[list[Any]], Any] | None:
        items = schema.get("items")
        prefix = schema.get("prefixItems")
        head = [self.build(s) for s in prefix] if isinstance(prefix, list) else []
        rest = self.build(items) if isinstance(items, Mapping) else None
        if not head and rest is None:
            return None

        def coerce(value: list[Any]) -> list[Any]:
            out: list[Any] | None = None
            for i, item in enumerate(value):
                convert = head[i] if i < len(head) else rest
                if convert is None:
                    continue
                new = convert(item)
                if new is not item:
                    if out is None:
                        out = list(value)
                    out[i] = new
            return value if out is None else out

        return coerce


def _loose_fit(schema: Any) -> Check:
    """For a branch the fast checker cannot compile: does the value have a listed type?"""
    if not isinstance(schema, Mapping):
        return _always if schema is not False else _never
    types = _types_of(schema)
    if types is None:
        return _always
    return lambda v: any(_is_type(v, t) for t in types)


# -------------------------------------------------------------------------- messages


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _join_path(base: str, parts: Sequence[Any]) -> str:
    path = base
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier():
            path += f".{part}"
        else:
            path += f"[{json.dumps(part)}]"
    return path


def _type_words(types: Any) -> str:
    names = [types] if isinstance(types, str) else list(types)
    return " or ".join(str(n) for n in names)


def _problems_from(error: Any, base: str) -> list[Problem]:
    """Word one jsonschema ValidationError as one or more problems."""
    path = _join_path(base, list(error.absolute_path))
    kind = error.validator
    rule = error.validator_value
    value = error.instance
    if kind == "required" and isinstance(value, dict):
        return [
            Problem(_join_path(path, [name]), "required field missing")
            for name in rule
            if name not in value
        ]
    if kind == "additionalProperties" and isinstance(value, dict):
        known = list(error.schema.get("properties") or ())
        allowed = f" (allowed: {', '.join(known)})" if known else ""
        return [
            Problem(_join_path(path, [name]), f"unknown field{allowed}")
            for name in value
            if name not in known
        ]
    if kind == "type":
        return [Problem(path, f"expected {_type_words(rule)}, got {_short(value)}")]
    if kind == "enum":
        options = ", ".join(_short(m, 30) for m in rule)
        return [Problem(path, f"expected one of {options}; got {_short(value)}")]
    if kind == "const":
        return [Problem(path, f"expected {_short(rule)}, got {_short(value)}")]
    bounds = {
        "minimum": ">=",
        "maximum": "<=",
        "exclusiveMinimum": ">",
        "exclusiveMaximum": "<",
    }
    if kind in bounds:
        return [Problem(path, f"expected a number {bounds[kind]} {rule}, got {_short(value)}")]
    sizes = {
        "minLength": ("at least", "characters"),
        "maxLength": ("at most", "characters"),
        "minItems": ("at least", "items"),
        "maxItems": ("at most", "items"),
        "minProperties": ("at least", "fields"),
        "maxProperties": ("at most", "fields"),
    }
    if kind in sizes:
        bound, unit = sizes[kind]
        return [Problem(path, f"expected {bound} {rule} {unit}, got {len(value)}")]
    if kind == "pattern":
        return [Problem(path, f"expected text matching /{rule}/, got {_short(value)}")]
    if kind in ("anyOf", "oneOf") and isinstance(rule, list):
        types = [b.get("type") for b in rule if isinstance(b, Mapping)]
        if len(types) == len(rule) and all(isinstance(t, str | list) for t in types):
            words = " or ".join(dict.fromkeys(_type_words(t) for t in types))
            return [Problem(path, f"expected {words}, got {_short(value)}")]
        return [Problem(path, f"matches none of the allowed forms, got {_short(value)}")]
    return [Problem(path, error.message)]


# ------------------------------------------------------------------------- the facade


class ToolArguments:
    """One tool's compiled argument handling: coercion, then validation.

    Build it once per schema (the registry keeps one per registered tool). Raises
    ValueError when ``parameters`` is not a valid JSON Schema.
    """

    def __init__(self, parameters: Any, *, base: str = "args") -> None:
        self.parameters = parameters
        self.base = base
        self._coerce = _CoercerBuilder(parameters).build(parameters)
        try:
            self._fast: Check | None = compile_check(parameters)
        except SchemaUnsupported:
            self._fast = None
        self._validator: Any = None
        if self._fast is None:
            self._jsonschema()  # check the schema now: a bad one is the tool's bug

    def _jsonschema(self) -> Any:
        if self._validator is None:
            import jsonschema
            import jsonschema.validators

            cls = jsonschema.validators.validator_for(
                self.parameters, default=jsonschema.Draft202012Validator
            )
            try:
                cls.check_schema(self.parameters)
            except jsonschema.SchemaError as exc:
                raise ValueError(f"invalid parameters schema: {exc.message}") from None
            self._validator = cls(self.parameters)
        return self._validator

    def coerce(self, args: Any) -> Any:
        """Coerce ``args`` toward the schema; the input is never modified.

        Rules, where the schema expects a type the value does not have:
        ``"42"`` -> 42 (integer), ``"4.5"`` -> 4.5 (number), ``"true"``/``"false"`` in any
        case -> bool, JSON text -> list or dict, a bare value -> ``[value]`` (array, after
        trying JSON), ``"null"`` -> None where the type allows null. An optional field sent
        as null (or ``"null"``) where null is not allowed is dropped: "not given", so the
        handler's default applies. anyOf/oneOf branches are tried in order and the first
        that fits after coercion wins (a value that already fits one is kept). Objects and
        array items are coerced recursively. Anything else is kept as it was, for
        validation to report.
        """
        return self._coerce(args)

    def is_valid(self, args: Any) -> bool:
        if self._fast is not None:
            return self._fast(args)
        return bool(self._jsonschema().is_valid(args))

    def problems(self, args: Any, limit: int = MAX_PROBLEMS) -> list[Problem]:
        """What is wrong with ``args`` (at most ``limit`` problems, plus a count of the rest)."""
        if self._fast is not None and self._fast(args):
            return []
        found: list[Problem] = []
        for error in self._jsonschema().iter_errors(args):
            for problem in _problems_from(error, self.base):
                if problem not in found:
                    found.append(problem)
        found.sort(key=lambda p: p.path)
        if len(found) > limit:
            rest = len(found) - limit
            found = found[:limit]
            found.append(Problem("...", f"and {rest} more problem{'s' if rest > 1 else ''}"))
        return found

    def prepare(self, args: Any) -> tuple[Any, list[Problem]]:
        """Coerce, then validate: the arguments to call with and what is wrong with them."""
        coerced = self._coerce(args)
        return coerced, self.problems(coerced)


def describe_problems(problems: Sequence[Problem]) -> str:
    """One line: ``args.limit: expected integer, got 'abc'; args.path: required ...``."""
    return "; ".join(str(p) for p in problems)


__all__ = [
    "MAX_PROBLEMS",
    "Problem",
    "SchemaUnsupported",
    "ToolArguments",
    "compile_check",
    "describe_problems",
]
