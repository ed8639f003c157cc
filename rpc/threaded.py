"""Serving a stream of requests with blocking reads in threads, leader/followers.

The shape the Unix socket (rpc/unix.py) and the files transport (rpc/files.py) share:
one thread at a time, the leader, reads; the thread that reads a request that needs
running (a :class:`Request` that :meth:`RPCServer.take` could not answer at once) hands
the reading to a follower *before* it runs the call on its own thread
(:meth:`RPCServer.reply_blocking`), sends the reply and becomes a follower again. A call
so costs its reads, a lock hand-off and the tool, with no event-loop pass and no thread
hop. An async tool goes to the run's event loop (:func:`rpc.server.loop_caller`), where it
runs in the caller's task group. The threads are bounded per source and per run
(:attr:`RPCServer.thread_slots`): when none is left, the thread that read a request runs
it without handing off, and further requests wait where they are (the socket, the
directory).

A transport subclasses :class:`LeaderFollowers` and supplies how to read
(:meth:`~LeaderFollowers._read`), how to send a reply (:meth:`~LeaderFollowers._send`),
how to wake a reader blocked at the end (:meth:`~LeaderFollowers._wake_readers`) and
what to release when the last thread and call are done
(:meth:`~LeaderFollowers._release`). Each item read carries a tag that the transport
gets back with its reply (the files transport's request key; None on a socket).
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread

from hermes_sandbox import threads
from hermes_sandbox.rpc.messages import Request
from hermes_sandbox.rpc.server import RPCServer, loop_caller

# Threads serving one source at most: one reading, the others running its calls.
SOURCE_THREADS = threads.TOOL_THREADS + 1

Item = tuple[Any, Any]  # (a Request, or a reply to send as it is; the transport's tag)


class LeaderFollowers:
    """One source of requests served by blocking reads in threads.

    Invariants: only the holder of ``_read_lock`` calls :meth:`_read` and takes from
    ``_ready``; :meth:`_release` runs once, when the last of the source's threads and
    calls has finished, so no thread ever uses a released (possibly reused) descriptor.
    :meth:`shut` wakes every thread blocked reading.
    """

    thread_name = "hermes-rpc"

    def __init__(self, server: RPCServer, tasks: anyio.abc.TaskGroup) -> None:
        self._server = server
        self._tasks = tasks
        self._later_send, self._later = anyio.create_memory_object_stream[Item](float("inf"))
        self._call_soon = loop_caller()
        self._ready: deque[Item] = deque()  # read, not yet taken
        self._read_lock = threading.Lock()
        self._state = threading.Lock()  # guards the counts and flags below
        self._threads = 0  # threads serving the source
        self._readers = 0  # of them, reading or waiting to (the leader, the followers)
        self._calls = 0  # requests taken and not yet answered (in threads or on the loop)
        self._input_ended = False
        self._finished = False
        self.closed = False
        self.ended = anyio.Event()  # every thread and call is done, the source released
        self.readers_gone = anyio.Event()  # after shut(): no thread reads any more

    # -- what a transport supplies ------------------------------------------------------

    def _read(self) -> bool:
        """Block until something is read, and put it in ``_ready``; False when the
        source ends for reading. Called by the leader only."""
        raise NotImplementedError

    def _send(self, reply: Any, tag: Any) -> None:
        """Send one reply (from any thread); drop it quietly once :attr:`closed`."""
        raise NotImplementedError

    def _wake_readers(self) -> None:
        """Wake a thread blocked in :meth:`_read` (called once, under ``_state``)."""

    def _release(self) -> None:
        """Release the source (called once, under ``_state``, after every thread and
        call is done)."""

    # -- threads ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the first thread (the caller admitted the source)."""
        self._spawn(slot=False)

    def _spawn(self, *, slot: bool) -> None:
        with self._state:
            self._threads += 1
        thread = threading.Thread(
            target=self._serve, args=(slot,), name=self.thread_name, daemon=True
        )
        try:
            thread.start()
        except RuntimeError:  # cannot start a thread: the others serve alone
            self._thread_exit(slot)

    def _serve(self, slot: bool) -> None:
        try:
            while (item := self._lead()) is not None:
                self._answer(*item)
        finally:
            self._thread_exit(slot)

    def _thread_exit(self, slot: bool) -> None:
        if slot:
            self._server.thread_slots.release()
        with self._state:
            self._threads -= 1
        self._finish_if_done()

    def _lead(self) -> Item | None:
        """Wait to be the leader, then read until a request needs running; hand the
        reading on and return it. None when the source is over for this thread."""
        with self._state:
            self._readers += 1
        try:
            with self._read_lock:
                while True:
                    while self._ready:
                        item = self._ready.popleft()
                        if isinstance(item[0], Request):
                            with self._state:
                                self._calls += 1
                            self._hand_off()
                            return item
                        self._send(*item)
                    if self.closed or self._input_ended:
                        return None
                    if not self._read():
                        return None
        finally:
            with self._state:
                self._readers -= 1
                gone = self.closed and not self._readers
            if gone:
                self._call_soon(self.readers_gone.set)

    def _hand_off(self) -> None:
        """Before this thread runs a call: make sure another will read (a follower
        waits already, or one is started while the source and the run have room)."""
        with self._state:
            needed = self._readers <= 1 and self._threads < SOURCE_THREADS
        if needed and self._server.thread_slots.acquire(blocking=False):
            self._spawn(slot=True)

    def _end_input(self) -> bool:
        """Mark the source ended for reading; return whether a call is in flight."""
        with self._state:
            self._input_ended = True
            return bool(self._calls)

    # -- calls --------------------------------------------------------------------------

    def _answer(self, request: Request, tag: Any) -> None:
        reply = None if self.closed else self._server.reply_blocking(request)
        # An async tool: to the run's event loop, into the source's tasks.
        if (
            reply is None
            and not self.closed
            and self._call_soon(functools.partial(self._start_later, request, tag))
        ):
            return
        if reply is not None:
            self._send(reply, tag)
        self._call_done()

    def _start_later(self, request: Request, tag: Any) -> None:
        """On the loop: queue ``request`` for :meth:`run_later` (at most one per
        thread of the source is ever queued)."""
        try:
            self._later_send.send_nowait((request, tag))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):  # the run ended
            self._call_done()

    async def run_later(self) -> None:
        """On the loop, for the life of the source: answer each request that needs
        the loop in a task of its own."""
        async with self._later:
            async for request, tag in self._later:
                self._tasks.start_soon(self._answer_later, request, tag)

    async def _answer_later(self, request: Request, tag: Any) -> None:
        try:
            reply = await self._server.reply_later(request)
            # The send may block (a peer slow to read): never on the loop. Not abandoned
            # when cancelled: the source must outlive it, and shut() wakes it.
            await anyio.to_thread.run_sync(self._send, reply, tag, limiter=threads.tool_limiter())
        finally:
            self._call_done()

    @property
    def calls_in_flight(self) -> int:
        """Requests taken and not yet answered (in threads or on the loop)."""
        return self._calls

    def _call_done(self) -> None:
        with self._state:
            self._calls -= 1
        self._finish_if_done()

    # -- the end ------------------------------------------------------------------------

    def shut(self) -> None:
        """End the source now: every thread blocked reading wakes, replies still to
        come are dropped. Any thread or the loop may call it."""
        with self._state:  # never beside _release in _finish_if_done: fds are reused
            if self.closed or self._finished:
                return
            self.closed = True
            gone = not self._readers
            self._wake_readers()
        if gone:
            self._call_soon(self.readers_gone.set)

    def close_later(self) -> None:
        """On the loop: no more requests for :meth:`run_later`; those queued and not
        started are dropped (the source is shut: no one would read their replies)."""
        self._later_send.close()
        while True:
            try:
                self._later.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return
            self._call_done()

    def _finish_if_done(self) -> None:
        with self._state:
            if self._finished or self._threads or self._calls:
                return
            self._finished = True
            self._release()
        self._call_soon(self.ended.set)


__all__ = ["SOURCE_THREADS", "LeaderFollowers"]
