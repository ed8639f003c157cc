"""What both modes of the patch tool share: the error a failed edit raises, loading the file
to edit from the run's environment, its text (decoding, line endings) and the diff of a change.
"""

from __future__ import annotations

import re

from hermes_sandbox.environments.base import Runtime
from hermes_sandbox.errors import ToolError
from hermes_sandbox.tools.path_policy import PathRefused, ResolvedPath, resolve_for_write
from hermes_sandbox.tools.registry import ToolContext

MAX_PATCH_FILE_BYTES = 20 * 1024 * 1024  # files bigger than this are refused, not edited
MAX_DIFF_CHARS = 6_000  # the diff in a result is cut past this many characters
BINARY_SNIFF = 8192  # a NUL byte in this many first bytes makes a file binary


class PatchError(ToolError):
    """Why a patch could not be applied; the message is meant for the model.

    ``refused`` marks a refusal by the path policy (the result then says so).
    """

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


# -- the file to edit ------------------------------------------------------------------


async def resolve_target(ctx: ToolContext, path: str) -> ResolvedPath:
    """Resolve a path the patch will write (or delete); raise PatchError if refused."""
    try:
        return await resolve_for_write(ctx, path)
    except PathRefused as exc:
        raise PatchError(str(exc), refused=True) from None


def is_binary(data: bytes) -> bool:
    return b"\0" in data[:BINARY_SNIFF]


def require_text(shown: str, data: bytes) -> None:
    if is_binary(data):
        raise PatchError(f"{shown} looks like a binary file; patch edits text files only")


async def load_file(
    env: Runtime, shown: str, resolved: ResolvedPath, *, text: bool = True
) -> bytes:
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
    if text:
        require_text(shown, data)
    return data


def require_absent(shown: str, resolved: ResolvedPath, message: str) -> None:
    """Raise PatchError(``message``) unless nothing is at ``resolved``.

    ``message`` may name ``{shown}`` and ``{what}`` (a file, a directory)."""
    if resolved.stat is not None:
        what = "a directory" if resolved.stat.kind == "directory" else "a file"
        raise PatchError(message.format(shown=shown, what=what))
    if isinstance(resolved.error, NotADirectoryError):
        raise PatchError(f"a parent of {shown} is a file, not a directory")
    if resolved.error is not None and not isinstance(resolved.error, FileNotFoundError):
        raise PatchError(f"cannot check {shown}: {resolved.error.strerror or resolved.error}")


# -- text -------------------------------------------------------------------------------


def decode(data: bytes) -> str:
    # surrogateescape: bytes that are not UTF-8 survive an edit elsewhere in the file.
    return data.decode("utf-8", "surrogateescape")


def encode(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise PatchError(f"{what} holds characters that cannot be written as UTF-8") from None


def dominant_eol(text: str) -> str:
    crlf = text.count("\r\n")
    return "\r\n" if crlf and crlf >= text.count("\n") - crlf else "\n"


def with_eol(text: str, eol: str) -> str:
    text = text.replace("\r\n", "\n")
    return text.replace("\n", eol) if eol != "\n" else text


def line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def quote_line(line: str, limit: int = 120) -> str:
    line = line.strip()
    return repr(line if len(line) <= limit else line[:limit] + "...")


# -- diffs ------------------------------------------------------------------------------


def _display_lines(text: str) -> list[str]:
    if not text:
        return []
    shown = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    lines = shown.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


_RANGE = re.compile(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@")


def unified_diff(before: str, after: str, old_label: str, new_label: str) -> str:
    """A unified diff of one file; only the changed region goes through difflib."""
    import difflib  # with heapq, for the patch tool's replies only: not at registration

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


def cap_diff(diff: str) -> str:
    if len(diff) <= MAX_DIFF_CHARS:
        return diff
    cut = diff.rfind("\n", 0, MAX_DIFF_CHARS)
    cut = cut if cut > 0 else MAX_DIFF_CHARS
    return f"{diff[:cut]}\n... [diff truncated: {len(diff) - cut:,} more characters]"
