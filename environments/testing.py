"""A fake backend to test code that uses hermes-sandbox, as httpx ships MockTransport.

:class:`FakeEnvironment` is a real, small exec-stream backend: its "sandbox" is a fresh
temporary directory on this machine, and every exec is a local subprocess run there
with the same Python helper and relay as any remote backend. So a run on it goes
through the whole runtime (staging, the stream relay, tool calls, limits, cleanup)
without a container engine, a cloud account or a network, and fast::

    from hermes_sandbox import execute_code
    from hermes_sandbox.environments.testing import FakeSettings

    result = execute_code("print(1 + 1)", backend=FakeSettings())

It is no isolation at all: scripts and commands run as this user on this machine,
inside the temporary directory only by their working directory. It records what it
was asked to run (:attr:`FakeEnvironment.commands`, :attr:`FakeEnvironment.execs`), and
a ``command_handler`` answers shell commands without running them (for code that
must never run what it is given, such as a test of dangerous-command approval).

Importing this module adds the ``fake`` backend to the table
(:func:`~hermes_sandbox.environments.register_backend`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import anyio

from hermes_sandbox.environments import register_backend
from hermes_sandbox.environments.base import DEFAULT_MAX_COMMAND_OUTPUT, CommandResult
from hermes_sandbox.environments.errors import EnvironmentFailure
from hermes_sandbox.environments.exec_stream import ExecStreamEnvironment
from hermes_sandbox.environments.local import LocalExecStream, open_local
from hermes_sandbox.environments.settings import BackendSettings

# Answers a shell command instead of running it (None: run it after all).
CommandHandler = Callable[[str], CommandResult | None]


@dataclass(frozen=True, slots=True)
class FakeSettings(BackendSettings):
    """Settings of the fake backend (see the module docstring)."""

    backend: ClassVar[str] = "fake"
    without_image: ClassVar[str] = "it runs on this machine, in a temporary directory"

    python: str = field(default_factory=lambda: sys.executable)
    # Variables every exec starts from, before the run's own (the sandbox's "image").
    base_env: Mapping[str, str] = field(
        default_factory=lambda: {"PATH": os.environ.get("PATH", os.defpath)}
    )
    command_handler: CommandHandler | None = None

    def check(self) -> None:
        if not self.python:
            raise ValueError("python must be a command name or a path, not empty")
        if self.command_handler is not None and not callable(self.command_handler):
            raise ValueError(f"command_handler must be callable, got {self.command_handler!r}")
        object.__setattr__(self, "base_env", dict(self.base_env))


class FakeEnvironment(ExecStreamEnvironment):
    """A temporary directory on this machine, reached through local subprocesses."""

    name: ClassVar[str] = "fake"
    settings_class: ClassVar[type[BackendSettings]] = FakeSettings
    where: ClassVar[str] = "in the fake sandbox"
    settings: FakeSettings

    def _setup(self) -> None:
        self.root: str | None = None
        self.commands: list[str] = []  # every command execute() was given
        self.execs: list[list[str]] = []  # every argv started in the sandbox

    @property
    def default_cwd(self) -> str:
        return self.root or "/"

    async def _start(self) -> None:
        self.root = await anyio.to_thread.run_sync(tempfile.mkdtemp, None, "hermes-fake-")
        self.scratch_parent = self.root

    async def _stop(self) -> None:
        root, self.root = self.root, None
        if root is not None:
            await anyio.to_thread.run_sync(shutil.rmtree, root, True)

    async def execute(
        self,
        command: str,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        max_output_bytes: int = DEFAULT_MAX_COMMAND_OUTPUT,
    ) -> CommandResult:
        """Record ``command``; answer it with the settings' ``command_handler`` if it
        gives an answer, else run it (see ExecStreamEnvironment.execute)."""
        self.commands.append(command)
        handler = self.settings.command_handler
        answer = handler(command) if handler is not None else None
        if answer is not None:
            return answer
        return await super().execute(
            command, timeout=timeout, cwd=cwd or self.root, max_output_bytes=max_output_bytes
        )

    async def _open_exec(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | None,
        stdin: bool,
    ) -> LocalExecStream:
        self._require_started()
        self.execs.append(list(argv))
        merged: dict[str, Any] = {**self.settings.base_env, **self._env, **(env or {})}
        merged.setdefault("HOME", self.root)
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 - owned by the stream
        try:
            handle = await open_local(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                cwd=cwd or self.root,
                env=merged,
            )
        except OSError as exc:
            stderr.close()
            raise EnvironmentFailure(f"cannot run {argv[0]!r} {self.where}: {exc}") from exc
        except BaseException:
            stderr.close()
            raise
        stream = LocalExecStream(handle, stderr)
        if not stdin:
            await stream.send_eof()
        return stream


register_backend("fake", f"{__name__}:FakeEnvironment")

__all__ = ["CommandHandler", "FakeEnvironment", "FakeSettings"]
