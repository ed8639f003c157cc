"""The Unix-socket transport, host side: listen on a path and serve each connection.

The socket is created inside a directory the caller made private (mode 0700) and is
itself set to mode 0600 before it listens, so only the run's own user can connect;
the token is the second lock. On asyncio, connections are served by
:class:`rpc.server.RPCProtocol` (the fast path); on other anyio backends, by
:meth:`rpc.server.RPCServer.serve` over anyio's socket stream.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc

from hermes_sandbox.rpc.server import RPCProtocol, RPCServer

# sun_path is 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH = 107
BACKLOG = 64


def _asyncio_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # another anyio backend (trio) runs this task
        return None


async def _serve_connection(server: RPCServer, conn: socket.socket) -> None:
    loop = _asyncio_loop()
    if loop is not None:
        _, protocol = await loop.connect_accepted_socket(lambda: RPCProtocol(server), conn)
        await protocol.run()
    else:
        await server.serve(await anyio.abc.SocketStream.from_socket(conn))


@asynccontextmanager
async def serve_unix_socket(
    server: RPCServer, path: str, *, mode: int = 0o600
) -> AsyncIterator[str]:
    """Listen on ``path`` while the context is open; yield the path.

    Raises ValueError if the path is too long for a Unix socket. Leaving the context
    closes every connection and removes the socket file.
    """
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ValueError(
            f"Unix socket path is {len(os.fsencode(path))} bytes, over the "
            f"{MAX_SOCKET_PATH}-byte limit: set TMPDIR to a shorter directory"
        )
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        os.chmod(path, mode)
        listener.listen(BACKLOG)
        listener.setblocking(False)
        async with anyio.create_task_group() as tasks:

            async def accept_forever() -> None:
                while True:
                    await anyio.wait_readable(listener)
                    try:
                        conn, _ = listener.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    tasks.start_soon(_serve_connection, server, conn)

            tasks.start_soon(accept_forever)
            try:
                yield path
            finally:
                try:
                    await server.drain()
                finally:
                    tasks.cancel_scope.cancel()
    finally:
        listener.close()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
