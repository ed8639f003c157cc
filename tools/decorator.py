"""The ``@tool`` decorator: register a plain typed function as a tool.

::

    @tool(toolset="math")
    def add(a: int, b: int = 2) -> dict:
        \"\"\"Add numbers.

        Args:
            a: first
            b: second
        \"\"\"
        return {"sum": a + b}

The schema comes from the signature and the docstring (Google-style ``Args:`` or reST
``:param x:``): str, int, float, bool, ``list[...]``/``tuple[...]``/``set[...]``,
``dict[str, ...]``, ``Optional[X]``/``X | None``, unions, ``Literal[...]`` and Enum
classes (an enum), ``Annotated[X, "description"]``; a parameter with a default is not
required and its default is shown. The function is called with keyword arguments taken
from the call's (already coerced and validated) arguments; a parameter annotated
:class:`~tools.registry.ToolContext` receives the run's context instead. It may be
async. Its return value becomes the result: a str as it is, anything else through
:func:`~tools.registry.tool_result`. The decorated function is returned unchanged (with
the registered entry as its ``tool_entry`` attribute), so it can still be called directly.
"""

from __future__ import annotations

import collections.abc
import enum
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from hermes_sandbox.tools.registry import ToolContext, ToolEntry, ToolRegistry, tool_result
from hermes_sandbox.tools.registry import registry as default_registry

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_TOOLSET = "custom"

_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Returns|Return|"
    r"Yields|Raises|Examples?|Notes?|Warnings?|See Also|Attributes|Todo)\s*:\s*$"
)
_PARAM_SECTIONS = {"Args", "Arguments", "Parameters", "Params", "Keyword Args", "Keyword Arguments"}
_GOOGLE_ENTRY = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_REST_FIELD = re.compile(r"^:(\w+)(?:\s+([^:]+?))?\s*:\s*(.*)$")


# ------------------------------------------------------------------------ docstrings


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """A docstring's description and its parameters' descriptions.

    Understands Google-style sections (``Args:`` with ``name: text`` or
    ``name (type): text`` entries) and reST fields (``:param x:``, ``:param int x:``).
    The description is the text before the first section or field.
    """
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    params: dict[str, str] = {}
    description: list[str] = []
    in_description = True
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        header = _SECTION.match(stripped)
        if header and not line.startswith((" ", "\t")):
            in_description = False
            i = _google_section(
                lines, i + 1, params if header.group(1) in _PARAM_SECTIONS else None
            )
            continue
        field = _REST_FIELD.match(stripped)
        if field:
            in_description = False
            text = [field.group(3).strip()]
            i += 1
            while i < len(lines) and lines[i].startswith((" ", "\t")) and lines[i].strip():
                text.append(lines[i].strip())
                i += 1
            kind, target = field.group(1), (field.group(2) or "").split()
            if kind in ("param", "parameter", "arg", "argument", "key", "keyword") and target:
                params[target[-1]] = " ".join(t for t in text if t)
            continue
        if in_description:
            description.append(line)
        i += 1
    return "\n".join(description).strip(), params


def _google_section(lines: list[str], i: int, params: dict[str, str] | None) -> int:
    """Read one section's body from line ``i``; record entries into ``params``."""
    entry_indent: int | None = None
    current: str | None = None
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            break  # the next section, or text after the sections
        if entry_indent is None:
            entry_indent = indent
        if indent <= entry_indent:
            match = _GOOGLE_ENTRY.match(line.strip())
            current = match.group(1) if match else None
            if params is not None and match:
                params[current] = match.group(2).strip()  # type: ignore[index]
        elif params is not None and current is not None:
            params[current] = f"{params[current]} {line.strip()}".strip()
        i += 1
    return i


# --------------------------------------------------------------------------- types


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    if not schema:
        return schema  # already anything, null included
    schema = dict(schema)
    if "anyOf" in schema:
        schema["anyOf"] = [*schema["anyOf"], {"type": "null"}]
        return schema
    declared = schema.get("type")
    if isinstance(declared, str):
        schema["type"] = [declared, "null"]
    elif isinstance(declared, list) and "null" not in declared:
        schema["type"] = [*declared, "null"]
    if "enum" in schema and None not in schema["enum"]:
        schema["enum"] = [*schema["enum"], None]
    return schema


def _json_type(value: Any) -> str | None:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return None


def _enum_schema(values: Sequence[Any]) -> dict[str, Any]:
    schema: dict[str, Any] = {"enum": list(values)}
    kinds = {_json_type(v) for v in values}
    if len(kinds) == 1 and None not in kinds:
        schema["type"] = kinds.pop()
    return schema


_ARRAYS = (
    list,
    tuple,
    set,
    frozenset,
    collections.abc.Sequence,
    collections.abc.Iterable,
    collections.abc.Set,
    collections.abc.MutableSequence,
    collections.abc.Collection,
)
_OBJECTS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)


def schema_for_type(tp: Any) -> dict[str, Any]:
    """The JSON Schema of a Python annotation (``{}`` when it says nothing usable)."""
    if tp is inspect.Parameter.empty or tp is Any or tp is object:
        return {}
    if tp is None or tp is type(None):
        return {"type": "null"}
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        schema = schema_for_type(args[0])
        notes = [a for a in args[1:] if isinstance(a, str)]
        if notes:
            schema = {**schema, "description": notes[0]}
        return schema
    simple = {str: "string", bool: "boolean", int: "integer", float: "number"}
    if tp in simple:
        return {"type": simple[tp]}
    if origin is typing.Literal:
        return _enum_schema(args)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum_schema([member.value for member in tp])
    if origin is typing.Union or origin is types.UnionType:
        others = [a for a in args if a is not type(None)]
        nullable = len(others) < len(args)
        if len(others) == 1:
            schema = schema_for_type(others[0])
        else:
            schema = {"anyOf": [schema_for_type(a) for a in others]}
        return _nullable(schema) if nullable else schema
    if tp in _ARRAYS or origin in _ARRAYS:
        schema = {"type": "array"}
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if args != ((),):
                schema["prefixItems"] = [schema_for_type(a) for a in args]
                schema["minItems"] = schema["maxItems"] = len(args)
        elif args:
            items = schema_for_type(args[0])
            if items:
                schema["items"] = items
        return schema
    if tp in _OBJECTS or origin in _OBJECTS:
        schema = {"type": "object"}
        if len(args) == 2:
            values = schema_for_type(args[1])
            if values:
                schema["additionalProperties"] = values
        return schema
    return {}


def _is_context(tp: Any) -> bool:
    if tp is ToolContext:
        return True
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        return any(a is ToolContext for a in typing.get_args(tp))
    return False


def _converter(tp: Any) -> Callable[[Any], Any] | None:
    """How to turn a JSON value into the annotated Python type, where they differ."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _converter(typing.get_args(tp)[0])
    if origin is typing.Union or origin is types.UnionType:
        others = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(others) == 1:
            inner = _converter(others[0])
            return None if inner is None else (lambda v: None if v is None else inner(v))
        return None
    target = origin or tp
    if target in (tuple, set, frozenset):
        return lambda v: target(v) if isinstance(v, list) else v
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return lambda v: v if isinstance(v, tp) else tp(v)
    return None


# -------------------------------------------------------------------------- building


@dataclass(frozen=True, slots=True)
class _Param:
    name: str
    positional_only: bool
    default: Any
    takes_null: bool
    convert: Callable[[Any], Any] | None


@dataclass(frozen=True, slots=True)
class _Plan:
    """How to call the function from an arguments dict."""

    params: tuple[_Param, ...]
    context_param: str | None
    extra_keywords: bool

    def call_arguments(
        self, args: dict[str, Any], ctx: ToolContext | None
    ) -> tuple[list[Any], dict[str, Any]]:
        positional: list[Any] = []
        keywords: dict[str, Any] = {}
        known = set()
        for p in self.params:
            known.add(p.name)
            value = args.get(p.name, inspect.Parameter.empty)
            if value is None and not p.takes_null:
                value = inspect.Parameter.empty  # null for a non-null parameter: "not given"
            if value is not inspect.Parameter.empty and p.convert is not None:
                value = p.convert(value)
            if p.positional_only:
                positional.append(p.default if value is inspect.Parameter.empty else value)
            elif value is not inspect.Parameter.empty:
                keywords[p.name] = value
        if self.context_param is not None:
            keywords[self.context_param] = ctx
        if self.extra_keywords:
            keywords.update((k, v) for k, v in args.items() if k not in known)
        return positional, keywords


def build_tool_schema(
    fn: Callable[..., Any], name: str | None = None, description: str | None = None
) -> tuple[dict[str, Any], _Plan]:
    """The function schema ``{"name", "description", "parameters"}`` of ``fn``, and how
    to call it. Raises TypeError for a ``*args`` parameter."""
    signature = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # an annotation that names something not importable here
        hints = {}
    summary, documented = parse_docstring(inspect.getdoc(fn))
    properties: dict[str, Any] = {}
    required: list[str] = []
    params: list[_Param] = []
    context_param = None
    extra_keywords = False
    for param in signature.parameters.values():
        annotation = hints.get(param.name, param.annotation)
        if isinstance(annotation, str):
            annotation = inspect.Parameter.empty  # unresolved: say nothing rather than guess
        if param.kind is param.VAR_POSITIONAL:
            raise TypeError(f"{fn.__qualname__}: *{param.name} cannot take tool arguments")
        if param.kind is param.VAR_KEYWORD:
            extra_keywords = True
            continue
        if _is_context(annotation):
            if param.kind is param.POSITIONAL_ONLY:
                raise TypeError(f"{fn.__qualname__}: the ToolContext must be passable by name")
            context_param = param.name
            continue
        schema = schema_for_type(annotation)
        if param.default is not param.empty and param.default is None:
            schema = _nullable(schema)
        if param.name in documented and "description" not in schema:
            schema = {**schema, "description": documented[param.name]}
        if param.default is param.empty:
            required.append(param.name)
        else:
            try:
                json.dumps(param.default)
            except (TypeError, ValueError):
                pass
            else:
                schema = {**schema, "default": param.default}
        properties[param.name] = schema
        params.append(
            _Param(
                name=param.name,
                positional_only=param.kind is param.POSITIONAL_ONLY,
                default=param.default,
                takes_null=_takes_null(schema),
                convert=_converter(annotation),
            )
        )
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    if not extra_keywords:
        parameters["additionalProperties"] = False
    function_schema = {
        "name": name or fn.__name__,
        "description": description if description is not None else summary,
        "parameters": parameters,
    }
    return function_schema, _Plan(tuple(params), context_param, extra_keywords)


def _takes_null(schema: dict[str, Any]) -> bool:
    if not schema or schema.keys() <= {"description", "default"}:
        return True
    declared = schema.get("type")
    if declared == "null" or (isinstance(declared, list) and "null" in declared):
        return True
    return any(_takes_null(b) for b in schema.get("anyOf", ()))


def _as_result(value: Any) -> str:
    return value if isinstance(value, str) else tool_result(value)


def tool(
    fn: F | None = None,
    *,
    name: str | None = None,
    toolset: str = DEFAULT_TOOLSET,
    description: str | None = None,
    registry: ToolRegistry | None = None,
    check_fn: Callable[[], bool] | None = None,
    requires_env: Sequence[str] = (),
    emoji: str = "",
    max_result_size_chars: int | None = None,
    override: bool = False,
) -> Any:
    """Register ``fn`` as a tool; usable as ``@tool`` or ``@tool(toolset=..., ...)``.

    ``name`` defaults to the function's name, ``description`` to its docstring's, and
    ``registry`` to the global one. Raises TypeError for a function that cannot be a
    tool (``*args``), ValueError as :meth:`ToolRegistry.register` does.
    """

    def decorate(func: F) -> F:
        function_schema, plan = build_tool_schema(func, name, description)
        handler: Callable[..., Any]
        if inspect.iscoroutinefunction(func):

            async def handler(args: dict[str, Any], ctx: ToolContext | None = None) -> str:
                positional, keywords = plan.call_arguments(args, ctx)
                return _as_result(await func(*positional, **keywords))

        else:

            def handler(args: dict[str, Any], ctx: ToolContext | None = None) -> str:
                positional, keywords = plan.call_arguments(args, ctx)
                return _as_result(func(*positional, **keywords))

        handler.__name__ = handler.__qualname__ = f"tool_{function_schema['name']}"
        handler.__doc__ = func.__doc__
        target = default_registry if registry is None else registry
        entry: ToolEntry = target.register(
            name=function_schema["name"],
            toolset=toolset,
            schema=function_schema,
            handler=handler,
            check_fn=check_fn,
            requires_env=requires_env,
            emoji=emoji,
            max_result_size_chars=max_result_size_chars,
            override=override,
        )
        try:
            func.tool_entry = entry  # type: ignore[attr-defined]
        except AttributeError:
            pass
        return func

    return decorate if fn is None else decorate(fn)


__all__ = ["DEFAULT_TOOLSET", "build_tool_schema", "parse_docstring", "schema_for_type", "tool"]
