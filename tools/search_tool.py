"""The search_files tool: find text in files, or files by name, where the script runs.

The search runs inside the run's environment as one small stdlib-only Python program
(stubs/_search.py), so one call is one round trip on every backend and only the
requested page of results travels back. The program finds candidates with ripgrep when
the environment has ``rg``, and with a walk of its own otherwise; either way the same
code then filters, sorts and pages them, so both engines give the same results.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
import warnings
import weakref
from typing import Any

from hermes_sandbox.environments.base import Runtime
from hermes_sandbox.stubs import program_source
from hermes_sandbox.tools.handler_args import bool_arg, int_arg
from hermes_sandbox.tools.path_policy import PathRefused, resolve_for_read
from hermes_sandbox.tools.registry import ToolContext, registry, tool_error, tool_result

DEFAULT_LIMIT = 50
MAX_LIMIT = 1000
MAX_CONTEXT = 10
MAX_LINE_CHARS = 500  # a longer line is cut, and "…" marks the cut
MAX_PAGE_CHARS = 100_000  # a page stops early past this many characters of results
MAX_FILESIZE = 20 * 1024 * 1024  # bigger files are skipped while walking a directory
SEARCH_TIMEOUT = 60.0
RG_PROBE_TIMEOUT = 10.0
EXCLUDED_DIRS = (".git", "node_modules", "__pycache__", ".venv")
_RESULT_MARKER = "@@hermes-search-result@@ "

SEARCH_FILES_SCHEMA = {
    "name": "search_files",
    "description": (
        "Search files under a directory: their contents with a regular expression "
        "(target='content', the default) or their names with a glob (target='files'). "
        f"Directories named {', '.join(EXCLUDED_DIRS)} are skipped, and so are symbolic "
        f"links and, while walking a directory, files over {MAX_FILESIZE // (1024 * 1024)} "
        "MiB; content searches also skip binary files (any file containing a NUL byte). "
        "Hidden files and files listed in .gitignore are searched. Results are sorted by "
        "path, then line number.\n"
        "Returns {matches, total, truncated, next_offset?}: total counts every result; "
        "when truncated is true, call again with offset=next_offset for the next page. "
        "The shape of matches depends on the mode:\n"
        "- target='content', output_mode='content': [{path, line, text}] one per matching "
        "line; with context=N each also has before and after, the lists of up to N lines "
        "around it;\n"
        "- output_mode='files_with_matches': [path, ...] the files with a match;\n"
        "- output_mode='count': [{path, count}] matching lines per file (total counts files);\n"
        "- target='files': [path, ...] the files whose name matches.\n"
        "Paths are relative to the working directory (absolute if path was absolute). "
        f"Lines longer than {MAX_LINE_CHARS} characters are cut and end with '…'. "
        "Errors: an invalid regular expression (with the reason and position), a path that "
        "does not exist, an argument out of range."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "pattern": {
                "type": "string",
                "description": "target='content': a Python regular expression matched against "
                "each line (e.g. 'def \\w+\\(' or 'TODO|FIXME'). target='files': a glob "
                "matched against file paths (e.g. '*.py', 'src/**/test_*.py', '*.{js,ts}').",
            },
            "target": {
                "type": "string",
                "enum": ["content", "files"],
                "default": "content",
                "description": "'content' searches inside files; 'files' lists files by name.",
            },
            "path": {
                "type": "string",
                "default": ".",
                "description": "Directory (or single file) to search; relative paths start "
                "at the working directory.",
            },
            "file_glob": {
                "type": "string",
                "description": "Only search files whose path matches this glob, e.g. '*.py'. "
                "A glob without '/' matches the file name at any depth; one with '/' matches "
                "the path below `path`; '**' spans directories; '{a,b}' means either; a "
                "leading '!' excludes instead (e.g. '!*.min.js').",
            },
            "output_mode": {
                "type": "string",
                "enum": ["content", "files_with_matches", "count"],
                "default": "content",
                "description": "target='content' only: matching lines, the files with a "
                "match, or the number of matching lines per file.",
            },
            "context": {
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_CONTEXT,
                "default": 0,
                "description": "Lines of context to return before and after each match.",
            },
            "case_insensitive": {
                "type": "boolean",
                "default": False,
                "description": "Ignore case in pattern (the regex, or the glob of target='files').",
            },
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_LIMIT,
                "default": DEFAULT_LIMIT,
                "description": "Most results to return in one call.",
            },
            "offset": {
                "type": "integer",
                "minimum": 0,
                "default": 0,
                "description": "Results to skip, for the next page (use next_offset).",
            },
        },
        "required": ["pattern"],
    },
}


# -- the host side --------------------------------------------------------------------

_RIPGREP: weakref.WeakKeyDictionary[Runtime, str | None] = weakref.WeakKeyDictionary()


async def ripgrep_path(env: Runtime) -> str | None:
    """Where ``rg`` is in ``env``, or None; asked once per environment object."""
    if env in _RIPGREP:
        return _RIPGREP[env]
    result = await env.execute("command -v rg", timeout=RG_PROBE_TIMEOUT)
    lines = result.output.strip().splitlines()
    found = lines[-1] if result.exit_code == 0 and lines and lines[-1].startswith("/") else None
    _RIPGREP[env] = found
    return found


def compile_pattern(pattern: str, case_insensitive: bool = False) -> re.Pattern[str]:
    """Compile a content pattern as the search does; raise ValueError saying what is wrong.

    Python's warnings about syntax it would read differently later (such as POSIX
    classes like ``[[:alpha:]]``) are errors here: they mean the pattern does not say
    what its author meant.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            return re.compile(pattern, re.IGNORECASE if case_insensitive else 0)
    except re.error as exc:
        where = f" at position {exc.pos}" if exc.pos is not None else ""
        raise ValueError(f"invalid regular expression {pattern!r}: {exc.msg}{where}") from None
    except Warning as exc:
        raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from None


def _choice(args: dict[str, Any], name: str, choices: tuple[str, ...]) -> str:
    value = args.get(name)
    if value is None:
        return choices[0]
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return str(value)


def _parameters(args: dict[str, Any]) -> dict[str, Any]:
    """The validated arguments of a call; raise ValueError naming the bad one."""
    pattern = args.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise ValueError("search_files needs a pattern (a non-empty string)")
    target = _choice(args, "target", ("content", "files"))
    path = args.get("path")
    if path is None or path == "":
        path = "."
    if not isinstance(path, str):
        raise ValueError(f"path must be a string, got {path!r}")
    file_glob = args.get("file_glob") or None
    if file_glob is not None and not isinstance(file_glob, str):
        raise ValueError(f"file_glob must be a string, got {file_glob!r}")
    case_insensitive = bool_arg(args, "case_insensitive")
    if target == "content":
        compile_pattern(pattern, case_insensitive)
    return {
        "pattern": pattern,
        "target": target,
        "path": path,
        "file_glob": file_glob,
        "output_mode": _choice(args, "output_mode", ("content", "files_with_matches", "count")),
        "context": int_arg(args, "context", 0, low=0, high=MAX_CONTEXT),
        "case_insensitive": case_insensitive,
        "limit": int_arg(args, "limit", DEFAULT_LIMIT, low=1, high=MAX_LIMIT),
        "offset": int_arg(args, "offset", 0, low=0),
    }


def _program_result(output: str) -> dict[str, Any] | None:
    for line in reversed(output.splitlines()):
        if line.startswith(_RESULT_MARKER):
            try:
                parsed = json.loads(line[len(_RESULT_MARKER) :])
            except ValueError:
                return None
            return parsed if isinstance(parsed, dict) else None
    return None


async def search_files(args: dict[str, Any], ctx: ToolContext) -> str:
    try:
        params = _parameters(args)
    except ValueError as exc:
        return tool_error(str(exc))
    env = ctx.environment
    shown = params["path"]
    try:
        resolved = await resolve_for_read(ctx, shown)
    except PathRefused as exc:
        return tool_error(str(exc), refused=True)
    info = resolved.stat
    if info is None:
        if isinstance(resolved.error, FileNotFoundError):
            return tool_error(f"Path not found: {shown}")
        if isinstance(resolved.error, PermissionError):
            return tool_error(f"Permission denied: {shown}")
        detail = resolved.error.strerror if resolved.error else None
        return tool_error(f"Cannot search {shown}: {detail or resolved.error}")
    if info.kind not in ("file", "directory"):
        return tool_error(f"{shown} is not a file or a directory")

    params.update(
        root=resolved.path,
        rg=await ripgrep_path(env),
        excluded_dirs=list(EXCLUDED_DIRS),
        max_filesize=MAX_FILESIZE,
        max_line_chars=MAX_LINE_CHARS,
        max_page_chars=MAX_PAGE_CHARS,
        marker=_RESULT_MARKER,
    )
    argv = (env.python, "-I", "-S", "-c", program_source("_search.py"), json.dumps(params))
    command = " ".join(shlex.quote(part) for part in argv)
    result = await env.execute(command, timeout=SEARCH_TIMEOUT)
    if result.timed_out:
        return tool_error(
            f"search_files took longer than {SEARCH_TIMEOUT:.0f} s; narrow path, file_glob "
            "or the pattern"
        )
    outcome = _program_result(result.output)
    if outcome is None:
        return tool_error(
            f"search_files failed (exit code {result.exit_code}): {result.output.strip()[-2000:]}"
        )
    if not outcome.get("ok"):
        return tool_error(str(outcome.get("error")))

    # Paths come back relative to root ("" is root itself); show them as the caller named it.
    absolute = posixpath.isabs(shown) or shown.startswith("~")
    base = ctx.resolve(shown) if absolute else posixpath.normpath(shown)

    def display(rel: str) -> str:
        if not rel:
            return base
        return rel if base == "." else posixpath.join(base, rel)

    items: list[Any] = outcome["items"]
    if params["target"] == "files" or params["output_mode"] == "files_with_matches":
        matches: list[Any] = [display(rel) for rel in items]
    else:
        matches = [{**item, "path": display(item["path"])} for item in items]
    total = int(outcome["total"])
    response: dict[str, Any] = {
        "matches": matches,
        "total": total,
        "truncated": params["offset"] + len(matches) < total,
    }
    if response["truncated"]:
        response["next_offset"] = params["offset"] + len(matches)
    return tool_result(response)


registry.register(
    name="search_files",
    toolset="file",
    schema=SEARCH_FILES_SCHEMA,
    handler=search_files,
    emoji="🔎",
)
