"""Generate hermes_tools.py, the module a script imports to call the host's tools.

The module runs the stdlib-only client (stubs/_client.py, staged beside it as
``_hermes_client.py``) in its own namespace, then defines one function per allowed
tool, whose signature and docstring come from the tool's JSON schema. The client is
also staged compiled, as marshalled code under a name carrying the host Python's
bytecode magic number: a sandbox Python with the same magic runs that instead of
compiling 30 KB of source on every run (about 3.5 ms of an 11.5 ms import on the test
VM); another Python compiles the source. Beside them the runtime stages
``_hermes_msgpack.py`` (stubs/_msgpack.py), which the client imports only when the
sandbox's Python has no msgpack.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import json
import keyword
import marshal
import os
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hermes_sandbox.errors import StubError

STUB_MODULE = "hermes_tools.py"
CLIENT_MODULE = "_hermes_client.py"
CODEC_MODULE = "_hermes_msgpack.py"
RELAY_MODULE = "_hermes_relay.py"
KERNEL_MODULE = "_hermes_kernel.py"

# Names the client and its helpers own; a tool or a parameter may not take them.
_RESERVED = frozenset({"json_parse", "shell_quote", "retry", "ToolCallError", "kwargs", "_call"})
_JSON_TO_PY = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "boolean": "bool",
    "array": "list",
    "object": "dict",
}


@functools.cache
def program_source(name: str) -> str:
    """The source of a program that runs inside the sandbox, by file name (``_relay.py``).

    Every such program is a real, linted, stdlib-only file in this package, read here;
    none is kept in a string. Read beside this module where the package is files (as
    installed: no importlib.resources, with its zipfile, on a run's path), else through
    importlib.resources.
    """
    try:
        with open(os.path.join(os.path.dirname(__file__), name), encoding="utf-8") as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError):
        from importlib import resources

        return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


@functools.cache
def client_source() -> str:
    return program_source("_client.py")


def code_file_name(module: str) -> str:
    """Where the sandbox side looks for ``module`` compiled by this interpreter:
    ``module``, this Python's bytecode magic number in hex, ``code``
    (``_hermes_relay.py.<magic>.code``, which stubs/_stage_files.py reads)."""
    return f"{module}.{importlib.util.MAGIC_NUMBER.hex()}.code"


def _renamed(code: types.CodeType, filename: str) -> types.CodeType:
    """``code`` and the code nested in it, their file name made ``filename``."""
    consts = tuple(
        _renamed(const, filename) if isinstance(const, types.CodeType) else const
        for const in code.co_consts
    )
    return code.replace(co_filename=filename, co_consts=consts)


@functools.cache
def client_code_file() -> tuple[str, bytes]:
    """The client compiled and marshalled, and the name to stage it under
    (:func:`code_file_name`): hermes_tools.py runs it instead of compiling
    ``_hermes_client.py`` when its Python has this one's magic (the runner stages it
    only for such a Python). Taken from the package's own cached bytecode of
    stubs/_client.py where there is one (pip writes it at install), so that a process
    that makes one run, the command line's, does not compile it either. Its file name
    is the staged one, relative: a traceback's lines are found through sys.path, which
    holds the stage."""
    path = os.path.join(os.path.dirname(__file__), "_client.py")
    loader = importlib.machinery.SourceFileLoader(f"{__package__}._client", path)
    try:
        code = loader.get_code(loader.name)
    except OSError:  # the package is not plain files
        code = None
    if code is None:
        code = compile(client_source(), CLIENT_MODULE, "exec", dont_inherit=True, optimize=0)
    return code_file_name(CLIENT_MODULE), marshal.dumps(_renamed(code, CLIENT_MODULE))


@functools.cache
def codec_source() -> str:
    return program_source("_msgpack.py")


@functools.cache
def relay_source() -> str:
    """The relay program, with the process-tree code it shares prepended."""
    return program_source("_proctree.py") + "\n" + program_source("_relay.py")


@functools.cache
def relay_code_file() -> tuple[str, bytes]:
    """The relay compiled by this interpreter and marshalled, under a name carrying this
    Python's bytecode magic number, to stage beside the relay: stubs/_stage_files.py
    runs it instead of compiling the source (most of the relay's start after the
    interpreter's own) when its Python has the same magic; another Python ignores it."""
    code = compile(relay_source(), RELAY_MODULE, "exec", dont_inherit=True, optimize=0)
    return code_file_name(RELAY_MODULE), marshal.dumps(code)


@functools.cache
def kernel_source() -> str:
    return program_source("_kernel.py")


def _docstring(text: str, indent: str = "    ") -> str:
    text = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"').replace("\0", "\\x00")
    text = text.strip()
    lines = text.splitlines() or [""]
    body = ("\n" + indent).join(line.rstrip() for line in lines)
    return f'{indent}"""{body}\n{indent}"""'


def _type_name(prop: Mapping[str, Any]) -> str:
    kind = prop.get("type")
    if isinstance(kind, list):
        return " | ".join(str(k) for k in kind)
    if isinstance(kind, str):
        return kind
    for union in ("anyOf", "oneOf"):
        if isinstance(prop.get(union), list):
            return " | ".join(_type_name(p) for p in prop[union])
    return "any"


def _annotation(prop: Mapping[str, Any]) -> str:
    kind = prop.get("type")
    return _JSON_TO_PY.get(kind, "") if isinstance(kind, str) else ""


def _is_python_name(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name) and name not in _RESERVED


@dataclass(slots=True)
class _Parameters:
    """How a tool's JSON-schema parameters become a Python function."""

    signature: list[str]  # the rendered parameters: "path: str", "limit: int = None"
    sent: list[str]  # the entries of the dict the function sends: "'path': path"
    docs: list[str]  # one "Args:" line per parameter
    awkward: list[str]  # schema names that are not Python names: passed as **kwargs


def _function_name(function: Mapping[str, Any]) -> str:
    name = function.get("name")
    if not isinstance(name, str) or not _is_python_name(name) or name.startswith("_"):
        raise StubError(
            f"tool name {name!r} is not a usable Python function name, so a script could "
            "not import it: rename the tool to a Python identifier that does not start "
            "with an underscore (letters, digits and _)"
        )
    return name


def _parameters(function: Mapping[str, Any]) -> _Parameters:
    parameters = function.get("parameters") or {}
    properties: Mapping[str, Any] = parameters.get("properties") or {}
    required = list(dict.fromkeys(p for p in parameters.get("required") or [] if p in properties))
    optional = [p for p in properties if p not in required]

    rendered = _Parameters(signature=[], sent=[], docs=[], awkward=[])
    for param in required + optional:
        prop = properties[param] or {}
        is_required = param in required
        detail = _type_name(prop) + (", required" if is_required else ", optional")
        if "default" in prop:
            detail += f", default {json.dumps(prop['default'])}"
        if "enum" in prop:
            detail += ", one of " + ", ".join(json.dumps(v) for v in prop["enum"])
        description = " ".join(str(prop.get("description", "")).split())
        rendered.docs.append(f"    {param} ({detail}): {description}".rstrip())
        if not _is_python_name(param):
            rendered.awkward.append(param)
            continue
        annotation = _annotation(prop)
        annotated = f"{param}: {annotation}" if annotation else param
        if is_required:
            rendered.signature.append(annotated)
        else:
            rendered.signature.append(f"{annotated} = None" if annotation else f"{param}=None")
        rendered.sent.append(f"{param!r}: {param}")
    if rendered.awkward or (
        parameters.get("additionalProperties", False) is not False and properties
    ):
        rendered.signature.append("**kwargs")
        rendered.sent.append("**kwargs")
    return rendered


def tool_signature(schema: Mapping[str, Any]) -> str:
    """The call signature of a tool's stub function, as hermes_tools.py declares it:
    ``read_file(path: str, offset: int = None, limit: int = None)``.

    An optional parameter defaults to None, which the client leaves out of the call, so
    the tool's own default applies. Raises :class:`StubError` as
    :func:`tool_function_source` does.
    """
    function = schema.get("function", schema)
    name = _function_name(function)
    return f"{name}({', '.join(_parameters(function).signature)})"


def tool_function_source(schema: Mapping[str, Any]) -> str:
    """The source of one stub function for an OpenAI-format tool schema.

    Raises :class:`StubError` for a tool name that cannot be a Python function name.
    """
    function = schema.get("function", schema)
    name = _function_name(function)
    rendered = _parameters(function)

    doc_lines = [str(function.get("description", "")).strip() or f"Call the {name} tool."]
    if rendered.docs:
        doc_lines += ["", "Args:", *rendered.docs]
    if rendered.awkward:
        doc_lines += [
            "",
            "Pass " + ", ".join(rendered.awkward) + " as keyword arguments: **{name: value}.",
        ]
    doc_lines += [
        "",
        "Returns the tool's result parsed from JSON (a dict for the built-in tools);",
        'a failed call returns {"error": "..."} instead of raising.',
    ]
    return (
        f"def {name}({', '.join(rendered.signature)}):\n"
        f"{_docstring(chr(10).join(doc_lines))}\n"
        f"    return _call({name!r}, {{{', '.join(rendered.sent)}}})\n"
    )


def generate_stub(schemas: Iterable[Mapping[str, Any]]) -> str:
    """The whole hermes_tools.py for the given tool schemas, in the order given.

    Raises :class:`StubError` for a schema that cannot become a function.
    """
    schemas = list(schemas)
    names = [s.get("function", s).get("name") for s in schemas]
    functions = [tool_function_source(s) for s in schemas]
    header = (
        '"""Tools of the host, callable from this script. Generated by hermes-sandbox.\n\n'
        f"Tools: {', '.join(names) if names else '(none)'}.\n"
        "Helpers: json_parse, shell_quote, retry.\n"
        '"""\n'
        f"__all__ = {[*names, 'json_parse', 'shell_quote', 'retry', 'ToolCallError']!r}\n\n"
    )
    return header + _LOAD_CLIENT + "\n\n# Tools\n\n" + "\n\n".join(functions)


# Runs the client in hermes_tools' own namespace (as if its source were here): its
# marshalled code where this Python's magic matches the host's, else its source,
# compiled. Python 3.8+, stdlib only; the names it leaves are deleted.
_LOAD_CLIENT = f'''\
def _hermes_client_code():
    import marshal
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    bootstrap = sys.modules.get("_frozen_importlib_external")
    magic = getattr(bootstrap, "MAGIC_NUMBER", b"").hex()
    try:
        with open(os.path.join(here, "{CLIENT_MODULE}." + magic + ".code"), "rb") as f:
            return marshal.loads(f.read())
    except (OSError, ValueError, EOFError, TypeError):
        pass  # another Python, or no compiled client: compile the source
    with open(os.path.join(here, "{CLIENT_MODULE}"), "rb") as f:
        return compile(f.read(), "{CLIENT_MODULE}", "exec", dont_inherit=True)


exec(_hermes_client_code(), globals())
del _hermes_client_code
'''


@functools.lru_cache(maxsize=64)
def _generate_cached(schemas_json: str) -> bytes:
    return generate_stub(json.loads(schemas_json)).encode()


def stub_files(schemas: Iterable[Mapping[str, Any]]) -> dict[str, bytes]:
    """The files to stage beside a script, by name: the stub, the client and the
    fallback codec (and, for a Python with this one's magic, :func:`client_code_file`).

    Generation is cached by the schemas' content, so repeated runs with one tool set
    do not pay for it again.
    """
    key = json.dumps(list(schemas), separators=(",", ":"))
    return {
        STUB_MODULE: _generate_cached(key),
        CLIENT_MODULE: _encoded("_client.py"),
        CODEC_MODULE: _encoded("_msgpack.py"),
    }


@functools.cache
def _encoded(name: str) -> bytes:
    """:func:`program_source` of ``name``, as the bytes staged, made once."""
    return program_source(name).encode()
