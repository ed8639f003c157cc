"""The file tools: read_file and write_file.

They act in the run's environment (``ctx.environment``), so a script in a container
reads and writes the container's files, never the host's. Paths go through
:mod:`tools.path_policy` first: resolved in the environment (``..`` and symlinks
followed), kept inside the workspace root when the run has one, and for writes kept out
of protected system paths. The tools then act on the resolved path they checked.
"""

from __future__ import annotations

import posixpath
from typing import Any

from hermes_sandbox.tools.handler_args import int_arg
from hermes_sandbox.tools.path_policy import PathRefused, resolve_for_read, resolve_for_write
from hermes_sandbox.tools.registry import ToolContext, registry, tool_error, tool_result

MAX_READ_FILE_BYTES = 20 * 1024 * 1024  # refuse bigger files: total_lines needs them whole
MAX_RETURNED_CHARS = 100_000  # what one call may return, whatever limit asks for
DEFAULT_LIMIT = 500
_BINARY_SNIFF = 8192

READ_FILE_SCHEMA = {
    "name": "read_file",
    "description": (
        "Read a text file. Lines are 1-indexed: offset is the first line to return, limit "
        "how many. Returns {content, total_lines, offset, lines_returned, truncated}; when "
        "truncated is true, continue from next_offset. Binary and device files are refused; "
        "text that is not UTF-8 comes with a note."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "description": "File to read; relative paths start at the working directory.",
            },
            "offset": {
                "type": "integer",
                "minimum": 1,
                "default": 1,
                "description": "First line to return (1 = the first line).",
            },
            "limit": {
                "type": "integer",
                "minimum": 1,
                "default": DEFAULT_LIMIT,
                "description": "Most lines to return.",
            },
        },
        "required": ["path"],
    },
}

WRITE_FILE_SCHEMA = {
    "name": "write_file",
    "description": (
        "Write text to a file, replacing it if it exists and creating missing parent "
        "directories. Returns {status, path, bytes_written, dirs_created}; dirs_created is "
        "true when the write made a missing parent directory."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File to write."},
            "content": {"type": "string", "description": "The whole new content of the file."},
        },
        "required": ["path", "content"],
    },
}

_SPECIAL_KINDS = {
    "char_device": "a character device",
    "block_device": "a block device",
    "fifo": "a named pipe",
    "socket": "a socket",
    "other": "not a regular file",
}


async def read_file(args: dict[str, Any], ctx: ToolContext) -> str:
    path = args.get("path")
    if not isinstance(path, str) or not path:
        return tool_error("read_file needs a path (a non-empty string)")
    try:
        offset = int_arg(args, "offset", 1, low=1)
        limit = int_arg(args, "limit", DEFAULT_LIMIT, low=1)
    except ValueError as exc:
        return tool_error(str(exc))
    env = ctx.environment
    try:
        resolved = await resolve_for_read(ctx, path)
    except PathRefused as exc:
        return tool_error(str(exc), refused=True)
    info = resolved.stat
    if info is None:
        if isinstance(resolved.error, FileNotFoundError):
            return tool_error(f"File not found: {path}")
        if isinstance(resolved.error, PermissionError):
            return tool_error(f"Permission denied: {path}")
        detail = resolved.error.strerror if resolved.error else None
        return tool_error(f"Cannot read {path}: {detail or resolved.error}")
    if info.kind == "directory":
        return tool_error(
            f"{path} is a directory, not a file; list it with terminal('ls -la {path}')"
        )
    if info.kind in _SPECIAL_KINDS:
        return tool_error(
            f"{path} is {_SPECIAL_KINDS[info.kind]}; read_file reads regular files only"
        )
    if info.size > MAX_READ_FILE_BYTES:
        return tool_error(
            f"{path} is {info.size:,} bytes, over read_file's {MAX_READ_FILE_BYTES:,}-byte "
            "limit; read a slice with terminal(\"sed -n '100,200p' FILE\") or use search_files"
        )
    try:
        data = await env.read_bytes(info.path, max_bytes=MAX_READ_FILE_BYTES + 1)
    except OSError as exc:
        return tool_error(f"Cannot read {path}: {exc.strerror or exc}")
    if b"\0" in data[:_BINARY_SNIFF]:
        return tool_error(
            f"{path} looks like a binary file; read_file returns text only "
            "(inspect it with terminal('file ...') or 'xxd ... | head')"
        )
    try:
        text, lossy = data.decode("utf-8"), False
    except UnicodeDecodeError:
        text, lossy = data.decode("utf-8", "replace"), True
    lines = _split_lines(text)
    total = len(lines)
    chosen = lines[offset - 1 : offset - 1 + limit]
    content_parts: list[str] = []
    cut_line: int | None = None
    size = 0
    for number, line in enumerate(chosen, start=offset):
        if size + len(line) > MAX_RETURNED_CHARS and content_parts:
            break
        if len(line) > MAX_RETURNED_CHARS:
            line = line[:MAX_RETURNED_CHARS]
            cut_line = number
        content_parts.append(line)
        size += len(line)
    returned = len(content_parts)
    result: dict[str, Any] = {
        "path": info.path,
        "content": "".join(content_parts),
        "total_lines": total,
        "offset": offset,
        "lines_returned": returned,
        "truncated": offset - 1 + returned < total,
    }
    if result["truncated"]:
        result["next_offset"] = offset + returned
    notes = []
    if lossy:
        # Said, not hidden: writing this text back would replace the file's bytes.
        notes.append(
            "the file is not valid UTF-8: bytes that are not were shown as U+FFFD, so "
            "writing this content back with write_file would change them; edit it with "
            "terminal (e.g. iconv, sed) instead"
        )
    if cut_line is not None:
        notes.append(
            f"line {cut_line} is longer than {MAX_RETURNED_CHARS:,} characters and was cut; "
            "read it with terminal(\"sed -n 'Np' FILE | cut -c1-...\")"
        )
    if notes:
        result["note"] = "; ".join(notes)
    return tool_result(result)


async def write_file(args: dict[str, Any], ctx: ToolContext) -> str:
    path = args.get("path")
    content = args.get("content")
    if not isinstance(path, str) or not path:
        return tool_error("write_file needs a path (a non-empty string)")
    if not isinstance(content, str):
        return tool_error("write_file needs content as a string")
    try:
        resolved = await resolve_for_write(ctx, path)
    except PathRefused as exc:
        return tool_error(str(exc), refused=True)
    if resolved.stat is not None and resolved.stat.kind == "directory":
        return tool_error(f"{path} is a directory; give a file path")
    data = content.encode("utf-8")
    # A file that exists has its parent; only a new file costs a second stat.
    dirs_created = resolved.stat is None and not await _exists(
        ctx, posixpath.dirname(resolved.path)
    )
    try:
        await ctx.environment.write_bytes(resolved.path, data, make_parents=True)
    except IsADirectoryError:
        return tool_error(f"{path} is a directory; give a file path")
    except OSError as exc:
        return tool_error(f"Cannot write {path}: {exc.strerror or exc}")
    return tool_result(
        status="ok", path=resolved.path, bytes_written=len(data), dirs_created=dirs_created
    )


async def _exists(ctx: ToolContext, path: str) -> bool:
    try:
        await ctx.environment.stat(path)
    except OSError:
        return False
    return True


def _split_lines(text: str) -> list[str]:
    """Lines ending at "\\n" only, as grep -n and sed count them (str.splitlines also
    breaks at form feeds, \\x1c-\\x1e and Unicode separators, which would skew offsets)."""
    pieces = text.split("\n")
    lines = [piece + "\n" for piece in pieces[:-1]]
    if pieces[-1]:
        lines.append(pieces[-1])
    return lines


registry.register(
    name="read_file",
    toolset="file",
    schema=READ_FILE_SCHEMA,
    handler=read_file,
    emoji="📖",
)
registry.register(
    name="write_file",
    toolset="file",
    schema=WRITE_FILE_SCHEMA,
    handler=write_file,
    emoji="✍️",
)
