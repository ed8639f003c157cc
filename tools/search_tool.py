"""The search_files tool: find text in files, or files by name, where the script runs.

The search runs inside the run's environment as one small Python program
(:func:`_search_program`), so one call is one round trip on every backend and only the
requested page of results travels back. The program finds candidates with ripgrep when
the environment has ``rg``, and with a walk of its own otherwise; either way the same
code then filters, sorts and pages them, so both engines give the same results.
"""

from __future__ import annotations

import functools
import inspect
import json
import posixpath
import re
import shlex
import warnings
import weakref
from typing import Any

from hermes_sandbox.environments.base import Runtime
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


# -- the program that runs inside the environment ------------------------------------
# It must run on any Python 3.8+ and use nothing from this module: its source is sent
# as is. It prints one line, the marker followed by {"ok": true, "total", "items"} or
# {"ok": false, "error"}.


def _search_program(params):
    import base64
    import json
    import os
    import re
    import subprocess
    import warnings
    from collections import deque

    root = params["root"]
    root_is_dir = os.path.isdir(root)
    target = params["target"]
    mode = params["output_mode"]
    context = params["context"]
    ignore_case = params["case_insensitive"]
    rg = params["rg"]
    excluded = params["excluded_dirs"]
    max_filesize = params["max_filesize"]
    line_chars = params["max_line_chars"]

    def emit(result):
        print(params["marker"] + json.dumps(result))

    def clean(name):
        """A path from rg (its JSON object) or from os (str) as display text."""
        if isinstance(name, dict):
            if "text" in name:
                name = name["text"]
            else:
                name = base64.b64decode(name["bytes"]).decode("utf-8", "replace")
        else:
            name = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        return name[2:] if name.startswith("./") else name

    # Globs: '*' and '?' stay within one path component, '**' spans them, '{a,b}' is
    # either, '[...]' a class; a glob without '/' matches the name at any depth.
    def glob_body(glob):
        out = []
        i = 0
        while i < len(glob):
            char = glob[i]
            if glob.startswith("**/", i):
                out.append("(?:.*/)?")
                i += 3
                continue
            if glob.startswith("**", i):
                out.append(".*")
                i += 2
                continue
            if char == "*":
                out.append("[^/]*")
            elif char == "?":
                out.append("[^/]")
            elif char == "[":
                start = i + 1
                negate = start < len(glob) and glob[start] in "!^"
                if negate:
                    start += 1
                close = glob.find("]", start + 1)
                if close < 0:
                    out.append(re.escape(char))
                else:
                    inner = "".join("\\" + c if c in "\\[]&~|^" else c for c in glob[start:close])
                    out.append("[" + ("^" if negate else "") + inner + "]")
                    i = close + 1
                    continue
            elif char == "{":
                close = glob.find("}", i)
                if close < 0:
                    out.append(re.escape(char))
                else:
                    options = glob[i + 1 : close].split(",")
                    out.append("(?:" + "|".join(glob_body(o) for o in options) + ")")
                    i = close + 1
                    continue
            elif char == "\\" and i + 1 < len(glob):
                out.append(re.escape(glob[i + 1]))
                i += 2
                continue
            else:
                out.append(re.escape(char))
            i += 1
        return "".join(out)

    def glob_filter(glob, glob_ignore_case):
        negated = glob.startswith("!")
        glob = glob[1:] if negated else glob
        anchored = "/" in glob
        glob = glob.lstrip("/")
        prefix = "" if anchored else "(?:.*/)?"
        flags = re.IGNORECASE if glob_ignore_case else 0
        return re.compile("(?s)" + prefix + glob_body(glob) + r"\Z", flags), negated

    filters = []
    if target == "files":
        filters.append(glob_filter(params["pattern"], ignore_case))
    if params["file_glob"]:
        filters.append(glob_filter(params["file_glob"], False))

    def wanted(rel):
        name = rel or os.path.basename(root)
        return all(bool(rx.match(name)) != negated for rx, negated in filters)

    # Globs rg may use to skip files early: only plain name globs, whose meaning in rg
    # is surely no narrower than ours. The filter above decides in the end.
    prefilter = []
    for glob in (params["pattern"] if target == "files" else None, params["file_glob"]):
        if glob and not ignore_case and re.match(r"[^/\\\[\]!?]+\Z", glob):
            prefilter += ["--glob", glob]
    rg_common = ["--no-config", "--no-ignore", "--hidden", "--no-messages"]
    rg_common += ["--max-filesize", str(max_filesize)]
    rg_walk = prefilter[:]  # after the include globs, so that the excludes win
    for name in excluded:
        rg_walk += ["--glob", "!" + name + "/"]

    # Finders yield (rel, {line_number: text}, [matching line numbers]) per file, in any
    # order; text is the line without its ending.
    def walk():
        if not root_is_dir:
            yield "", root
            return
        pending = [("", root)]
        while pending:
            rel_dir, full_dir = pending.pop()
            try:
                entries = list(os.scandir(full_dir))
            except OSError:
                continue
            for entry in entries:
                rel = rel_dir + "/" + entry.name if rel_dir else entry.name
                try:
                    if entry.is_symlink():
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name not in excluded:
                            pending.append((rel, entry.path))
                    elif (
                        entry.is_file(follow_symlinks=False)
                        and entry.stat(follow_symlinks=False).st_size <= max_filesize
                    ):
                        yield rel, entry.path
                except OSError:
                    continue

    def python_scan(full, rx):
        lines: dict[int, str] = {}  # (local annotations are never evaluated: fine on 3.8)
        matches = []
        before: deque[tuple[int, str]] = deque(maxlen=context)
        after = 0
        number = 0
        try:
            with open(full, "rb") as handle:
                if b"\0" in handle.read(65536):
                    return None
                handle.seek(0)
                for raw in handle:
                    if b"\0" in raw:
                        return None  # binary, however late the NUL
                    number += 1
                    if raw.endswith(b"\n"):
                        raw = raw[:-1]
                    if raw.endswith(b"\r"):
                        raw = raw[:-1]
                    text = raw.decode("utf-8", "replace")
                    if rx.search(text):
                        lines.update(before)
                        before.clear()
                        lines[number] = text
                        matches.append(number)
                        after = context
                    elif after:
                        lines[number] = text
                        after -= 1
                    elif context:
                        before.append((number, text))
        except OSError:
            return None
        return lines, matches

    def python_content(rx):
        for rel, full in walk():
            rel = clean(rel)
            if not wanted(rel):
                continue
            found = python_scan(full, rx)
            if found and found[1]:
                yield rel, found[0], found[1]

    def rg_content(rx):
        argv = [rg, "--json", "--crlf", "--encoding", "none", "--no-mmap", *rg_common]
        argv += ["--ignore-case" if ignore_case else "--case-sensitive"]
        argv += ["--regexp", params["pattern"]]
        if context:
            argv += ["--context", str(context)]
        if root_is_dir:
            argv += [*rg_walk, "--", "."]
        else:
            argv += ["--", root]
        process = subprocess.Popen(
            argv,
            cwd=root if root_is_dir else None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        produced = 0
        current = None
        assert process.stdout is not None
        with process:
            for raw in process.stdout:
                try:
                    message = json.loads(raw)
                    kind = message["type"]
                    data = message["data"]
                except (ValueError, KeyError, TypeError):
                    continue
                if kind == "begin":
                    current = ("" if not root_is_dir else clean(data["path"]), {}, [])
                elif kind in ("match", "context") and current is not None:
                    lines = data["lines"]
                    text = lines["text"] if "text" in lines else clean(lines)
                    text = text[:-1] if text.endswith("\n") else text
                    text = text[:-1] if text.endswith("\r") else text
                    current[1][data["line_number"]] = text
                    if kind == "match":
                        current[2].append(data["line_number"])
                elif kind == "end" and current is not None:
                    # A NUL anywhere makes the file binary; rg reports where it saw one.
                    if data.get("binary_offset") is None and wanted(current[0]):
                        produced += 1
                        yield current
                    current = None
        if process.returncode not in (0, 1) and not produced:
            # rg refused (a regex only Python accepts, say): the walk gives the answer.
            yield from python_content(rx)

    def rg_files():
        process = subprocess.run(
            [rg, "--files", "--null", *rg_common, *rg_walk, "--", "."],
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        if process.returncode not in (0, 1):
            return None
        names = process.stdout.split(b"\0")
        return [clean(name.decode("utf-8", "surrogateescape")) for name in names if name]

    # Keep only the page's worth of the smallest results: memory stays bounded however
    # many there are.
    keep_count = params["offset"] + params["limit"]
    kept = []

    def key(entry):
        return entry[0]

    def keep(sort_key, item):
        kept.append((sort_key, item))
        if len(kept) >= 2 * keep_count + 1000:
            kept.sort(key=key)
            del kept[keep_count:]

    def cut(text):
        return text if len(text) <= line_chars else text[:line_chars] + "…"

    total = 0
    if target == "files":
        names = None
        if not root_is_dir:
            names = [""]
        elif rg:
            names = rg_files()
        if names is None:
            names = [clean(rel) for rel, _ in walk()]
        for rel in names:
            if wanted(rel):
                total += 1
                keep((rel.split("/"),), rel)
    else:
        flags = re.IGNORECASE if ignore_case else 0
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                rx = re.compile(params["pattern"], flags)
        except (re.error, Warning) as exc:
            emit({"ok": False, "error": f"invalid regular expression: {exc}"})
            return
        for rel, lines, matches in rg_content(rx) if rg else python_content(rx):
            parts = rel.split("/")
            if mode == "content":
                for number in matches:
                    item = {"path": rel, "line": number, "text": cut(lines[number])}
                    if context:
                        item["before"] = [
                            cut(lines[n]) for n in range(number - context, number) if n in lines
                        ]
                        item["after"] = [
                            cut(lines[n])
                            for n in range(number + 1, number + 1 + context)
                            if n in lines
                        ]
                    keep((parts, number), item)
                total += len(matches)
            else:
                total += 1
                if mode == "count":
                    keep((parts,), {"path": rel, "count": len(matches)})
                else:
                    keep((parts,), rel)

    kept.sort(key=key)
    page: list[object] = []
    size = 0
    for _, item in kept[params["offset"] : keep_count]:
        size += len(json.dumps(item))
        if page and size > params["max_page_chars"]:
            break
        page.append(item)
    emit({"ok": True, "total": total, "items": page})


@functools.cache
def _program_source() -> str:
    source = inspect.getsource(_search_program)
    return f"{source}\nimport json, sys\n_search_program(json.loads(sys.argv[1]))\n"


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
    argv = (env.python, "-I", "-S", "-c", _program_source(), json.dumps(params))
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
