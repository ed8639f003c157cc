"""The web tools: web_search through a search provider, web_extract to read pages as markdown.

Both run on the host (they are network tools: the run's environment plays no part) and
are configured by environment variables (docs/web.md); unconfigured, each is hidden by
its check_fn. Their machinery is the :mod:`hermes_sandbox.tools.web` package; it needs
the ``web`` extra (httpx, beautifulsoup4, markdownify), imported lazily so this module
imports without it. Errors are caught in the handlers and returned as ``{"error": ...}``
results.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import anyio

from hermes_sandbox.tools.handler_args import int_arg
from hermes_sandbox.tools.registry import registry, tool_error, tool_result
from hermes_sandbox.tools.web.client import missing_libraries, open_client, setting, web_timeout
from hermes_sandbox.tools.web.errors import NotConfiguredError, PageError, ProviderError
from hermes_sandbox.truncation import cut_middle

if TYPE_CHECKING:
    import httpx

    from hermes_sandbox.tools.web.base import ExtractProvider

# The providers, direct fetching and its destination guard (socket, ipaddress, their
# dataclasses) are imported when a call or a check_fn needs them: registering the two
# tools, which every run does, needs only their schemas.

log = logging.getLogger(__name__)

DEFAULT_LIMIT = 5
MAX_LIMIT = 20
MAX_URLS = 10
DEFAULT_CHAR_LIMIT = 15_000
MIN_CHAR_LIMIT = 200
MAX_CHAR_LIMIT = 100_000
HEAD_SHARE = 0.75  # a cut page keeps more of its start, where the substance usually is


def _missing_libraries_error() -> str | None:
    missing = missing_libraries()
    if not missing:
        return None
    return tool_error(f"the web tools need {', '.join(missing)}: install hermes-sandbox[web]")


# -- web_search ---------------------------------------------------------------------------

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
    from hermes_sandbox.tools.web.providers import search_provider_from_env

    try:
        provider = search_provider_from_env()
        timeout = web_timeout()
    except NotConfiguredError as exc:
        return tool_error(str(exc))
    try:
        async with open_client(timeout) as client:
            with anyio.fail_after(timeout):
                hits = await provider.search(client, query, limit, timeout=timeout)
    except ProviderError as exc:
        return tool_error(str(exc), provider=provider.name)
    except TimeoutError:
        return tool_error(
            f"{provider.name} did not answer: timed out after {timeout:g}s", provider=provider.name
        )
    return tool_result(query=query, provider=provider.name, results=[asdict(hit) for hit in hits])


# What the search providers read to find their configuration (each provider's
# ``required_env``; a test holds the two equal).
SEARCH_ENV = ("SEARXNG_URL", "BRAVE_SEARCH_API_KEY", "TAVILY_API_KEY")


def _search_available() -> bool:
    # Nothing set, nothing configured: answered without importing the providers.
    if not any(setting(os.environ, name) for name in ("HERMES_WEB_SEARCH_PROVIDER", *SEARCH_ENV)):
        return False
    from hermes_sandbox.tools.web.providers import search_provider_from_env

    try:
        search_provider_from_env()
    except NotConfiguredError:
        return False
    return not missing_libraries()


# -- web_extract --------------------------------------------------------------------------


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


def extract_provider_from_env(environ: Mapping[str, str] | None = None) -> ExtractProvider:
    """The provider web_extract uses. Raises NotConfiguredError saying what to set.

    HERMES_WEB_EXTRACT=direct or =firecrawl chooses; unset, FIRECRAWL_API_KEY means
    Firecrawl. Direct fetching reads its DestinationPolicy here too.
    """
    from hermes_sandbox.tools.web.direct import DirectExtract
    from hermes_sandbox.tools.web.guard import DestinationPolicy
    from hermes_sandbox.tools.web.providers import FirecrawlExtract

    environ = os.environ if environ is None else environ
    wanted = setting(environ, "HERMES_WEB_EXTRACT").lower()
    key = setting(environ, "FIRECRAWL_API_KEY")
    if wanted == "direct":
        return DirectExtract(DestinationPolicy.from_env(environ))
    if wanted in ("firecrawl", "") and key:
        base = setting(environ, "FIRECRAWL_API_URL")
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
    # Neither set: extract_provider_from_env would refuse, answered without its imports.
    if not setting(os.environ, "HERMES_WEB_EXTRACT") and not setting(
        os.environ, "FIRECRAWL_API_KEY"
    ):
        return False
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
    requires_env=SEARCH_ENV,
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
