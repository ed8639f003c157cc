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
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any

import anyio
from anyio.from_thread import BlockingPortal


class _PortalThread:
    """One blocking portal in a daemon thread of its own, started when first needed.

    The thread is hosted here rather than by ``start_blocking_portal``, whose context
    manager, once dropped, waits for its loop to stop: in a child forked after the portal
    started there is no such loop, and the child would hang as it exits. The child just
    forgets the parent's portal and starts one of its own.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._portal: BlockingPortal | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._exit_hook = False

    def _running_portal(self) -> BlockingPortal:
        with self._lock:
            if self._portal is not None and self._pid == os.getpid():
                return self._portal
            started: Future[BlockingPortal] = Future()

            async def serve() -> None:
                async with BlockingPortal() as portal:
                    started.set_result(portal)
                    await portal.sleep_until_stopped()

            def main() -> None:
                try:
                    anyio.run(serve)
                except BaseException as exc:
                    if not started.done():
                        started.set_exception(exc)

            thread = threading.Thread(target=main, name=self.name, daemon=True)
            thread.start()
            self._portal, self._thread, self._pid = started.result(), thread, os.getpid()
            if not self._exit_hook:
                atexit.register(self.stop)
                self._exit_hook = True
            return self._portal

    def owns_current_thread(self) -> bool:
        """Whether the calling code runs on this portal's event loop."""
        return self._thread is threading.current_thread() and self._pid == os.getpid()

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

    def start_soon(self, func: Callable[..., Awaitable[Any]], *args: Any) -> Future[Any]:
        """Start ``func(*args)`` on the portal; its result comes in the returned future
        (whose ``cancel`` cancels it)."""
        return self._running_portal().start_task_soon(func, *args)

    def stop(self) -> None:
        """Stop the portal, cancelling what still runs on it; a later run starts another."""
        with self._lock:
            portal, thread = self._portal, self._thread
            self._portal = self._thread = None
        if portal is None or thread is None or self._pid != os.getpid():
            return
        try:
            portal.call(portal.stop, True)
        except RuntimeError:  # already stopped
            return
        thread.join(timeout=5)


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _discard(awaitable: Awaitable[Any]) -> None:
    """Close a coroutine that will never run (so Python does not warn about it)."""
    if inspect.iscoroutine(awaitable):
        awaitable.close()


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


# For a caller that keeps loop-bound objects of its own on a loop of their own.
PortalThread = _PortalThread

__all__ = ["PortalThread", "run_awaitable"]
