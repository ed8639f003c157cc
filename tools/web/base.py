"""The two seams of the web tools: a search provider and an extract provider.

A :class:`SearchProvider` turns a query into :class:`SearchHit` values; an
:class:`ExtractProvider` reads one URL into a :class:`Page`. Each is built from the
environment variables that configure it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from hermes_sandbox.tools.web.client import open_client

if TYPE_CHECKING:
    import httpx


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One search result, its title and description as plain text."""

    url: str
    title: str
    description: str


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


@dataclass(slots=True)
class Page:
    """One page as a provider read it, before it is cut to the caller's char_limit."""

    url: str
    final_url: str
    title: str | None
    content: str
    content_type: str | None
    size_capped: bool = False


class ExtractProvider(ABC):
    """A way to read pages. ``fetch`` returns a Page or raises PageError (never another)."""

    name: ClassVar[str]
    required_env: ClassVar[tuple[str, ...]]

    def open_client(self, timeout: float) -> httpx.AsyncClient:
        """The client one web_extract call shares among its URLs."""
        return open_client(timeout)

    @abstractmethod
    async def fetch(self, client: httpx.AsyncClient, url: str, *, timeout: float) -> Page: ...
