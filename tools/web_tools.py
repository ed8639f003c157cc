"""The web tools: web_search through a search provider, web_extract to read pages as markdown.

Both run on the host (they are network tools: the run's environment plays no part) and
are configured by environment variables; unconfigured, each is hidden by its check_fn.
They need the ``web`` extra (httpx, beautifulsoup4, markdownify), imported lazily so
this module imports without it.

web_search providers, tried in this order unless HERMES_WEB_SEARCH_PROVIDER names one:

- ``searxng``: SEARXNG_URL, the instance's base URL. ``GET {url}/search?q=...&format=json``;
  the answer is ``{"query", "number_of_results", "results": [{"url", "title", "content",
  "engine", ...}], "answers", "infoboxes", "suggestions", ...}``. The instance must allow
  the json format (``search.formats`` in settings.yml), else it answers 403. It has no
  result-count parameter: one page is about 20 results, cut here to ``limit``.
- ``brave``: BRAVE_SEARCH_API_KEY (BRAVE_SEARCH_URL overrides the endpoint,
  https://api.search.brave.com/res/v1/web/search). ``GET ?q=...&count=N`` (count 1-20) with
  the key in the ``X-Subscription-Token`` header; the answer is ``{"type": "search",
  "query": {...}, "web": {"results": [{"title", "url", "description", ...}]}, ...}``, "web"
  absent when there are no web results. Descriptions carry ``<strong>`` highlighting,
  stripped here.
- ``tavily``: TAVILY_API_KEY (TAVILY_API_URL overrides the endpoint,
  https://api.tavily.com/search; a base URL without ``/search`` gets it appended).
  ``POST`` JSON ``{"query", "max_results"}`` (0-20) with ``Authorization: Bearer KEY``;
  the answer is ``{"query", "answer", "images", "results": [{"title", "url", "content",
  "score", "raw_content"}], "response_time"}``. Errors come as ``{"detail": {"error"}}``.

web_extract providers: ``direct`` (HERMES_WEB_EXTRACT=direct) fetches each page itself:
all URLs of a call at once, following up to 5 redirects, reading at most 5 MB of a body,
refusing binary content types, with a User-Agent naming hermes-sandbox. HTML becomes
markdown through markdownify on BeautifulSoup's stdlib parser (MIT, maintained, no C
extension), after scripts and styles are cut out; html2text is GPL-3.0 and trafilatura,
whose boilerplate removal would be welcome, brings lxml and five more packages.
``firecrawl`` (FIRECRAWL_API_KEY, FIRECRAWL_API_URL overriding https://api.firecrawl.dev;
chosen when the key is set and HERMES_WEB_EXTRACT does not say ``direct``) posts
``{"url", "formats": ["markdown"]}`` to ``/v2/scrape`` with ``Authorization: Bearer KEY``
and reads ``{"success", "data": {"markdown", "metadata": {"title", "sourceURL",
"statusCode", "error"}}}``.

Direct fetching refuses internal destinations, which a script steered by a hostile page
could otherwise use to read services on this host or its network: loopback, private
(10/8, 172.16/12, 192.168/16, fc00::/7), link-local (169.254/16 with the cloud metadata
address 169.254.169.254, fe80::/10), the unspecified address 0.0.0.0, multicast, shared
(100.64/10), reserved and documentation ranges, and IPv4-mapped, 6to4 and NAT64 IPv6
forms of them. The check sits in the connection layer (an httpcore network backend): each
new connection resolves its host once, refuses it if any address is internal, and
connects to the address it checked, so a name that resolves inward, a numeric spelling
(2130706433, 0x7f.1, 127.1: read as the IPv4 address they stand for, as the C resolver
would) and a DNS answer that changes between check and connect are all caught.
Redirects are followed one hop at a time, each hop checked, and a refusal names the hop.
A refused URL gets a per-URL error saying why. Two settings loosen it, for the operator:

- HERMES_WEB_ALLOW_PRIVATE=1: no destination is refused.
- HERMES_WEB_ALLOW_HOSTS: comma-separated ``host:port`` pairs let through exactly as the
  URL names them (``127.0.0.1:8080``, ``[::1]:8080``, ``wiki.internal:443``); the port is
  required, and another spelling of the same address is not let through.

Provider endpoints (SEARXNG_URL, FIRECRAWL_API_URL, ...) are set by the operator and are
not checked. Direct fetching connects by itself: HTTP(S)_PROXY and ALL_PROXY do not apply
to it, since a proxy would resolve names where the check cannot see them.

HERMES_WEB_TIMEOUT (seconds, default 30) bounds each provider call and each page fetch.

Errors, all caught in the handlers and returned as ``{"error": ...}`` results::

    WebToolError
     ├── NotConfiguredError   no provider set up, a provider name or setting that is wrong
     ├── ProviderError        a provider's HTTP error, non-JSON or ill-shaped answer,
     │                        or no answer at all
     └── PageError            one URL of web_extract could not be read (a per-URL error)
          └── DestinationRefused   its host is an internal address (raised at connect)
"""

from __future__ import annotations

import html
import importlib.util
import ipaddress
import json
import logging
import os
import re
import socket
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urljoin, urlsplit, urlunsplit

import anyio
import anyio.to_thread

from hermes_sandbox.errors import ToolError
from hermes_sandbox.tools.handler_args import int_arg
from hermes_sandbox.tools.registry import registry, tool_error, tool_result
from hermes_sandbox.truncation import cut_middle

if TYPE_CHECKING:
    from collections.abc import Iterable

    import httpcore
    import httpx

log = logging.getLogger(__name__)

DEFAULT_LIMIT = 5
MAX_LIMIT = 20
MAX_URLS = 10
DEFAULT_CHAR_LIMIT = 15_000
MIN_CHAR_LIMIT = 200
MAX_CHAR_LIMIT = 100_000
DEFAULT_TIMEOUT = 30.0
MAX_RESPONSE_BYTES = 5 * 1024 * 1024  # stop reading a page (or a provider's answer) past this
MAX_REDIRECTS = 5
# Markup converted per page, once scripts and styles are cut out: parsing and converting
# are pure Python, a few seconds per MB of dense markup on a small machine, and the GIL
# makes pages convert one at a time. Nearly every real page fits well inside this.
MAX_HTML_CONVERT_BYTES = 1024 * 1024
HEAD_SHARE = 0.75  # a cut page keeps more of its start, where the substance usually is
USER_AGENT = "hermes-sandbox/0.1 (web_extract; an AI agent's page reader)"

_REQUIRED_LIBRARIES = ("httpx", "bs4", "markdownify")
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
# Dropped before conversion: code, styling and embedded objects, never reading matter.
_DROPPED_TAGS = (
    "script",
    "style",
    "noscript",
    "template",
    "iframe",
    "object",
    "embed",
    "svg",
    "canvas",
    "head",
)


class WebToolError(ToolError):
    """Root of the web tools' errors; the message is what the model is shown."""


class NotConfiguredError(WebToolError):
    """No provider is set up, or a setting names something that does not exist."""


class ProviderError(WebToolError):
    """A provider answered with an HTTP error or something unreadable, or not at all."""


class PageError(WebToolError):
    """One page of web_extract could not be read."""


ALLOW_PRIVATE_HINT = (
    "web_extract does not fetch loopback, private, link-local or other internal addresses "
    "unless the host running the tools sets HERMES_WEB_ALLOW_PRIVATE=1"
)


class DestinationRefused(PageError):
    """A connection for direct fetching would go to an internal address.

    Raised by the guarded network backend, before any connection is made; it passes
    through httpcore and httpx untouched, and DirectExtract.fetch words it for the model.
    """

    def __init__(self, host: str, address: str, kind: str) -> None:
        self.host = host
        self.address = address
        self.kind = kind
        super().__init__(f"refused: {self.reason}; {ALLOW_PRIVATE_HINT}")

    @property
    def reason(self) -> str:
        if _is_literal(self.host):
            return f"{self.host} is {self.kind}"
        return f"{self.host} resolves to {self.address}, {self.kind}"


# -- configuration ------------------------------------------------------------------------


def _env(environ: Mapping[str, str], name: str) -> str:
    return environ.get(name, "").strip()


def web_timeout(environ: Mapping[str, str] | None = None) -> float:
    """HERMES_WEB_TIMEOUT in seconds (default 30). Raises NotConfiguredError if malformed."""
    raw = _env(os.environ if environ is None else environ, "HERMES_WEB_TIMEOUT")
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


def _missing_libraries_error() -> str | None:
    missing = missing_libraries()
    if not missing:
        return None
    return tool_error(f"the web tools need {', '.join(missing)}: install hermes-sandbox[web]")


# -- talking to providers -----------------------------------------------------------------


def _open_client(
    timeout: float, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    import httpx

    return httpx.AsyncClient(
        follow_redirects=True,
        max_redirects=MAX_REDIRECTS,
        timeout=httpx.Timeout(timeout),
        headers={"User-Agent": USER_AGENT},
        transport=transport,
    )


def _describe_transport_error(exc: Exception, timeout: float) -> str:
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


async def _read_capped(response: httpx.Response, cap: int) -> tuple[bytes, bool]:
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


def _without_userinfo(url: str) -> str:
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


async def _call_json(
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
            body, _ = await _read_capped(response, MAX_RESPONSE_BYTES)
    except httpx.HTTPError as exc:
        reason = _describe_transport_error(exc, timeout)
        raise ProviderError(
            f"{provider} request to {_without_userinfo(url)} failed: {reason}"
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


def _plain(text: Any) -> str:
    """Text without markup: providers highlight matches with <strong> and escape entities."""
    if not isinstance(text, str):
        return ""
    return html.unescape(re.sub(r"<[^>]+>", "", text)).strip()


# -- web_search ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SearchHit:
    url: str
    title: str
    description: str


def _hits(items: Any, provider: str, description_key: str) -> list[SearchHit]:
    if not isinstance(items, list):
        raise ProviderError(f"{provider} answered without a list of results")
    hits = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("url"), str) and item["url"]:
            hits.append(
                SearchHit(
                    url=item["url"],
                    title=_plain(item.get("title")),
                    description=_plain(item.get(description_key)),
                )
            )
    return hits


class SearchProvider(ABC):
    """One web search service.

    ``from_env`` builds it from the environment, or returns None when its variables are
    not set; ``search`` returns up to ``limit`` hits or raises ProviderError.
    """

    name: ClassVar[str]
    required_env: ClassVar[tuple[str, ...]]

    @classmethod
    @abstractmethod
    def from_env(cls, environ: Mapping[str, str]) -> SearchProvider | None: ...

    @abstractmethod
    async def search(
        self, client: httpx.AsyncClient, query: str, limit: int, *, timeout: float
    ) -> list[SearchHit]: ...


@dataclass(frozen=True, slots=True)
class SearXNGSearch(SearchProvider):
    base_url: str
    name: ClassVar[str] = "searxng"
    required_env: ClassVar[tuple[str, ...]] = ("SEARXNG_URL",)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> SearXNGSearch | None:
        url = _env(environ, "SEARXNG_URL")
        return cls(url.rstrip("/")) if url else None

    @property
    def endpoint(self) -> str:
        return self.base_url if self.base_url.endswith("/search") else self.base_url + "/search"

    async def search(
        self, client: httpx.AsyncClient, query: str, limit: int, *, timeout: float
    ) -> list[SearchHit]:
        data = await _call_json(
            client,
            self.name,
            "GET",
            self.endpoint,
            timeout=timeout,
            params={"q": query, "format": "json"},
            headers={"Accept": "application/json"},
            hint={403: "is the json format enabled in the instance's settings.yml?"},
        )
        if not isinstance(data, dict):
            raise ProviderError(f"{self.name} answered without a list of results")
        return _hits(data.get("results"), self.name, "content")[:limit]


@dataclass(frozen=True, slots=True)
class BraveSearch(SearchProvider):
    api_key: str
    url: str = "https://api.search.brave.com/res/v1/web/search"
    name: ClassVar[str] = "brave"
    required_env: ClassVar[tuple[str, ...]] = ("BRAVE_SEARCH_API_KEY",)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> BraveSearch | None:
        key = _env(environ, "BRAVE_SEARCH_API_KEY")
        if not key:
            return None
        url = _env(environ, "BRAVE_SEARCH_URL")
        return cls(key, url) if url else cls(key)

    async def search(
        self, client: httpx.AsyncClient, query: str, limit: int, *, timeout: float
    ) -> list[SearchHit]:
        data = await _call_json(
            client,
            self.name,
            "GET",
            self.url,
            timeout=timeout,
            params={"q": query, "count": limit},
            headers={"Accept": "application/json", "X-Subscription-Token": self.api_key},
        )
        if not isinstance(data, dict):
            raise ProviderError(f"{self.name} answered without a list of results")
        web = data.get("web")
        if web is None:
            return []  # Brave leaves "web" out when nothing matched
        if not isinstance(web, dict):
            raise ProviderError(f"{self.name} answered without a list of results")
        return _hits(web.get("results", []), self.name, "description")[:limit]


@dataclass(frozen=True, slots=True)
class TavilySearch(SearchProvider):
    api_key: str
    url: str = "https://api.tavily.com/search"
    name: ClassVar[str] = "tavily"
    required_env: ClassVar[tuple[str, ...]] = ("TAVILY_API_KEY",)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> TavilySearch | None:
        key = _env(environ, "TAVILY_API_KEY")
        if not key:
            return None
        url = _env(environ, "TAVILY_API_URL").rstrip("/")
        if not url:
            return cls(key)
        return cls(key, url if url.endswith("/search") else url + "/search")

    async def search(
        self, client: httpx.AsyncClient, query: str, limit: int, *, timeout: float
    ) -> list[SearchHit]:
        data = await _call_json(
            client,
            self.name,
            "POST",
            self.url,
            timeout=timeout,
            json={"query": query, "max_results": limit},
            headers={"Authorization": f"Bearer {self.api_key}"},
        )
        if not isinstance(data, dict):
            raise ProviderError(f"{self.name} answered without a list of results")
        return _hits(data.get("results"), self.name, "content")[:limit]


# In order of preference when HERMES_WEB_SEARCH_PROVIDER does not choose.
SEARCH_PROVIDERS: dict[str, type[SearchProvider]] = {
    cls.name: cls for cls in (SearXNGSearch, BraveSearch, TavilySearch)
}


def search_provider_from_env(environ: Mapping[str, str] | None = None) -> SearchProvider:
    """The provider web_search uses: HERMES_WEB_SEARCH_PROVIDER's, else the first configured.

    Raises NotConfiguredError saying what to set.
    """
    environ = os.environ if environ is None else environ
    wanted = _env(environ, "HERMES_WEB_SEARCH_PROVIDER").lower()
    if wanted:
        cls = SEARCH_PROVIDERS.get(wanted)
        if cls is None:
            raise NotConfiguredError(
                f"HERMES_WEB_SEARCH_PROVIDER={wanted!r} is not a search provider; "
                f"choose one of {', '.join(SEARCH_PROVIDERS)}"
            )
        provider = cls.from_env(environ)
        if provider is None:
            raise NotConfiguredError(
                f"HERMES_WEB_SEARCH_PROVIDER={wanted} but {' and '.join(cls.required_env)} "
                "is not set"
            )
        return provider
    for cls in SEARCH_PROVIDERS.values():
        found = cls.from_env(environ)
        if found is not None:
            return found
    names = ", ".join(var for cls in SEARCH_PROVIDERS.values() for var in cls.required_env)
    raise NotConfiguredError(f"no web search provider is configured; set one of {names}")


WEB_SEARCH_SCHEMA = {
    "name": "web_search",
    "description": (
        "Search the web. Returns {query, provider, results: [{url, title, description}]}, "
        "best match first. Read a result's page with web_extract."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What to search for."},
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_LIMIT,
                "default": DEFAULT_LIMIT,
                "description": "Most results to return.",
            },
        },
        "required": ["query"],
    },
}


async def web_search(args: dict[str, Any]) -> str:
    query = args.get("query")
    if not isinstance(query, str) or not query.strip():
        return tool_error("web_search needs a query (a non-empty string)")
    query = query.strip()
    try:
        limit = int_arg(args, "limit", DEFAULT_LIMIT, low=1, high=MAX_LIMIT)
    except ValueError as exc:
        return tool_error(str(exc))
    missing = _missing_libraries_error()
    if missing:
        return missing
    try:
        provider = search_provider_from_env()
        timeout = web_timeout()
    except NotConfiguredError as exc:
        return tool_error(str(exc))
    try:
        async with _open_client(timeout) as client:
            with anyio.fail_after(timeout):
                hits = await provider.search(client, query, limit, timeout=timeout)
    except ProviderError as exc:
        return tool_error(str(exc), provider=provider.name)
    except TimeoutError:
        return tool_error(
            f"{provider.name} did not answer: timed out after {timeout:g}s", provider=provider.name
        )
    return tool_result(query=query, provider=provider.name, results=[asdict(hit) for hit in hits])


def _search_available() -> bool:
    try:
        search_provider_from_env()
    except NotConfiguredError:
        return False
    return not missing_libraries()


# -- web_extract --------------------------------------------------------------------------


@dataclass(slots=True)
class Page:
    """One page as a provider read it, before it is cut to the caller's char_limit."""

    url: str
    final_url: str
    title: str | None
    content: str
    content_type: str | None
    size_capped: bool = False


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


_CODE_BLOCK_START = re.compile(rb"<(script|style|noscript|template|svg)\b|<!--", re.IGNORECASE)


def strip_code_blocks(data: bytes) -> bytes:
    """``data`` without its script, style, noscript, template and svg elements and comments.

    A cheap linear pass before parsing: on real pages these are often most of the bytes,
    and the parser would build a tree for them only to throw it away. An element left
    open runs to the end of the document, as a browser would take it.
    """
    lower = data.lower()
    kept: list[bytes] = []
    position = 0
    while True:
        found = _CODE_BLOCK_START.search(lower, position)
        if found is None:
            kept.append(data[position:])
            break
        kept.append(data[position : found.start()])
        if found.group(1) is None:
            end = lower.find(b"-->", found.end())
            position = len(data) if end < 0 else end + 3
            continue
        end = lower.find(b"</" + found.group(1), found.end())
        if end < 0:
            break
        close = lower.find(b">", end)
        position = len(data) if close < 0 else close + 1
    return b"".join(kept)


def html_to_markdown(
    data: bytes,
    base_url: str,
    charset: str | None = None,
    *,
    max_markup: int = MAX_HTML_CONVERT_BYTES,
) -> tuple[str | None, str, bool]:
    """The title and markdown text of an HTML document, and whether it was cut short.

    CPU-bound: call it in a worker thread. Scripts, styles and embedded objects are
    dropped; only the first ``max_markup`` bytes of what is left are converted; links and
    images are made absolute against ``base_url``; inline data: images are dropped.
    """
    from bs4 import BeautifulSoup
    from markdownify import MarkdownConverter

    data = strip_code_blocks(data)
    cut = len(data) > max_markup
    if cut:
        data = data[:max_markup]
    # Without a charset from the headers, BeautifulSoup reads <meta charset> or guesses.
    soup = BeautifulSoup(data, "html.parser", from_encoding=charset)
    title = None
    if soup.title is not None:
        title = " ".join(soup.title.get_text(" ").split()) or None
    if title is None:
        og = soup.find("meta", attrs={"property": "og:title"})
        if og is not None and og.get("content"):
            title = " ".join(str(og["content"]).split()) or None
    if title is None:
        h1 = soup.find("h1")
        if h1 is not None:
            title = " ".join(h1.get_text(" ").split()) or None
    for tag in soup.find_all(_DROPPED_TAGS):
        tag.decompose()
    for link in soup.find_all("a", href=True):
        href = str(link["href"]).strip()
        if href.lower().startswith("javascript:"):
            link.unwrap()
        else:
            link["href"] = urljoin(base_url, href)
    for image in soup.find_all("img"):
        src = str(image.get("src") or "").strip()
        if not src or src.lower().startswith("data:"):
            image.decompose()
        else:
            image["src"] = urljoin(base_url, src)
    converter = MarkdownConverter(
        heading_style="ATX",
        bullets="-",
        escape_underscores=False,
        escape_asterisks=False,
    )
    markdown = converter.convert_soup(soup.body or soup)
    markdown = re.sub(r"[ \t]+\n", "\n", markdown)
    markdown = re.sub(r"\n{3,}", "\n\n", markdown).strip()
    return title, markdown, cut


def clip(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to at most ``limit`` characters: head and tail around a marker."""
    return cut_middle(text, limit, head_share=HEAD_SHARE), len(text) > limit


def check_url(url: Any) -> str:
    """``url`` if it is an absolute http(s) URL; else raise PageError saying why."""
    if not isinstance(url, str) or not url.strip():
        raise PageError("not a URL (expected a non-empty string)")
    parts = urlsplit(url.strip())
    if parts.scheme.lower() not in ("http", "https"):
        shown = f"{parts.scheme}:" if parts.scheme else "no scheme"
        raise PageError(f"only http and https URLs can be fetched, not {shown}")
    if not parts.hostname:
        raise PageError("the URL has no host")
    return url.strip()


# -- where direct fetching may connect ----------------------------------------------------

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
_METADATA_ADDRESSES = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def internal_address_kind(address: str) -> str | None:
    """What makes ``address`` internal ("a loopback address", ...), or None if it is public.

    An IPv6 address carrying an IPv4 one is judged by it: IPv4-mapped and NAT64 addresses
    by it alone (the connection ends there), 6to4 ones by it and by themselves.
    Anything that does not parse as an address is internal: the check fails closed.
    """
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return "not an address that can be checked"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:  # the connection goes to the IPv4 address
            return internal_address_kind(str(ip.ipv4_mapped))
        if ip in _NAT64:  # a NAT64 gateway translates it to the IPv4 address
            return internal_address_kind(str(ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF)))
        if ip.sixtofour is not None:  # 6to4: judged by both
            kind = internal_address_kind(str(ip.sixtofour))
            if kind is not None:
                return kind
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_unspecified:
        return "the unspecified address (this host)"
    if ip in _METADATA_ADDRESSES:
        return "the cloud metadata address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_private:
        return "a private address"
    if ip.is_reserved:
        return "a reserved address"
    if not ip.is_global:
        return "a non-public address"
    return None


@dataclass(frozen=True, slots=True)
class DestinationPolicy:
    """Where direct fetching may connect: public addresses, plus what the operator allows."""

    allow_private: bool = False
    allowed_hosts: frozenset[tuple[str, int]] = frozenset()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DestinationPolicy:
        """HERMES_WEB_ALLOW_PRIVATE and HERMES_WEB_ALLOW_HOSTS; NotConfiguredError if malformed."""
        environ = os.environ if environ is None else environ
        raw = _env(environ, "HERMES_WEB_ALLOW_PRIVATE").lower()
        if raw not in _TRUE | _FALSE:
            raise NotConfiguredError(f"HERMES_WEB_ALLOW_PRIVATE must be 1 or 0, got {raw!r}")
        hosts = set()
        for entry in _env(environ, "HERMES_WEB_ALLOW_HOSTS").split(","):
            entry = entry.strip()
            if not entry:
                continue
            parts = urlsplit(f"//{entry}")
            try:
                port = parts.port
            except ValueError:
                port = None
            if not parts.hostname or port is None or parts.netloc != entry or "@" in entry:
                raise NotConfiguredError(
                    f"HERMES_WEB_ALLOW_HOSTS takes comma-separated host:port pairs, got {entry!r}"
                )
            hosts.add((parts.hostname, port))
        return cls(raw in _TRUE, frozenset(hosts))

    def allows(self, host: str, port: int) -> bool:
        """Whether a connection to ``host`` (as the URL names it) skips the address check."""
        return self.allow_private or (host.lower(), port) in self.allowed_hosts


async def _resolve(host: str, port: int) -> list[str]:
    """The addresses ``host`` stands for, in the resolver's order of preference.

    An IP literal is itself; a numeric IPv4 spelling (2130706433, 0x7f.1, 127.1) is the
    address inet_aton reads it as, which is what getaddrinfo would answer, without asking
    any name server; anything else goes to getaddrinfo.
    """
    if _is_literal(host):
        return [host]
    try:
        return [socket.inet_ntoa(socket.inet_aton(host))]
    except OSError:
        pass
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class _GuardedBackend:
    """An httpcore network backend that connects only where the policy allows.

    httpcore calls connect_tcp with the URL's host for every new connection (the first
    hop, each redirect to a new origin, each reconnect). The host is resolved once, every
    address checked, and the connection made to a checked address: there is no second
    lookup for a rebinding name server to answer differently. TLS is started on the
    returned stream by httpcore with the URL's host as server name (SNI and certificate
    check), and httpx sends the URL's Host header, so connecting by address changes
    neither.
    """

    def __init__(self, policy: DestinationPolicy) -> None:
        import httpcore

        self._policy = policy
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        import httpcore

        try:
            with anyio.fail_after(timeout):
                addresses = await _resolve(host, port)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"resolving {host} timed out") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        if not addresses:
            raise httpcore.ConnectError(f"{host} resolves to no address")
        if not self._policy.allows(host, port):
            for address in addresses:
                kind = internal_address_kind(address)
                if kind is not None:
                    raise DestinationRefused(host, address, kind)
        failure: httpcore.ConnectError | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except httpcore.ConnectError as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise NotImplementedError("direct fetching connects over TCP only")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def _guarded_transport(policy: DestinationPolicy) -> httpx.AsyncHTTPTransport:
    """httpx's transport with its connection pool on the guarded backend.

    httpx 0.28 has no parameter for an httpcore network backend (encode/httpx#3749 would
    add one), so the pool is built here as httpx builds its default one, and put in the
    transport's place for it. If a later httpx keeps its pool elsewhere this raises
    rather than fetch unguarded.
    """
    import httpcore
    import httpx

    transport = httpx.AsyncHTTPTransport()
    if not isinstance(getattr(transport, "_pool", None), httpcore.AsyncConnectionPool):
        raise RuntimeError("this httpx keeps no connection pool in AsyncHTTPTransport._pool")
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=httpx.create_ssl_context(),
        max_connections=100,  # httpx's default limits
        max_keepalive_connections=20,
        keepalive_expiry=5.0,
        network_backend=_GuardedBackend(policy),  # type: ignore[arg-type]
    )
    return transport


class ExtractProvider(ABC):
    """A way to read pages. ``fetch`` returns a Page or raises PageError (never another)."""

    name: ClassVar[str]
    required_env: ClassVar[tuple[str, ...]]

    def open_client(self, timeout: float) -> httpx.AsyncClient:
        """The client one web_extract call shares among its URLs."""
        return _open_client(timeout)

    @abstractmethod
    async def fetch(self, client: httpx.AsyncClient, url: str, *, timeout: float) -> Page: ...


@dataclass(frozen=True, slots=True)
class DirectExtract(ExtractProvider):
    """Fetch pages over HTTP(S) from this host and convert HTML to markdown here.

    Connections go through the guarded backend, which refuses what ``policy`` does not
    allow; redirects are followed here, one hop at a time, so a refusal can name its hop.
    """

    policy: DestinationPolicy = DestinationPolicy()
    name: ClassVar[str] = "direct"
    required_env: ClassVar[tuple[str, ...]] = ("HERMES_WEB_EXTRACT",)

    def open_client(self, timeout: float) -> httpx.AsyncClient:
        return _open_client(timeout, transport=_guarded_transport(self.policy))

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
                        data, capped = await _read_capped(response, MAX_RESPONSE_BYTES)
                        charset = response.charset_encoding
                        final_url = str(response.url)
                        break
                    finally:
                        await response.aclose()
        except DestinationRefused as exc:
            if hop == 0:
                raise
            target = _without_userinfo(str(request.url))
            raise PageError(
                f"refused: the page redirected to {target}, and {exc.reason}; {ALLOW_PRIVATE_HINT}"
            ) from None
        except httpx.HTTPError as exc:
            raise PageError(_describe_transport_error(exc, timeout)) from exc
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
                html_to_markdown, data, final_url, charset
            )
            capped = capped or cut
        else:
            title, content = None, _decode(data, charset)
        return Page(url, final_url, title, content, media_type or None, capped)


@dataclass(frozen=True, slots=True)
class FirecrawlExtract(ExtractProvider):
    """Ask Firecrawl's scrape API for each page's markdown."""

    api_key: str
    base_url: str = "https://api.firecrawl.dev"
    name: ClassVar[str] = "firecrawl"
    required_env: ClassVar[tuple[str, ...]] = ("FIRECRAWL_API_KEY",)

    @property
    def endpoint(self) -> str:
        base = self.base_url.rstrip("/")
        if base.endswith("/scrape"):
            return base
        return base + ("/scrape" if base.endswith("/v2") else "/v2/scrape")

    async def fetch(self, client: httpx.AsyncClient, url: str, *, timeout: float) -> Page:
        try:
            with anyio.fail_after(timeout):
                data = await _call_json(
                    client,
                    self.name,
                    "POST",
                    self.endpoint,
                    timeout=timeout,
                    json={"url": url, "formats": ["markdown"]},
                    headers={"Authorization": f"Bearer {self.api_key}"},
                )
        except ProviderError as exc:
            raise PageError(str(exc)) from exc
        except TimeoutError:
            raise PageError(f"{self.name} timed out after {timeout:g}s") from None
        answer: dict[str, Any] = data if isinstance(data, dict) else {}
        page = answer.get("data")
        if not isinstance(page, dict) or answer.get("success") is False:
            detail = answer.get("error") or "no data"
            raise PageError(f"{self.name} could not scrape the page: {detail}")
        meta = page.get("metadata")
        if not isinstance(meta, dict):
            meta = {}
        status = meta.get("statusCode")
        if isinstance(status, int) and status >= 400:
            raise PageError(f"HTTP {status}" + (f": {meta['error']}" if meta.get("error") else ""))
        title = meta.get("title")
        if isinstance(title, list):
            title = title[0] if title else None
        final_url = meta.get("url") or meta.get("sourceURL") or url
        content_type = meta.get("contentType")
        return Page(
            url=url,
            final_url=str(final_url),
            title=str(title) if title else None,
            content=str(page.get("markdown") or ""),
            content_type=str(content_type) if content_type else None,
        )


def extract_provider_from_env(environ: Mapping[str, str] | None = None) -> ExtractProvider:
    """The provider web_extract uses. Raises NotConfiguredError saying what to set.

    HERMES_WEB_EXTRACT=direct or =firecrawl chooses; unset, FIRECRAWL_API_KEY means
    Firecrawl. Direct fetching reads its DestinationPolicy here too.
    """
    environ = os.environ if environ is None else environ
    wanted = _env(environ, "HERMES_WEB_EXTRACT").lower()
    key = _env(environ, "FIRECRAWL_API_KEY")
    if wanted == "direct":
        return DirectExtract(DestinationPolicy.from_env(environ))
    if wanted in ("firecrawl", "") and key:
        base = _env(environ, "FIRECRAWL_API_URL")
        return FirecrawlExtract(key, base) if base else FirecrawlExtract(key)
    if wanted == "firecrawl":
        raise NotConfiguredError("HERMES_WEB_EXTRACT=firecrawl but FIRECRAWL_API_KEY is not set")
    if wanted:
        raise NotConfiguredError(
            f"HERMES_WEB_EXTRACT={wanted!r} is not an extract provider; choose direct or firecrawl"
        )
    raise NotConfiguredError(
        "web_extract is not configured; set HERMES_WEB_EXTRACT=direct to fetch pages from "
        "this host, or FIRECRAWL_API_KEY"
    )


WEB_EXTRACT_SCHEMA = {
    "name": "web_extract",
    "description": (
        "Fetch web pages and return their text as markdown. Returns {provider, results}: one "
        "entry per URL, in order, either {url, final_url, title, content, content_type, "
        "truncated, total_chars, size_capped} or {url, error}. A page longer than char_limit "
        "keeps its start and end around an omission marker."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "urls": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 1,
                "maxItems": MAX_URLS,
                "description": f"http or https URLs to read, at most {MAX_URLS}.",
            },
            "char_limit": {
                "type": "integer",
                "minimum": MIN_CHAR_LIMIT,
                "maximum": MAX_CHAR_LIMIT,
                "default": DEFAULT_CHAR_LIMIT,
                "description": "Most characters of content to return per page.",
            },
        },
        "required": ["urls"],
    },
}


async def _extract_one(
    provider: ExtractProvider,
    client: httpx.AsyncClient,
    url: Any,
    char_limit: int,
    timeout: float,
) -> dict[str, Any]:
    """One entry of web_extract's results: the page, or ``{url, error}``. Never raises."""
    try:
        checked = check_url(url)
        page = await provider.fetch(client, checked, timeout=timeout)
    except PageError as exc:
        return {"url": url, "error": str(exc)}
    except Exception as exc:  # one page's surprise must not cost the others their results
        log.debug("web_extract failed on %r", url, exc_info=True)
        return {"url": url, "error": f"could not read the page: {type(exc).__name__}: {exc}"}
    content, truncated = clip(page.content, char_limit)
    return {
        "url": page.url,
        "final_url": page.final_url,
        "title": page.title,
        "content": content,
        "content_type": page.content_type,
        "truncated": truncated,
        "total_chars": len(page.content),
        "size_capped": page.size_capped,
    }


async def web_extract(args: dict[str, Any]) -> str:
    urls = args.get("urls")
    if isinstance(urls, str):
        urls = [urls]
    if not isinstance(urls, list) or not urls:
        return tool_error("web_extract needs urls: a list of 1 to 10 http(s) URLs")
    if len(urls) > MAX_URLS:
        return tool_error(
            f"too many URLs ({len(urls)}); web_extract reads at most {MAX_URLS} per call"
        )
    try:
        char_limit = int_arg(
            args, "char_limit", DEFAULT_CHAR_LIMIT, low=MIN_CHAR_LIMIT, high=MAX_CHAR_LIMIT
        )
    except ValueError as exc:
        return tool_error(str(exc))
    missing = _missing_libraries_error()
    if missing:
        return missing
    try:
        provider = extract_provider_from_env()
        timeout = web_timeout()
    except NotConfiguredError as exc:
        return tool_error(str(exc))
    results: list[dict[str, Any]] = [{} for _ in urls]

    async def run(client: httpx.AsyncClient, index: int, url: Any) -> None:
        results[index] = await _extract_one(provider, client, url, char_limit, timeout)

    async with provider.open_client(timeout) as client, anyio.create_task_group() as group:
        for index, url in enumerate(urls):
            group.start_soon(run, client, index, url)
    return tool_result(provider=provider.name, results=results)


def _extract_available() -> bool:
    try:
        extract_provider_from_env()
    except NotConfiguredError:
        return False
    return not missing_libraries()


registry.register(
    name="web_search",
    toolset="web",
    schema=WEB_SEARCH_SCHEMA,
    handler=web_search,
    check_fn=_search_available,
    requires_env=("SEARXNG_URL", "BRAVE_SEARCH_API_KEY", "TAVILY_API_KEY"),
    emoji="🔍",
)
registry.register(
    name="web_extract",
    toolset="web",
    schema=WEB_EXTRACT_SCHEMA,
    handler=web_extract,
    check_fn=_extract_available,
    requires_env=("HERMES_WEB_EXTRACT", "FIRECRAWL_API_KEY"),
    emoji="📄",
)
