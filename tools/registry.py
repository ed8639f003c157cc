"""The tool registry: what a tool is, how it is registered, found and called.

Tool modules register themselves at import time::

    registry.register(name="read_file", toolset="file", schema=SCHEMA, handler=handle)

(or with the :func:`tools.decorator.tool` decorator); :mod:`tools.discovery` finds and
imports such modules. A handler takes the call's arguments (a dict) and, if it accepts
a second parameter, the :class:`ToolContext` of the run; it returns the result as JSON
text (see :func:`tool_result` and :func:`tool_error`). It may be a coroutine function.

Before a handler runs, its arguments are coerced toward the tool's schema and validated
(:mod:`tools.arguments`): a call that does not fit gets an error result naming each
problem, and the handler never sees it. :meth:`ToolRegistry.dispatch` and
:meth:`ToolRegistry.adispatch` never raise: an unknown tool, bad arguments or a failing
handler become an ``{"error": ...}`` result.

Where a handler runs:

- ``await adispatch(...)`` (async code): an async handler runs in the caller's event
  loop; a sync handler in a worker thread, so the loop is never blocked.
- ``dispatch(...)`` (sync code, any thread): a sync handler runs in the calling thread;
  an async handler runs on the registry's own event loop, an anyio blocking portal kept
  for the life of the process (:mod:`hermes_sandbox.tools.async_bridge`), and the caller
  waits. Called from inside a running event loop, ``dispatch`` blocks that loop until
  the tool is done: async code should use ``adispatch``.

A result longer than its tool's ``max_result_size_chars`` is cut to fit
(:mod:`hermes_sandbox.tools.capping`).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import posixpath
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from hermes_sandbox.threads import tool_limiter
from hermes_sandbox.tools.arguments import ToolArguments, describe_problems
from hermes_sandbox.tools.capping import cap_result

if TYPE_CHECKING:
    from hermes_sandbox.environments.base import Runtime

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
    environment: Runtime
    cwd: str
    # Policy the host sets for the run; None means "no policy of that kind".
    approval: Any = None  # tools.approval.ApprovalPolicy: who may allow a dangerous command
    workspace_root: str | None = None  # file tools may only write below this path

    def expand_user(self, path: str) -> str:
        """``~`` and ``~/...`` with the home of the environment's user (not the host's,
        unless the environment is the host); other paths unchanged."""
        if not path.startswith("~"):
            return path
        if self.environment.shares_host:
            return posixpath.expanduser(path)
        home = self.environment.home
        if home and (path == "~" or path.startswith("~/")):
            return home.rstrip("/") + path[1:] if home != "/" else "/" + path[2:]
        return path

    def resolve(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.cwd, self.expand_user(path)))


@dataclass(slots=True)
class ToolEntry:
    """One registered tool. ``arguments`` is its compiled argument handling."""

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
    validate_args: bool = True
    inline: bool = False
    takes_context: bool = field(default=False, repr=False)
    arguments: ToolArguments | None = field(default=None, repr=False, compare=False)

    @property
    def parameters(self) -> dict[str, Any]:
        return self.schema["function"]["parameters"]  # type: ignore[no-any-return]


def tool_error(message: object, **extra: Any) -> str:
    """A tool's error result: ``{"error": message, **extra}`` as JSON text."""
    return json.dumps({"error": str(message), **extra}, ensure_ascii=False)


def tool_result(data: Any = None, **fields: Any) -> str:
    """A tool's result as JSON text: ``data`` if given, else the keyword fields."""
    return json.dumps(fields if data is None else data, ensure_ascii=False, default=str)


def _normalise_schema(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    """Accept a bare function schema or the OpenAI ``{"type": "function", ...}`` wrapper.

    The registered name wins over a ``name`` inside the schema: the stored schema is
    named as the tool is dispatched, so a model never sees a name that cannot be called.
    """
    function = dict(schema.get("function", schema))
    function["name"] = name
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


class ToolRegistry:
    """Every tool the host can serve, by name. Thread-safe.

    ``clock`` (seconds, monotonic) times the check_fn cache; tests pass a fake one.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._tools: dict[str, ToolEntry] = {}
        self._lock = threading.RLock()
        # Kept by check_fn, not by tool: tools sharing one check run it once.
        self._checks: dict[Callable[[], bool], tuple[float, bool]] = {}
        self._clock = clock
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
        validate_args: bool = True,
        inline: bool = False,
        override: bool = False,
    ) -> ToolEntry:
        """Add a tool, or replace one of the same toolset.

        ``requires_env`` names the environment variables the tool needs (shown to
        users; ``check_fn`` decides availability). ``validate_args=False`` hands the
        handler coerced but unvalidated arguments, for a tool that words its own advice
        on wrong calls. ``inline=True`` promises that a sync handler never blocks (no
        I/O, no sleeping, quick): it is then run on whatever thread read the call (the
        event loop's, a connection's serving thread, or paramiko's transport thread for
        a call relayed over ssh) instead of being handed to a worker thread, which saves
        most of a call's cost.

        Raises ValueError if ``name`` belongs to another toolset (unless ``override``)
        or if the schema's ``parameters`` is not a valid JSON Schema.
        """
        if not name or not isinstance(name, str):
            raise ValueError("a tool needs a non-empty string name")
        normalised = _normalise_schema(name, schema, description)
        try:
            arguments = ToolArguments(normalised["function"]["parameters"])
        except ValueError as exc:
            raise ValueError(f"tool {name!r}: {exc}") from None
        entry = ToolEntry(
            name=name,
            toolset=toolset,
            schema=normalised,
            handler=handler,
            check_fn=check_fn,
            requires_env=tuple(requires_env),
            is_async=inspect.iscoroutinefunction(handler) if is_async is None else is_async,
            description=description or schema.get("function", schema).get("description", ""),
            emoji=emoji,
            max_result_size_chars=max_result_size_chars,
            validate_args=validate_args,
            inline=inline,
            takes_context=_takes_context(handler),
            arguments=arguments,
        )
        with self._lock:
            existing = self._tools.get(name)
            if existing is not None and existing.toolset != toolset and not override:
                raise ValueError(
                    f"tool {name!r} is already registered by toolset {existing.toolset!r}; "
                    "pass override=True to replace it"
                )
            if existing is not None and existing.check_fn is not None:
                self._checks.pop(existing.check_fn, None)
            if check_fn is not None:
                self._checks.pop(check_fn, None)
            self._tools[name] = entry
            self.generation += 1
        return entry

    def deregister(self, name: str) -> bool:
        """Remove a tool; return whether it was there."""
        with self._lock:
            entry = self._tools.pop(name, None)
            removed = entry is not None
            if entry is not None and entry.check_fn is not None:
                self._checks.pop(entry.check_fn, None)
            if removed:
                self.generation += 1
            return removed

    def get(self, name: str) -> ToolEntry | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def names(self, toolset: str | None = None) -> list[str]:
        """Registered tool names, sorted; only those of ``toolset`` when given."""
        if toolset is None:
            return sorted(self._tools)
        return sorted(n for n, e in list(self._tools.items()) if e.toolset == toolset)

    def toolsets(self) -> list[str]:
        """The toolsets that registered tools belong to, sorted."""
        return sorted({e.toolset for e in list(self._tools.values())})

    def is_available(self, name: str) -> bool:
        """Whether the tool exists and its check_fn passes.

        A check_fn's answer is kept for CHECK_TTL_SECONDS, by the function, so tools that
        share one check run it once; one that raises means unavailable. Registering or
        removing a tool forgets the kept answer of its check.
        """
        entry = self._tools.get(name)
        if entry is None:
            return False
        return self._check(entry, {})

    def _check(self, entry: ToolEntry, seen: dict[Callable[[], bool], bool]) -> bool:
        """``entry``'s check_fn answer; ``seen`` holds the answers of this one pass."""
        check = entry.check_fn
        if check is None:
            return True
        if check in seen:
            return seen[check]
        now = self._clock()
        cached = self._checks.get(check)
        if cached is not None and now - cached[0] < CHECK_TTL_SECONDS:
            ok = cached[1]
        else:
            try:
                ok = bool(check())
            except Exception:
                log.debug(
                    "check_fn of %s raised; treating it as unavailable", entry.name, exc_info=True
                )
                ok = False
            self._checks[check] = (now, ok)
        seen[check] = ok
        return ok

    def get_definitions(self, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """OpenAI-format schemas of the available tools among ``names`` (default: all).

        Each distinct check_fn runs at most once per call, however many tools share it.
        """
        wanted = self.names() if names is None else list(dict.fromkeys(names))
        seen: dict[Callable[[], bool], bool] = {}
        definitions = []
        for name in wanted:
            entry = self._tools.get(name)
            if entry is not None and self._check(entry, seen):
                definitions.append(entry.schema)
        return definitions

    def _prepare(self, entry: ToolEntry, args: Any) -> tuple[dict[str, Any], str | None]:
        """The arguments to call the handler with, or an error result instead."""
        if args is None:
            args = {}
        elif isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                return {}, tool_error(
                    f"Invalid arguments for {entry.name}: expected a JSON object, "
                    f"got text that is not JSON: {args[:60]!r}"
                )
        if not isinstance(args, dict):
            return {}, tool_error(
                f"Invalid arguments for {entry.name}: expected an object of named "
                f"arguments, got {type(args).__name__}"
            )
        if entry.arguments is None:
            return args, None
        if not entry.validate_args:
            return entry.arguments.coerce(args), None
        coerced, problems = entry.arguments.prepare(args)
        if problems:
            return coerced, tool_error(
                f"Invalid arguments for {entry.name}: {describe_problems(problems)}",
                problems=[str(p) for p in problems],
            )
        return coerced, None

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
        """Call a tool from async code without blocking the loop. Never raises.

        An async handler runs in this loop; a sync one in a worker thread.
        """
        entry = self._tools.get(name)
        if entry is None:
            return tool_error(f"Unknown tool: {name}")
        try:
            args, refusal = self._prepare(entry, args)
            if refusal is not None:
                return refusal
            if entry.is_async:
                result = await self._invoke(entry, args, ctx)
            else:
                # Abandoned if cancelled (the run ended): a blocking tool cannot hold it.
                result = await anyio.to_thread.run_sync(
                    functools.partial(self._invoke, entry, args, ctx),
                    abandon_on_cancel=True,
                    limiter=tool_limiter(),
                )
                if inspect.isawaitable(result):  # a sync callable that returned a coroutine
                    result = await result
            return self._finish(entry, result)
        except Exception as exc:
            log.debug("tool %s failed", name, exc_info=True)
            return tool_error(f"Tool execution failed: {type(exc).__name__}: {exc}")

    def runs_inline(self, name: str) -> bool:
        """Whether ``name`` is a sync tool registered ``inline``: safe to call on a loop."""
        entry = self._tools.get(name)
        return entry is not None and entry.inline and not entry.is_async

    def runs_async(self, name: str) -> bool:
        """Whether ``name`` is an async tool: it runs on an event loop, not a thread."""
        entry = self._tools.get(name)
        return entry is not None and entry.is_async

    def dispatch(self, name: str, args: dict[str, Any], ctx: ToolContext | None = None) -> str:
        """Call a tool from synchronous code, in any thread. Never raises.

        A sync handler runs in this thread. An async handler runs on the registry's
        own event loop while this thread waits (see the module docstring); from
        inside a running event loop that blocks the loop, so async code should use
        :meth:`adispatch`.
        """
        entry = self._tools.get(name)
        if entry is None:
            return tool_error(f"Unknown tool: {name}")
        try:
            args, refusal = self._prepare(entry, args)
            if refusal is not None:
                return refusal
            result = self._invoke(entry, args, ctx)
            if type(result) is not str and inspect.isawaitable(result):
                # The portal (with anyio.from_thread) only where a sync caller meets an
                # async handler: a run dispatches with adispatch, and never needs it.
                from hermes_sandbox.tools.async_bridge import run_awaitable

                result = run_awaitable(result)
            return self._finish(entry, result)
        except Exception as exc:
            log.debug("tool %s failed", name, exc_info=True)
            return tool_error(f"Tool execution failed: {type(exc).__name__}: {exc}")


registry = ToolRegistry()
