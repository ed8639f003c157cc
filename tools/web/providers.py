"""The hosted services behind the web tools: SearXNG, Brave and Tavily for web_search,
Firecrawl for web_extract. Their endpoints and answers are described in docs/web.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import anyio

from hermes_sandbox.tools.web.base import ExtractProvider, Page, SearchHit, SearchProvider
from hermes_sandbox.tools.web.client import call_json, setting
from hermes_sandbox.tools.web.errors import NotConfiguredError, PageError, ProviderError

if TYPE_CHECKING:
    import httpx


def _plain(text: Any) -> str:
    """Text without markup: providers highlight matches with <strong> and escape entities."""
    import html  # not at import (its entity table): every run registers the web tools

    if not isinstance(text, str):
        return ""
    return html.unescape(re.sub(r"<[^>]+>", "", text)).strip()


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


@dataclass(frozen=True, slots=True)
class SearXNGSearch(SearchProvider):
    base_url: str
    name: ClassVar[str] = "searxng"
    required_env: ClassVar[tuple[str, ...]] = ("SEARXNG_URL",)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> SearXNGSearch | None:
        url = setting(environ, "SEARXNG_URL")
        return cls(url.rstrip("/")) if url else None

    @property
    def endpoint(self) -> str:
        return self.base_url if self.base_url.endswith("/search") else self.base_url + "/search"

    async def search(
        self, client: httpx.AsyncClient, query: str, limit: int, *, timeout: float
    ) -> list[SearchHit]:
        data = await call_json(
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
        key = setting(environ, "BRAVE_SEARCH_API_KEY")
        if not key:
            return None
        url = setting(environ, "BRAVE_SEARCH_URL")
        return cls(key, url) if url else cls(key)

    async def search(
        self, client: httpx.AsyncClient, query: str, limit: int, *, timeout: float
    ) -> list[SearchHit]:
        data = await call_json(
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
        key = setting(environ, "TAVILY_API_KEY")
        if not key:
            return None
        url = setting(environ, "TAVILY_API_URL").rstrip("/")
        if not url:
            return cls(key)
        return cls(key, url if url.endswith("/search") else url + "/search")

    async def search(
        self, client: httpx.AsyncClient, query: str, limit: int, *, timeout: float
    ) -> list[SearchHit]:
        data = await call_json(
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
    wanted = setting(environ, "HERMES_WEB_SEARCH_PROVIDER").lower()
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
                data = await call_json(
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
