"""Serving a stream of requests with blocking reads in threads, leader/followers.

The shape the Unix socket (rpc/unix.py) and the files transport (rpc/files.py) share:
one thread at a time, the leader, holds the read turn: it reads, and runs each sync
call it reads (:meth:`RPCServer.reply_blocking`) on its own thread *still holding the
turn*, sends the reply and reads on. A quick call so costs its reads, the tool and its
send, as an ``inline`` tool does: no thread is woken, no lock changes hands. When a call
runs long, the process's hand-off watch (:class:`_HandOffWatch`, one thread that ticks
every :data:`HAND_OFF_SECONDS` while some source has run a call since its last tick, and
sleeps without a timeout otherwise) takes the turn from the thread running it and hands
it to a follower (one waiting, or one started), which reads and serves what comes next;
the thread that ran the long call becomes a follower when it is done. So a tool that
blocks holds the requests behind it for one to two ticks at most. An async tool goes to
the run's event loop (:func:`rpc.server.loop_caller`), where it runs in the caller's
task group. The threads are bounded per source and per run
(:attr:`RPCServer.thread_slots`): when none is left, a long call keeps the turn, and
further requests wait where they are (the socket, the directory).

A transport subclasses :class:`LeaderFollowers` and supplies how to read
(:meth:`~LeaderFollowers._read`), how to send a reply (:meth:`~LeaderFollowers._send`),
how to wake a reader blocked at the end (:meth:`~LeaderFollowers._wake_readers`),
what to release when the last thread and call are done
(:meth:`~LeaderFollowers._release`) and what may take a while to release, which is
released only once that end is signalled
(:meth:`~LeaderFollowers._release_after_end`). Each item read carries a tag that the
transport gets back with its reply (the files transport's request key; None on a
socket).
"""

from __future__ import annotations

import functools
import os
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
# The hand-off watch's tick: a call that runs through a whole tick has the read turn
# taken from its thread, so requests behind it wait one to two ticks at most.
HAND_OFF_SECONDS = 0.002
WATCH_THREAD = "hermes-rpc-watch"

Item = tuple[Any, Any]  # (a Request, or a reply to send as it is; the transport's tag)


class LeaderFollowers:
    """One source of requests served by blocking reads in threads.

    Invariants: only the holder of the read turn (``_read_lock``, which the hand-off
    watch may release on behalf of a thread running a call) calls :meth:`_read` and
    takes from ``_ready``; ``_lent`` is the loan of the turn to the call its holder
    runs (a token of that call's own), and only the thread that clears it under
    ``_state`` (the holder when its call is done, or the watch) decides who has the
    turn next; :meth:`_release` runs once, when the last of the source's threads and
    calls has finished, so no thread ever uses a released (possibly reused)
    descriptor. :meth:`shut` wakes every thread blocked reading.
    """

    thread_name = "hermes-rpc"

    def __init__(self, server: RPCServer, tasks: anyio.abc.TaskGroup) -> None:
        self._server = server
        self._tasks = tasks
        self._later_send, self._later = anyio.create_memory_object_stream[Item](float("inf"))
        self._call_soon = loop_caller()
        self._ready: deque[Item] = deque()  # read, not yet taken
        self._read_lock = threading.Lock()  # the read turn
        self._state = threading.Lock()  # guards the counts and flags below
        self._threads = 0  # threads serving the source (or about to)
        # Of them, those that may still read: waiting for the turn, or holding it while
        # not inside a call (counted from their start).
        self._readers = 0
        self._calls = 0  # requests taken and not yet answered (in threads or on the loop)
        # The loan of the turn to the call its holder runs (None: not lent): a token of
        # that call's own, so a thread whose call lost the turn to the watch can never
        # take the loan of the next holder's call for its own when it returns.
        self._lent: object | None = None
        self._lent_calls = 0  # calls run with the turn lent so far: the watch's clock
        self._watched = False  # the watch looks at this source each tick
        # Requests handed to the loop (_call_soon) and not yet queued there: the loop may
        # end before it runs them, so close_later counts them done.
        self._bound_for_loop = 0
        self._later_closed = False  # close_later has run: nothing more goes to the loop
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

    def _release_after_end(self) -> None:
        """Release what may take long to close (called once, after :meth:`_release`,
        outside the locks, once the source's end is signalled: the end of a run does
        not wait for it)."""

    # -- threads ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the first thread (the caller admitted the source)."""
        with self._state:
            self._threads += 1
            self._readers += 1
        self._start_thread(slot=False)

    def _spawn_follower(self) -> None:
        """Start a thread to take the turn if none waits for it and the source and the
        run have room (any thread)."""
        with self._state:
            if self.closed or self._readers or self._threads >= SOURCE_THREADS:
                return
            self._threads += 1
            self._readers += 1
        if self._server.thread_slots.acquire(blocking=False):
            self._start_thread(slot=True)
        else:
            self._thread_gone(slot=False)

    def _start_thread(self, *, slot: bool) -> None:
        """Start a thread counted already (a thread and a reader)."""
        thread = threading.Thread(
            target=self._serve, args=(slot,), name=self.thread_name, daemon=True
        )
        try:
            thread.start()
        except RuntimeError:  # cannot start a thread: the others serve alone
            self._thread_gone(slot)

    def _serve(self, slot: bool) -> None:
        try:
            while True:
                self._read_lock.acquire()
                if not self._lead():
                    return
        finally:
            with self._state:
                self._threads -= 1
            if slot:
                self._server.thread_slots.release()
            self._finish_if_done()

    def _thread_gone(self, slot: bool) -> None:
        """A thread counted (as a reader too) that will never serve, or has stopped
        reading for good."""
        with self._state:
            self._threads -= 1
        if slot:
            self._server.thread_slots.release()
        self._reader_gone()
        self._finish_if_done()

    def _reader_gone(self) -> None:
        with self._state:
            self._readers -= 1
            gone = self.closed and not self._readers
        if gone:
            self._call_soon(self.readers_gone.set)

    def _lead(self) -> bool:
        """Holding the turn: read and answer until the source is over for this thread
        (the turn released: return False) or the watch took the turn during a call
        (return True: wait for it again)."""
        while True:
            item = self._next()
            if item is None:
                self._read_lock.release()
                self._reader_gone()
                return False
            request, tag = item
            if not isinstance(request, Request):
                self._send(request, tag)
                continue
            loan = object()
            with self._state:
                self._calls += 1
                self._readers -= 1
                self._lent = loan
                self._lent_calls += 1
                watch = not self._watched
                self._watched = True
                gone = self.closed and not self._readers
            if gone:
                self._call_soon(self.readers_gone.set)
            if watch and not _WATCH.watch(self):
                self._hand_on()  # no watch: hand the turn on now, as every call did before
            done = self._answer(request, tag)
            with self._state:
                if done:
                    self._calls -= 1
                kept = self._lent is loan
                if kept:
                    self._lent = None
                reading = not self.closed
                if reading:
                    self._readers += 1
            if not kept:
                return reading  # the watch handed the turn on: wait for it again
            if not reading:
                self._read_lock.release()
                return False

    def _next(self) -> Item | None:
        """The next item read (reading if none is), or None once the source is over."""
        while not self._ready:
            if self.closed or self._input_ended or not self._read():
                return None
        return self._ready.popleft()

    def _hand_on(self, calls: int | None = None) -> None:
        """Take the turn from the thread running a call with it (the ``calls``-th, if
        given, else whichever) and leave it to a follower: one waiting takes it, or one
        is started while the source and the run have room."""
        with self._state:
            if self._lent is None or (calls is not None and calls != self._lent_calls):
                return  # that call is done: its thread kept the turn
            self._lent = None
            self._read_lock.release()
        self._spawn_follower()

    # -- calls --------------------------------------------------------------------------

    def _answer(self, request: Request, tag: Any) -> bool:
        """Answer ``request`` on this thread, or send it to the loop (an async tool);
        return whether it is done here (the caller counts it done)."""
        reply = None if self.closed else self._server.reply_blocking(request)
        if reply is not None:
            self._send(reply, tag)
            return True
        # An async tool: to the run's event loop, into the source's tasks. Until the
        # loop has queued it, close_later counts it done if the run ends first.
        with self._state:
            if self.closed or self._later_closed:
                return True
            self._bound_for_loop += 1
        if self._call_soon(functools.partial(self._start_later, request, tag)):
            return False
        with self._state:  # the loop is gone
            if self._later_closed:
                return False  # close_later counted it
            self._bound_for_loop -= 1
        return True

    def _start_later(self, request: Request, tag: Any) -> None:
        """On the loop: queue ``request`` for :meth:`run_later` (at most one per
        thread of the source is ever queued); after :meth:`close_later`, which
        counted it done, drop it."""
        with self._state:
            if self._later_closed:
                return
            self._bound_for_loop -= 1
        self._later_send.send_nowait((request, tag))

    async def run_later(self) -> None:
        """On the loop, for the life of the source: answer each request that needs
        the loop in a task of its own. Cancelled, it ends the queue (close_later):
        a request left in it would never be answered nor counted done."""
        async with self._later:
            try:
                async for request, tag in self._later:
                    self._tasks.start_soon(self._answer_later, request, tag)
            finally:
                self.close_later()

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
        """On the loop: no more requests for :meth:`run_later`; those handed to the
        loop and not started are dropped and counted done (the source is shut: no
        one would read their replies). Idempotent."""
        with self._state:
            if self._later_closed:
                return
            self._later_closed = True
            dropped, self._bound_for_loop = self._bound_for_loop, 0
        self._later_send.close()
        while True:
            try:
                self._later.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
            dropped += 1
        for _ in range(dropped):
            self._call_done()

    def _finish_if_done(self) -> None:
        with self._state:
            if self._finished or self._threads or self._calls:
                return
            self._finished = True
            self._release()
        self._call_soon(self.ended.set)
        # No thread is left to read: shut() after this is a no-op, and the end of a
        # run, which waits for the readers after a source ended by itself, must not
        # wait out its bound.
        self._call_soon(self.readers_gone.set)
        self._release_after_end()


class _HandOffWatch:
    """Hands a source's read turn on when the thread holding it has run one call for a
    whole tick (:data:`HAND_OFF_SECONDS`): one thread for the process, started at the
    first call. It ticks only while some source has run a call since its last tick, and
    waits without a timeout when none has: an idle run costs no wake-ups. A source
    joins it at its first call after a quiet tick, so a stream of quick calls costs the
    watch one lock per tick, not one per call.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        # source -> its lent-call count at the last tick (-1: not seen yet)
        self._sources: dict[LeaderFollowers, int] = {}
        self._thread: threading.Thread | None = None
        self._failed = False

    def watch(self, source: LeaderFollowers) -> bool:
        """Look at ``source`` each tick from now on (it set its ``_watched``); False
        when there is no watch thread and none can be started."""
        with self._cond:
            if self._thread is None and not self._failed:
                thread = threading.Thread(target=self._run, name=WATCH_THREAD, daemon=True)
                try:
                    thread.start()
                except RuntimeError:
                    self._failed = True  # tried once: every call hands on at once
                else:
                    self._thread = thread
            if self._thread is None:
                with source._state:
                    source._watched = False
                return False
            if not self._sources:
                self._cond.notify()
            self._sources[source] = -1
            return True

    @property
    def idle(self) -> bool:
        """No source to look at: the watch thread waits without a timeout."""
        with self._cond:
            return not self._sources

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._sources:
                    self._cond.wait()
                self._cond.wait(HAND_OFF_SECONDS)
                due = self._tick()
            for source, calls in due:
                source._hand_on(calls)

    def _tick(self) -> list[tuple[LeaderFollowers, int]]:
        """Under ``_cond``: the sources whose same call has run since the last tick;
        those with no call since then leave the watch."""
        due = []
        for source, seen in list(self._sources.items()):
            with source._state:
                calls = source._lent_calls
                if calls == seen and source._lent is None:
                    source._watched = False
                    del self._sources[source]
                    continue
            if calls == seen:
                due.append((source, calls))
            else:
                self._sources[source] = calls
        return due


_WATCH = _HandOffWatch()


def _new_watch_after_fork() -> None:
    # A forked child has none of its parent's threads: a watch that believes its
    # thread runs would never hand a blocked call's turn on. The child starts its own.
    global _WATCH
    _WATCH = _HandOffWatch()


os.register_at_fork(after_in_child=_new_watch_after_fork)

__all__ = ["HAND_OFF_SECONDS", "SOURCE_THREADS", "LeaderFollowers"]
