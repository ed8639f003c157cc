"""Running an async tool handler to completion from synchronous code.

:meth:`ToolRegistry.dispatch` (sync code, any thread) hands an async handler's coroutine
to :func:`run_awaitable`, which runs it on an anyio blocking portal: an event loop in a
daemon thread, started on first use and kept for the life of the process, while the
caller waits. Reusing one loop keeps any loop-bound state a handler caches (a client, a
lock) valid from call to call: the usual source of "Event loop is closed". A handler
sees a copy of the caller's context variables, as it would under ``adispatch``. After
a fork the child starts a portal of its own; at interpreter exit the portals are
stopped and what still runs on them is cancelled.
"""

from __future__ import annotations

import atexit
import inspect
import os
import threading
from collections.abc import Awaitable
from contextlib import AbstractContextManager
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal


class _PortalThread:
    """One blocking portal, started when first needed and restarted after a fork."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._context: AbstractContextManager[BlockingPortal] | None = None
        self._portal: BlockingPortal | None = None
        self._thread_id: int | None = None
        self._pid = 0
        self._exit_hook = False

    def _running_portal(self) -> BlockingPortal:
        with self._lock:
            if self._portal is not None and self._pid == os.getpid():
                return self._portal
            if self._context is not None:
                # The parent's, whose loop thread did not survive the fork. Closing it
                # would wait for that loop forever, and so would collecting it: keep it.
                _forsaken.append(self._context)
            context = start_blocking_portal("asyncio")
            portal = context.__enter__()
            self._thread_id = portal.call(_name_current_thread, self.name)
            self._context, self._portal, self._pid = context, portal, os.getpid()
            if not self._exit_hook:
                atexit.register(self.stop)
                self._exit_hook = True
            return portal

    def owns_current_thread(self) -> bool:
        """Whether the calling code runs on this portal's event loop."""
        return (
            self._portal is not None
            and self._pid == os.getpid()
            and self._thread_id == threading.get_ident()
        )

    def run(self, awaitable: Awaitable[Any]) -> Any:
        """Run ``awaitable`` on the portal; block until done and return its result."""
        try:
            portal = self._running_portal()
            future = portal.start_task_soon(_await, awaitable)
        except BaseException:
            _discard(awaitable)
            raise
        try:
            return future.result()
        finally:
            if not future.done():  # interrupted while waiting: do not leave the tool running
                future.cancel()

    def stop(self) -> None:
        """Stop the portal, cancelling what still runs on it; a later run starts another."""
        with self._lock:
            context, portal = self._context, self._portal
            self._context = self._portal = self._thread_id = None
        if context is None or portal is None or self._pid != os.getpid():
            return
        try:
            portal.call(portal.stop, True)
        except RuntimeError:  # already stopped
            pass
        context.__exit__(None, None, None)


def _name_current_thread(name: str) -> int:
    thread = threading.current_thread()
    thread.name = name
    return thread.ident or threading.get_ident()


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _discard(awaitable: Awaitable[Any]) -> None:
    """Close a coroutine that will never run (so Python does not warn about it)."""
    if inspect.iscoroutine(awaitable):
        awaitable.close()


_forsaken: list[AbstractContextManager[BlockingPortal]] = []
_portals_lock = threading.Lock()
_portals: list[_PortalThread] = []


def run_awaitable(awaitable: Awaitable[Any]) -> Any:
    """Run ``awaitable`` to completion from synchronous code and return its result.

    It runs on the registry's portal (see the module docstring) while the calling thread
    waits, and raises what it raises. Code already running on that portal's loop (an
    async handler that calls ``dispatch``) cannot wait for its own loop, so its call goes
    to a second portal, and so on one level deeper for each nesting; each level's portal
    persists like the first.
    """
    with _portals_lock:
        level = next((i + 1 for i, p in enumerate(_portals) if p.owns_current_thread()), 0)
        while len(_portals) <= level:
            _portals.append(_PortalThread(f"tool-dispatch-portal-{len(_portals)}"))
        portal = _portals[level]
    return portal.run(awaitable)


__all__ = ["run_awaitable"]
