"""A V4A patch checked whole against the files, then made on them all or not at all.

The operations are played in order over a picture of the files (so a patch may rename a
file and then edit it, or delete a file and add one at its path) and every misfit is
collected before anything is written. Making the plan moves files with ``mv`` (a
renamed file keeps its mode), writes the new bytes, then deletes; if a step fails, every
step already made is undone.
"""

from __future__ import annotations

import posixpath
import shlex
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

from hermes_sandbox.environments.base import Runtime
from hermes_sandbox.tools.patch_format import Operation
from hermes_sandbox.tools.patch_hunks import apply_hunks
from hermes_sandbox.tools.patch_text import (
    PatchError,
    decode,
    encode,
    load_file,
    require_absent,
    require_text,
    resolve_target,
)
from hermes_sandbox.tools.path_policy import ResolvedPath
from hermes_sandbox.tools.registry import ToolContext

SHELL_TIMEOUT = 60.0  # seconds for one rm or mv in the environment

_LABELS = {"add": "Add File", "update": "Update File", "delete": "Delete File"}
_ADD_EXISTS = "{what} already exists there; use '*** Update File:' to change it"
_MOVE_EXISTS = "cannot move to {shown}: {what} already exists there"


@dataclass(slots=True)
class _File:
    """A file as the patch has left it so far."""

    data: bytes | None  # None: no file there
    origin: str | None  # the file on disk this one is (edited or moved), None if new


@dataclass(slots=True)
class Step:
    """What one operation did, for the result."""

    action: str
    shown: str  # the path as the patch wrote it
    path: str  # resolved by the path policy: where the change is made
    before: bytes = b""
    after: bytes = b""
    move_to: str | None = None  # resolved, like path
    shown_move_to: str | None = None


@dataclass(slots=True)
class Plan:
    steps: list[Step] = field(default_factory=list)
    disk: dict[str, bytes | None] = field(default_factory=dict)  # as found, by resolved path
    final: dict[str, _File] = field(default_factory=dict)  # as the patch leaves them


class _Picture:
    """The files as the operations so far have left them, read from disk on first use."""

    def __init__(self, ctx: ToolContext, plan: Plan) -> None:
        self.ctx = ctx
        self.plan = plan

    async def file(self, shown: str, resolved: ResolvedPath, *, text: bool) -> _File:
        """The file at ``resolved``; raise PatchError if there is none (or it is unfit)."""
        path = resolved.path
        known = self.plan.final.get(path)
        if known is None:
            data = await load_file(self.ctx.environment, shown, resolved, text=text)
            self.plan.disk[path] = data
            known = self.plan.final[path] = _File(data, path)
        if known.data is None:
            gone = " (this patch removed or moved it)" if self.plan.disk.get(path) else ""
            raise PatchError(f"File not found: {shown}{gone}")
        if text:
            require_text(shown, known.data)
        return known

    def require_free(self, shown: str, resolved: ResolvedPath, message: str) -> None:
        """Raise PatchError(``message``) unless no file is at ``resolved`` (by now)."""
        known = self.plan.final.get(resolved.path)
        if known is None:
            require_absent(shown, resolved, message)
            self.plan.disk[resolved.path] = None
            self.plan.final[resolved.path] = _File(None, None)
        elif known.data is not None:
            raise PatchError(message.format(shown=shown, what="a file (made by this patch)"))


def _require_inside_cwd(ctx: ToolContext, path: str) -> None:
    """Refuse a patch header that leaves the working directory: any '..' component, or an
    absolute (or ``~``) path outside it. Checked on the text, with or without a workspace
    root: a patch is text a model may have copied from anywhere."""
    cwd = posixpath.normpath(ctx.cwd)
    full = posixpath.normpath(posixpath.join(cwd, ctx.expand_user(path)))
    climbs = ".." in path.split("/")
    if climbs or not (cwd == "/" or full == cwd or full.startswith(cwd.rstrip("/") + "/")):
        why = "it has a '..' component (path traversal)" if climbs else f"it is {full}"
        raise PatchError(
            f"Refused: {why}, outside the working directory {cwd}. A patch header names "
            "a file inside the working directory, relative to it and without '..'.",
            refused=True,
        )


async def _play(op: Operation, picture: _Picture) -> Step:
    """Play one operation on the picture; raise PatchError (leaving it as it was) if unfit."""
    ctx = picture.ctx
    _require_inside_cwd(ctx, op.path)
    if op.move_to is not None:
        _require_inside_cwd(ctx, op.move_to)
    resolved = await resolve_target(ctx, op.path)
    step = Step(op.action, op.path, resolved.path)
    if op.action == "add":
        picture.require_free(op.path, resolved, _ADD_EXISTS)
        step.after = encode("".join(line + "\n" for line in op.lines), f"the content of {op.path}")
        picture.plan.final[resolved.path] = _File(step.after, None)
        return step
    current = await picture.file(op.path, resolved, text=op.action == "update")
    step.before = step.after = current.data or b""
    if op.action == "delete":
        step.after = b""
        picture.plan.final[resolved.path] = _File(None, None)
        return step
    if op.hunks:
        after = apply_hunks(decode(step.before), op.hunks)
        step.after = encode(after, f"the new content of {op.path}")
    destination = resolved.path
    if op.move_to is not None:
        target = await resolve_target(ctx, op.move_to)
        if target.path != resolved.path:
            picture.require_free(op.move_to, target, _MOVE_EXISTS)
            destination = step.move_to = target.path
            step.shown_move_to = op.move_to
            picture.plan.final[resolved.path] = _File(None, None)
    picture.plan.final[destination] = _File(step.after, current.origin)
    return step


async def plan_patch(operations: list[Operation], ctx: ToolContext) -> Plan:
    """Check every operation against the files; raise PatchError listing every misfit."""
    plan = Plan()
    picture = _Picture(ctx, plan)
    problems: list[str] = []
    refused = False
    for op in operations:
        try:
            plan.steps.append(await _play(op, picture))
        except PatchError as exc:
            refused = refused or exc.refused
            problems.append(f"{_LABELS[op.action]} {op.path} (patch line {op.patch_line}): {exc}")
    if problems:
        count = f"{len(problems)} problems" if len(problems) > 1 else "a problem"
        raise PatchError(
            f"The patch was not applied ({count}; no file was changed):\n- "
            + "\n- ".join(problems),
            refused=refused,
        )
    return plan


# -- making the plan ---------------------------------------------------------------------


async def _sh(env: Runtime, command: str) -> None:
    result = await env.execute(command, timeout=SHELL_TIMEOUT)
    if result.exit_code != 0:
        raise PatchError(result.output.strip() or f"'{command}' exited with {result.exit_code}")


async def _restore_if_missing(env: Runtime, path: str, data: bytes) -> None:
    try:
        await env.stat(path)
    except FileNotFoundError:
        await env.write_bytes(path, data, make_parents=True)


def _moves(plan: Plan) -> dict[str, str]:
    """Destination -> source of the files to ``mv``: each moved file whose old path is
    left empty. A file moved where another one is moved away (a swap) is rewritten."""
    final = plan.final
    uses = Counter(f.origin for f in final.values() if f.data is not None and f.origin)
    return {
        path: f.origin
        for path, f in final.items()
        if f.data is not None
        and f.origin is not None
        and f.origin != path
        and uses[f.origin] == 1
        and final[f.origin].data is None
    }


Undo = Callable[[], Awaitable[None]]


async def make_plan(plan: Plan, env: Runtime) -> None:
    """Move, write, then delete; undo what was done if a step fails."""
    q = shlex.quote
    undo: list[Undo] = []
    moves = _moves(plan)
    moved_away = set(moves.values())
    current = ""
    try:
        on_disk = dict(plan.disk)
        for destination, source in moves.items():
            current = destination
            replaced = plan.disk.get(destination)
            if replaced is not None:  # a file the patch removed earlier
                undo.append(partial(_restore_if_missing, env, destination, replaced))
            parent = q(posixpath.dirname(destination) or "/")
            # mv keeps the file's mode and owner; rewriting it at the new path would not.
            await _sh(env, f"mkdir -p -- {parent} && mv -f -- {q(source)} {q(destination)}")
            undo.append(partial(_sh, env, f"mv -- {q(destination)} {q(source)}"))
            on_disk[destination], on_disk[source] = on_disk[source], None
        for path, f in plan.final.items():
            if f.data is None or f.data == on_disk.get(path):
                continue
            current = path
            before = on_disk.get(path)
            await env.write_bytes(path, f.data, make_parents=True)
            if before is None:
                undo.append(partial(_sh, env, f"rm -f -- {q(path)}"))
            else:
                undo.append(partial(env.write_bytes, path, before, make_parents=False))
        deletions = [
            path
            for path, f in plan.final.items()
            if f.data is None and plan.disk.get(path) is not None and path not in moved_away
        ]
        if deletions:
            current = ", ".join(deletions)
            # Restoring a deleted file rewrites its bytes (its mode is not kept).
            undo.extend(
                partial(_restore_if_missing, env, path, plan.disk[path] or b"")
                for path in deletions
            )
            await _sh(env, "rm -f -- " + " ".join(q(path) for path in deletions))
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
