"""The V4A patch format (the multi-file patches of coding agents), parsed into operations.

The grammar, and what this parser tolerates, is described in docs/compatibility.md
("V4A patches"). Markers count only at the start of a line, so a content line that
mentions one (``+*** End Patch``) stays content.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hermes_sandbox.tools.patch_text import PatchError

BEGIN = "*** Begin Patch"
END = "*** End Patch"

_BEGIN = re.compile(r"^\*\*\*\s*Begin\s+Patch\s*$")
_END = re.compile(r"^\*\*\*\s*End\s+Patch\s*$")
_FILE = re.compile(r"^\*\*\*\s*(Add|Update|Delete)\s+File:(.*)$")
_MOVE_FILE = re.compile(r"^\*\*\*\s*Move\s+File:(.*)$")
_MOVE_TO = re.compile(r"^\*\*\*\s*Move\s+to:(.*)$")
_END_OF_FILE = re.compile(r"^\*\*\*\s*End\s+of\s+File\s*$")
_ARROW = re.compile(r"^(.+?)\s*->\s*(.+)$")
# A unified-diff hunk header ("@@ -12,5 +12,6 @@ def f():") is accepted in place of "@@".
_UNIFIED_HEADER = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@ ?(.*)$")
_HEADERS = "'*** Add File:', '*** Update File:', '*** Delete File:', '*** Move File:'"


@dataclass(slots=True)
class Hunk:
    number: int  # 1-based within its file
    patch_line: int  # where it starts in the patch
    anchors: list[str] = field(default_factory=list)  # the @@ lines: hints where to look
    old: list[str] = field(default_factory=list)  # context and removed lines
    new: list[str] = field(default_factory=list)  # context and added lines
    # For each line of ``new``: the index in ``old`` of the context line it is, or None
    # for an added line. Context lines are kept as the file has them.
    sources: list[int | None] = field(default_factory=list)
    at_eof: bool = False


@dataclass(slots=True)
class Operation:
    action: str  # "add", "update" or "delete"; a move is an update with ``move_to``
    path: str  # as written in the patch
    patch_line: int
    move_to: str | None = None
    lines: list[str] = field(default_factory=list)  # an added file's content
    hunks: list[Hunk] = field(default_factory=list)


def parse_patch(text: str) -> list[Operation]:
    """Parse a V4A patch into operations; raise PatchError naming the bad line.

    ``*** Begin Patch`` and ``*** End Patch`` may be left out; text before the Begin
    line and after the End line is ignored, unless it holds a file header or another
    Begin line (then the patch is refused rather than partly applied).
    """
    lines = [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]
    end = next((i for i, line in enumerate(lines) if _END.match(line)), len(lines))
    begins = [i for i in range(end) if _BEGIN.match(lines[i])]
    start = begins[-1] + 1 if begins else 0
    outside = [*range(start - 1), *range(end + 1, len(lines))]
    for index in outside:
        if _is_header(lines[index]) or _BEGIN.match(lines[index]):
            where = f"before '{BEGIN}'" if index < start else f"after '{END}'"
            raise PatchError(
                f"patch line {index + 1} is {where}; a patch is one '{BEGIN}' ... '{END}' "
                "block holding every file"
            )
    operations: list[Operation] = []
    index = start
    while index < end:
        line = lines[index]
        if not line.strip():
            index += 1
            continue
        stop = _section_end(lines, index + 1, end)
        operations.append(_parse_section(lines, index, stop))
        index = stop
    if not operations:
        raise PatchError("the patch changes no file")
    return operations


def _is_header(line: str) -> bool:
    return bool(_FILE.match(line) or _MOVE_FILE.match(line))


def _section_end(lines: list[str], start: int, end: int) -> int:
    stop = start
    while stop < end and not _is_header(lines[stop]):
        stop += 1
    return stop


def _parse_section(lines: list[str], index: int, stop: int) -> Operation:
    """One file's section: its header at ``index``, its body up to ``stop``."""
    line, number = lines[index], index + 1
    body = lines[index + 1 : stop]
    while body and body[-1] == "":
        body.pop()  # blank lines between sections
    if (moved := _MOVE_FILE.match(line)) is not None:
        arrow = _ARROW.match(moved.group(1).strip())
        if arrow is None:
            raise PatchError(f"patch line {number}: '*** Move File:' needs 'old/path -> new/path'")
        source, destination = arrow.group(1).strip(), arrow.group(2).strip()
        operation = Operation("update", source, number, move_to=destination)
        operation.hunks = _parse_hunks(body, index + 1, source)
        return _checked_update(operation)
    header = _FILE.match(line)
    if header is None:
        raise PatchError(
            f"patch line {number}: expected '{BEGIN}' or a file header ({_HEADERS}); got {line!r}"
        )
    kind, path = header.group(1), header.group(2).strip()
    if not path:
        raise PatchError(f"patch line {number}: '*** {kind} File:' needs a path")
    if kind == "Delete":
        if any(content.strip() for content in body):
            first = next(i for i, content in enumerate(body) if content.strip())
            raise PatchError(
                f"patch line {index + 2 + first}: '*** Delete File:' takes no lines; "
                f"got {body[first]!r}"
            )
        return Operation("delete", path, number)
    if kind == "Add":
        operation = Operation("add", path, number)
        for offset, content in enumerate(body):
            if not content.startswith("+"):
                raise PatchError(
                    f"patch line {index + 2 + offset}: every line of an added file starts "
                    f"with '+' ('+' alone for an empty line); got {content!r}"
                )
            operation.lines.append(content[1:])
        return operation
    operation = Operation("update", path, number)
    first = 0
    if body and (move := _MOVE_TO.match(body[0])) is not None:
        operation.move_to = move.group(1).strip()
        if not operation.move_to:
            raise PatchError(f"patch line {index + 2}: '*** Move to:' needs a path")
        first = 1
    operation.hunks = _parse_hunks(body[first:], index + 1 + first, path)
    return _checked_update(operation)


def _checked_update(operation: Operation) -> Operation:
    """Drop hunks that change nothing; refuse an update left with nothing to do."""
    hunks = [hunk for hunk in operation.hunks if hunk.old != hunk.new]
    if not hunks and operation.move_to is None:
        if operation.hunks:
            first = operation.hunks[0]
            raise PatchError(
                f"patch line {first.patch_line}: the hunks of Update File {operation.path} "
                "have no '-' or '+' lines (or they cancel out), so it changes nothing"
            )
        raise PatchError(
            f"patch line {operation.patch_line}: Update File {operation.path} has no hunks "
            "and no '*** Move to:'"
        )
    for number, hunk in enumerate(hunks, 1):
        hunk.number = number
    operation.hunks = hunks
    return operation


def _anchor(line: str) -> str:
    """The anchor of an @@ line: ``@@ def f():``, ``@@ def f @@`` or a unified header."""
    unified = _UNIFIED_HEADER.match(line)
    text = (unified.group(1) if unified else line[2:]).strip()
    if text.endswith("@@"):
        text = text[:-2].strip()
    return text


def _parse_hunks(body: list[str], start: int, path: str) -> list[Hunk]:
    """The hunks of an update; ``body[0]`` is patch line ``start + 1``."""
    hunks: list[Hunk] = []
    current: Hunk | None = None

    def close() -> None:
        nonlocal current
        if current is not None:
            hunks.append(current)
            current = None

    for offset, line in enumerate(body):
        number = start + offset + 1
        if line.startswith("@@"):
            if current is not None and (current.old or current.new):
                close()
            if current is None:
                current = Hunk(len(hunks) + 1, number)
            if anchor := _anchor(line):
                current.anchors.append(anchor)
        elif _END_OF_FILE.match(line):
            if current is None or not (current.old or current.new):
                raise PatchError(f"patch line {number}: '*** End of File' must end a hunk")
            current.at_eof = True
            close()
        elif _MOVE_TO.match(line):
            raise PatchError(
                f"patch line {number}: '*** Move to:' goes on the line right after "
                f"'*** Update File: {path}'"
            )
        elif line.startswith("***"):
            raise PatchError(
                f"patch line {number}: in the changes to {path}, an unknown marker {line!r} "
                f"(a new file starts with one of {_HEADERS})"
            )
        elif line.startswith("\\"):
            continue  # "\ No newline at end of file", as diff writes it
        else:
            if current is None:
                current = Hunk(len(hunks) + 1, number)
            # A line without a prefix is context, as a model that dropped the space meant it.
            kind, content = (line[0], line[1:]) if line[:1] in ("-", "+", " ") else (" ", line)
            if kind != "+":
                current.old.append(content)
            if kind != "-":
                current.new.append(content)
                current.sources.append(len(current.old) - 1 if kind == " " else None)
    close()
    return hunks
