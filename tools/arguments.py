"""Argument handling before dispatch: coerce what a model sent toward the tool's schema,
then validate it, so a handler only ever sees a call that fits its schema.

Models often send ``"42"`` for an integer, ``"true"`` for a boolean, an array as JSON
text, or one bare value where a list is expected. :class:`ToolArguments` compiles a
tool's ``parameters`` schema once and then, per call:

1. coerces each value toward its schema (see :meth:`ToolArguments.coerce` for the rules),
   keeping the original wherever no conversion fits;
2. validates the result. The ``jsonschema`` library (Draft 2020-12 unless the schema's
   ``$schema`` names another draft) is the reference: it checks the schema when the tool
   is registered (a built-in tool's, which the test suite checks, at its first need)
   and words every problem. Because it costs 20-60 µs a call, the schema is
   also compiled by ``fastjsonschema`` into Python code that decides the valid case in a
   few microseconds; jsonschema is consulted only when that code says no. Where
   fastjsonschema (which reads schemas as draft 7) would judge differently, see
   :func:`fast_validator`, jsonschema alone decides.

Problems come back as :class:`Problem` values naming the field by its path
(``args.limit``) and what was expected (``expected integer, got 'abc'``).
"""

from __future__ import annotations

import ast
import copy
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

MAX_PROBLEMS = 5
# Longest text that is parsed as a Python literal ("['a', 'b']"); literal_eval is
# recursive and has no size limit of its own.
_LITERAL_EVAL_LIMIT = 20_000

_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")
_NUMBER_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NULL_TEXT = frozenset({"null", "none"})

Check = Callable[[Any], bool]


def _always(_: Any) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a call: where (``args.limit``) and what (``expected ...``)."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


# --------------------------------------------------------------------------- types


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


# ------------------------------------------------------------------ the fast path

# Keywords that fastjsonschema reads differently from jsonschema's Draft 2020-12 reading,
# or does not know (so ignores): a schema using one anywhere is left to jsonschema.
_READ_DIFFERENTLY = frozenset(
    {
        # later drafts' keywords, unknown to draft 7
        "prefixItems",
        "dependentRequired",
        "dependentSchemas",
        "unevaluatedItems",
        "unevaluatedProperties",
        "minContains",
        "maxContains",
        "$anchor",
        "$dynamicRef",
        "$dynamicAnchor",
        "$recursiveRef",
        "$recursiveAnchor",
        "$vocabulary",
        # draft 7's, dropped or made annotations since (fastjsonschema decodes content*)
        "additionalItems",
        "dependencies",
        "contentEncoding",
        "contentMediaType",
        "contentSchema",
        # another base URI for $ref (and remote documents fastjsonschema would fetch)
        "$id",
        "id",
        # fastjsonschema divides in Decimal, jsonschema in float: 19.01 / 0.01 differ
        "multipleOf",
    }
)
# What may stand beside a "$ref": draft 7 ignores its siblings, 2020-12 applies them.
_BESIDE_REF = frozenset(
    {
        "$ref",
        "$defs",
        "definitions",
        "$schema",
        "$comment",
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)
# "$schema" values under which fastjsonschema reads a schema as jsonschema does (up to the
# keywords above); any other draft is left to jsonschema.
_SAME_DRAFT = frozenset(
    {
        "http://json-schema.org/draft-06/schema",
        "http://json-schema.org/draft-07/schema",
        "https://json-schema.org/draft/2019-09/schema",
        "https://json-schema.org/draft/2020-12/schema",
    }
)
# Where subschemas sit: one schema, a list of them, a mapping of names to them.
_SUBSCHEMA = (
    "items",
    "additionalProperties",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
)
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
# References the walk below also covers: the whole schema, or a schema kept for reference.
_WALKED_REFS = ("#/$defs/", "#/definitions/")


def _read_alike(schema: Any, *, refs: bool) -> bool:
    """Whether fastjsonschema decides validity under ``schema`` as jsonschema does.

    ``refs=False`` refuses any ``$ref``: a subschema compiled on its own cannot resolve a
    reference into the document around it.
    """
    if not isinstance(schema, Mapping):
        return True
    if not _READ_DIFFERENTLY.isdisjoint(schema):
        return False
    if "$ref" in schema:
        ref = schema["$ref"]
        if not refs or not isinstance(ref, str):
            return False
        if ref != "#" and not ref.startswith(_WALKED_REFS):
            return False
        if not _BESIDE_REF.issuperset(schema):
            return False
    if isinstance(schema.get("items"), list):
        return False
    subschemas: list[Any] = [schema[key] for key in _SUBSCHEMA if key in schema]
    for key in _SUBSCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            subschemas.extend(schema[key])
    for key in _SUBSCHEMA_MAPS:
        if isinstance(schema.get(key), Mapping):
            subschemas.extend(schema[key].values())
    return all(_read_alike(sub, refs=refs) for sub in subschemas)


def fast_validator(schema: Any, *, refs: bool = True) -> Check | None:
    """fastjsonschema's compiled check of ``schema``, or None where jsonschema must decide.

    None when the schema names a draft other than 6, 7, 2019-09 or 2020-12, uses a keyword
    that draft 7 reads differently (:data:`_READ_DIFFERENTLY`, or a ``$ref`` with validating
    siblings or to anywhere but ``#``, ``#/$defs/...`` and ``#/definitions/...``), or does
    not compile. Defaults are not filled in and formats are not checked, as in jsonschema.
    The check then answers as jsonschema would (tests/test_arguments.py checks this with
    generated instances) but in two corners: a ``$`` in a pattern does not match before a
    final newline (stricter, so jsonschema has the last word), and a tuple passes as an
    array, which only a Python caller can send (JSON and msgpack arrays decode to lists).
    The check never raises.
    """
    if isinstance(schema, Mapping) and "$schema" in schema:
        named = schema["$schema"]
        if not isinstance(named, str) or named.rstrip("#") not in _SAME_DRAFT:
            return None
    if not _read_alike(schema, refs=refs):
        return None
    import fastjsonschema

    try:
        validate = fastjsonschema.compile(
            copy.deepcopy(schema),  # fastjsonschema rewrites "$ref" values in place
            use_default=False,
            use_formats=False,
        )
    except Exception:  # a schema fastjsonschema cannot compile is jsonschema's alone
        return None

    def check(value: Any) -> bool:
        try:
            validate(value)
        except Exception:  # JsonSchemaValueException, or a value it cannot read
            return False
        return True

    return check


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


def _is_null(value: Any, takes_text: bool) -> bool:
    """Whether ``value`` is a null: None, or "null"/"none" where text would not be valid."""
    if value is None:
        return True
    return not takes_text and isinstance(value, str) and value.strip().lower() in _NULL_TEXT


class _CoercerBuilder:
    """Compiles a schema into a coercion function; follows local ``$ref``s.

    ``fit`` gives, for an anyOf/oneOf branch, the check of whether a value fits it.
    """

    def __init__(self, root: Any, fit: Callable[[Any], Check]) -> None:
        self.root = root
        self.fit = fit
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
        compiled = [(self.fit(branch), self.build(branch)) for branch in branches]

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
                    # Judged on the value as sent too: converting first would turn the
                    # text "null" for an array into ["null"].
                    new = item if drop_null and _is_null(item, takes_text) else convert(item)
                    if drop_null and _is_null(new, takes_text):
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


# Set while the built-in tool modules register (tools/discovery.py): their schemas are
# checked by the test suite (tests/test_tools_startup.py), so start-up skips the check and
# the jsonschema import; each validator is built, and its schema checked, at first need.
_schema_checked: ContextVar[bool] = ContextVar("hermes_sandbox_schema_checked", default=False)


@contextmanager
def schemas_checked_elsewhere() -> Iterator[None]:
    """Within it, :class:`ToolArguments` defers the schema check to the first validation."""
    token = _schema_checked.set(True)
    try:
        yield
    finally:
        _schema_checked.reset(token)


def _jsonschema_validator(parameters: Any) -> Any:
    """jsonschema's validator for ``parameters`` (its draft, else 2020-12), after
    checking the schema; ValueError when it is not a valid JSON Schema."""
    import jsonschema
    import jsonschema.validators

    cls = jsonschema.validators.validator_for(parameters, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(parameters)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"invalid parameters schema: {exc.message}") from None
    return cls(parameters)


class ToolArguments:
    """One tool's compiled argument handling: coercion, then validation.

    Build it once per schema (the registry keeps one per registered tool). Raises
    ValueError when ``parameters`` is not a valid JSON Schema. The fast path is compiled
    at the first call (a few milliseconds a schema; most tools are never called in a run).
    """

    def __init__(self, parameters: Any, *, base: str = "args") -> None:
        self.parameters = parameters
        self.base = base
        self._validator: Any = None
        self._fast: Check | None = None
        self._compiled = False
        if not _schema_checked.get():
            self._validator = _jsonschema_validator(
                parameters
            )  # now: a bad schema is the tool's bug
        self._coerce = _CoercerBuilder(parameters, self._branch_check).build(parameters)

    @property
    def validator(self) -> Any:
        """The jsonschema validator of ``parameters``, built at the first need."""
        if self._validator is None:
            self._validator = _jsonschema_validator(self.parameters)
        return self._validator

    def _fast_path(self) -> Check | None:
        if not self._compiled:
            self._fast = fast_validator(self.parameters)
            self._compiled = True
        return self._fast

    def _branch_check(self, branch: Any) -> Check:
        """Whether a value fits ``branch``, judged as part of the whole schema."""
        compiled: list[Check] = []

        def fits(value: Any) -> bool:
            if not compiled:
                fast = fast_validator(branch, refs=False)
                if fast is None:  # jsonschema resolves its references in the whole schema
                    fast = self.validator.evolve(schema=branch).is_valid
                compiled.append(fast)
            return bool(compiled[0](value))

        return fits

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
        """Whether ``args`` fits the schema as it stands (no coercion)."""
        fast = self._fast_path()
        if fast is not None and fast(args):
            return True
        return bool(self.validator.is_valid(args))

    def problems(self, args: Any, limit: int = MAX_PROBLEMS) -> list[Problem]:
        """What is wrong with ``args`` (at most ``limit`` problems, plus a count of the rest)."""
        fast = self._fast_path()
        if fast is not None and fast(args):
            return []
        found: list[Problem] = []
        for error in self.validator.iter_errors(args):
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
        # The fast check written out: this is every call's path, and the arguments
        # almost always pass it.
        fast = self._fast if self._compiled else self._fast_path()
        if fast is not None and fast(coerced):
            return coerced, []
        return coerced, self.problems(coerced)


def describe_problems(problems: Sequence[Problem]) -> str:
    """One line: ``args.limit: expected integer, got 'abc'; args.path: required ...``."""
    return "; ".join(str(p) for p in problems)


__all__ = [
    "MAX_PROBLEMS",
    "Problem",
    "ToolArguments",
    "describe_problems",
    "fast_validator",
]
