"""The tool registry: what a tool is, how it is registered, found and called.

Tool modules register themselves at import time::

    registry.register(name="read_file", toolset="file", schema=SCHEMA, handler=handle)

A handler takes the call's arguments (a dict) and, if it accepts a second parameter,
the :class:`ToolContext` of the run; it returns the result as JSON text (see
:func:`tool_result` and :func:`tool_error`). It may be a coroutine function.
:meth:`ToolRegistry.dispatch` and :meth:`ToolRegistry.adispatch` never raise: an
unknown tool or a failing handler becomes an ``{"error": ...}`` result.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

if TYPE_CHECKING:
    from environments.base import Environment

log = logging.getLogger(__name__)

CHECK_TTL_SECONDS = 30.0

Handler = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a handler knows of the run that called it.

    ``environment`` is where the script runs: file tools and terminal act there.
    ``cwd`` is the script's working directory inside it; relative paths resolve
    against it.
    """

    task_id: str
    environment: Environment
    cwd: str
    # Policy the host sets for the run; None means "no policy of that kind".
    approval: Any = None  # tools.approval.ApprovalPolicy: who may allow a dangerous command
    workspace_root: str | None = None  # file tools may only write below this path

    def resolve(self, path: str) -> str:
        import posixpath

        path = posixpath.expanduser(path) if path.startswith("~") else path
        return posixpath.normpath(posixpath.join(self.cwd, path))


@dataclass(slots=True)
class ToolEntry:
    name: str
    toolset: str
    schema: dict[str, Any]
    handler: Handler
    check_fn: Callable[[], bool] | None = None
    requires_env: Sequence[str] = ()
    is_async: bool = False
    description: str = ""
    emoji: str = ""
    max_result_size_chars: int | None = None
    takes_context: bool = field(default=False, repr=False)


def tool_error(message: object, **extra: Any) -> str:
    """A tool's error result: ``{"error": message, **extra}`` as JSON text."""
    return json.dumps({"error": str(message), **extra}, ensure_ascii=False)


def tool_result(data: Any = None, **fields: Any) -> str:
    """A tool's result as JSON text: ``data`` if given, else the keyword fields."""
    return json.dumps(fields if data is None else data, ensure_ascii=False, default=str)


def _normalise_schema(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    """Accept a bare function schema or the OpenAI ``{"type": "function", ...}`` wrapper."""
    function = dict(schema.get("function", schema))
    function.setdefault("name", name)
    if function["name"] != name:
        raise ValueError(f"schema names {function['name']!r}, but the tool is {name!r}")
    if description and not function.get("description"):
        function["description"] = description
    function.setdefault("parameters", {"type": "object", "properties": {}})
    return {"type": "function", "function": function}


def _takes_context(handler: Handler) -> bool:
    try:
        params = list(inspect.signature(handler).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in positional)


def cap_result(result: str, limit: int | None) -> str:
    """Keep the head (40%) and tail (60%) of an over-long result around a marker."""
    if limit is None or len(result) <= limit:
        return result
    head = int(limit * 0.4)
    tail = limit - head
    omitted = len(result) - limit
    return f"{result[:head]}\n... [{omitted} characters omitted] ...\n{result[-tail:]}"


class ToolRegistry:
    """Every tool the host can serve, by name. Thread-safe."""

    def __init__(self) -> None:
        self._tools: dict[str, ToolEntry] = {}
        self._lock = threading.RLock()
        self._checks: dict[str, tuple[float, bool]] = {}
        self.generation = 0  # bumped on every change; caches key on it

    def register(
        self,
        name: str,
        toolset: str,
        schema: dict[str, Any],
        handler: Handler,
        *,
        check_fn: Callable[[], bool] | None = None,
        requires_env: Sequence[str] = (),
        is_async: bool | None = None,
        description: str = "",
        emoji: str = "",
        max_result_size_chars: int | None = None,
        override: bool = False,
    ) -> ToolEntry:
        """Add a tool, or replace one of the same toolset.

        Raises ValueError if ``name`` belongs to another toolset, unless ``override``.
        """
        if not name or not isinstance(name, str):
            raise ValueError("a tool needs a non-empty string name")
        entry = ToolEntry(
            name=name,
            toolset=toolset,
            schema=_normalise_schema(name, schema, description),
            handler=handler,
            check_fn=check_fn,
            requires_env=tuple(requires_env),
            is_async=inspect.iscoroutinefunction(handler) if is_async is None else is_async,
            description=description or schema.get("function", schema).get("description", ""),
            emoji=emoji,
            max_result_size_chars=max_result_size_chars,
            takes_context=_takes_context(handler),
        )
        with self._lock:
            existing = self._tools.get(name)
            if existing is not None and existing.toolset != toolset and not override:
                raise ValueError(
                    f"tool {name!r} is already registered by toolset {existing.toolset!r}; "
                    "pass override=True to replace it"
                )
            self._tools[name] = entry
            self._checks.pop(name, None)
            self.generation += 1
        return entry

    def deregister(self, name: str) -> bool:
        """Remove a tool; return whether it was there."""
        with self._lock:
            removed = self._tools.pop(name, None) is not None
            self._checks.pop(name, None)
            if removed:
                self.generation += 1
            return removed

    def get(self, name: str) -> ToolEntry | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def names(self) -> list[str]:
        return sorted(self._tools)

    def is_available(self, name: str) -> bool:
        """Whether the tool exists and its check_fn passes (cached 30 s; raising = no)."""
        entry = self._tools.get(name)
        if entry is None:
            return False
        if entry.check_fn is None:
            return True
        now = time.monotonic()
        cached = self._checks.get(name)
        if cached is not None and now - cached[0] < CHECK_TTL_SECONDS:
            return cached[1]
        try:
            ok = bool(entry.check_fn())
        except Exception:
            log.debug("check_fn of %s raised; treating it as unavailable", name, exc_info=True)
            ok = False
        self._checks[name] = (now, ok)
        return ok

    def get_definitions(self, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """OpenAI-format schemas of the available tools among ``names`` (default: all)."""
        wanted = self.names() if names is None else list(dict.fromkeys(names))
        return [self._tools[n].schema for n in wanted if n in self._tools and self.is_available(n)]

    def _invoke(self, entry: ToolEntry, args: dict[str, Any], ctx: ToolContext | None) -> Any:
        if entry.takes_context:
            return entry.handler(args, ctx)
        return entry.handler(args)

    def _finish(self, entry: ToolEntry, result: Any) -> str:
        if not isinstance(result, str):
            result = tool_result(result)
        return cap_result(result, entry.max_result_size_chars)

    async def adispatch(
        self, name: str, args: dict[str, Any], ctx: ToolContext | None = None
    ) -> str:
        """Call a tool from async code; sync handlers run in a worker thread. Never raises."""
        entry = self._tools.get(name)
        if entry is None:
            return tool_error(f"Unknown tool: {name}")
        try:
            if entry.is_async:
                result = await self._invoke(entry, args, ctx)
            else:
                result = await anyio.to_thread.run_sync(
                    functools.partial(self._invoke, entry, args, ctx)
                )
            return self._finish(entry, result)
        except Exception as exc:
            log.debug("tool %s failed", name, exc_info=True)
            return tool_error(f"Tool execution failed: {type(exc).__name__}: {exc}")

    def dispatch(self, name: str, args: dict[str, Any], ctx: ToolContext | None = None) -> str:
        """Call a tool from synchronous code. Never raises.

        An async handler runs on a private event loop: in this thread when none is
        running here, else in a helper thread (blocking this one: async callers should
        use :meth:`adispatch`).
        """
        entry = self._tools.get(name)
        if entry is None:
            return tool_error(f"Unknown tool: {name}")
        try:
            if not entry.is_async:
                return self._finish(entry, self._invoke(entry, args, ctx))

            async def run() -> Any:
                return await self._invoke(entry, args, ctx)

            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return self._finish(entry, anyio.run(run))
            box: dict[str, Any] = {}

            def in_thread() -> None:
                try:
                    box["result"] = anyio.run(run)
                except BaseException as exc:
                    box["error"] = exc

            worker = threading.Thread(target=in_thread, name=f"dispatch-{name}")
            worker.start()
            worker.join()
            if "error" in box:
                raise box["error"]
            return self._finish(entry, box["result"])
        except Exception as exc:
            log.debug("tool %s failed", name, exc_info=True)
            return tool_error(f"Tool execution failed: {type(exc).__name__}: {exc}")


registry = ToolRegistry()
