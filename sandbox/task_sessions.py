"""The execute_code tool's warm sessions: one :class:`~hermes_sandbox.session.AsyncSession`
per task id, as Hermes keeps one sandbox per task.

A session's environment belongs to the event loop that started it (its processes,
sockets and clients), while the tool is called from whatever loop or thread the agent
uses. So the sessions live on an event loop of their own, in a daemon thread, and each
call is handed to it. :func:`close_task_session` ends one task's session (call it when
the task ends), :func:`close_all_sessions` every one; the latter also runs when the
interpreter exits. A session no run has used for ``idle_seconds`` (1800 s unless
given, as Hermes reaps idle interpreters) is closed by itself; the task's next run
starts a new one and its result says so.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel

from hermes_sandbox.environments import BackendError
from hermes_sandbox.result import ExecutionResult
from hermes_sandbox.runner import RunOptions
from hermes_sandbox.session import AsyncSession
from hermes_sandbox.tools.async_bridge import PortalThread
from hermes_sandbox.tools.registry import ToolRegistry

T = TypeVar("T")
log = logging.getLogger(__name__)

# How long a task's session may go unused before it is closed (its sandbox removed).
DEFAULT_IDLE_SECONDS = 1800.0

_loop = PortalThread("hermes-sandbox-sessions")
_all_lock = threading.Lock()
_all: weakref.WeakSet[TaskSessions] = weakref.WeakSet()
_exit_hook = False


class TaskSessions:
    """Warm sessions for the runs of one execute_code registration, by task id.

    Calls for one task run one after another (a second waits for the first); calls
    for different tasks run at once. A run that fails with a BackendError (the
    sandbox went away) closes its task's session: the next call starts a new one.

    With ``persistent`` each task's session keeps one interpreter whose globals survive
    between calls; the sessions are then entered (``async with``) in tasks of a task
    group this registration keeps on the sessions' loop.

    A session whose last run ended ``idle_seconds`` ago (None: never) is closed by a
    reaper task on the sessions' loop, started with the first session; the task's next
    run starts a new session, and its result's ``warning`` says the old one was closed.
    """

    def __init__(
        self,
        options: RunOptions,
        registry: ToolRegistry,
        *,
        persistent: bool = False,
        idle_seconds: float | None = DEFAULT_IDLE_SECONDS,
    ) -> None:
        self._options = options
        self._registry = registry
        self._persistent = persistent
        self._idle_seconds = checked_idle_seconds(idle_seconds)
        self._sessions: dict[str, AsyncSession] = {}
        # Used on the sessions' loop only: each task's lock (held by its run), the loop
        # time its last run ended, and the tasks whose session the reaper closed.
        self._locks: dict[str, anyio.Lock] = {}
        self._last_used: dict[str, float] = {}
        self._reaped: set[str] = set()
        self._reaper: concurrent.futures.Future[None] | None = None
        self._reaper_lock = threading.Lock()
        self._holders: dict[str, tuple[anyio.Event, anyio.Event]] = {}  # closing, closed
        self._tasks: anyio.abc.TaskGroup | None = None
        if persistent:
            ready = threading.Event()
            _loop.start_soon(self._hold_tasks, ready)
            ready.wait()
        global _exit_hook
        with _all_lock:
            _all.add(self)
            if not _exit_hook:
                # Registered after the loop's own exit hook would be (first use starts
                # it), so this one runs first: sessions close while their loop runs.
                _loop.run(anyio.lowlevel.checkpoint())
                atexit.register(close_all_sessions)
                _exit_hook = True

    async def _hold_tasks(self, ready: threading.Event) -> None:
        """Keep the task group the persistent sessions are held in (as long as the loop)."""
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            ready.set()
            await anyio.sleep_forever()

    async def _hold(
        self,
        session: AsyncSession,
        closing: anyio.Event,
        closed: anyio.Event,
        *,
        task_status: anyio.abc.TaskStatus[None],
    ) -> None:
        """Keep ``session`` entered until ``closing`` is set."""
        try:
            async with session:
                task_status.started()
                await closing.wait()
        except Exception as exc:
            if not closing.is_set():
                raise  # it could not start: the run that made it says why
            log.warning("closing a persistent execute_code session failed: %s", exc)
        finally:
            closed.set()

    @property
    def task_ids(self) -> list[str]:
        """The tasks that have a session now."""
        return list(self._sessions)

    async def run(self, task_id: str, code: str, *, reset: bool = False) -> ExecutionResult:
        """Run ``code`` in ``task_id``'s session (started if it has none; made anew
        first when ``reset``). Raises RunError and BackendError as a run does."""
        self._start_reaper()
        return await _on_loop(self._run, task_id, code, reset)

    async def _run(self, task_id: str, code: str, reset: bool) -> ExecutionResult:
        lock = self._locks.setdefault(task_id, anyio.Lock())
        async with lock:
            self._last_used.pop(task_id, None)  # not idle while it runs: the reaper skips it
            try:
                result = await self._run_locked(task_id, code, reset)
            finally:
                if task_id in self._sessions:  # not closed by the run's failure
                    self._last_used[task_id] = anyio.current_time()
            if task_id in self._reaped and not reset:
                note = (
                    f"This task's sandbox had been closed after {self._idle_seconds:g} s "
                    "unused; this run started in a new one: what earlier runs left inside "
                    "the old one (files, processes, globals) is gone."
                )
                result.add_warning(note, first=True)
            self._reaped.discard(task_id)
            return result

    async def _run_locked(self, task_id: str, code: str, reset: bool) -> ExecutionResult:
        session = self._sessions.get(task_id)
        if session is None:
            session = AsyncSession(
                self._options.backend,
                registry=self._registry,
                start_in_workspace=False,  # where a one-shot run starts, as before
                persistent=self._persistent,
                **_session_fields(self._options, task_id),
            )
            if self._persistent:
                assert self._tasks is not None
                holder = (anyio.Event(), anyio.Event())
                await self._tasks.start(self._hold, session, *holder)
                self._holders[task_id] = holder
            self._sessions[task_id] = session
        elif reset:
            await session.reset()
        try:
            return await session.run(code)
        except BackendError:
            await self._close(task_id)
            raise

    async def _close(self, task_id: str) -> bool:
        session = self._sessions.pop(task_id, None)
        self._locks.pop(task_id, None)
        self._last_used.pop(task_id, None)
        if session is None:
            return False
        holder = self._holders.pop(task_id, None)
        if holder is None:
            await session.aclose()
        else:
            closing, closed = holder
            closing.set()
            await closed.wait()
        return True

    def close(self, task_id: str) -> bool:
        """Close ``task_id``'s session and remove all it holds; whether there was one.
        Waits for a run of the task in progress to end."""
        return bool(_loop.run(self._close_waiting(task_id)))

    async def _close_waiting(self, task_id: str) -> bool:
        self._reaped.discard(task_id)  # closed on purpose: the next run starts afresh
        lock = self._locks.get(task_id)
        if lock is None:
            return await self._close(task_id)
        async with lock:
            return await self._close(task_id)

    def close_all(self) -> None:
        """Close every session of this registration, and stop its reaper."""
        with self._reaper_lock:
            reaper, self._reaper = self._reaper, None
        if reaper is not None:
            reaper.cancel()
        for task_id in list(self._sessions):
            self.close(task_id)

    # -- the idle sessions' end ----------------------------------------------------------

    def _start_reaper(self) -> None:
        """Start the reaper on the sessions' loop, once (from the caller's thread)."""
        if self._idle_seconds is None or self._reaper is not None:
            return
        with self._reaper_lock:
            if self._reaper is None:
                self._reaper = _loop.start_soon(self._reap)

    async def _reap(self) -> None:
        """Close each session idle for ``idle_seconds``, waking when the next may be due:
        a session made or used while it sleeps is due no sooner than its wake."""
        assert self._idle_seconds is not None
        idle = self._idle_seconds
        while True:
            now = anyio.current_time()
            for task_id, used in list(self._last_used.items()):
                if now - used >= idle:
                    await self._close_idle(task_id, used)
            due = [used + idle for used in self._last_used.values()]
            # At least a moment: a session whose close failed is tried again, not spun on.
            await anyio.sleep(max(min(due, default=now + idle) - now, min(idle, 1.0)))

    async def _close_idle(self, task_id: str, used: float) -> None:
        lock = self._locks.get(task_id)
        if lock is not None and lock.locked():  # a run goes on: not idle
            return
        if lock is None or task_id not in self._sessions:  # closed meanwhile
            self._last_used.pop(task_id, None)
            return
        async with lock:
            if self._last_used.get(task_id) != used or task_id not in self._sessions:
                return  # used (or closed) meanwhile
            log.info("closing the session of task %s: unused for %g s", task_id, self._idle_seconds)
            try:
                await self._close(task_id)
            except Exception as exc:  # the reaper goes on with the others
                log.warning("closing the idle session of task %s failed: %s", task_id, exc)
            self._reaped.add(task_id)


def checked_idle_seconds(value: float | None) -> float | None:
    """``value`` if it is a time a session may go unused (positive) or None (never);
    raises ValueError otherwise."""
    if value is not None and (isinstance(value, bool) or not value > 0):
        raise ValueError(f"idle_seconds must be positive, or None for never; got {value!r}")
    return value


def _session_fields(options: RunOptions, task_id: str) -> dict[str, Any]:
    """The RunOptions fields an AsyncSession takes as keywords, the task's id set."""
    fields = {
        name: getattr(options, name)
        for name in RunOptions.__dataclass_fields__
        if name not in ("backend", "tools")
    }
    fields["task_id"] = task_id
    return {**fields, "tools": options.tools}


async def _on_loop(func: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``await func(*args)`` on the sessions' loop, from any loop or thread. Cancelling
    the caller cancels it there too (a run then kills its script), and waits for that."""
    future: concurrent.futures.Future[T] = _loop.start_soon(func, *args)
    try:
        return await anyio.to_thread.run_sync(future.result, abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        future.cancel()
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(concurrent.futures.wait, [future])
        raise


def close_task_session(task_id: str) -> bool:
    """Close the sessions ``task_id`` has in every execute_code registration, removing
    everything they started (processes, stage, workspace, container, instance); whether
    there was one. Call it when a task ends. Blocks; safe from any thread."""
    with _all_lock:
        owners = list(_all)
    return any([owner.close(task_id) for owner in owners])


def close_all_sessions() -> None:
    """Close every task's session (at host shutdown; also run at interpreter exit)."""
    with _all_lock:
        owners = list(_all)
    for owner in owners:
        owner.close_all()


__all__ = [
    "DEFAULT_IDLE_SECONDS",
    "TaskSessions",
    "checked_idle_seconds",
    "close_all_sessions",
    "close_task_session",
]
