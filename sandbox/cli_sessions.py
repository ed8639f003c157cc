"""The command line's side of named sessions: ``run --session NAME`` and ``sessions``.

It talks to the sessions daemon (:mod:`sandbox.named_sessions`), starting it when none
runs, over the wire of :mod:`sandbox.sessions_wire`; it imports none of the daemon's
modules, so a ``run --session`` starts light. docs/sessions.md is the user's guide.
"""

from __future__ import annotations

# _socket, the C module: socket's Python layer (its enums, selectors) was a tenth of this
# client's start-up, and one Unix stream socket needs none of it.
import _socket
import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hermes_sandbox.errors import UsageError
from hermes_sandbox.result import ExecutionResult
from hermes_sandbox.sessions_wire import (
    HEADER,
    LOG_NAME,
    SOCKET_NAME,
    SessionsError,
    decode,
    encode,
    private_dir,
    sessions_dir,
)

if TYPE_CHECKING:
    from hermes_sandbox.options import RunOptions

START_WAIT = 30.0  # seconds the command line waits for a daemon it started


def _recv_exactly(sock: _socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise SessionsError("the sessions daemon closed the connection (see its log)")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# -- the client ---------------------------------------------------------------------------


def _connect(directory: str) -> _socket.socket | None:
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(os.path.join(directory, SOCKET_NAME))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    return sock


def _start_daemon(directory: str) -> None:
    import subprocess  # only when no daemon runs

    log = os.open(os.path.join(directory, LOG_NAME), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        subprocess.Popen(
            [sys.executable, "-m", "hermes_sandbox.named_sessions", "serve", directory],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(log)


def request(message: Mapping[str, Any], *, start: bool = True) -> dict[str, Any] | None:
    """Send ``message`` to the daemon and return its answer; start the daemon first
    when ``start`` (else None when none runs). Raises SessionsError for a refusal."""
    directory = private_dir(sessions_dir())
    sock = _connect(directory)
    if sock is None:
        if not start:
            return None
        _start_daemon(directory)
        deadline = time.monotonic() + START_WAIT
        while sock is None:
            if time.monotonic() > deadline:
                log = os.path.join(directory, LOG_NAME)
                raise SessionsError(f"the sessions daemon did not start; see {log}")
            time.sleep(0.05)
            sock = _connect(directory)
    try:
        try:
            sock.sendall(encode(message))
            (size,) = HEADER.unpack(_recv_exactly(sock, HEADER.size))
            answer = decode(_recv_exactly(sock, size))
        finally:
            sock.close()
    except OSError as exc:
        raise SessionsError(f"lost the sessions daemon ({exc}); see its log") from None
    if not answer.get("ok"):
        raise SessionsError(str(answer.get("error")))
    return answer


def run_request(
    name: str, code: str, options: RunOptions, tools_modules: list[str], allowlist: list[str]
) -> ExecutionResult:
    """Run ``code`` in the named session (made with ``options`` if it does not exist);
    the result."""
    if not name or "/" in name or len(name) > 200:
        raise UsageError(f"--session needs a name without '/', got {name!r}")
    if options.argv or options.stdin is not None:
        raise UsageError(
            "a --session run is a cell of a persistent interpreter: it takes no script "
            "arguments after -- and no piped standard input"
        )
    settings = options.backend_settings()
    key = {
        "backend": options.backend_name,
        "settings": json.loads(json.dumps(dataclasses.asdict(settings), default=list)),  # type: ignore[call-overload]
        "tools": None if options.tools is None else list(options.tools),
        "cwd": options.cwd,
        "env": dict(options.env or {}),
        "allowlist": sorted(set(allowlist)),
    }
    message = {
        "op": "run",
        "name": name,
        "session": key,
        "code": code,
        "timeout": options.timeout,
        "max_tool_calls": options.max_tool_calls,
        "tools_modules": [os.path.abspath(m) if os.path.exists(m) else m for m in tools_modules],
        "options": {
            "max_stdout_bytes": options.max_stdout_bytes,
            "max_stderr_bytes": options.max_stderr_bytes,
            "max_spill_bytes": options.max_spill_bytes,
            "spill_dir": options.spill_dir,
            "kill_grace": options.kill_grace,
            "workspace_root": options.workspace_root,
            "transport": options.transport,
        },
    }
    answer = request(message)
    assert answer is not None
    return ExecutionResult(**answer["result"])


# -- the command line ---------------------------------------------------------------------


def add_sessions_command(commands: Any) -> None:
    sessions = commands.add_parser(
        "sessions",
        help="list the named sessions of `run --session`, or remove them",
        description="List the named sessions the sessions daemon holds (name, backend, age, "
        "idle time, whether the interpreter is alive); `sessions rm NAME` or `sessions rm "
        "--all` removes them and all they hold (interpreter, container, stage, workspace).",
    )
    sessions.add_argument("--json", action="store_true", help="print a JSON list")
    actions = sessions.add_subparsers(dest="action", metavar="ACTION")
    rm = actions.add_parser("rm", help="remove named sessions")
    rm.add_argument("name", nargs="?", help="the session to remove")
    rm.add_argument("--all", action="store_true", help="remove every session")


def run_sessions_command(args: argparse.Namespace) -> int:
    if getattr(args, "action", None) == "rm":
        if args.all == bool(args.name):
            raise UsageError("sessions rm takes a NAME or --all")
        answer = request({"op": "rm", "name": args.name, "all": args.all}, start=False)
        if answer is None:
            if args.all:
                return 0
            raise SessionsError(f"no session named {args.name!r} (no sessions daemon runs)")
        for name in answer["removed"]:
            sys.stdout.write(f"removed {name}\n")
        return 0
    answer = request({"op": "list"}, start=False)
    rows = [] if answer is None else answer["sessions"]
    if args.json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return 0
    for row in rows:
        state = "alive" if row["alive"] else "no interpreter"
        sys.stdout.write(
            f"{row['name']:<20} {row['backend']:<12} age {row['age_seconds']:>8.0f}s  "
            f"idle {row['idle_seconds']:>8.0f}s  {state}\n"
        )
    return 0


__all__ = ["add_sessions_command", "request", "run_request", "run_sessions_command"]
