"""The Unix-socket transport, host side: listen on a path and serve each connection.

The socket is created inside a directory the caller made private (mode 0700) and is
itself set to mode 0600, so only the run's own user can connect; the token is the
second lock.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from rpc.server import RPCServer

# sun_path is 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH = 107


@asynccontextmanager
async def serve_unix_socket(
    server: RPCServer, path: str, *, mode: int = 0o600
) -> AsyncIterator[str]:
    """Listen on ``path`` while the context is open; yield the path.

    Raises ValueError if the path is too long for a Unix socket. The socket file is
    removed on exit.
    """
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ValueError(
            f"Unix socket path is {len(os.fsencode(path))} bytes, over the "
            f"{MAX_SOCKET_PATH}-byte limit: set TMPDIR to a shorter directory"
        )
    listener = await anyio.create_unix_listener(path)
    try:
        os.chmod(path, mode)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(listener.serve, server.serve)
            try:
                yield path
            finally:
                tasks.cancel_scope.cancel()
    finally:
        await listener.aclose()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
