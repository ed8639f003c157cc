"""Sessions: one environment kept warm for many runs, and files moved in and out of it.

:class:`AsyncSession` starts the environment once (the container, the instance, the SSH
connection, this machine), makes a stage holding the stub files and a private
workspace directory, and runs each script there; leaving it removes all of them.
:class:`Session` is the same for synchronous code, on an event loop of its own, the
way httpx pairs Client with AsyncClient. docs/sessions.md is the user's guide.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import time
import uuid
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.abc
import anyio.from_thread

from hermes_sandbox.environments import BackendSettings, Environment, Runtime
from hermes_sandbox.errors import RunError
from hermes_sandbox.kernel import Kernel
from hermes_sandbox.result import ExecutionResult
from hermes_sandbox.runner import (
    Plan,
    RunOptions,
    Stage,
    make_environment,
    open_stage,
    plan_run,
    remove_stage,
    run_in_stage,
)
from hermes_sandbox.streaming import OutputCallback
from hermes_sandbox.tools.registry import ToolRegistry
from hermes_sandbox.tools.toolsets import tools_for_run

WORKSPACE_PREFIX = "hermes-session-"
NEEDS_ASYNC_WITH = (
    "a persistent AsyncSession keeps its interpreter in a task of its own: use it as "
    "`async with AsyncSession(..., persistent=True) as s:`"
)


class AsyncSession:
    """A warm sandbox for many runs; an async context manager.

    ``backend``, ``tools``, ``toolsets``, ``timeout``, ``max_tool_calls``, ``cwd``,
    ``env`` and the other keyword arguments (fields of
    :class:`~hermes_sandbox.runner.RunOptions`) are the session's defaults, as for
    :func:`~hermes_sandbox.execute_code`. Runs start in the session's
    :attr:`workspace` unless ``cwd`` is given (or ``start_in_workspace`` is False:
    then where a one-shot run starts, the backend's default directory). Runs in one
    session are sequential: a call made while another is in progress raises
    :class:`RunError` rather than wait.

    With ``persistent=True`` the runs are cells of one interpreter whose globals
    survive between them (see :mod:`sandbox.kernel`); the session must then be used
    as ``async with``.

    Raises :class:`RunError` for options that make no sense and
    :class:`~hermes_sandbox.environments.BackendError` when the backend cannot be
    started.
    """

    def __init__(
        self,
        backend: str | BackendSettings = "local",
        *,
        tools: Sequence[str] | None = None,
        toolsets: Sequence[str] | None = None,
        persistent: bool = False,
        start_in_workspace: bool = True,
        timeout: float = 300,
        max_tool_calls: int = 50,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        registry: ToolRegistry | None = None,
        **options: Any,
    ) -> None:
        if isinstance(tools, str) or isinstance(toolsets, str):
            raise RunError('tools and toolsets are lists of names, not a string: ["terminal"]')
        chosen = tools_for_run(tools, toolsets, registry)
        run_options = RunOptions(
            backend=backend,
            tools=None if chosen is None else tuple(chosen),
            timeout=timeout,
            max_tool_calls=max_tool_calls,
            cwd=cwd,
            env=env,
            **options,
        )
        if run_options.task_id is None:  # one task for all runs: tools keep their state
            run_options = dataclasses.replace(run_options, task_id=uuid.uuid4().hex)
        self._plan: Plan = plan_run(run_options, registry)
        self._environment: Environment | None = None
        self._stage: Stage | None = None
        self._workspace: str | None = None
        self._start_in_workspace = start_in_workspace
        self._busy: str | None = None  # what is in progress
        self._closed = False
        self.persistent = persistent
        self._kernel: Kernel | None = None
        self._kernel_tasks: anyio.abc.TaskGroup | None = None  # while inside `async with`
        self._exit_stack: AsyncExitStack | None = None

    # -- what a caller may look at ------------------------------------------------------

    @property
    def options(self) -> RunOptions:
        """The session's run defaults, checked."""
        return self._plan.options

    @property
    def environment(self) -> Environment | None:
        """The started environment (its container id, instance name...), or None."""
        return self._environment

    @property
    def workspace(self) -> str | None:
        """The session's private directory in the environment, or None before start.
        Runs start there (unless ``cwd`` says otherwise), and relative paths given to
        :meth:`upload` and :meth:`download` are taken from it."""
        return self._workspace

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def interpreter_alive(self) -> bool:
        """True while a persistent session's interpreter runs."""
        return self._kernel is not None and self._kernel.alive

    # -- the lifecycle ------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if not self.persistent:
            await self.start()
            return self
        # Started before the interpreters' task group is entered: a failure to start is
        # raised as itself, not inside the group's ExceptionGroup.
        await self.start()
        stack = AsyncExitStack()
        self._kernel_tasks = await stack.enter_async_context(anyio.create_task_group())
        self._exit_stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._exit_stack = self._exit_stack, None
        try:
            await self.aclose()
        finally:
            self._kernel_tasks = None
            if stack is not None:
                await stack.aclose()

    async def start(self) -> None:
        """Start the environment and make the stage and the workspace (done for you by
        ``async with`` and by the first run). Raises RunError once closed."""
        with self._exclusive("start"):
            await self._start()

    async def _start(self) -> None:
        if self._environment is not None:
            return
        options = self._plan.options
        environment, base_env = make_environment(options, options.env)
        self._environment = environment
        try:
            runtime = await environment.start()
            self._stage = await open_stage(runtime, self._plan, base_env)
            self._workspace = await runtime.make_private_dir(WORKSPACE_PREFIX)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._stop()
            raise

    async def _stop(self) -> str | None:
        """Remove the stage and the workspace, close the environment; what could not be
        removed, if anything."""
        environment, stage, workspace = self._environment, self._stage, self._workspace
        self._environment = self._stage = self._workspace = None
        problem = None
        if environment is None:
            return None
        try:
            kernel, self._kernel = self._kernel, None
            if kernel is not None:
                await kernel.shut_down("the session was reset or closed")
            if stage is not None:
                problem = await remove_stage(stage.runtime, stage.path)
            if workspace is not None and stage is not None:
                problem = await remove_stage(stage.runtime, workspace) or problem
        finally:
            await environment.aclose()
        return problem

    async def reset(self) -> None:
        """A fresh environment and workspace: everything the session held is removed
        (its processes, files, the container or instance) and started anew."""
        with self._exclusive("reset"):
            with anyio.CancelScope(shield=True):
                await self._stop()
            await self._start()

    async def aclose(self) -> None:
        """Remove everything the session started. Idempotent; not cancellable. Raises
        RunError while a run is in progress (interrupt or cancel it first)."""
        if self._closed:
            return
        if self._busy is not None:
            raise RunError(f"the session cannot close while a {self._busy} is in progress")
        self._closed = True
        with anyio.CancelScope(shield=True):
            await self._stop()

    # -- runs and files -----------------------------------------------------------------

    async def run(
        self,
        code: str,
        *,
        timeout: float | None = None,
        max_tool_calls: int | None = None,
        cwd: str | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        interrupt: anyio.Event | None = None,
    ) -> ExecutionResult:
        """Run ``code`` in the warm environment and return its result, shaped as
        :func:`~hermes_sandbox.execute_code`'s. ``timeout`` and ``max_tool_calls``
        override the session's for this run. ``on_stdout`` and ``on_stderr`` get the
        output as it is printed, in lines (see :mod:`sandbox.streaming`); the result
        is capped as always. Raises RunError (bad options, a run already in
        progress, a closed session) and BackendError."""
        started = time.monotonic()
        with self._exclusive("run"):
            await self._start()
            assert self._stage is not None and self._workspace is not None
            changes: dict[str, Any] = {}
            if timeout is not None:
                changes["timeout"] = timeout
            if max_tool_calls is not None:
                changes["max_tool_calls"] = max_tool_calls
            default = self._workspace if self._start_in_workspace else None
            changes["cwd"] = cwd or self._plan.options.cwd or default
            options = dataclasses.replace(self._plan.options, **changes).validate()
            if self.persistent:
                previous = self._kernel
                kernel = await self._live_kernel(options)
                note = previous.unreported_end() if previous not in (None, kernel) else None
                result = await kernel.run_cell(
                    code,
                    options,
                    cwd=cwd,
                    on_stdout=on_stdout,
                    on_stderr=on_stderr,
                    interrupt=interrupt,
                    started=started,
                )
                if note:
                    result.add_warning(note, first=True)
                return result
            return await run_in_stage(
                self._stage,
                code,
                self._plan,
                options=options,
                interrupt=interrupt,
                on_stdout=on_stdout,
                on_stderr=on_stderr,
                started=started,
            )

    async def upload(self, local_path: str | os.PathLike[str], remote_path: str) -> str:
        """Copy the file ``local_path`` into the environment at ``remote_path``
        (relative: in the workspace), keeping its permission bits; return the path
        written. The file is read whole into memory. Raises OSError (IsADirectoryError
        for a directory) and BackendError."""
        with self._exclusive("upload"):
            await self._start()
            runtime = self._runtime()
            source = os.fspath(local_path)

            def read() -> tuple[bytes, int]:
                with open(source, "rb") as handle:
                    return handle.read(), os.fstat(handle.fileno()).st_mode & 0o777

            data, mode = await anyio.to_thread.run_sync(read)
            target = self._remote(remote_path)
            await runtime.write_bytes(target, data, mode=mode)
            return target

    async def download(self, remote_path: str, local_path: str | os.PathLike[str]) -> str:
        """Copy the file ``remote_path`` (relative: in the workspace) out of the
        environment to ``local_path``; return the local path. The file is read whole
        into memory. Raises OSError (FileNotFoundError...) and BackendError."""
        with self._exclusive("download"):
            await self._start()
            data = await self._runtime().read_bytes(self._remote(remote_path))
            target = os.fspath(local_path)

            def write() -> None:
                with open(target, "wb") as handle:
                    handle.write(data)

            await anyio.to_thread.run_sync(write)
            return target

    # -- helpers --------------------------------------------------------------------------

    async def _live_kernel(self, options: RunOptions) -> Kernel:
        """The session's interpreter, started anew if it ended (or never started)."""
        if self._kernel_tasks is None:
            raise RunError(NEEDS_ASYNC_WITH)
        if self._kernel is None or not self._kernel.alive:
            if self._kernel is not None:
                # One that ended itself (idle, the limit) may still be letting go of
                # the stage (its socket, its streams): a new one starts after it is gone.
                await self._kernel.shut_down()
            assert self._stage is not None
            cwd = options.cwd or self._stage.runtime.default_cwd
            kernel = Kernel(self._stage, self._plan, options, cwd)
            await kernel.start(self._kernel_tasks)
            self._kernel = kernel
        return self._kernel

    def _runtime(self) -> Runtime:
        assert self._stage is not None
        return self._stage.runtime

    def _remote(self, path: str) -> str:
        if not path:
            raise RunError("a path in the environment is needed, got an empty one")
        assert self._workspace is not None
        return posixpath.join(self._workspace, path)

    def _exclusive(self, doing: str) -> _Exclusive:
        return _Exclusive(self, doing)


class _Exclusive:
    """Marks the session busy for one operation; refuses a second one meanwhile."""

    def __init__(self, session: AsyncSession, doing: str) -> None:
        self._session = session
        self._doing = doing

    def __enter__(self) -> None:
        session = self._session
        if session._closed:
            raise RunError("this session is closed; start a new one")
        if session._busy is not None:
            raise RunError(
                f"a {session._busy} is in progress in this session: runs in one session are "
                "sequential (wait for it, or use another session)"
            )
        session._busy = self._doing

    def __exit__(self, *exc_info: object) -> None:
        self._session._busy = None


class Session:
    """:class:`AsyncSession` for synchronous code; a context manager.

    It runs the async session on an event loop in a thread of its own; the output
    callbacks are called in that thread. Every method blocks until done and takes
    the arguments of its async twin; see :class:`AsyncSession` for them and the errors.
    """

    def __init__(
        self,
        backend: str | BackendSettings = "local",
        *,
        tools: Sequence[str] | None = None,
        toolsets: Sequence[str] | None = None,
        persistent: bool = False,
        **options: Any,
    ) -> None:
        self._session = AsyncSession(
            backend, tools=tools, toolsets=toolsets, persistent=persistent, **options
        )
        self._portal_cm: Any = None
        self._portal: Any = None
        self._held: Any = None  # a persistent session, entered in a task of the loop

    @property
    def options(self) -> RunOptions:
        return self._session.options

    @property
    def environment(self) -> Environment | None:
        return self._session.environment

    @property
    def workspace(self) -> str | None:
        return self._session.workspace

    @property
    def closed(self) -> bool:
        return self._session.closed

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _call(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        if self._portal is None:
            if self._session.closed:
                raise RunError("this session is closed; start a new one")
            self._portal_cm = anyio.from_thread.start_blocking_portal()
            self._portal = self._portal_cm.__enter__()
            if self._session.persistent:  # its interpreter needs the `async with`
                held = self._portal.wrap_async_context_manager(self._session)
                try:
                    held.__enter__()
                except BaseException:
                    self._stop_loop()
                    raise
                self._held = held
        return self._portal.call(lambda: func(*args, **kwargs))

    def start(self) -> None:
        self._call(self._session.start)

    def run(self, code: str, **kwargs: Any) -> ExecutionResult:
        result: ExecutionResult = self._call(self._session.run, code, **kwargs)
        return result

    def upload(self, local_path: str | os.PathLike[str], remote_path: str) -> str:
        return str(self._call(self._session.upload, local_path, remote_path))

    def download(self, remote_path: str, local_path: str | os.PathLike[str]) -> str:
        return str(self._call(self._session.download, remote_path, local_path))

    def reset(self) -> None:
        self._call(self._session.reset)

    def close(self) -> None:
        """Remove everything the session started, and stop its event loop. Idempotent.
        Raises RunError while a run (in another thread) is in progress."""
        if self._portal is None:  # never started: nothing to remove, but closed all the same
            self._session._closed = True
            return
        try:
            self._portal.call(self._session.aclose)
        except RunError:
            raise  # a run in progress (in another thread): the session and its loop stay
        except BaseException:
            self._stop_loop()
            raise
        self._stop_loop()

    def _stop_loop(self) -> None:
        held, self._held = self._held, None
        try:
            if held is not None:
                held.__exit__(None, None, None)
        finally:
            portal_cm, self._portal, self._portal_cm = self._portal_cm, None, None
            portal_cm.__exit__(None, None, None)


__all__ = ["AsyncSession", "Session"]
