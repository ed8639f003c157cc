"""The patch tool: edit files in place, by one exact replacement or by a multi-file patch.

It acts in the run's environment (``ctx.environment``), like read_file and write_file. A
multi-file patch (the "V4A" format of coding agents) is checked whole against the files
before anything is written, and a write that fails midway is rolled back, so a patch
lands completely or not at all.
"""

from __future__ import annotations

import difflib
import posixpath
import re
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from hermes_sandbox.environments.base import Runtime
from hermes_sandbox.errors import ToolError
from hermes_sandbox.tools.handler_args import bool_arg
from hermes_sandbox.tools.path_policy import PathRefused, ResolvedPath, resolve_for_write
from hermes_sandbox.tools.registry import ToolContext, registry, tool_error, tool_result

MAX_PATCH_FILE_BYTES = 20 * 1024 * 1024  # files bigger than this are refused, not edited
MAX_DIFF_CHARS = 6_000  # the diff in a result is cut past this many characters
SHELL_TIMEOUT = 60.0  # seconds for one rm or mv in the environment
_BINARY_SNIFF = 8192
_SHOWN_LINES = 6  # lines of a hunk quoted back in an error

PATCH_SCHEMA = {
    "name": "patch",
    "description": (
        "Edit text files in place. Two modes.\n"
        "mode='replace' (the default): replace old_string with new_string in the file at "
        "path. old_string must match the file exactly (whitespace and indentation "
        "included) and, unless replace_all is true, exactly once: add surrounding lines "
        "to make it unique. Line endings are kept (a CRLF file stays CRLF).\n"
        "mode='patch' (the default when `patch` is given): apply one patch that adds, "
        "updates, renames and deletes any number of files:\n"
        "*** Begin Patch\n"
        "*** Add File: path/new.txt\n"
        "+first line of the new file\n"
        "*** Update File: path/existing.py\n"
        "*** Move to: path/renamed.py   (optional: rename the file too)\n"
        "@@ def some_function():   (optional anchor: a line to find first)\n"
        " context line (leading space)\n"
        "-line to remove\n"
        "+line to add\n"
        "*** End of File   (optional: this hunk is at the end of the file)\n"
        "*** Delete File: path/old.txt\n"
        "*** End Patch\n"
        "Each hunk's context and '-' lines must appear in the file, in order, after the "
        "previous hunk (trailing whitespace is ignored); a hunk with no context or '-' "
        "lines inserts its '+' lines right after its @@ anchor, or at the end of the file. "
        "The whole patch is checked before anything is written: if any file or hunk does "
        "not fit, nothing changes and the error names every file and hunk that failed.\n"
        "Returns {status: 'ok', path, replacements, diff} in replace mode and "
        "{status: 'ok', files: [{path, action, moved_to?}], diff} in patch mode (action is "
        "'add', 'update' or 'delete'); diff is a unified diff of the change, cut past "
        f"{MAX_DIFF_CHARS:,} characters. On failure returns {{error}}: file not found, "
        "old_string not found (with the line of a match that differs only in whitespace, "
        "if there is one), old_string found N times (with their lines), a file to add "
        "that already exists, a hunk that does not match, a malformed patch."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "description": "replace mode: the file to edit; relative paths start at the "
                "working directory.",
            },
            "old_string": {
                "type": "string",
                "description": "replace mode: the exact text to replace, copied from the "
                "file with its indentation.",
            },
            "new_string": {
                "type": "string",
                "description": "replace mode: the text to put in its place ('' deletes it).",
            },
            "replace_all": {
                "type": "boolean",
                "default": False,
                "description": "replace mode: replace every occurrence instead of requiring "
                "exactly one.",
            },
            "mode": {
                "type": "string",
                "enum": ["replace", "patch"],
                "description": "'replace' (default) or 'patch' (default when patch is given).",
            },
            "patch": {
                "type": "string",
                "description": "patch mode: the whole patch, from '*** Begin Patch' to "
                "'*** End Patch'. Paths in it are relative to the working directory and stay "
                "inside it: a header with '..' or an absolute path elsewhere is refused.",
            },
        },
        "required": [],
    },
}


class PatchError(ToolError):
    """Why a patch could not be applied; the message is meant for the model.

    ``refused`` marks a refusal by the path policy (the result then says so).
    """

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


# -- text files: loading, line endings, diffs ------------------------------------------


async def _resolve(ctx: ToolContext, path: str) -> ResolvedPath:
    """Resolve a path the patch will write (or delete); raise PatchError if refused."""
    try:
        return await resolve_for_write(ctx, path)
    except PathRefused as exc:
        raise PatchError(str(exc), refused=True) from None


async def _load(env: Runtime, shown: str, resolved: ResolvedPath, *, text: bool = True) -> bytes:
    """The bytes of a regular file to edit (``text``) or to keep for a rollback."""
    info = resolved.stat
    if info is None:
        if isinstance(resolved.error, FileNotFoundError):
            raise PatchError(f"File not found: {shown}")
        if isinstance(resolved.error, PermissionError):
            raise PatchError(f"Permission denied: {shown}")
        detail = resolved.error.strerror if resolved.error else None
        raise PatchError(f"Cannot read {shown}: {detail or resolved.error}")
    if info.kind == "directory":
        raise PatchError(f"{shown} is a directory; patch works on files")
    if info.kind != "file":
        raise PatchError(f"{shown} is not a regular file")
    if info.size > MAX_PATCH_FILE_BYTES:
        raise PatchError(
            f"{shown} is {info.size:,} bytes, over patch's {MAX_PATCH_FILE_BYTES:,}-byte limit"
        )
    try:
        data = await env.read_bytes(resolved.path, max_bytes=MAX_PATCH_FILE_BYTES + 1)
    except OSError as exc:
        raise PatchError(f"Cannot read {shown}: {exc.strerror or exc}") from None
    if text and b"\0" in data[:_BINARY_SNIFF]:
        raise PatchError(f"{shown} looks like a binary file; patch edits text files only")
    return data


def _require_absent(shown: str, resolved: ResolvedPath, message: str) -> None:
    """Raise PatchError(``message``) unless nothing is at ``resolved``."""
    if resolved.stat is not None:
        what = "a directory" if resolved.stat.kind == "directory" else "a file"
        raise PatchError(message.format(shown=shown, what=what))
    if isinstance(resolved.error, NotADirectoryError):
        raise PatchError(f"a parent of {shown} is a file, not a directory")
    if resolved.error is not None and not isinstance(resolved.error, FileNotFoundError):
        raise PatchError(f"cannot check {shown}: {resolved.error.strerror or resolved.error}")


def _decode(data: bytes) -> str:
    # surrogateescape: bytes that are not UTF-8 survive an edit elsewhere in the file.
    return data.decode("utf-8", "surrogateescape")


def _encode(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise PatchError(f"{what} holds characters that cannot be written as UTF-8") from None


def _dominant_eol(text: str) -> str:
    crlf = text.count("\r\n")
    return "\r\n" if crlf and crlf >= text.count("\n") - crlf else "\n"


def _with_eol(text: str, eol: str) -> str:
    text = text.replace("\r\n", "\n")
    return text.replace("\n", eol) if eol != "\n" else text


def _display_lines(text: str) -> list[str]:
    if not text:
        return []
    shown = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    lines = shown.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


_RANGE = re.compile(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@")


def _unified_diff(before: str, after: str, old_label: str, new_label: str) -> str:
    """A unified diff of one file; only the changed region goes through difflib."""
    a, b = _display_lines(before), _display_lines(after)
    # Trim the common head and tail first: difflib is slow on big files.
    head = 0
    while head < len(a) and head < len(b) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < len(a) - head and tail < len(b) - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    skip = max(head - 3, 0)
    keep = max(tail - 3, 0)
    lines = list(
        difflib.unified_diff(
            a[skip : len(a) - keep],
            b[skip : len(b) - keep],
            fromfile=old_label,
            tofile=new_label,
            lineterm="",
        )
    )

    def shift(match: re.Match[str]) -> str:
        old_start, old_len, new_start, new_len = match.groups()
        return (
            f"@@ -{int(old_start) + skip}{old_len or ''} +{int(new_start) + skip}{new_len or ''} @@"
        )

    return "\n".join(_RANGE.sub(shift, line) if line.startswith("@@") else line for line in lines)


def _cap_diff(diff: str) -> str:
    if len(diff) <= MAX_DIFF_CHARS:
        return diff
    cut = diff.rfind("\n", 0, MAX_DIFF_CHARS)
    cut = cut if cut > 0 else MAX_DIFF_CHARS
    return f"{diff[:cut]}\n... [diff truncated: {len(diff) - cut:,} more characters]"


def _line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _quote_line(line: str, limit: int = 120) -> str:
    line = line.strip()
    return repr(line if len(line) <= limit else line[:limit] + "...")


# -- replace mode ---------------------------------------------------------------------


_HINT_MAX_CHARS = 5_000  # longer old_strings get no whitespace-insensitive hint


def _not_found_message(shown: str, text: str, old: str) -> str:
    message = f"old_string was not found in {shown}."
    visible = "".join(old.split())
    if visible and len(visible) <= _HINT_MAX_CHARS:
        # The same characters with any whitespace between them; no backtracking blow-up,
        # since each \s* run stops at the next visible character.
        loose = re.compile(r"\s*".join(re.escape(char) for char in visible))
        found = loose.search(text)
        if found is not None:
            line = _line_of(text, found.start())
            first = text.split("\n", line)[line - 1]
            return (
                f"{message} Text that differs only in whitespace (indentation, line breaks or "
                f"trailing spaces) starts at line {line}: {_quote_line(first)}. Copy the exact "
                "text from read_file, whitespace included, and try again."
            )
    return f"{message} Read the file again (read_file) and copy the exact text to replace."


def _occurrences(text: str, needle: str) -> list[int]:
    found: list[int] = []
    start = text.find(needle)
    while start >= 0:
        found.append(start)
        start = text.find(needle, start + len(needle))
    return found


async def _replace(args: dict[str, Any], ctx: ToolContext) -> str:
    path = args.get("path")
    old = args.get("old_string")
    new = args.get("new_string")
    if not isinstance(path, str) or not path:
        raise PatchError("replace mode needs a path (a non-empty string)")
    if not isinstance(old, str) or not old:
        raise PatchError(
            "replace mode needs old_string, the exact text to replace (to create a file, "
            "use write_file)"
        )
    if not isinstance(new, str):
        raise PatchError("replace mode needs new_string as a string ('' deletes old_string)")
    if old == new:
        raise PatchError("old_string and new_string are identical; nothing to change")
    try:
        replace_all = bool_arg(args, "replace_all")
    except ValueError as exc:
        raise PatchError(str(exc)) from None
    resolved = await _resolve(ctx, path)
    text = _decode(await _load(ctx.environment, path, resolved))

    # The model writes "\n"; in a CRLF file that text is there with "\r\n".
    eol = _dominant_eol(text)
    variants = [(_with_eol(old, eol), _with_eol(new, eol)), (old, new)]
    chosen = next(((o, n) for o, n in variants if o in text), None)
    if chosen is None:
        raise PatchError(_not_found_message(path, text, old))
    old_text, new_text = chosen
    positions = _occurrences(text, old_text)
    if len(positions) > 1 and not replace_all:
        lines = [_line_of(text, p) for p in positions[:20]]
        shown = ", ".join(map(str, lines)) + (", ..." if len(positions) > 20 else "")
        raise PatchError(
            f"old_string occurs {len(positions)} times in {path} (lines {shown}). Include more "
            "surrounding lines to make it unique, or set replace_all=true to replace every "
            "occurrence."
        )
    updated = text.replace(old_text, new_text)
    data = _encode(updated, "new_string")
    try:
        await ctx.environment.write_bytes(resolved.path, data, make_parents=False)
    except OSError as exc:
        raise PatchError(f"Cannot write {path}: {exc.strerror or exc}") from None
    diff = _unified_diff(text, updated, f"a/{path}", f"b/{path}")
    return tool_result(
        status="ok", path=resolved.path, replacements=len(positions), diff=_cap_diff(diff)
    )


# -- patch mode: parsing --------------------------------------------------------------

_BEGIN = "*** Begin Patch"
_END = "*** End Patch"
_ADD = "*** Add File: "
_UPDATE = "*** Update File: "
_DELETE = "*** Delete File: "
_MOVE = "*** Move to: "
_END_OF_FILE = "*** End of File"
_FILE_HEADERS = (_ADD, _UPDATE, _DELETE)
# A unified-diff hunk header ("@@ -12,5 +12,6 @@ def f():") is accepted in place of "@@".
_UNIFIED_HEADER = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@ ?(.*)$")


@dataclass(slots=True)
class _Hunk:
    number: int  # 1-based within its file
    patch_line: int  # where it starts in the patch
    anchors: list[str] = field(default_factory=list)
    old: list[str] = field(default_factory=list)  # context and removed lines
    new: list[str] = field(default_factory=list)  # context and added lines
    # For each line of ``new``: the index in ``old`` of the context line it is, or None
    # for an added line. Context lines are kept as the file has them.
    sources: list[int | None] = field(default_factory=list)
    changes: bool = False
    at_eof: bool = False


@dataclass(slots=True)
class _Operation:
    action: str  # "add", "update" or "delete"
    path: str  # as written in the patch
    patch_line: int
    move_to: str | None = None
    lines: list[str] = field(default_factory=list)  # an added file's content
    hunks: list[_Hunk] = field(default_factory=list)


def _parse_patch(text: str) -> list[_Operation]:
    """Parse a V4A patch into operations; raise PatchError naming the bad line."""
    lines = [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]
    filled = [i for i, line in enumerate(lines) if line.strip()]
    if not filled or lines[filled[0]].strip() != _BEGIN:
        raise PatchError(f"a patch starts with the line '{_BEGIN}'")
    if lines[filled[-1]].strip() != _END:
        raise PatchError(f"a patch ends with the line '{_END}'")
    end = filled[-1]
    index = filled[0] + 1
    operations: list[_Operation] = []

    def section_end(start: int) -> int:
        stop = start
        while stop < end and not lines[stop].startswith(_FILE_HEADERS):
            stop += 1
        return stop

    while index < end:
        line = lines[index]
        if not line.strip():
            index += 1
            continue
        if line.startswith(_DELETE):
            operations.append(_Operation("delete", _header_path(line, _DELETE, index), index + 1))
            index += 1
        elif line.startswith(_ADD):
            operation = _Operation("add", _header_path(line, _ADD, index), index + 1)
            stop = section_end(index + 1)
            body = lines[index + 1 : stop]
            while body and body[-1] == "":
                body.pop()  # blank lines between sections
            for offset, content in enumerate(body):
                if not content.startswith("+"):
                    raise PatchError(
                        f"patch line {index + 2 + offset}: every line of an added file starts "
                        f"with '+' ('+' alone for an empty line); got {content!r}"
                    )
                operation.lines.append(content[1:])
            operations.append(operation)
            index = stop
        elif line.startswith(_UPDATE):
            operation = _Operation("update", _header_path(line, _UPDATE, index), index + 1)
            index += 1
            if index < end and lines[index].startswith(_MOVE):
                operation.move_to = _header_path(lines[index], _MOVE, index)
                index += 1
            stop = section_end(index)
            operation.hunks = _parse_hunks(lines, index, stop, operation.path)
            if not operation.hunks and operation.move_to is None:
                raise PatchError(
                    f"patch line {operation.patch_line}: Update File {operation.path} has no "
                    "hunks and no '*** Move to:'"
                )
            operations.append(operation)
            index = stop
        else:
            raise PatchError(
                f"patch line {index + 1}: expected '{_ADD.strip()}', '{_UPDATE.strip()}', "
                f"'{_DELETE.strip()}' or '{_END}'; got {line!r}"
            )
    if not operations:
        raise PatchError("the patch changes no file")
    return operations


def _header_path(line: str, header: str, index: int) -> str:
    path = line[len(header) :].strip()
    if not path:
        raise PatchError(f"patch line {index + 1}: '{header.strip()}' needs a path")
    return path


def _parse_hunks(lines: list[str], start: int, stop: int, path: str) -> list[_Hunk]:
    body = lines[start:stop]
    while body and body[-1] == "":
        body.pop()  # blank lines between sections
    hunks: list[_Hunk] = []
    current: _Hunk | None = None

    def close() -> None:
        nonlocal current
        if current is None:
            return
        if not current.changes:
            raise PatchError(
                f"patch line {current.patch_line}: hunk {current.number} of {path} has no "
                "'-' or '+' lines, so it changes nothing"
            )
        hunks.append(current)
        current = None

    for offset, line in enumerate(body):
        number = start + offset + 1
        if line.startswith("@@"):
            unified = _UNIFIED_HEADER.match(line)
            anchor = (unified.group(1) if unified else line[2:]).strip()
            if current is not None and (current.old or current.new):
                close()
            if current is None:
                current = _Hunk(len(hunks) + 1, number)
            if anchor:
                current.anchors.append(anchor)
        elif line.strip() == _END_OF_FILE:
            if current is None or not (current.old or current.new):
                raise PatchError(f"patch line {number}: '{_END_OF_FILE}' must end a hunk")
            current.at_eof = True
            close()
        elif line == "" or line[0] in " -+":
            if current is None:
                current = _Hunk(len(hunks) + 1, number)
            kind, content = (line[0], line[1:]) if line else (" ", "")
            if kind != "+":
                current.old.append(content)
            if kind != "-":
                current.new.append(content)
                current.sources.append(len(current.old) - 1 if kind == " " else None)
            current.changes = current.changes or kind != " "
        else:
            raise PatchError(
                f"patch line {number}: in Update File {path}, a line starts with ' ' (context), "
                f"'-' (remove), '+' (add) or '@@' (new hunk); got {line!r}"
            )
    close()
    return hunks


# -- patch mode: fitting hunks to a file ----------------------------------------------


@dataclass(slots=True)
class _Line:
    content: str  # without its line ending
    ending: str  # "\n", "\r\n", or "" for a last line without one


def _split_lines(text: str) -> list[_Line]:
    parts = text.split("\n")
    result = [
        _Line(part[:-1], "\r\n") if part.endswith("\r") else _Line(part, "\n")
        for part in parts[:-1]
    ]
    if parts[-1]:
        result.append(_Line(parts[-1], ""))
    return result


def _seek(lines: list[_Line], pattern: list[str], start: int, at_eof: bool) -> int | None:
    """First index >= start where ``pattern`` matches, exactly or up to trailing whitespace."""
    last = len(lines) - len(pattern)

    def fits(index: int, strict: bool) -> bool:
        if strict:
            return all(lines[index + k].content == p for k, p in enumerate(pattern))
        return all(lines[index + k].content.rstrip() == p.rstrip() for k, p in enumerate(pattern))

    for strict in (True, False):
        if at_eof and last >= start and fits(last, strict):
            return last
        for index in range(start, last + 1):
            if fits(index, strict):
                return index
    return None


def _hunk_failure(hunk: _Hunk, lines: list[_Line], start: int, why: str) -> str:
    quoted = "\n".join(f"    {line}" for line in hunk.old[:_SHOWN_LINES])
    hidden = len(hunk.old) - _SHOWN_LINES
    more = f"\n    ... ({hidden} more)" if hidden > 0 else ""
    message = f"hunk {hunk.number} (patch line {hunk.patch_line}) {why}"
    if hunk.old:
        message += f":\n{quoted}{more}"
        first = next((line for line in hunk.old if line.strip()), None)
        if first is not None:
            seen = [i + 1 for i, line in enumerate(lines) if line.content.strip() == first.strip()]
            if seen:
                listed = ", ".join(map(str, seen[:10])) + (", ..." if len(seen) > 10 else "")
                message += f"\n  ({_quote_line(first)} is at line {listed} of the file"
                message += f"; this hunk was searched from line {start + 1})" if start else ")"
    return message


def _apply_hunks(text: str, hunks: list[_Hunk]) -> str:
    """The new text of a file after its hunks; raise PatchError for the first misfit."""
    lines = _split_lines(text)
    eol = _dominant_eol(text)
    replacements: list[tuple[int, int, list[str], list[int | None]]] = []
    cursor = 0
    for hunk in hunks:
        for anchor in hunk.anchors:
            found = next(
                (i for i in range(cursor, len(lines)) if lines[i].content.strip() == anchor),
                None,
            )
            if found is None:
                raise PatchError(
                    f"hunk {hunk.number} (patch line {hunk.patch_line}): the @@ anchor "
                    f"line {_quote_line(anchor)} was not found"
                    + (f" after line {cursor}" if cursor else "")
                )
            cursor = found + 1
        old, new, sources = hunk.old, hunk.new, hunk.sources
        at: int | None
        if not old:
            at = cursor if hunk.anchors and not hunk.at_eof else len(lines)
        else:
            at = _seek(lines, old, cursor, hunk.at_eof)
            if at is None and old[-1] == "" and sources and sources[-1] == len(old) - 1:
                # A trailing blank context line is often an artefact of the patch's layout.
                old, new, sources = old[:-1], new[:-1], sources[:-1]
                at = _seek(lines, old, cursor, hunk.at_eof) if old else None
            if at is None:
                why = "does not match the file" + (" (expected at its end)" if hunk.at_eof else "")
                raise PatchError(_hunk_failure(hunk, lines, cursor, why))
        replacements.append((at, len(old), new, sources))
        cursor = at + len(old)

    for at, count, new, sources in reversed(replacements):  # last first: indexes stay valid
        fresh = [
            _Line(content, eol)
            if source is None
            else _Line(lines[at + source].content, lines[at + source].ending)
            for content, source in zip(new, sources, strict=True)
        ]
        # Keep "no newline at end of file" when a hunk replaces or extends that last line.
        unterminated = bool(lines) and lines[-1].ending == "" and at + count == len(lines)
        if unterminated and fresh:
            if not count:
                lines[-1].ending = eol
            fresh[-1].ending = ""
        lines[at : at + count] = fresh
    return "".join(line.content + line.ending for line in lines)


# -- patch mode: checking the whole plan, then applying it ----------------------------


@dataclass(slots=True)
class _Change:
    action: str
    shown: str  # the path as the patch wrote it
    path: str  # resolved by the path policy: where the change is made
    before: bytes = b""
    after: bytes = b""
    move_to: str | None = None  # resolved, like path
    shown_move_to: str | None = None


_LABELS = {"add": "Add File", "update": "Update File", "delete": "Delete File"}
_ADD_EXISTS = "{what} is already there; use '*** Update File:' to change it"
_MOVE_EXISTS = "cannot move to {shown}: {what} is already there"


async def _plan(operations: list[_Operation], ctx: ToolContext) -> list[_Change]:
    """Check every operation against the files; raise PatchError listing every misfit."""
    env = ctx.environment
    problems: list[str] = []
    refused = False
    changes: list[_Change] = []
    claimed: dict[str, int] = {}  # resolved path -> the patch line that changes it

    def claim(path: str, shown: str, line: int) -> None:
        if path in claimed:
            raise PatchError(
                f"{shown} is already changed by this patch (at patch line {claimed[path]}); "
                "change each file once"
            )
        claimed[path] = line

    for op in operations:
        try:
            _require_inside_cwd(ctx, op.path)
            if op.move_to is not None:
                _require_inside_cwd(ctx, op.move_to)
            resolved = await _resolve(ctx, op.path)
            claim(resolved.path, op.path, op.patch_line)
            change = _Change(op.action, op.path, resolved.path)
            if op.action == "add":
                _require_absent(op.path, resolved, _ADD_EXISTS)
                change.after = _encode(_joined(op.lines), f"the content of {op.path}")
            else:
                change.before = await _load(env, op.path, resolved, text=op.action == "update")
                if op.action == "update":
                    after = _apply_hunks(_decode(change.before), op.hunks)
                    change.after = _encode(after, f"the new content of {op.path}")
            if op.move_to is not None:
                destination = await _resolve(ctx, op.move_to)
                if destination.path != resolved.path:
                    claim(destination.path, op.move_to, op.patch_line)
                    _require_absent(op.move_to, destination, _MOVE_EXISTS)
                    change.move_to, change.shown_move_to = destination.path, op.move_to
        except PatchError as exc:
            refused = refused or exc.refused
            problems.append(f"{_LABELS[op.action]} {op.path} (patch line {op.patch_line}): {exc}")
            continue
        changes.append(change)
    if problems:
        count = f"{len(problems)} problems" if len(problems) > 1 else "a problem"
        raise PatchError(
            f"The patch was not applied ({count}; no file was changed):\n- "
            + "\n- ".join(problems),
            refused=refused,
        )
    return changes


def _require_inside_cwd(ctx: ToolContext, path: str) -> None:
    """Refuse a patch header that leaves the working directory: any '..' component, or an
    absolute (or ``~``) path outside it. Checked on the text, with or without a workspace
    root: a patch is text a model may have copied from anywhere."""
    cwd = posixpath.normpath(ctx.cwd)
    full = posixpath.normpath(posixpath.join(cwd, ctx.expand_user(path)))
    climbs = ".." in path.split("/")
    if climbs or not (cwd == "/" or full == cwd or full.startswith(cwd.rstrip("/") + "/")):
        why = "it has a '..' component" if climbs else f"it is {full}"
        raise PatchError(
            f"Refused: {why}, outside the working directory {cwd}. A patch header names "
            "a file inside the working directory, relative to it and without '..'.",
            refused=True,
        )


def _joined(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


async def _sh(env: Runtime, command: str) -> None:
    result = await env.execute(command, timeout=SHELL_TIMEOUT)
    if result.exit_code != 0:
        raise PatchError(result.output.strip() or f"'{command}' exited with {result.exit_code}")


Undo = Callable[[], Awaitable[None]]


async def _apply(changes: list[_Change], env: Runtime) -> None:
    """Make every change, deletions last; undo what was done if one fails."""
    q = shlex.quote
    undo: list[Undo] = []
    deletions = [c for c in changes if c.action == "delete"]
    current = ""
    try:
        for change in changes:
            current = change.shown
            if change.action == "add":
                await env.write_bytes(change.path, change.after, make_parents=True)
                undo.append(partial(_sh, env, f"rm -f -- {q(change.path)}"))
            elif change.action == "update" and change.move_to is None:
                await env.write_bytes(change.path, change.after, make_parents=False)
                undo.append(
                    partial(env.write_bytes, change.path, change.before, make_parents=False)
                )
            elif change.action == "update":
                assert change.move_to is not None
                source, destination = q(change.path), q(change.move_to)
                parent = q(posixpath.dirname(change.move_to) or "/")
                # mv keeps the file's mode and owner; rewriting it at the new path would not.
                await _sh(env, f"mkdir -p -- {parent} && mv -- {source} {destination}")
                undo.append(partial(_sh, env, f"mv -- {destination} {source}"))
                await env.write_bytes(change.move_to, change.after, make_parents=False)
                undo.append(
                    partial(env.write_bytes, change.move_to, change.before, make_parents=False)
                )
        if deletions:
            current = ", ".join(c.shown for c in deletions)
            # Restoring a deleted file rewrites its bytes (its mode is not kept).
            undo.extend(partial(_restore_if_missing, env, c.path, c.before) for c in deletions)
            await _sh(env, "rm -f -- " + " ".join(q(c.path) for c in deletions))
    except Exception as exc:
        failed: list[str] = []
        for step in reversed(undo):
            try:
                await step()
            except Exception as undo_exc:
                failed.append(f"{type(undo_exc).__name__}: {undo_exc}")
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        message = f"The patch failed while writing {current}: {reason}."
        if failed:
            message += (
                " Rolling back the changes already made ALSO failed, so files may be in a "
                "mixed state: " + "; ".join(failed)
            )
        else:
            message += " Every change already made was rolled back; no file was changed."
        raise PatchError(message) from exc


async def _restore_if_missing(env: Runtime, path: str, data: bytes) -> None:
    try:
        await env.stat(path)
    except FileNotFoundError:
        await env.write_bytes(path, data, make_parents=True)


async def _apply_patch(args: dict[str, Any], ctx: ToolContext) -> str:
    text = args.get("patch")
    if not isinstance(text, str) or not text.strip():
        raise PatchError(f"patch mode needs patch, the patch text from '{_BEGIN}' to '{_END}'")
    operations = _parse_patch(text)
    changes = await _plan(operations, ctx)
    await _apply(changes, ctx.environment)
    files: list[dict[str, str]] = []
    diffs: list[str] = []
    for change in changes:
        entry = {"path": change.path, "action": change.action}
        old_label = "/dev/null" if change.action == "add" else f"a/{change.shown}"
        new_label = "/dev/null" if change.action == "delete" else f"b/{change.shown}"
        if change.move_to is not None:
            entry["moved_to"] = change.move_to
            new_label = f"b/{change.shown_move_to}"
        files.append(entry)
        before, after = _decode(change.before), _decode(change.after)
        if change.action == "delete" and b"\0" in change.before[:_BINARY_SNIFF]:
            diffs.append(f"Binary file {change.shown} deleted")
        else:
            diff = _unified_diff(before, after, old_label, new_label)
            diffs.append(diff or f"{change.shown} renamed to {change.shown_move_to} unchanged")
    return tool_result(status="ok", files=files, diff=_cap_diff("\n".join(diffs)))


async def patch(args: dict[str, Any], ctx: ToolContext) -> str:
    mode = args.get("mode") or ("patch" if args.get("patch") is not None else "replace")
    try:
        if mode == "replace":
            return await _replace(args, ctx)
        if mode == "patch":
            return await _apply_patch(args, ctx)
        return tool_error(f"mode must be 'replace' or 'patch', got {mode!r}")
    except PatchError as exc:
        return tool_error(str(exc), **({"refused": True} if exc.refused else {}))


registry.register(
    name="patch",
    toolset="file",
    schema=PATCH_SCHEMA,
    handler=patch,
    emoji="🩹",
)
