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
  an async handler runs on the registry's private event loop, which lives in a daemon
  thread for the life of the process, and the caller waits. Reusing one loop keeps any
  loop-bound state a handler caches (a client, a lock) valid from call to call. Called
  from inside a running event loop, ``dispatch`` blocks that loop until the tool is
  done: async code should use ``adispatch``.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextvars
import functools
import inspect
import json
import logging
import os
import posixpath
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from hermes_sandbox.tools.arguments import ToolArguments, describe_problems

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


# ------------------------------------------------------------------------ result caps

HEAD_SHARE = 0.4  # of what is kept; the tail gets the rest
_MAX_JSON_ROUNDS = 32
# A string shorter than this gains nothing from a marker in its middle.
_MIN_CUTTABLE = 64


def _marker(omitted: int) -> str:
    return f"\n... [{omitted} characters omitted] ...\n"


def _cut(text: str, keep: int) -> str:
    """``text`` with only ``keep`` of its characters, head and tail, around a marker."""
    head = int(keep * HEAD_SHARE)
    tail = keep - head
    return text[:head] + _marker(len(text) - keep) + text[len(text) - tail :]


def _cap_text(text: str, limit: int) -> str:
    keep = limit - len(_marker(len(text)))
    if keep <= 0:
        return text[:limit]
    return _cut(text, keep)


def _string_leaves(node: Any, found: list[tuple[Any, Any, str]]) -> None:
    """Every string value inside ``node``, as (container, key, text)."""
    items: Iterable[tuple[Any, Any]]
    if isinstance(node, dict):
        items = node.items()
    elif isinstance(node, list):
        items = enumerate(node)
    else:
        return
    for key, value in items:
        if isinstance(value, str):
            found.append((node, key, value))
        else:
            _string_leaves(value, found)


def _json_cost(text: str) -> int:
    """Characters ``text`` takes inside JSON, quotes excluded (escapes count)."""
    return len(json.dumps(text, ensure_ascii=False)) - 2


def _cap_json_object(text: str, limit: int) -> str | None:
    """Cut the longest string fields of a JSON object until its text fits, or None."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    data["truncated"] = True
    leaves = [leaf for leaf in _string_leaves_of(data) if len(leaf[2]) >= _MIN_CUTTABLE]
    kept = [len(leaf[2]) for leaf in leaves]
    costs = [_json_cost(leaf[2]) for leaf in leaves]
    for _ in range(_MAX_JSON_ROUNDS):
        out = json.dumps(data, ensure_ascii=False)
        excess = len(out) - limit
        if excess <= 0:
            return out
        shrinkable = [j for j in range(len(leaves)) if kept[j] > 0]
        if not shrinkable:
            return None
        i = max(shrinkable, key=costs.__getitem__)
        container, key, original = leaves[i]
        budget = costs[i] - excess  # what this field may take for the whole to fit
        # The most characters to keep with the cut field within budget: every character
        # costs at least one (escapes more), so search below budget - marker.
        low, high = 0, max(min(kept[i] - 1, budget - len(_marker(len(original)))), 0)
        while low < high:
            middle = (low + high + 1) // 2
            if _json_cost(_cut(original, middle)) <= budget:
                low = middle
            else:
                high = middle - 1
        kept[i] = low
        container[key] = _cut(original, low)
        costs[i] = _json_cost(container[key])
    return None


def _string_leaves_of(data: dict[str, Any]) -> list[tuple[Any, Any, str]]:
    found: list[tuple[Any, Any, str]] = []
    _string_leaves(data, found)
    return found


def cap_result(result: str, limit: int | None) -> str:
    """Fit an over-long result in ``limit`` characters.

    A JSON object stays valid JSON: its longest string fields are cut, keeping their
    head (40%) and tail (60%) around a ``... [N characters omitted] ...`` marker, and
    ``"truncated": true`` is set. Any other text (or an object that cannot be made to
    fit that way) keeps its own head and tail around the marker.
    """
    if limit is None or len(result) <= limit:
        return result
    capped = _cap_json_object(result, limit)
    return capped if capped is not None else _cap_text(result, limit)


# ----------------------------------------------------------------------- async bridge


class _LoopThread:
    """A private asyncio event loop running in a daemon thread for the whole process.

    Sync callers hand it coroutines and wait for them. One loop for every call, rather
    than a fresh ``asyncio.run`` each time, keeps loop-bound state that a handler
    caches valid: the usual source of "Event loop is closed". Each coroutine runs in a
    fresh ``contextvars`` context, so nothing of the caller's event loop (such as
    sniffio's note that trio is running) leaks into it. Restarted after a fork; stopped
    and closed at interpreter exit.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._exit_hook = False

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            loop, thread = self._loop, self._thread
            if (
                loop is not None
                and thread is not None
                and thread.is_alive()
                and self._pid == os.getpid()
            ):
                return loop
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def main() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                try:
                    loop.run_forever()
                finally:
                    _close_loop(loop)

            thread = threading.Thread(target=main, name=self.name, daemon=True)
            thread.start()
            ready.wait()
            self._loop, self._thread, self._pid = loop, thread, os.getpid()
            if not self._exit_hook:
                atexit.register(self.stop)
                self._exit_hook = True
            return loop

    def owns_current_thread(self) -> bool:
        return self._thread is threading.current_thread()

    def run(self, awaitable: Awaitable[Any]) -> Any:
        """Run ``awaitable`` on the private loop; block until done and return its result."""
        loop = self._running_loop()
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        tasks: list[asyncio.Task[Any]] = []

        def finish(task: asyncio.Task[Any]) -> None:
            if task.cancelled():
                done.set_exception(concurrent.futures.CancelledError())
            elif task.exception() is not None:
                done.set_exception(task.exception())  # type: ignore[arg-type]
            else:
                done.set_result(task.result())

        def start() -> None:
            if not done.set_running_or_notify_cancel():
                _discard(awaitable)
                return
            task = loop.create_task(_as_coroutine(awaitable))
            tasks.append(task)
            task.add_done_callback(finish)

        loop.call_soon_threadsafe(start, context=contextvars.Context())
        try:
            return done.result()
        finally:
            if not done.done():  # interrupted while waiting: do not leave the tool running
                if done.cancel():
                    _discard(awaitable)
                else:
                    try:
                        loop.call_soon_threadsafe(lambda: tasks and tasks[0].cancel())
                    except RuntimeError:  # the loop is closed: nothing left to stop
                        pass

    def stop(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None or self._pid != os.getpid():
            return
        try:
            loop.call_soon_threadsafe(loop.stop)
        except RuntimeError:  # already closed
            return
        thread.join(timeout=5)


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    try:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
    finally:
        loop.close()


async def _as_coroutine(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _discard(awaitable: Awaitable[Any]) -> None:
    """Close a coroutine that will never run (so Python does not warn about it)."""
    if inspect.iscoroutine(awaitable):
        awaitable.close()


_loop_threads_lock = threading.Lock()
_loop_threads: list[_LoopThread] = []


def run_awaitable(awaitable: Awaitable[Any]) -> Any:
    """Run ``awaitable`` to completion from synchronous code and return its result.

    It runs on the registry's private event loop (see the module docstring) while the
    calling thread waits. Code already running on that loop (an async handler that
    calls ``dispatch``) cannot wait for its own loop, so its call goes to a second
    private loop, and so on one level deeper for each nesting; each level's loop
    persists like the first.
    """
    with _loop_threads_lock:
        level = next((i + 1 for i, t in enumerate(_loop_threads) if t.owns_current_thread()), 0)
        while len(_loop_threads) <= level:
            _loop_threads.append(_LoopThread(f"tool-dispatch-loop-{len(_loop_threads)}"))
        loop_thread = _loop_threads[level]
    return loop_thread.run(awaitable)


# --------------------------------------------------------------------------- registry


class ToolRegistry:
    """Every tool the host can serve, by name. Thread-safe.

    ``clock`` (seconds, monotonic) times the check_fn cache; tests pass a fake one.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._tools: dict[str, ToolEntry] = {}
        self._lock = threading.RLock()
        self._checks: dict[str, tuple[float, bool]] = {}
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
        I/O, no sleeping, quick): async callers then run it on the event loop itself
        instead of handing it to a worker thread, which saves most of a call's cost.

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

        A check_fn's answer is kept for CHECK_TTL_SECONDS; one that raises means
        unavailable. Registering the tool again forgets the kept answer.
        """
        entry = self._tools.get(name)
        if entry is None:
            return False
        if entry.check_fn is None:
            return True
        now = self._clock()
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
                result = await anyio.to_thread.run_sync(
                    functools.partial(self._invoke, entry, args, ctx)
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

    def dispatch(self, name: str, args: dict[str, Any], ctx: ToolContext | None = None) -> str:
        """Call a tool from synchronous code, in any thread. Never raises.

        A sync handler runs in this thread. An async handler runs on the registry's
        private event loop while this thread waits (see the module docstring); from
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
            if inspect.isawaitable(result):
                result = run_awaitable(result)
            return self._finish(entry, result)
        except Exception as exc:
            log.debug("tool %s failed", name, exc_info=True)
            return tool_error(f"Tool execution failed: {type(exc).__name__}: {exc}")


registry = ToolRegistry()
