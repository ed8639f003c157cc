"""A small real HTTP server for tests: 127.0.0.1, a port the OS picks, a thread per request.

Tests give it routes, each a :class:`Reply` or a function of the :class:`Request`::

    with LocalHTTPServer() as server:
        server.route("/page", Reply.html("<h1>Hi</h1>"))
        server.route("/api", lambda request: Reply.json({"q": request.param("q")}))
        fetch(server.url("/page"))
        assert server.requests[-1].path == "/api"

It speaks HTTP/1.0: one request per connection, and a body given as an iterable of
chunks is streamed without a Content-Length, ending when the connection closes. That is
how the tests serve pages bigger than a client's cap. A reply may wait ``delay`` seconds
before answering; closing the server cuts such waits and streams short, and joins every
request thread, so nothing outlives the ``with`` block.
"""

from __future__ import annotations

import json
import socketserver
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass(frozen=True, slots=True)
class Request:
    """What the server received. Header names are lower-case."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def param(self, name: str) -> str | None:
        """The first value of a query parameter, or None."""
        values = self.query.get(name)
        return values[0] if values else None

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(slots=True)
class Reply:
    """What a route answers. ``body`` is bytes, or an iterable of chunks to stream."""

    status: int = 200
    body: bytes | Iterable[bytes] = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0

    @classmethod
    def html(cls, text: str, status: int = 200, **kwargs: Any) -> Reply:
        return cls(status, text.encode(), {"Content-Type": "text/html; charset=utf-8"}, **kwargs)

    @classmethod
    def text(cls, text: str, status: int = 200, **kwargs: Any) -> Reply:
        return cls(status, text.encode(), {"Content-Type": "text/plain; charset=utf-8"}, **kwargs)

    @classmethod
    def json(cls, data: Any, status: int = 200, **kwargs: Any) -> Reply:
        body = json.dumps(data).encode()
        return cls(status, body, {"Content-Type": "application/json"}, **kwargs)

    @classmethod
    def redirect(cls, location: str, status: int = 302) -> Reply:
        return cls(status, b"", {"Location": location})


Route = Reply | Callable[[Request], Reply]


class LocalHTTPServer:
    """A real HTTP server on 127.0.0.1 for the length of a ``with`` block.

    ``requests`` lists what arrived, in order; ``aborted`` the paths whose client went
    away before the whole reply was written (a client that stopped reading).
    """

    def __init__(self) -> None:
        self._routes: dict[str, Route] = {}
        self._lock = threading.Condition()
        self._closing = threading.Event()
        self.requests: list[Request] = []
        self.aborted: list[str] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def wait_aborted(self, path: str, timeout: float) -> bool:
        """Block until a client hung up on ``path`` (True) or ``timeout`` seconds pass."""
        with self._lock:
            return self._lock.wait_for(lambda: path in self.aborted, timeout)

    def route(self, path: str, reply: Route) -> None:
        """Answer requests for ``path`` (any method, any query) with ``reply``."""
        with self._lock:
            self._routes[path] = reply

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the server is not running")
        return self._server.server_address[1]

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> LocalHTTPServer:
        self._server = _Server(("127.0.0.1", 0), _Handler, self)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="local-http-server",
        )
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._closing.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()  # joins the request threads
        if self._thread is not None:
            self._thread.join()

    def _dispatch(self, request: Request) -> Reply:
        with self._lock:
            self.requests.append(request)
            route = self._routes.get(request.path)
        if route is None:
            return Reply.text("not found", status=404)
        return route if isinstance(route, Reply) else route(request)


class _Server(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True  # server_close() waits for the request threads

    def __init__(self, address: tuple[str, int], handler: type, owner: LocalHTTPServer) -> None:
        self.owner = owner
        super().__init__(address, handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks the host name up (getfqdn); nothing here needs it.
        socketserver.TCPServer.server_bind(self)
        self.server_name = "127.0.0.1"
        self.server_port = self.server_address[1]

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up is part of what the tests do


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def _serve(self) -> None:
        owner = self.server.owner
        split = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        request = Request(
            method=self.command,
            path=split.path,
            query=parse_qs(split.query),
            headers={name.lower(): value for name, value in self.headers.items()},
            body=self.rfile.read(length) if length else b"",
        )
        reply = owner._dispatch(request)
        if reply.delay and owner._closing.wait(reply.delay):
            return
        try:
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            if isinstance(reply.body, bytes):
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)
                return
            self.end_headers()
            for chunk in reply.body:
                if owner._closing.is_set():
                    return
                self.wfile.write(chunk)
        except (BrokenPipeError, ConnectionResetError):
            with owner._lock:
                owner.aborted.append(request.path)
                owner._lock.notify_all()
