"""The patch tool: edit files in place, by one exact replacement or by a multi-file patch.

It acts in the run's environment (``ctx.environment``), like read_file and write_file. A
multi-file patch (the "V4A" format of coding agents) is parsed by patch_format, its hunks
placed by patch_hunks, and it is checked whole and then made all or nothing by
patch_plan; shared pieces (PatchError, loading a file, diffs) are in patch_text.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from hermes_sandbox.tools.handler_args import bool_arg
from hermes_sandbox.tools.patch_text import (
    MAX_DIFF_CHARS,
    MAX_PATCH_FILE_BYTES,
    PatchError,
    cap_diff,
    decode,
    dominant_eol,
    encode,
    is_binary,
    line_of,
    load_file,
    quote_line,
    resolve_target,
    unified_diff,
    with_eol,
)
from hermes_sandbox.tools.registry import ToolContext, registry, tool_error, tool_result

if TYPE_CHECKING:
    from hermes_sandbox.tools.patch_plan import Step

__all__ = ["MAX_DIFF_CHARS", "MAX_PATCH_FILE_BYTES", "PATCH_SCHEMA", "PatchError", "patch"]

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
        "@@ def some_function @@   (optional: a line near the change, a hint where to look)\n"
        " context line (leading space)\n"
        "-line to remove\n"
        "+line to add\n"
        "*** End of File   (optional: this hunk is at the end of the file)\n"
        "*** Move File: path/old.py -> path/new.py\n"
        "*** Delete File: path/old.txt\n"
        "*** End Patch\n"
        "Each hunk's context and '-' lines must appear in the file (trailing whitespace, "
        "then indentation, is ignored if no exact match); they are looked for after the "
        "@@ line, then after the previous hunk, then anywhere they fit once. A hunk with "
        "only '+' lines goes right after its @@ line, or at the end of the file. Files are "
        "changed in the order given: a patch may rename a file and then update it. The "
        "whole patch is checked before anything is written: if any file or hunk does "
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
            line = line_of(text, found.start())
            first = text.split("\n", line)[line - 1]
            return (
                f"{message} Text that differs only in whitespace (indentation, line breaks or "
                f"trailing spaces) starts at line {line}: {quote_line(first)}. Copy the exact "
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
    resolved = await resolve_target(ctx, path)
    text = decode(await load_file(ctx.environment, path, resolved))

    # The model writes "\n"; in a CRLF file that text is there with "\r\n".
    eol = dominant_eol(text)
    variants = [(with_eol(old, eol), with_eol(new, eol)), (old, new)]
    chosen = next(((o, n) for o, n in variants if o in text), None)
    if chosen is None:
        raise PatchError(_not_found_message(path, text, old))
    old_text, new_text = chosen
    positions = _occurrences(text, old_text)
    if len(positions) > 1 and not replace_all:
        lines = [line_of(text, p) for p in positions[:20]]
        shown = ", ".join(map(str, lines)) + (", ..." if len(positions) > 20 else "")
        raise PatchError(
            f"old_string occurs {len(positions)} times in {path} (lines {shown}). Include more "
            "surrounding lines to make it unique, or set replace_all=true to replace every "
            "occurrence."
        )
    updated = text.replace(old_text, new_text)
    data = encode(updated, "new_string")
    try:
        await ctx.environment.write_bytes(resolved.path, data, make_parents=False)
    except OSError as exc:
        raise PatchError(f"Cannot write {path}: {exc.strerror or exc}") from None
    diff = unified_diff(text, updated, f"a/{path}", f"b/{path}")
    return tool_result(
        status="ok", path=resolved.path, replacements=len(positions), diff=cap_diff(diff)
    )


# -- patch mode -----------------------------------------------------------------------


def _describe(step: Step) -> str:
    """The diff of one step of a patch, or a line saying what it did."""
    if step.action == "delete" and is_binary(step.before):
        return f"Binary file {step.shown} deleted"
    old_label = "/dev/null" if step.action == "add" else f"a/{step.shown}"
    new_label = "/dev/null" if step.action == "delete" else f"b/{step.shown_move_to or step.shown}"
    diff = unified_diff(decode(step.before), decode(step.after), old_label, new_label)
    if diff:
        return diff
    if step.action == "add":
        return f"Added empty file {step.shown}"
    if step.action == "delete":
        return f"Deleted empty file {step.shown}"
    return f"{step.shown} renamed to {step.shown_move_to} unchanged"


async def _apply_patch(args: dict[str, Any], ctx: ToolContext) -> str:
    # The patch engine is imported at the first patch: registering the tool, which every
    # run does, needs only its schema.
    from hermes_sandbox.tools.patch_format import BEGIN, END, parse_patch
    from hermes_sandbox.tools.patch_plan import make_plan, plan_patch

    text = args.get("patch")
    if not isinstance(text, str) or not text.strip():
        raise PatchError(f"patch mode needs patch, the patch text from '{BEGIN}' to '{END}'")
    plan = await plan_patch(parse_patch(text), ctx)
    await make_plan(plan, ctx.environment)
    files: list[dict[str, str]] = []
    for step in plan.steps:
        entry = {"path": step.path, "action": step.action}
        if step.move_to is not None:
            entry["moved_to"] = step.move_to
        files.append(entry)
    diff = "\n".join(_describe(step) for step in plan.steps)
    return tool_result(status="ok", files=files, diff=cap_diff(diff))


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
