"""The persistent interpreter of a session (``Session(persistent=True)``), host side.

:class:`Kernel` starts ``stubs/_kernel.py`` in the session's stage the way a script is
started (same transport, same containment), serves its tool calls, and hands it one
cell per run: the program asks for the next cell with the reserved request
``__kernel__`` over its own RPC connection, so nothing polls, and the cell's output
comes back on the process's stdout and stderr, each ended by a marker stripped here.

A kernel's lifecycle belongs to its session, bounded per host process by
:data:`LIMITS` (set with :func:`set_interpreter_limits`): at most ``max_interpreters``
run at once (starting one more shuts down the least recently used) and one left idle
``idle_seconds`` is shut down. docs/sessions.md is the user's guide.
"""

from __future__ import annotations

import json
import logging
import posixpath
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from hermes_sandbox.errors import RunError
from hermes_sandbox.gate import ToolCallBudget, ToolGate
from hermes_sandbox.result import INTERRUPTED_EXIT_CODE, TIMEOUT_EXIT_CODE, ExecutionResult, Status
from hermes_sandbox.rpc.messages import Request
from hermes_sandbox.runner import (
    DRAIN_SECONDS,
    Plan,
    RunOptions,
    Stage,
    launch_script,
    run_sinks,
    shape_result,
    tool_context,
    wait_within,
)
from hermes_sandbox.streaming import OutputCallback, StreamedOutput
from hermes_sandbox.stubs import KERNEL_MODULE, kernel_source
from hermes_sandbox.transports import TransportUnavailable

log = logging.getLogger(__name__)

KERNEL_REQUEST = "__kernel__"
BETWEEN_CELLS_BYTES = 64 * 1024  # output printed between cells, kept for the next one
EVICT_WAIT_SECONDS = 60.0  # how long starting a kernel waits for an evicted one to end


@dataclass(slots=True)
class InterpreterLimits:
    """How many persistent interpreters one host process keeps, and for how long."""

    max_interpreters: int = 4
    idle_seconds: float = 1800.0


LIMITS = InterpreterLimits()


def set_interpreter_limits(
    *, max_interpreters: int | None = None, idle_seconds: float | None = None
) -> InterpreterLimits:
    """Change :data:`LIMITS` (for interpreters started, or left idle, from now on);
    return the limits as they were. Raises ValueError for a limit below 1 (or 0 s)."""
    before = InterpreterLimits(LIMITS.max_interpreters, LIMITS.idle_seconds)
    if max_interpreters is not None:
        if max_interpreters < 1:
            raise ValueError("max_interpreters must be at least 1")
        LIMITS.max_interpreters = max_interpreters
    if idle_seconds is not None:
        if idle_seconds <= 0:
            raise ValueError("idle_seconds must be positive")
        LIMITS.idle_seconds = idle_seconds
    return before


# The running kernels of this process, least recently used first.
_running: OrderedDict[Kernel, None] = OrderedDict()
_running_lock = threading.Lock()


def _admit(kernel: Kernel) -> list[Kernel]:
    """Count ``kernel`` in; the kernels to shut down to stay within the limit."""
    with _running_lock:
        _running[kernel] = None
        victims = []
        while len(_running) > LIMITS.max_interpreters:
            victim, _ = _running.popitem(last=False)
            victims.append(victim)
        return victims


def _touch(kernel: Kernel) -> None:
    with _running_lock:
        if kernel in _running:
            _running.move_to_end(kernel)


def _forget(kernel: Kernel) -> None:
    with _running_lock:
        _running.pop(kernel, None)


def _hold_back(data: bytes, marker: bytes) -> tuple[bytes, bytes]:
    """``data`` split before its longest ending that could be the start of ``marker``."""
    for size in range(min(len(marker) - 1, len(data)), 0, -1):
        if data.endswith(marker[:size]):
            return data[:-size], data[-size:]
    return data, b""


async def _first_of(*events: anyio.Event) -> None:
    """Return once any of ``events`` is set."""
    async with anyio.create_task_group() as waiters:

        async def wait(event: anyio.Event) -> None:
            await event.wait()
            waiters.cancel_scope.cancel()

        for event in events:
            waiters.start_soon(wait, event)


class _Cell:
    """One run in the kernel: its code, its output and what became of it."""

    def __init__(
        self,
        code: str,
        cwd: str | None,
        gate: ToolGate,
        options: RunOptions,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
    ) -> None:
        self.code = code
        self.cwd = cwd
        self.gate = gate
        self.stdout, self.stderr = run_sinks(options)
        self.streamed = {
            1: StreamedOutput(self.stdout, on_stdout) if on_stdout else None,
            2: StreamedOutput(self.stderr, on_stderr) if on_stderr else None,
        }
        self.streams_done = {1: anyio.Event(), 2: anyio.Event()}
        self.outcome: dict[str, Any] | None = None
        self.answered = anyio.Event()

    async def feed(self, fd: int, data: bytes) -> None:
        streamed = self.streamed[fd]
        if streamed is not None:
            await streamed.feed(data)
        else:
            (self.stdout if fd == 1 else self.stderr).feed(data)


class Kernel:
    """One persistent interpreter in a session's stage; an RPC request handler too
    (its own ``__kernel__`` requests, and the current cell's tool calls)."""

    def __init__(self, stage: Stage, plan: Plan, options: RunOptions, cwd: str) -> None:
        self._stage = stage
        self._plan = plan
        self._options = options
        self._cwd = cwd
        self._marker = ("\x1e" + secrets.token_hex(16) + "\x1e").encode("ascii")
        self._cells_in: Any = None  # the cells to run, made by start()
        self._cells_out: Any = None
        self._cell: _Cell | None = None
        self._gate = self._new_gate(options)
        self._between = {1: bytearray(), 2: bytearray()}
        self._stop = anyio.Event()
        self._ended = anyio.Event()
        self._gone = threading.Event()  # _ended, for other threads
        self._token: Any = None
        self.cells_run = 0
        self.exit_code: int | None = None
        self.end_reason: str | None = None  # why it ended (or will), for the result
        self.lost: str | None = None  # why the sandbox went away, if it did
        self.loss_reported = False  # whether a run's result said it ended

    @property
    def alive(self) -> bool:
        return not self._ended.is_set() and not self._stop.is_set()

    def unreported_end(self) -> str | None:
        """Why it ended between runs (idle, the limit), if no run's result said so."""
        if self.alive or self.loss_reported:
            return None
        return (
            f"The persistent interpreter had ended between runs ({self.end_reason}); this "
            "run started a fresh one: globals from earlier runs are gone."
        )

    def _new_gate(self, options: RunOptions) -> ToolGate:
        budget = ToolCallBudget(options.max_tool_calls, parent=options.budget)
        context = tool_context(self._stage, options, self._cwd)
        return ToolGate(self._plan.registry, self._plan.tools, budget, context)

    # -- the lifecycle --------------------------------------------------------------------

    async def start(self, task_group: anyio.abc.TaskGroup) -> None:
        """Start the interpreter in a task of ``task_group``, which owns it until it ends;
        shut down the least recently used ones beyond the limit. Raises RunError and
        BackendError."""
        runtime = self._stage.runtime
        path = posixpath.join(self._stage.path, KERNEL_MODULE)
        await runtime.write_bytes(path, kernel_source().encode(), mode=0o600)
        self._token = anyio.lowlevel.current_token()
        self._cells_in, self._cells_out = anyio.create_memory_object_stream[_Cell](1)
        await task_group.start(self._own, path)
        for victim in _admit(self):
            await victim.evict(
                f"the limit of {LIMITS.max_interpreters} persistent interpreters per host "
                "process was reached and it was the least recently used"
            )

    async def _own(self, path: str, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        _, launch = launch_script(
            self._stage,
            self,
            [self._stage.runtime.python, path],
            self._cwd,
            self._options,
            {"HERMES_KERNEL_MARKER": self._marker.decode("ascii")},
        )
        started = False
        try:
            async with launch as process:
                task_status.started()
                started = True
                async with anyio.create_task_group() as pumps:
                    pumps.start_soon(self._pump, process.stdout, 1)
                    pumps.start_soon(self._pump, process.stderr, 2)
                    async with anyio.create_task_group() as waiters:

                        async def stop_asked() -> None:
                            await self._stop.wait()
                            waiters.cancel_scope.cancel()

                        waiters.start_soon(stop_asked)
                        self.exit_code = await process.wait()
                        waiters.cancel_scope.cancel()
                        if self.end_reason is None:
                            self.end_reason = f"it exited with code {self.exit_code}"
                    with anyio.CancelScope(shield=True):
                        await process.kill(self._options.kill_grace)
                    # The interpreter's request for its next cell is still waiting:
                    # answer it ("end") now, or the transport's drain waits for it.
                    self._cells_in.close()
                    pumps.cancel_scope.deadline = anyio.current_time() + DRAIN_SECONDS
                self.lost = getattr(process, "lost", None)
        except TransportUnavailable as exc:
            if not started:
                raise RunError(str(exc)) from None
            self.end_reason = self.end_reason or str(exc)
        except Exception as exc:
            if not started:
                raise
            log.warning("the persistent interpreter failed: %s", exc)
            self.end_reason = self.end_reason or f"it failed ({exc})"
        finally:
            self._cells_in.close()
            self._cells_out.close()
            self._ended.set()
            _forget(self)
            self._gone.set()

    async def shut_down(self, reason: str | None = None) -> None:
        """End the interpreter (from its own event loop) and wait until it is gone."""
        if reason and self.end_reason is None:
            self.end_reason = reason
        self._stop.set()
        await self._ended.wait()

    async def evict(self, reason: str) -> None:
        """End the interpreter from any event loop or thread and wait until it is gone."""
        if self.end_reason is None:
            self.end_reason = reason
        if anyio.lowlevel.current_token() == self._token:
            await self.shut_down()
            return

        def stop_there() -> None:
            if self._gone.is_set():
                return
            try:
                anyio.from_thread.run_sync(self._stop.set, token=self._token)
            except RuntimeError:  # its event loop has ended, and the kernel with it
                return
            self._gone.wait(EVICT_WAIT_SECONDS)

        await anyio.to_thread.run_sync(stop_there)

    # -- the output -----------------------------------------------------------------------

    async def _pump(self, stream: Any, fd: int) -> None:
        held = b""
        try:
            async for chunk in stream:
                data = held + chunk
                while (at := data.find(self._marker)) >= 0:
                    await self._deliver(fd, data[:at])
                    if self._cell is not None:
                        self._cell.streams_done[fd].set()
                    data = data[at + len(self._marker) :]
                data, held = _hold_back(data, self._marker)
                await self._deliver(fd, data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        finally:
            cell = self._cell
            if cell is not None:
                if held:
                    (cell.stdout if fd == 1 else cell.stderr).feed(held)
                cell.streams_done[fd].set()

    async def _deliver(self, fd: int, data: bytes) -> None:
        if not data:
            return
        if self._cell is not None:
            await self._cell.feed(fd, data)
            return
        kept = self._between[fd]  # printed between cells (a thread, a child): the next's
        kept += data[: max(0, BETWEEN_CELLS_BYTES - len(kept))]

    # -- the RPC handler --------------------------------------------------------------------

    def answer_now(self, request: Request) -> str | None:
        if request.tool == KERNEL_REQUEST:
            return None
        return self._gate.answer_now(request)

    def answer_blocking(self, request: Request) -> str | None:
        if request.tool == KERNEL_REQUEST:
            return None
        return self._gate.answer_blocking(request)

    async def __call__(self, request: Request) -> str:
        if request.tool != KERNEL_REQUEST:
            return await self._gate(request)
        cell = self._cell
        if cell is not None and not cell.answered.is_set():
            outcome = request.args.get("outcome")
            cell.outcome = outcome if isinstance(outcome, dict) else {}
            cell.answered.set()
        with anyio.move_on_after(LIMITS.idle_seconds):
            try:
                cell = await self._cells_out.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                return json.dumps({"end": True})
            self._cell, self._gate = cell, cell.gate
            for fd, kept in self._between.items():
                if kept:
                    await cell.feed(fd, bytes(kept))
                    kept.clear()
            return json.dumps({"code": cell.code, "cwd": cell.cwd})
        if self.end_reason is None:
            self.end_reason = f"it was idle for {LIMITS.idle_seconds:g} s"
        self._stop.set()
        return json.dumps({"end": True})

    # -- one run ----------------------------------------------------------------------------

    async def run_cell(
        self,
        code: str,
        options: RunOptions,
        *,
        cwd: str | None,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        interrupt: anyio.Event | None,
        started: float,
    ) -> ExecutionResult:
        """Run ``code`` in the interpreter under ``options`` (its timeout, tool budget and
        output caps); ``cwd``, if given, is where the cell starts. A timeout or an
        interrupt ends the interpreter; so does the cell's ``sys.exit``."""
        fresh = self.cells_run == 0
        self.cells_run += 1
        _touch(self)
        cell = _Cell(code, cwd, self._new_gate(options), options, on_stdout, on_stderr)
        status: Status = "success"
        exit_code: int | None = 0
        try:
            if self.alive:
                try:
                    self._cells_in.send_nowait(cell)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.WouldBlock):
                    pass

            async def answered() -> None:
                await _first_of(cell.answered, self._ended)
                if not self._ended.is_set():
                    await _first_of(cell.streams_done[1], self._ended)
                    await _first_of(cell.streams_done[2], self._ended)

            cut, _ = await wait_within(answered, options.timeout, interrupt)
            status = cut or status
            if status in ("timeout", "interrupted"):
                with anyio.CancelScope(shield=True):
                    how = "timed out" if status == "timeout" else "was interrupted"
                    await self.shut_down(f"the run {how}")
            for streamed in cell.streamed.values():
                if streamed is not None:
                    await streamed.flush()
        except BaseException:
            with anyio.CancelScope(shield=True):  # a cancelled run takes the interpreter
                await self.shut_down("the run was cancelled")
            raise
        finally:
            if self._cell is cell:
                self._cell = None
            cell.stdout.close()
        if status == "timeout":
            exit_code = TIMEOUT_EXIT_CODE
        elif status == "interrupted":
            exit_code = INTERRUPTED_EXIT_CODE
        elif cell.outcome is not None and not self._ended.is_set():
            if not cell.outcome.get("ok"):
                status, exit_code = "error", 1
        else:  # the interpreter ended during the cell: sys.exit, a crash, an eviction
            exit_code = self.exit_code
            if exit_code is None:
                exit_code = 1
            elif exit_code < 0:
                exit_code = 128 - exit_code
            status = "success" if exit_code == 0 else "error"
        result = shape_result(
            status,
            exit_code,
            cell.stdout,
            cell.stderr,
            calls=cell.gate.calls_made,
            duration=time.monotonic() - started,
            timeout=options.timeout,
            tools=self._plan.tools,
            lost=self.lost,
        )
        if status == "error" and cell.outcome is not None and cell.outcome.get("error"):
            result.error = str(cell.outcome["error"])[:300]
        result.interpreter_started = fresh
        result.state_lost = not self.alive
        if result.state_lost:
            self.loss_reported = True
            note = (
                f"The persistent interpreter ended ({self.end_reason or 'it exited'}): its "
                "globals are gone and the next run starts a fresh one."
            )
            result.add_warning(note)
        return result


__all__ = ["KERNEL_REQUEST", "LIMITS", "InterpreterLimits", "Kernel", "set_interpreter_limits"]
