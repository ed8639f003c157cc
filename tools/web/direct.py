"""Direct extraction: fetch pages from this host and convert HTML to markdown here.

Connections go through the network guard (guard.py); redirects are followed one hop at
a time, each hop checked; binary content is refused; HTML becomes markdown in a worker
thread (markdown.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import anyio
import anyio.to_thread

from hermes_sandbox.threads import tool_limiter
from hermes_sandbox.tools.web.base import ExtractProvider, Page
from hermes_sandbox.tools.web.client import (
    MAX_REDIRECTS,
    MAX_RESPONSE_BYTES,
    describe_transport_error,
    open_client,
    read_capped,
    without_userinfo,
)
from hermes_sandbox.tools.web.errors import PageError
from hermes_sandbox.tools.web.guard import (
    ALLOW_PRIVATE_HINT,
    DestinationPolicy,
    DestinationRefused,
    guarded_transport,
)
from hermes_sandbox.tools.web.markdown import html_to_markdown

if TYPE_CHECKING:
    import httpx

_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/xml",
        "application/javascript",
        "application/x-javascript",
        "application/ecmascript",
        "application/x-sh",
        "application/x-yaml",
        "application/yaml",
        "application/toml",
        "application/x-ndjson",
    }
)


@dataclass(frozen=True, slots=True)
class DirectExtract(ExtractProvider):
    """Fetch pages over HTTP(S) from this host and convert HTML to markdown here.

    Connections go through the guarded backend, which refuses what ``policy`` does not
    allow; redirects are followed here, one hop at a time, so a refusal can name its hop.
    """

    policy: DestinationPolicy = field(default_factory=DestinationPolicy)
    name: ClassVar[str] = "direct"
    required_env: ClassVar[tuple[str, ...]] = ("HERMES_WEB_EXTRACT",)

    def open_client(self, timeout: float) -> httpx.AsyncClient:
        return open_client(timeout, transport=guarded_transport(self.policy))

    async def fetch(self, client: httpx.AsyncClient, url: str, *, timeout: float) -> Page:
        import httpx

        request = client.build_request(
            "GET",
            url,
            headers={"Accept": "text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.5"},
        )
        hop = 0
        try:
            with anyio.fail_after(timeout):
                while True:
                    response = await client.send(request, stream=True, follow_redirects=False)
                    try:
                        if response.next_request is not None:
                            if hop == MAX_REDIRECTS:
                                raise PageError(f"too many redirects (more than {MAX_REDIRECTS})")
                            request = response.next_request
                            hop += 1
                            continue
                        if response.status_code >= 400:
                            reason = response.reason_phrase or ""
                            raise PageError(f"HTTP {response.status_code} {reason}".strip())
                        content_type = response.headers.get("content-type", "")
                        media_type = _media_type(content_type)
                        if _classify(media_type, b"") == "binary" and media_type:
                            raise PageError(
                                f"binary content ({media_type}); web_extract reads HTML and text"
                            )
                        data, capped = await read_capped(response, MAX_RESPONSE_BYTES)
                        charset = response.charset_encoding
                        final_url = str(response.url)
                        break
                    finally:
                        await response.aclose()
        except DestinationRefused as exc:
            if hop == 0:
                raise
            target = without_userinfo(str(request.url))
            raise PageError(
                f"refused: the page redirected to {target}, and {exc.reason}; {ALLOW_PRIVATE_HINT}"
            ) from None
        except httpx.HTTPError as exc:
            raise PageError(describe_transport_error(exc, timeout)) from exc
        except TimeoutError:
            raise PageError(f"timed out after {timeout:g}s") from None
        kind = _classify(media_type, data[:8192])
        if kind == "binary":
            raise PageError(
                f"binary content ({media_type or 'no content type'}); "
                "web_extract reads HTML and text"
            )
        if kind == "html":
            title, content, cut = await anyio.to_thread.run_sync(
                html_to_markdown, data, final_url, charset, limiter=tool_limiter()
            )
            capped = capped or cut
        else:
            title, content = None, _decode(data, charset)
        return Page(url, final_url, title, content, media_type or None, capped)


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _classify(media_type: str, head: bytes) -> str:
    """ "html", "text" or "binary", from the declared type and, when it is vague, the bytes."""
    if media_type in _HTML_TYPES:
        return "html"
    if (
        media_type.startswith("text/")
        or media_type in _TEXT_TYPES
        or media_type.endswith(("+json", "+xml"))
    ):
        return "binary" if b"\0" in head else "text"
    if media_type and media_type != "application/octet-stream":
        return "binary"
    if b"\0" in head:
        return "binary"
    start = head.lstrip()[:64].lower()
    if start.startswith((b"<!doctype html", b"<html")):
        return "html"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not merely a character cut at the sniff boundary
            return "binary"
    return "text"


def _decode(data: bytes, charset: str | None) -> str:
    try:
        return data.decode(charset or "utf-8", "replace")
    except LookupError:  # a charset Python does not know
        return data.decode("utf-8", "replace")
