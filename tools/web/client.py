"""Talking HTTP for the web tools: the shared client, its settings, reading answers.

httpx is imported lazily (the ``web`` extra), so this module imports without it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from hermes_sandbox.tools.web.errors import NotConfiguredError, ProviderError

if TYPE_CHECKING:
    import httpx

DEFAULT_TIMEOUT = 30.0
MAX_RESPONSE_BYTES = 5 * 1024 * 1024  # stop reading a page (or a provider's answer) past this
MAX_REDIRECTS = 5
USER_AGENT = "hermes-sandbox/0.1 (web_extract; an AI agent's page reader)"

_REQUIRED_LIBRARIES = ("httpx", "bs4", "markdownify")


def setting(environ: Mapping[str, str], name: str) -> str:
    """The environment variable ``name``, stripped; empty when unset."""
    return environ.get(name, "").strip()


def web_timeout(environ: Mapping[str, str] | None = None) -> float:
    """HERMES_WEB_TIMEOUT in seconds (default 30). Raises NotConfiguredError if malformed."""
    raw = setting(os.environ if environ is None else environ, "HERMES_WEB_TIMEOUT")
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise NotConfiguredError(
            f"HERMES_WEB_TIMEOUT must be a positive number of seconds, got {raw!r}"
        )
    return value


def missing_libraries() -> list[str]:
    """Which of the ``web`` extra's libraries cannot be imported here."""
    return [name for name in _REQUIRED_LIBRARIES if importlib.util.find_spec(name) is None]


def open_client(
    timeout: float, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    """An httpx client with the web tools' timeout, redirect limit and User-Agent."""
    import httpx

    return httpx.AsyncClient(
        follow_redirects=True,
        max_redirects=MAX_REDIRECTS,
        timeout=httpx.Timeout(timeout),
        headers={"User-Agent": USER_AGENT},
        transport=transport,
    )


def describe_transport_error(exc: Exception, timeout: float) -> str:
    """A short reason for an httpx failure, for a model to read."""
    import httpx

    if isinstance(exc, httpx.TooManyRedirects):
        return f"too many redirects (more than {MAX_REDIRECTS})"
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out after {timeout:g}s"
    if isinstance(exc, httpx.UnsupportedProtocol):
        return f"unsupported URL: {exc}"
    if isinstance(exc, httpx.ConnectError):
        return f"could not connect ({exc})"
    return f"{type(exc).__name__}: {exc}"


async def read_capped(response: httpx.Response, cap: int) -> tuple[bytes, bool]:
    """The (decoded) body up to ``cap`` bytes, and whether there was more."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        room = cap - size
        if len(chunk) > room:
            chunks.append(chunk[:room])
            return b"".join(chunks), True
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks), False


def without_userinfo(url: str) -> str:
    """``url`` fit to show: a user:password@ in it (say in SEARXNG_URL) is left out."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def _snippet(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _error_detail(body: bytes) -> str:
    """The message in a provider's error body, whatever its dialect."""
    text = body.decode("utf-8", "replace")
    try:
        data = json.loads(text)
    except ValueError:
        return _snippet(re.sub(r"<[^>]+>", " ", text))
    if isinstance(data, dict):
        for outer, inner in (("detail", "error"), ("error", "detail"), ("error", "message")):
            value = data.get(outer)
            if isinstance(value, dict) and isinstance(value.get(inner), str):
                return _snippet(value[inner])
        for key in ("error", "message", "detail"):
            if isinstance(data.get(key), str):
                return _snippet(data[key])
    return _snippet(text)


async def call_json(
    client: httpx.AsyncClient,
    provider: str,
    method: str,
    url: str,
    *,
    timeout: float,
    hint: Mapping[int, str] | None = None,
    **kwargs: Any,
) -> Any:
    """Send one request to a provider and return its JSON answer.

    Raises ProviderError naming the provider: with the HTTP status for an error status,
    for a body that is not JSON, and when the provider cannot be reached in time.
    """
    import httpx

    try:
        async with client.stream(method, url, **kwargs) as response:
            body, _ = await read_capped(response, MAX_RESPONSE_BYTES)
    except httpx.HTTPError as exc:
        reason = describe_transport_error(exc, timeout)
        raise ProviderError(
            f"{provider} request to {without_userinfo(url)} failed: {reason}"
        ) from exc
    if response.status_code >= 400:
        message = f"{provider} answered HTTP {response.status_code}"
        detail = _error_detail(body)
        if detail:
            message += f": {detail}"
        if hint and response.status_code in hint:
            message += f" ({hint[response.status_code]})"
        raise ProviderError(message)
    try:
        return json.loads(body)
    except ValueError as exc:
        content_type = response.headers.get("content-type", "no content type")
        raise ProviderError(
            f"{provider} answered with something that is not JSON ({content_type}): "
            f"{_snippet(body.decode('utf-8', 'replace'), 120)!r}"
        ) from exc
