"""Named sessions: ``hermes-sandbox run --session NAME`` keeps a warm persistent session
across command-line invocations.

A small per-user daemon (``python -m hermes_sandbox.named_sessions serve``), started by
the first ``--session`` run, holds :class:`~hermes_sandbox.AsyncSession` objects
(``persistent=True``) by name. It listens on a Unix socket (mode 0600) in a per-user
directory (mode 0700) and answers only peers of its own uid (``SO_PEERCRED``). The wire
is a 4-byte big-endian length and a JSON object, each way (sandbox/sessions_wire.py).
It exits once it has held no session for :data:`LINGER` seconds. The command line's side is
:mod:`sandbox.cli_sessions`; docs/sessions.md is the user's guide.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import logging
import os
import socket
import struct
import time
from typing import Any

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

from hermes_sandbox import sessions_wire as wire
from hermes_sandbox.errors import SandboxError
from hermes_sandbox.session import AsyncSession
from hermes_sandbox.sessions_wire import SessionsError, sessions_dir
from hermes_sandbox.tools.approval_policy import ApprovalPolicy

LINGER = 600.0  # seconds the daemon stays with no session before it exits
log = logging.getLogger(__name__)


async def _receive(stream: anyio.abc.ByteStream) -> dict[str, Any] | None:
    buffered = BufferedByteReceiveStream(stream)
    try:
        (size,) = wire.HEADER.unpack(await buffered.receive_exactly(wire.HEADER.size))
    except (anyio.EndOfStream, anyio.IncompleteRead):
        return None
    if size > wire.MAX_MESSAGE:
        raise ValueError(f"a message of {size} bytes is over the limit")
    return wire.decode(await buffered.receive_exactly(size))


# -- the daemon ---------------------------------------------------------------------------


@dataclasses.dataclass
class _Held:
    name: str
    session: AsyncSession
    key: dict[str, Any]
    created: float
    last_used: float
    close: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    closed: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    runs: int = 0

    def describe(self) -> dict[str, Any]:
        now = time.time()
        return {
            "name": self.name,
            "backend": self.key["backend"],
            "age_seconds": round(now - self.created, 1),
            "idle_seconds": round(now - self.last_used, 1),
            "runs": self.runs,
            "alive": self.session.interpreter_alive,
        }


def _peer_uid(stream: anyio.abc.SocketStream) -> int:
    sock = stream.extra(anyio.abc.SocketAttribute.raw_socket)
    data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", data)[1]


class _Daemon:
    def __init__(self, tasks: anyio.abc.TaskGroup, linger: float) -> None:
        self._tasks = tasks
        self._linger = linger
        self._held: dict[str, _Held] = {}
        self._connections = 0
        self._empty_since = time.monotonic()

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        try:
            await self._handle(stream)
        except Exception:  # one client's trouble (it went away...) is not the daemon's
            log.exception("a request failed")

    async def _handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            if _peer_uid(stream) != os.getuid():
                return  # another user: not a word
            self._connections += 1
            try:
                request = await _receive(stream)
                if request is None:
                    return
                try:
                    answer = {"ok": True, **await self._answer(request)}
                except (SandboxError, ValueError, TypeError, KeyError) as exc:
                    answer = {"ok": False, "error": str(exc)}
                await stream.send(wire.encode(answer))
            finally:
                self._connections -= 1
                self._empty_since = time.monotonic()

    async def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request["op"]
        if op == "run":
            return {"result": await self._run(request)}
        if op == "list":
            return {"sessions": [held.describe() for held in self._held.values()]}
        if op == "rm":
            names = list(self._held) if request.get("all") else [request["name"]]
            missing = [name for name in names if name not in self._held]
            if missing:
                raise SessionsError(f"no session named {missing[0]!r}")
            for name in names:
                await self._remove(self._held[name])
            return {"removed": names}
        raise ValueError(f"unknown request {op!r}")

    async def _remove(self, held: _Held) -> None:
        held.close.set()
        await held.closed.wait()

    async def _run(self, request: dict[str, Any]) -> dict[str, Any]:
        name, key = request["name"], request["session"]
        held = self._held.get(name)
        if held is not None and held.key != key:
            if held.key["backend"] != key["backend"]:
                what = f"runs on {held.key['backend']}, not {key['backend']}"
            else:
                differs = sorted(k for k in {*key, *held.key} if key.get(k) != held.key.get(k))
                what = f"was made with other {', '.join(differs)}"
            raise SessionsError(
                f"session {name!r} {what}; use another name, or "
                f"`hermes-sandbox sessions rm {name}` first"
            )
        if held is None:
            held = await self._open(name, key, request)
        held.last_used = time.time()
        held.runs += 1
        result = await held.session.run(
            request["code"], timeout=request["timeout"], max_tool_calls=request["max_tool_calls"]
        )
        held.last_used = time.time()
        return result.to_dict()

    async def _open(self, name: str, key: dict[str, Any], request: dict[str, Any]) -> _Held:
        from hermes_sandbox.cli import _load_tools  # the run's own way to load tools
        from hermes_sandbox.environments import get_settings_class

        _load_tools(request.get("tools_modules", []))
        settings = get_settings_class(key["backend"]).from_mapping(key["settings"])
        session = AsyncSession(
            settings,
            tools=key["tools"],
            persistent=True,
            cwd=key["cwd"],
            env=key["env"],
            approval=ApprovalPolicy(allowlist=key["allowlist"]),  # no one to ask: refuse
            **request.get("options", {}),
        )
        now = time.time()
        held = _Held(name, session, key, now, now)
        await self._tasks.start(self._hold, held)
        return held

    async def _hold(self, held: _Held, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        try:
            async with held.session:
                self._held[held.name] = held
                task_status.started()
                await held.close.wait()
        finally:
            self._held.pop(held.name, None)
            self._empty_since = time.monotonic()
            held.closed.set()

    async def close_all(self) -> None:
        for held in list(self._held.values()):
            await self._remove(held)

    async def wait_idle(self) -> None:
        """Return once no session and no connection has been held for the linger time."""
        while True:
            await anyio.sleep(min(1.0, self._linger))
            if self._held or self._connections:
                continue
            if time.monotonic() - self._empty_since >= self._linger:
                return


def _take_lock(directory: str) -> Any:
    """The daemon lock of ``directory`` (an open file, held until closed), or None
    when another daemon holds it."""
    wire.private_dir(directory)
    lock = open(os.path.join(directory, wire.LOCK_NAME), "a")  # noqa: SIM115 - held while serving
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    return lock


async def serve(directory: str, linger: float = LINGER) -> None:
    """Serve named sessions from ``directory`` until idle for ``linger`` seconds or
    SIGTERM/SIGINT. The caller holds the directory's lock (:func:`_take_lock`)."""
    import signal

    path = os.path.join(directory, wire.SOCKET_NAME)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    old_umask = os.umask(0o177)
    try:
        listener = await anyio.create_unix_listener(path)
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    try:
        async with listener, anyio.create_task_group() as tasks:
            daemon = _Daemon(tasks, linger)

            async def stop_when_done() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async with anyio.create_task_group() as waiting:

                        async def on_signal() -> None:
                            async for _ in signals:
                                break
                            waiting.cancel_scope.cancel()

                        async def on_idle() -> None:
                            await daemon.wait_idle()
                            waiting.cancel_scope.cancel()

                        waiting.start_soon(on_signal)
                        waiting.start_soon(on_idle)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)  # no new client from here on
                await daemon.close_all()
                tasks.cancel_scope.cancel()

            tasks.start_soon(stop_when_done)
            await listener.serve(daemon.handle, tasks)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hermes_sandbox.named_sessions")
    commands = parser.add_subparsers(dest="command", required=True)
    serve_args = commands.add_parser("serve", help="run the sessions daemon")
    serve_args.add_argument("directory")
    serve_args.add_argument("--linger", type=float, default=LINGER)
    args = parser.parse_args(argv)
    from hermes_sandbox.cli import _log_to_stderr

    _log_to_stderr(False)
    lock = _take_lock(args.directory)
    if lock is None:
        return 0  # another daemon serves this directory
    with lock:
        anyio.run(serve, args.directory, args.linger)
    return 0


__all__ = ["SessionsError", "serve", "sessions_dir"]

if __name__ == "__main__":
    raise SystemExit(main())
