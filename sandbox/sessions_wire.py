"""The sessions daemon's place and wire, shared by the daemon (sandbox/named_sessions.py)
and the command line's client (sandbox/cli_sessions.py): the per-user directory, and a
message as a 4-byte big-endian length and a JSON object. A module of its own, standard
library only, so that ``run --session`` sends its request without importing the
daemon's event loop and sessions (docs/sessions.md, "How it works")."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import struct
from collections.abc import Mapping
from typing import Any

from hermes_sandbox.errors import SandboxError

DIR_VARIABLE = "HERMES_SANDBOX_SESSIONS_DIR"
SOCKET_NAME = "daemon.sock"
LOCK_NAME = "daemon.lock"
LOG_NAME = "daemon.log"
MAX_MESSAGE = 256 * 1024 * 1024
HEADER = struct.Struct(">I")


class SessionsError(SandboxError):
    """A named session could not be used: the daemon, or a request it refused."""


# -- the place ----------------------------------------------------------------------------


def sessions_dir() -> str:
    """The per-user directory of the daemon: $HERMES_SANDBOX_SESSIONS_DIR, else
    $XDG_RUNTIME_DIR/hermes-sandbox, else /tmp/hermes-sandbox-UID."""
    chosen = os.environ.get(DIR_VARIABLE)
    if chosen:
        return os.path.abspath(chosen)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "hermes-sandbox")
    return f"/tmp/hermes-sandbox-{os.getuid()}"


def private_dir(path: str) -> str:
    """Make ``path`` (mode 0700) or check that it is ours and private; raise
    SessionsError when it is not (another user's, or open to others)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise SessionsError(f"{path} is not a directory of this user: refusing to use it")
    if info.st_mode & 0o077:
        raise SessionsError(f"{path} is open to other users (mode {info.st_mode & 0o777:o})")
    return path


# -- the wire -----------------------------------------------------------------------------


def encode(message: Mapping[str, Any]) -> bytes:
    data = json.dumps(message, ensure_ascii=False).encode()
    return HEADER.pack(len(data)) + data


def decode(data: bytes) -> dict[str, Any]:
    message = json.loads(data)
    if not isinstance(message, dict):
        raise ValueError("a message is a JSON object")
    return message
