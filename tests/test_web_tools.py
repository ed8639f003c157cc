"""web_search and web_extract against a real HTTP server on 127.0.0.1.

The server (tests/httpserver.py) plays SearXNG, Brave, Tavily and Firecrawl with the
request and answer shapes of their public APIs, and serves the pages web_extract reads:
HTML, plain text, binary, redirects, a 404, a page bigger than the size cap, slow pages.
Every provider variable is cleared first, so nothing here leaves 127.0.0.1. Direct
fetching refuses loopback addresses by default: the tests that read the local server's
pages set HERMES_WEB_ALLOW_PRIVATE=1 (the ``direct`` fixture), and those of the refusals
make sure no connection is even attempted (the ``no_connections`` fixture).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.to_thread
import httpcore
import pytest
from httpserver import LocalHTTPServer, Reply, Request

from hermes_sandbox.tools import web_tools
from hermes_sandbox.tools.registry import ToolRegistry, registry
from hermes_sandbox.tools.web import guard
from hermes_sandbox.tools.web.client import MAX_REDIRECTS, MAX_RESPONSE_BYTES
from hermes_sandbox.tools.web.guard import ALLOW_PRIVATE_HINT, internal_address_kind
from hermes_sandbox.tools.web.markdown import html_to_markdown, strip_code_blocks

BRAVE_KEY = "brave-test-key"
TAVILY_KEY = "tvly-test-key"
FIRECRAWL_KEY = "fc-test-key"
WEB_TOOLS = ("web_search", "web_extract")
CONFIG_VARS = (
    "SEARXNG_URL",
    "BRAVE_SEARCH_API_KEY",
    "BRAVE_SEARCH_URL",
    "TAVILY_API_KEY",
    "TAVILY_API_URL",
    "HERMES_WEB_SEARCH_PROVIDER",
    "HERMES_WEB_EXTRACT",
    "FIRECRAWL_API_KEY",
    "FIRECRAWL_API_URL",
    "HERMES_WEB_TIMEOUT",
    "HERMES_WEB_ALLOW_PRIVATE",
    "HERMES_WEB_ALLOW_HOSTS",
)
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")

ARTICLE = """<!DOCTYPE html>
<html><head><title>The  Test Article</title>
<style>body { color: red; }</style>
<script>window.secret = "SCRIPT-IN-HEAD";</script>
</head><body>
<h1>Main heading</h1>
<p>An opening paragraph with <a href="/docs/next.html">a relative link</a> and
<a href="https://example.org/abs">an absolute one</a>.</p>
<h2>Things to know</h2>
<ul><li>first point</li><li>second point</li></ul>
<ol><li>step one</li><li>step two</li></ol>
<script>document.write("SCRIPT-IN-BODY");</script>
<noscript>NOSCRIPT-TEXT</noscript>
</body></html>
"""
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4


# -- the providers and the site ------------------------------------------------------------


def searxng(request: Request) -> Reply:
    if request.param("format") != "json":
        return Reply.html("<html><body>a results page for people</body></html>")
    query = request.param("q") or ""
    results: list[dict[str, Any]] = [
        {
            "url": f"https://example.org/searx/{i}",
            "title": f"{query} result {i}",
            "content": f"About {query}, number {i}",
            "engine": "duckduckgo",
            "engines": ["duckduckgo"],
            "score": 1.0,
            "category": "general",
        }
        for i in range(25)
    ]
    results.insert(2, {"title": "an entry without a url", "content": "skipped"})
    return Reply.json(
        {
            "query": query,
            "number_of_results": len(results),
            "results": results,
            "answers": [],
            "corrections": [],
            "infoboxes": [],
            "suggestions": [],
            "unresponsive_engines": [],
        }
    )


def brave(request: Request) -> Reply:
    if request.headers.get("x-subscription-token") != BRAVE_KEY:
        return Reply.json(
            {
                "type": "ErrorResponse",
                "error": {
                    "code": "SUBSCRIPTION_TOKEN_INVALID",
                    "detail": "The provided subscription token is invalid.",
                    "status": 401,
                },
            },
            status=401,
        )
    query = request.param("q") or ""
    count = int(request.param("count") or 20)
    results = [
        {
            "title": f"<strong>{query}</strong> page {i}",
            "url": f"https://example.org/brave/{i}",
            "description": f"All about <strong>{query}</strong> &amp; more ({i})",
            "extra_snippets": [],
        }
        for i in range(count)
    ]
    return Reply.json(
        {
            "type": "search",
            "query": {"original": query, "more_results_available": True},
            "web": {"type": "search", "results": results},
        }
    )


def tavily(request: Request) -> Reply:
    if request.method != "POST":
        return Reply.json({"detail": {"error": "Method Not Allowed"}}, status=405)
    if request.headers.get("authorization") != f"Bearer {TAVILY_KEY}":
        return Reply.json(
            {"detail": {"error": "Unauthorized: missing or invalid API key."}}, status=401
        )
    body = request.json()
    results = [
        {
            "title": f"{body['query']} source {i}",
            "url": f"https://example.org/tavily/{i}",
            "content": f"Snippet {i} on {body['query']}",
            "score": 0.9 - i / 100,
            "raw_content": None,
        }
        for i in range(body.get("max_results", 5))
    ]
    return Reply.json(
        {
            "query": body["query"],
            "answer": None,
            "images": [],
            "results": results,
            "response_time": 0.42,
        }
    )


def firecrawl(request: Request) -> Reply:
    if request.headers.get("authorization") != f"Bearer {FIRECRAWL_KEY}":
        return Reply.json({"success": False, "error": "Unauthorized"}, status=401)
    url = request.json()["url"]
    if url.endswith("/gone"):
        metadata = {"sourceURL": url, "statusCode": 404, "error": "Not Found"}
        return Reply.json({"success": True, "data": {"markdown": "", "metadata": metadata}})
    metadata = {"title": ["Scraped title"], "sourceURL": url, "url": url, "statusCode": 200}
    return Reply.json(
        {"success": True, "data": {"markdown": f"# Scraped\n\n{url}", "metadata": metadata}}
    )


def huge_text(request: Request) -> Reply:
    block = b"x" * 65536

    def chunks() -> Iterator[bytes]:
        for _ in range(1024):  # 64 MB, far past the cap
            yield block

    return Reply(200, chunks(), {"Content-Type": "text/plain"})


def huge_html(request: Request) -> Reply:
    """A script-heavy page whose body goes on past the size cap."""
    script = b"<script>var blob = '" + b"j" * 65_000 + b"';</script>\n"

    def chunks() -> Iterator[bytes]:
        yield b"<html><head><title>Big</title></head><body><h1>Big page</h1><p>Intro.</p>"
        # 65 MB of script, like /huge: past the cap and past what the kernel's socket
        # buffers take in (4 MB sent, up to 32 MB received here), so a client that stops
        # at the cap is seen to hang up however slowly it read (with 13 MB, a slow
        # reader's grown receive buffer took the rest and the server never saw it go).
        for _ in range(1000):
            yield script
        yield b"<p>NEVER-READ</p></body></html>"

    return Reply(200, chunks(), {"Content-Type": "text/html"})


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No real keys or proxies from the developer's shell reach these tests."""
    for name in CONFIG_VARS + PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.setenv("HERMES_WEB_TIMEOUT", "5")


@pytest.fixture
def site() -> Iterator[LocalHTTPServer]:
    with LocalHTTPServer() as server:
        server.route("/searxng/search", searxng)
        server.route("/searxng-json-off/search", Reply.html("<h1>403 Forbidden</h1>", 403))
        server.route("/searxng-html/search", Reply.html("<html><body>oops</body></html>"))
        server.route("/searxng-broken/search", Reply.text("Internal Server Error", 500))
        server.route("/searxng-slow/search", Reply.json({"results": []}, delay=3))
        server.route("/brave/res/v1/web/search", brave)
        server.route("/brave-empty", Reply.json({"type": "search", "query": {"original": "x"}}))
        server.route("/tavily/search", tavily)
        server.route("/firecrawl/v2/scrape", firecrawl)
        server.route("/article", Reply.html(ARTICLE))
        server.route("/plain", Reply.text("just some text\nover two lines\n"))
        server.route("/data.json", Reply.json({"key": "value"}))
        server.route("/image.png", Reply(200, PNG, {"Content-Type": "image/png"}))
        server.route("/mystery", Reply(200, PNG, {"Content-Type": "application/octet-stream"}))
        server.route(
            "/latin1",
            Reply(
                200,
                "<html><head><title>Caf\xe9</title></head><body><p>cr\xe8me br\xfbl\xe9e</p>"
                "</body></html>".encode("latin-1"),
                {"Content-Type": "text/html; charset=iso-8859-1"},
            ),
        )
        server.route("/hop/1", Reply.redirect("/hop/2", 301))
        server.route("/hop/2", Reply.redirect("/hop/3", 302))
        server.route("/hop/3", Reply.redirect("/article", 307))
        server.route("/loop", Reply.redirect("/loop"))
        server.route("/huge", huge_text)
        server.route("/huge.html", huge_html)
        long_page = "START\n\n" + "\n\n".join(f"Paragraph {i}. " * 8 for i in range(300))
        server.route("/long", Reply.html(f"<html><body><p>{long_page}</p><p>END</p></body></html>"))
        for i in range(3):
            server.route(f"/slow/{i}", Reply.html(f"<p>slow page {i}</p>", delay=2.0))
        server.route("/very-slow", Reply.html("<p>too late</p>", delay=3.0))
        yield server


@pytest.fixture
def tools() -> ToolRegistry:
    """The web tools as the module registered them, in a registry of their own.

    A fresh registry has no cached check_fn answers (the registry keeps them 30 s), so a
    test sees the environment it set.
    """
    fresh = ToolRegistry()
    for name in WEB_TOOLS:
        entry = registry.get(name)
        assert entry is not None
        fresh.register(
            entry.name,
            entry.toolset,
            entry.schema,
            entry.handler,
            check_fn=entry.check_fn,
            requires_env=entry.requires_env,
            emoji=entry.emoji,
        )
    return fresh


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def call(tools: ToolRegistry, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return json.loads(await tools.adispatch(name, args))


def defined(tools: ToolRegistry) -> set[str]:
    return {schema["function"]["name"] for schema in tools.get_definitions()}


# -- registration and availability --------------------------------------------------------


def test_both_tools_are_registered_async_in_the_web_toolset() -> None:
    for name in WEB_TOOLS:
        entry = registry.get(name)
        assert entry is not None
        assert entry.toolset == "web"
        assert entry.is_async
        assert entry.check_fn is not None
    search, extract = (registry.get(name) for name in WEB_TOOLS)
    assert search is not None and extract is not None
    assert search.requires_env == ("SEARXNG_URL", "BRAVE_SEARCH_API_KEY", "TAVILY_API_KEY")
    assert extract.requires_env == ("HERMES_WEB_EXTRACT", "FIRECRAWL_API_KEY")


def test_the_search_check_reads_what_the_providers_read() -> None:
    # The check_fn answers an environment with none of these set without importing the
    # providers: it must name every variable a provider is configured by.
    from hermes_sandbox.tools.web.providers import SEARCH_PROVIDERS

    read = tuple(var for cls in SEARCH_PROVIDERS.values() for var in cls.required_env)
    assert read == web_tools.SEARCH_ENV


@pytest.mark.anyio
async def test_the_shared_registry_serves_them(
    site: LocalHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEARXNG_URL", site.url("/searxng"))
    monkeypatch.setenv("HERMES_WEB_EXTRACT", "direct")
    monkeypatch.setenv("HERMES_WEB_ALLOW_PRIVATE", "1")
    search = json.loads(await registry.adispatch("web_search", {"query": "q", "limit": 1}))
    assert search["results"][0]["url"] == "https://example.org/searx/0"
    extract = json.loads(await registry.adispatch("web_extract", {"urls": [site.url("/plain")]}))
    assert extract["results"][0]["content"].startswith("just some text")


def test_unconfigured_tools_are_hidden_from_the_definitions(tools: ToolRegistry) -> None:
    assert defined(tools) == set()
    assert "web_search" in tools and "web_extract" in tools


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SEARXNG_URL", "http://127.0.0.1:9/"),
        ("BRAVE_SEARCH_API_KEY", BRAVE_KEY),
        ("TAVILY_API_KEY", TAVILY_KEY),
    ],
)
def test_any_search_provider_shows_web_search(
    tools: ToolRegistry, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    assert defined(tools) == {"web_search"}


@pytest.mark.parametrize(
    "settings",
    [{"HERMES_WEB_EXTRACT": "direct"}, {"FIRECRAWL_API_KEY": FIRECRAWL_KEY}],
)
def test_an_extract_provider_shows_web_extract(
    tools: ToolRegistry, monkeypatch: pytest.MonkeyPatch, settings: dict[str, str]
) -> None:
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    assert defined(tools) == {"web_extract"}


def test_a_named_provider_without_its_key_hides_web_search(
    tools: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEARXNG_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("HERMES_WEB_SEARCH_PROVIDER", "brave")
    assert defined(tools) == set()


@pytest.mark.anyio
async def test_unconfigured_calls_say_what_to_set(tools: ToolRegistry) -> None:
    search = await call(tools, "web_search", {"query": "x"})
    assert "no web search provider is configured" in search["error"]
    assert "BRAVE_SEARCH_API_KEY" in search["error"]
    extract = await call(tools, "web_extract", {"urls": ["http://127.0.0.1/"]})
    assert "HERMES_WEB_EXTRACT=direct" in extract["error"]


@pytest.mark.anyio
async def test_a_wrong_provider_setting_is_explained(
    tools: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HERMES_WEB_SEARCH_PROVIDER", "google")
    result = await call(tools, "web_search", {"query": "x"})
    assert "'google' is not a search provider" in result["error"]
    assert "searxng, brave, tavily" in result["error"]
    monkeypatch.setenv("HERMES_WEB_SEARCH_PROVIDER", "tavily")
    result = await call(tools, "web_search", {"query": "x"})
    assert "TAVILY_API_KEY is not set" in result["error"]
    monkeypatch.setenv("HERMES_WEB_EXTRACT", "magic")
    result = await call(tools, "web_extract", {"urls": ["http://127.0.0.1/"]})
    assert "'magic' is not an extract provider" in result["error"]


# -- web_search ----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_searxng_request_and_results(
    tools: ToolRegistry, site: LocalHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEARXNG_URL", site.url("/searxng/"))
    result = await call(tools, "web_search", {"query": "  hermes agent  "})
    request = site.requests[-1]
    assert request.method == "GET"
    assert request.param("q") == "hermes agent"
    assert request.param("format") == "json"
    assert request.headers["user-agent"].startswith("hermes-sandbox/")
    assert result["query"] == "hermes agent"
    assert result["provider"] == "searxng"
    assert len(result["results"]) == 5  # the default limit
    assert result["results"][0] == {
        "url": "https://example.org/searx/0",
        "title": "hermes agent result 0",
        "description": "About hermes agent, number 0",
    }
    # The entry without a url is skipped, not returned half-empty.
    assert [hit["url"][-1] for hit in result["results"]] == ["0", "1", "2", "3", "4"]


@pytest.mark.anyio
async def test_searxng_url_may_already_name_the_search_path(
    tools: ToolRegistry, site: LocalHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEARXNG_URL", site.url("/searxng/search"))
    result = await call(tools, "web_search", {"query": "q", "limit": 2})
    assert len(result["results"]) == 2
    assert site.requests[-1].path == "/searxng/search"


@pytest.mark.anyio
@pytest.mark.parametrize("limit", [1, 7, 20])
async def test_limit_caps_the_results(
    tools: ToolRegistry, site: LocalHTTPServer, monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    monkeypatch.setenv("SEARXNG_URL", site.url("/searxng"))
    result = await call(tools, "web_search", {"query": "q", "limit": limit})
    assert len(result["results"]) == limit


@pytest.mark.anyio
async def test_brave_sends_its_token_and_count_and_strips_highlighting(
    tools: ToolRegistry, site: LocalHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BRAVE_SEARCH_API_KEY", BRAVE_KEY)
    monkeypatch.setenv("BRAVE_SEARCH_URL", site.url("/brave/res/v1/web/search"))
    result = await call(tools, "web_search", {"query": "rust", "limit": 3})
    request = site.requests[-1]
    assert request.headers["x-subscription-token"] == BRAVE_KEY
    assert request.headers["accept"] == "application/json"
    assert request.param("count") == "3"
    assert result["provider"] == "brave"
    assert result["results"] == [
        {
            "url": f"https://example.org/brave/{i}",
            "title": f"rust page {i}",
            "description": f"All about rust & more ({i})",
        }
        for i in range(3)
    ]


@pytest.mark.anyio
async def test_brave_with_a_wrong_key_reports_the_status_and_its_detail(
    tools: ToolRegistry, site: LocalHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BRAVE_SEARCH_API_KEY", "wrong")
    monkeypatch.setenv("BRAVE_SEARCH_URL", site.url("/brave/res/v1/web/search"))
    result = await call(tools, "web_search", {"query": "rust"})
    assert result["provider"] == "brave"
    assert "HTTP 401" in result["error"]
    assert "The provided subscription token is invalid." in result["error"]


@pytest.mark.anyio
async def test_brave_without_web_results_is_an_empty_list(
    tools: ToolRegistry, site: LocalHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BRAVE_SEARCH_API_KEY", BRAVE_KEY)
    monkeypatch.setenv("BRAVE_SEARCH_URL", site.url("/brave-empty"))
    result = await call(tools, "web_search", {"query": "x"})
    assert result == {"query": "x", "provider": "brave", "results": []}


@pytest.mark.anyio
@pytest.mark.parametrize("api_url", ["/tavily/search", "/tavily", "/tavily/"])
async def test_tavily_posts_json_with_a_bearer_key(
    tools: ToolRegistry, site: LocalHTTPServer, monkeypatch: pytest.MonkeyPatch, api_url: str
) -> None:
    monkeypatch.setenv("TAVILY_API_KEY", TAVILY_KEY)
    monkeypatch.setenv("TAVILY_API_URL", site.url(api_url))
    result = await call(tools, "web_search", {"query": "llm agents", "limit": 4})
    request = site.requests[-1]
    assert request.method == "POST"
    assert request.path == "/tavily/search"
    assert request.headers["authorization"] == f"Bearer {TAVILY_KEY}"
    assert request.headers["content-type"] == "application/json"
    assert request.json() == {"query": "llm agents", "max_results": 4}
    assert result["provider"] == "tavily"
    assert result["results"][1] == {
        "url": "https://example.org/tavily/1",
        "title": "llm agents source 1",
        "description": "Snippet 1 on llm agents",
    }
    assert len(result["results"]) == 4


@pytest.mark.anyio
async def test_tavily_error_detail_is_reported(
    tools: ToolRegistry, site: LocalHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TAVILY_API_KEY", "tvly-wrong")
    monkeypatch.setenv("TAVILY_API_URL", site.url("/tavily/search"))
    result = await call(tools, "web_search", {"query": "x"})
    assert result["error"] == (
        "tavily answered HTTP 401: Unauthorized: missing or invalid API key."
    )


@pytest.mark.anyio
async def test_first_configured_provider_wins_unless_one_is_named(
    tools: ToolRegistry, site: LocalHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TAVILY_API_KEY", TAVILY_KEY)
    monkeypatch.setenv("TAVILY_API_URL", site.url("/tavily/search"))
    monkeypatch.setenv("BRAVE_SEARCH_API_KEY", BRAVE_KEY)
    monkeypatch.setenv("BRAVE_SEARCH_URL", site.url("/brave/res/v1/web/search"))
    monkeypatch.setenv("SEARXNG_URL", site.url("/searxng"))
    assert (await call(tools, "web_search", {"query": "q"}))["provider"] == "searxng"
    monkeypatch.setenv("HERMES_WEB_SEARCH_PROVIDER", "Tavily")
    assert (await call(tools, "web_search", {"query": "q"}))["provider"] == "tavily"
    monkeypatch.setenv("HERMES_WEB_SEARCH_PROVIDER", "brave")
    assert (await call(tools, "web_search", {"query": "q"}))["provider"] == "brave"


BAD_SEARCH_ARGUMENTS = [
    ({}, "query", "web_search needs a query"),
    ({"query": "   "}, "query", "web_search needs a query"),
    ({"query": 42}, "query", "web_search needs a query"),
    ({"query": "q", "limit": 0}, "limit", "limit must be between 1 and 20, got 0"),
    ({"query": "q", "limit": 21}, "limit", "limit must be between 1 and 20, got 21"),
    ({"query": "q", "limit": "many"}, "limit", "limit must be an integer"),
    ({"query": "q", "limit": True}, "limit", "limit must be an integer"),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("args", "field", "message"), BAD_SEARCH_ARGUMENTS)
async def test_bad_search_arguments_are_refused_before_any_request(
    tools: ToolRegistry,
    site: LocalHTTPServer,
    monkeypatch: pytest.MonkeyPatch,
    args: dict[str, Any],
    field: str,
    message: str,
) -> None:
    monkeypatch.setenv("SEARXNG_URL", site.url("/searxng"))
    # The registry may refuse them against the schema first; either way the field is named.
    assert field in (await call(tools, "web_search", args))["error"]
    # The handler refuses them on its own too, when called without the registry's checks.
    assert message in json.loads(await web_tools.web_search(args))["error"]
    assert site.requests == []


@pytest.mark.anyio
async def test_limit_may_come_as_text(
    tools: ToolRegistry, site: LocalHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEARXNG_URL", site.url("/searxng"))
    result = await call(tools, "web_search", {"query": "q", "limit": "3"})
    assert len(result["results"]) == 3


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/searxng-broken", "searxng answered HTTP 500: Internal Server Error"),
        ("/searxng-json-off", "HTTP 403: 403 Forbidden (is the json format enabled"),
        ("/searxng-html", "searxng answered with something that is not JSON (text/html"),
    ],
)
async def test_provider_failures_become_error_results(
    tools: ToolRegistry,
    site: LocalHTTPServer,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    expected: str,
) -> None:
    monkeypatch.setenv("SEARXNG_URL", site.url(path))
    result = await call(tools, "web_search", {"query": "q"})
    assert expected in result["error"]
    assert result["provider"] == "searxng"


@pytest.mark.anyio
async def test_an_unreachable_provider_is_reported(
    tools: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = closed_port()
    monkeypatch.setenv("SEARXNG_URL", f"http://me:secret@127.0.0.1:{port}")
    result = await call(tools, "web_search", {"query": "q"})
    assert result["error"].startswith(
        f"searxng request to http://127.0.0.1:{port}/search failed: could not connect"
    )
    assert "secret" not in result["error"]


@pytest.mark.anyio
async def test_a_slow_provider_times_out(
    tools: ToolRegistry, site: LocalHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEARXNG_URL", site.url("/searxng-slow"))
    monkeypatch.setenv("HERMES_WEB_TIMEOUT", "0.3")
    started = time.monotonic()
    result = await call(tools, "web_search", {"query": "q"})
    assert time.monotonic() - started < 2.9  # the page answers after 3 s
    assert "timed out after 0.3s" in result["error"]


@pytest.mark.anyio
async def test_a_malformed_timeout_setting_is_explained(
    tools: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEARXNG_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("HERMES_WEB_TIMEOUT", "soon")
    result = await call(tools, "web_search", {"query": "q"})
    assert (
        "HERMES_WEB_TIMEOUT must be a positive number of seconds, got 'soon'" in (result["error"])
    )


# -- web_extract: pages --------------------------------------------------------------------


@pytest.fixture
def direct(monkeypatch: pytest.MonkeyPatch) -> None:
    """Direct fetching, allowed to reach the local server (a loopback address)."""
    monkeypatch.setenv("HERMES_WEB_EXTRACT", "direct")
    monkeypatch.setenv("HERMES_WEB_ALLOW_PRIVATE", "1")


@pytest.mark.anyio
@pytest.mark.usefixtures("direct")
async def test_html_becomes_markdown_with_its_title(
    tools: ToolRegistry, site: LocalHTTPServer
) -> None:
    result = await call(tools, "web_extract", {"urls": [site.url("/article")]})
    assert result["provider"] == "direct"
    (page,) = result["results"]
    assert page["url"] == site.url("/article")
    assert page["final_url"] == site.url("/article")
    assert page["title"] == "The Test Article"
    assert page["content_type"] == "text/html"
    assert page["truncated"] is False
    assert page["size_capped"] is False
    content = page["content"]
    assert content.startswith("# Main heading")
    assert "\n## Things to know\n" in content
    assert f"[a relative link]({site.url('/docs/next.html')})" in content
    assert "[an absolute one](https://example.org/abs)" in content
    assert "- first point\n- second point" in content
    assert "1. step one\n2. step two" in content
    for hidden in ("SCRIPT-IN-HEAD", "SCRIPT-IN-BODY", "NOSCRIPT-TEXT", "color: red"):
        assert hidden not in content
    assert page["total_chars"] == len(content)
    assert site.requests[-1].headers["user-agent"].startswith("hermes-sandbox/")


@pytest.mark.anyio
@pytest.mark.usefixtures("direct")
async def test_text_passes_through_and_binary_is_refused(
    tools: ToolRegistry, site: LocalHTTPServer
) -> None:
    urls = [site.url(p) for p in ("/plain", "/data.json", "/image.png", "/mystery")]
    result = await call(tools, "web_extract", {"urls": urls})
    plain, data, image, mystery = result["results"]
    assert plain["content"] == "just some text\nover two lines\n"
    assert plain["title"] is None
    assert plain["content_type"] == "text/plain"
    assert json.loads(data["content"]) == {"key": "value"}
    assert image == {
        "url": urls[2],
        "error": "binary content (image/png); web_extract reads HTML and text",
    }
    assert mystery["url"] == urls[3]
    assert "binary content (application/octet-stream)" in mystery["error"]


@pytest.mark.anyio
@pytest.mark.usefixtures("direct")
async def test_the_declared_charset_is_used(tools: ToolRegistry, site: LocalHTTPServer) -> None:
    result = await call(tools, "web_extract", {"urls": [site.url("/latin1")]})
    (page,) = result["results"]
    assert page["title"] == "Café"
    assert page["content"] == "crème brûlée"


@pytest.mark.anyio
@pytest.mark.usefixtures("direct")
async def test_redirects_are_followed_to_the_final_url(
    tools: ToolRegistry, site: LocalHTTPServer
) -> None:
    result = await call(tools, "web_extract", {"urls": [site.url("/hop/1")]})
    (page,) = result["results"]
    assert page["url"] == site.url("/hop/1")
    assert page["final_url"] == site.url("/article")
    assert page["title"] == "The Test Article"
    assert [r.path for r in site.requests] == ["/hop/1", "/hop/2", "/hop/3", "/article"]


@pytest.mark.anyio
@pytest.mark.usefixtures("direct")
async def test_a_redirect_loop_stops_at_the_limit(
    tools: ToolRegistry, site: LocalHTTPServer
) -> None:
    result = await call(tools, "web_extract", {"urls": [site.url("/loop")]})
    (page,) = result["results"]
    assert page["error"] == f"too many redirects (more than {MAX_REDIRECTS})"
    assert len(site.requests) == MAX_REDIRECTS + 1


@pytest.mark.anyio
@pytest.mark.usefixtures("direct")
async def test_errors_are_per_url_and_results_keep_their_order(
    tools: ToolRegistry, site: LocalHTTPServer
) -> None:
    refused = f"http://127.0.0.1:{closed_port()}/page"
    urls = [
        site.url("/missing"),
        site.url("/plain"),
        refused,
        "ftp://127.0.0.1/file.txt",
        "file:///etc/passwd",
        "not a url",
        "http:///no-host",
        site.url("/article"),
    ]
    result = await call(tools, "web_extract", {"urls": urls})
    entries = result["results"]
    assert [entry["url"] for entry in entries] == urls
    assert entries[0] == {"url": urls[0], "error": "HTTP 404 Not Found"}
    assert entries[1]["content"].startswith("just some text")
    assert entries[2]["url"] == refused
    assert entries[2]["error"].startswith("could not connect")
    assert entries[3]["error"] == "only http and https URLs can be fetched, not ftp:"
    assert entries[4]["error"] == "only http and https URLs can be fetched, not file:"
    assert entries[5]["error"] == "only http and https URLs can be fetched, not no scheme"
    assert entries[6]["error"] == "the URL has no host"
    assert entries[7]["title"] == "The Test Article"


@pytest.mark.anyio
@pytest.mark.usefixtures("direct")
async def test_char_limit_keeps_head_and_tail_around_a_marker(
    tools: ToolRegistry, site: LocalHTTPServer
) -> None:
    whole = (await call(tools, "web_extract", {"urls": [site.url("/long")]}))["results"][0]
    assert whole["truncated"] is True  # the default 15,000 is less than this page
    assert len(whole["content"]) <= 15_000
    result = await call(tools, "web_extract", {"urls": [site.url("/long")], "char_limit": 1000})
    (page,) = result["results"]
    content = page["content"]
    assert page["truncated"] is True
    assert page["total_chars"] == whole["total_chars"] > 20_000
    assert len(content) <= 1000
    assert content.startswith("START")
    assert content.endswith("END")
    head, rest = content.split("\n... [", 1)
    omitted, tail = rest.split(" characters omitted] ...\n", 1)
    assert len(head) + int(omitted.replace(",", "")) + len(tail) == page["total_chars"]
    assert len(head) > len(tail) > 100  # more of the start is kept than of the end


@pytest.mark.anyio
@pytest.mark.usefixtures("direct")
async def test_a_page_past_the_size_cap_is_read_only_up_to_it(
    tools: ToolRegistry, site: LocalHTTPServer
) -> None:
    started = time.monotonic()
    result = await call(tools, "web_extract", {"urls": [site.url("/huge")]})
    elapsed = time.monotonic() - started
    (page,) = result["results"]
    assert page["size_capped"] is True
    assert page["total_chars"] == MAX_RESPONSE_BYTES
    assert page["truncated"] is True
    assert len(page["content"]) <= 15_000
    assert elapsed < 15  # a generous bound: loopback is fast, but CI machines are busy
    # The client hung up: the server, 64 MB to send, found nobody reading.
    assert await anyio.to_thread.run_sync(site.wait_aborted, "/huge", 5.0)


@pytest.mark.anyio
@pytest.mark.usefixtures("direct")
async def test_a_script_heavy_page_past_the_cap_keeps_its_text(
    tools: ToolRegistry, site: LocalHTTPServer
) -> None:
    result = await call(tools, "web_extract", {"urls": [site.url("/huge.html")]})
    (page,) = result["results"]
    assert page["size_capped"] is True
    assert page["title"] == "Big"
    assert page["content"] == "# Big page\n\nIntro."
    assert await anyio.to_thread.run_sync(site.wait_aborted, "/huge.html", 5.0)


@pytest.mark.anyio
@pytest.mark.usefixtures("direct")
async def test_pages_are_fetched_concurrently(tools: ToolRegistry, site: LocalHTTPServer) -> None:
    urls = [site.url(f"/slow/{i}") for i in range(3)]
    started = time.monotonic()
    result = await call(tools, "web_extract", {"urls": urls})
    elapsed = time.monotonic() - started
    assert [page["content"] for page in result["results"]] == [f"slow page {i}" for i in range(3)]
    assert 2.0 <= elapsed < 5.5  # one after another would take 6 s or more


@pytest.mark.anyio
@pytest.mark.usefixtures("direct")
async def test_a_slow_page_times_out_alone(
    tools: ToolRegistry, site: LocalHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HERMES_WEB_TIMEOUT", "0.5")
    started = time.monotonic()
    result = await call(
        tools, "web_extract", {"urls": [site.url("/very-slow"), site.url("/plain")]}
    )
    assert time.monotonic() - started < 2.9  # the slow page answers after 3 s
    slow, plain = result["results"]
    assert slow == {"url": site.url("/very-slow"), "error": "timed out after 0.5s"}
    assert plain["content"].startswith("just some text")


BAD_EXTRACT_ARGUMENTS = [
    ({}, "urls", "web_extract needs urls"),
    ({"urls": []}, "urls", "web_extract needs urls"),
    ({"urls": {"a": 1}}, "urls", "web_extract needs urls"),
    ({"urls": [f"http://127.0.0.1/{i}" for i in range(11)]}, "urls", "too many URLs (11)"),
    ({"urls": ["http://127.0.0.1/"], "char_limit": 10}, "char_limit", "between 200 and 100,000"),
    ({"urls": ["http://127.0.0.1/"], "char_limit": "x"}, "char_limit", "must be an integer"),
]


@pytest.mark.anyio
@pytest.mark.usefixtures("direct")
@pytest.mark.parametrize(("args", "field", "message"), BAD_EXTRACT_ARGUMENTS)
async def test_bad_extract_arguments_are_refused(
    tools: ToolRegistry, site: LocalHTTPServer, args: dict[str, Any], field: str, message: str
) -> None:
    assert field in (await call(tools, "web_extract", args))["error"].lower()
    assert message in json.loads(await web_tools.web_extract(args))["error"]
    assert site.requests == []


@pytest.mark.anyio
@pytest.mark.usefixtures("direct")
async def test_a_single_url_string_is_taken_as_a_list(
    tools: ToolRegistry, site: LocalHTTPServer
) -> None:
    result = await call(tools, "web_extract", {"urls": site.url("/plain")})
    assert result["results"][0]["content"].startswith("just some text")


# -- web_extract: internal destinations ----------------------------------------------------

HINT = ALLOW_PRIVATE_HINT


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Direct fetching with the default policy: internal destinations are refused."""
    monkeypatch.setenv("HERMES_WEB_EXTRACT", "direct")


@pytest.fixture
def connections(site: LocalHTTPServer, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every address:port the guarded backend connects to, in order.

    Only the local server's is really connected; any other fails here, recorded, so a
    check that let something through shows up as an entry here and never as traffic.
    """
    attempts: list[str] = []
    original = httpcore.AnyIOBackend.connect_tcp

    async def connect_tcp(
        self: httpcore.AnyIOBackend, host: str, port: int, *args: Any, **kwargs: Any
    ) -> httpcore.AsyncNetworkStream:
        attempts.append(f"{host}:{port}")
        if (host, port) != ("127.0.0.1", site.port):
            raise httpcore.ConnectError("test: only the local server is reachable")
        return await original(self, host, port, *args, **kwargs)

    monkeypatch.setattr(httpcore.AnyIOBackend, "connect_tcp", connect_tcp)
    return attempts


REFUSED_DESTINATIONS = [
    ("http://127.0.0.1:{port}/plain", "127.0.0.1 is a loopback address"),
    ("http://localhost:{port}/plain", "localhost resolves to "),
    ("http://[::1]:{port}/plain", "::1 is a loopback address"),
    ("http://2130706433:{port}/plain", "2130706433 resolves to 127.0.0.1, a loopback address"),
    ("http://0x7f.1:{port}/plain", "0x7f.1 resolves to 127.0.0.1, a loopback address"),
    ("http://017700000001:{port}/plain", "017700000001 resolves to 127.0.0.1, a loopback"),
    ("http://127.1:{port}/plain", "127.1 resolves to 127.0.0.1, a loopback address"),
    ("http://[::ffff:127.0.0.1]:{port}/plain", "::ffff:127.0.0.1 is a loopback address"),
    ("http://0.0.0.0:{port}/plain", "0.0.0.0 is the unspecified address (this host)"),
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is the cloud metadata address"),
    ("http://[::ffff:a9fe:a9fe]/latest/", "::ffff:a9fe:a9fe is the cloud metadata address"),
    ("http://[fd00:ec2::254]/latest/", "fd00:ec2::254 is the cloud metadata address"),
    ("http://169.254.1.1/", "169.254.1.1 is a link-local address"),
    ("http://[fe80::1]/", "fe80::1 is a link-local address"),
    ("http://10.0.0.1/", "10.0.0.1 is a private address"),
    ("http://172.16.5.4/", "172.16.5.4 is a private address"),
    ("http://192.168.1.1:8080/", "192.168.1.1 is a private address"),
    ("http://[fc00::1]/", "fc00::1 is a private address"),
    ("http://[::ffff:10.0.0.1]/", "::ffff:10.0.0.1 is a private address"),
    ("http://224.0.0.1/", "224.0.0.1 is a multicast address"),
    ("http://[ff02::1]/", "ff02::1 is a multicast address"),
    ("http://100.100.100.200/", "100.100.100.200 is a non-public address"),
]


@pytest.mark.anyio
@pytest.mark.usefixtures("guarded")
@pytest.mark.parametrize(("url", "reason"), REFUSED_DESTINATIONS)
async def test_internal_destinations_are_refused_before_any_connection(
    tools: ToolRegistry, site: LocalHTTPServer, connections: list[str], url: str, reason: str
) -> None:
    url = url.format(port=site.port)  # the server is there, so only the check stops it
    result = await call(tools, "web_extract", {"urls": [url]})
    (entry,) = result["results"]
    assert entry["url"] == url
    assert entry["error"].startswith(f"refused: {reason}")
    assert entry["error"].endswith(f"; {HINT}")
    assert "HERMES_WEB_ALLOW_PRIVATE=1" in entry["error"]
    assert connections == []
    assert site.requests == []


@pytest.mark.anyio
@pytest.mark.usefixtures("guarded")
async def test_allow_private_lets_internal_destinations_through(
    tools: ToolRegistry,
    site: LocalHTTPServer,
    connections: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HERMES_WEB_ALLOW_PRIVATE", "1")
    spellings = ("127.0.0.1", "localhost", "2130706433", "0x7f.1")
    urls = [f"http://{host}:{site.port}/plain" for host in spellings]
    result = await call(tools, "web_extract", {"urls": urls})
    assert [entry["content"] for entry in result["results"]] == [
        "just some text\nover two lines\n"
    ] * len(urls)
    # Each spelling connected to the address it stands for; the Host header kept the name.
    assert connections.count(f"127.0.0.1:{site.port}") == len(urls)
    assert sorted(r.headers["host"] for r in site.requests) == sorted(
        f"{host}:{site.port}" for host in spellings
    )


@pytest.mark.anyio
@pytest.mark.usefixtures("guarded")
async def test_allowed_hosts_let_exactly_those_through(
    tools: ToolRegistry,
    site: LocalHTTPServer,
    connections: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HERMES_WEB_ALLOW_HOSTS", f" [::1]:1 , 127.0.0.1:{site.port} ")
    other_port = closed_port()
    urls = [
        site.url("/plain"),
        f"http://127.0.0.1:{other_port}/plain",
        f"http://localhost:{site.port}/plain",
        f"http://2130706433:{site.port}/plain",
    ]
    result = await call(tools, "web_extract", {"urls": urls})
    allowed, other, by_name, decimal = result["results"]
    assert allowed["content"].startswith("just some text")
    assert other["error"] == f"refused: 127.0.0.1 is a loopback address; {HINT}"
    assert by_name["error"].startswith("refused: localhost resolves to ")
    assert decimal["error"].startswith("refused: 2130706433 resolves to 127.0.0.1")
    assert connections == [f"127.0.0.1:{site.port}"]


@pytest.mark.anyio
@pytest.mark.usefixtures("guarded")
async def test_a_redirect_to_an_internal_address_is_refused_at_that_hop(
    tools: ToolRegistry,
    site: LocalHTTPServer,
    connections: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The local server stands for a public site: its own address is let through.
    monkeypatch.setenv("HERMES_WEB_ALLOW_HOSTS", f"127.0.0.1:{site.port}")
    targets = {
        "/to-metadata": "http://169.254.169.254/latest/meta-data/",
        "/to-localhost": f"http://localhost:{site.port}/plain",
        "/to-decimal": f"http://2130706433:{site.port}/plain",
        "/to-private": "http://user:secret@10.0.0.7/admin",
    }
    for path, target in targets.items():
        site.route(path, Reply.redirect(target))
    urls = [site.url(path) for path in targets] + [site.url("/hop/1")]
    result = await call(tools, "web_extract", {"urls": urls})
    metadata, localhost, decimal, private, allowed = result["results"]
    assert metadata == {
        "url": urls[0],
        "error": "refused: the page redirected to http://169.254.169.254/latest/meta-data/, "
        f"and 169.254.169.254 is the cloud metadata address; {HINT}",
    }
    assert localhost["error"].startswith(
        f"refused: the page redirected to http://localhost:{site.port}/plain, "
        "and localhost resolves to "
    )
    assert decimal["error"] == (
        f"refused: the page redirected to http://2130706433:{site.port}/plain, and "
        f"2130706433 resolves to 127.0.0.1, a loopback address; {HINT}"
    )
    assert private["error"] == (
        "refused: the page redirected to http://10.0.0.7/admin, and 10.0.0.7 is a private "
        f"address; {HINT}"
    )
    # Redirects that stay on allowed ground are followed as before.
    assert allowed["final_url"] == site.url("/article")
    served = sorted(r.path for r in site.requests)
    assert served == sorted([*targets, "/hop/1", "/hop/2", "/hop/3", "/article"])
    assert set(connections) == {f"127.0.0.1:{site.port}"}


@pytest.mark.anyio
@pytest.mark.usefixtures("guarded")
async def test_a_name_is_resolved_once_and_the_checked_address_connected(
    tools: ToolRegistry,
    site: LocalHTTPServer,
    connections: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lookups: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        lookups.append(host)
        return ["127.0.0.1"]

    monkeypatch.setattr(guard, "_resolve", resolve)
    url = f"http://wiki.invalid:{site.port}/plain"
    refused = (await call(tools, "web_extract", {"urls": [url]}))["results"][0]
    assert refused["error"] == (
        f"refused: wiki.invalid resolves to 127.0.0.1, a loopback address; {HINT}"
    )
    assert connections == []
    monkeypatch.setenv("HERMES_WEB_ALLOW_HOSTS", f"wiki.invalid:{site.port}")
    page = (await call(tools, "web_extract", {"urls": [url]}))["results"][0]
    assert page["content"].startswith("just some text")
    assert page["final_url"] == url
    assert lookups == ["wiki.invalid", "wiki.invalid"]  # once per connection, never again
    assert connections == [f"127.0.0.1:{site.port}"]  # the address, not the name
    assert site.requests[-1].headers["host"] == f"wiki.invalid:{site.port}"


@pytest.mark.anyio
@pytest.mark.usefixtures("guarded")
async def test_dns_rebinding_gets_no_second_answer(
    tools: ToolRegistry, connections: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name server that answers public first and loopback next is asked only once."""
    answers = iter([["93.184.215.14"], ["127.0.0.1"]])
    lookups: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        lookups.append(host)
        return next(answers)

    monkeypatch.setattr(guard, "_resolve", resolve)
    result = await call(tools, "web_extract", {"urls": ["http://rebind.invalid/"]})
    assert result["results"][0]["error"] == (
        "could not connect (test: only the local server is reachable)"
    )
    assert lookups == ["rebind.invalid"]
    assert connections == ["93.184.215.14:80"]  # the checked address, not a new lookup


@pytest.mark.anyio
@pytest.mark.usefixtures("guarded")
async def test_a_name_with_any_internal_address_is_refused(
    tools: ToolRegistry, connections: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def resolve(host: str, port: int) -> list[str]:
        return ["93.184.215.14", "10.0.0.5"]

    monkeypatch.setattr(guard, "_resolve", resolve)
    result = await call(tools, "web_extract", {"urls": ["https://mixed.invalid/"]})
    assert result["results"][0]["error"] == (
        f"refused: mixed.invalid resolves to 10.0.0.5, a private address; {HINT}"
    )
    assert connections == []


@pytest.mark.anyio
@pytest.mark.usefixtures("guarded")
@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        (
            "HERMES_WEB_ALLOW_PRIVATE",
            "maybe",
            "HERMES_WEB_ALLOW_PRIVATE must be 1 or 0, got 'maybe'",
        ),
        ("HERMES_WEB_ALLOW_HOSTS", "127.0.0.1", "host:port pairs, got '127.0.0.1'"),
        ("HERMES_WEB_ALLOW_HOSTS", "a:1,b:http", "host:port pairs, got 'b:http'"),
        ("HERMES_WEB_ALLOW_HOSTS", "http://h:80", "host:port pairs, got 'http://h:80'"),
        ("HERMES_WEB_ALLOW_HOSTS", "h:80/path", "host:port pairs, got 'h:80/path'"),
    ],
)
async def test_malformed_destination_settings_are_explained(
    tools: ToolRegistry,
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    value: str,
    message: str,
) -> None:
    monkeypatch.setenv(variable, value)
    result = await call(tools, "web_extract", {"urls": ["http://example.org/"]})
    assert message in result["error"]
    assert defined(tools) == set()


@pytest.mark.anyio
async def test_provider_endpoints_are_not_checked(
    tools: ToolRegistry, site: LocalHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator sets them; a SearXNG or Firecrawl on loopback is reached as before."""
    monkeypatch.setenv("SEARXNG_URL", site.url("/searxng"))
    monkeypatch.setenv("FIRECRAWL_API_KEY", FIRECRAWL_KEY)
    monkeypatch.setenv("FIRECRAWL_API_URL", site.url("/firecrawl"))
    search = await call(tools, "web_search", {"query": "q", "limit": 1})
    assert search["results"][0]["url"] == "https://example.org/searx/0"
    extract = await call(tools, "web_extract", {"urls": ["https://example.org/a"]})
    assert extract["results"][0]["title"] == "Scraped title"


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "a loopback address"),
        ("127.255.0.9", "a loopback address"),
        ("::1", "a loopback address"),
        ("::ffff:127.0.0.1", "a loopback address"),
        ("2002:7f00:1::", "a loopback address"),  # 6to4 around 127.0.0.1
        ("0.0.0.0", "the unspecified address (this host)"),
        ("::", "the unspecified address (this host)"),
        ("169.254.169.254", "the cloud metadata address"),
        ("::ffff:169.254.169.254", "the cloud metadata address"),
        ("fd00:ec2::254", "the cloud metadata address"),
        ("169.254.0.1", "a link-local address"),
        ("fe80::1%eth0", "a link-local address"),
        ("10.1.2.3", "a private address"),
        ("172.31.255.255", "a private address"),
        ("192.168.0.1", "a private address"),
        ("fd12:3456::1", "a private address"),
        ("64:ff9b::a00:1", "a private address"),  # NAT64 around 10.0.0.1
        ("224.0.0.251", "a multicast address"),
        ("ff05::2", "a multicast address"),
        ("100.64.0.1", "a non-public address"),
        ("not-an-address", "not an address that can be checked"),
        ("93.184.215.14", None),
        ("8.8.8.8", None),
        ("2606:4700:4700::1111", None),
        ("::ffff:8.8.8.8", None),
        ("64:ff9b::808:808", None),
    ],
)
def test_internal_address_kind(address: str, kind: str | None) -> None:
    assert internal_address_kind(address) == kind


@pytest.mark.parametrize(
    "address", ["192.0.2.1", "198.51.100.7", "240.0.0.1", "255.255.255.255", "2001:db8::1"]
)
def test_reserved_and_documentation_ranges_are_internal(address: str) -> None:
    assert internal_address_kind(address) is not None


# -- web_extract through Firecrawl ---------------------------------------------------------


@pytest.mark.anyio
async def test_firecrawl_scrapes_each_url(
    tools: ToolRegistry, site: LocalHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FIRECRAWL_API_KEY", FIRECRAWL_KEY)
    monkeypatch.setenv("FIRECRAWL_API_URL", site.url("/firecrawl"))
    urls = ["https://example.org/a", "https://example.org/gone", "gopher://x"]
    result = await call(tools, "web_extract", {"urls": urls})
    assert result["provider"] == "firecrawl"
    good, gone, bad = result["results"]
    assert good["title"] == "Scraped title"
    assert good["content"] == "# Scraped\n\nhttps://example.org/a"
    assert good["final_url"] == "https://example.org/a"
    assert gone == {"url": urls[1], "error": "HTTP 404: Not Found"}
    assert "only http and https" in bad["error"]
    bodies = [r.json() for r in site.requests]
    assert {"url": "https://example.org/a", "formats": ["markdown"]} in bodies
    assert all(r.headers["authorization"] == f"Bearer {FIRECRAWL_KEY}" for r in site.requests)
    assert len(site.requests) == 2  # the gopher URL never left this host


@pytest.mark.anyio
async def test_direct_is_chosen_over_firecrawl_when_asked(
    tools: ToolRegistry, site: LocalHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FIRECRAWL_API_KEY", FIRECRAWL_KEY)
    monkeypatch.setenv("FIRECRAWL_API_URL", site.url("/firecrawl"))
    monkeypatch.setenv("HERMES_WEB_EXTRACT", "direct")
    monkeypatch.setenv("HERMES_WEB_ALLOW_PRIVATE", "1")
    result = await call(tools, "web_extract", {"urls": [site.url("/plain")]})
    assert result["provider"] == "direct"


@pytest.mark.anyio
async def test_firecrawl_errors_are_per_url(
    tools: ToolRegistry, site: LocalHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FIRECRAWL_API_KEY", "fc-wrong")
    monkeypatch.setenv("FIRECRAWL_API_URL", site.url("/firecrawl"))
    result = await call(tools, "web_extract", {"urls": ["https://example.org/a"]})
    assert result["results"] == [
        {"url": "https://example.org/a", "error": "firecrawl answered HTTP 401: Unauthorized"}
    ]


# -- pieces --------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [200, 201, 999, 1000, 5000])
def test_clip_never_exceeds_the_limit(limit: int) -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(20_000))
    clipped, cut = web_tools.clip(text, limit)
    assert cut
    assert len(clipped) <= limit
    assert clipped.startswith(text[:50])
    assert clipped.endswith(text[-20:])
    assert web_tools.clip("short", limit) == ("short", False)


@pytest.mark.parametrize(
    ("markup", "expected"),
    [
        (b"a<script>x()</script>b", b"ab"),
        (b"a<SCRIPT type='module'>x()</Script >b", b"ab"),
        (b"a<!-- note -->b<style>p { }</style>c", b"abc"),
        (b"a<svg><path d='M0'/></svg>b<noscript>n</noscript>c<template>t</template>", b"abc"),
        (b"a<script>if (x < 1) { never closed", b"a"),
        (b"a<!-- never closed", b"a"),
        (b"a<scripts>kept</scripts>b", b"a<scripts>kept</scripts>b"),
    ],
)
def test_strip_code_blocks(markup: bytes, expected: bytes) -> None:
    assert strip_code_blocks(markup) == expected


def test_html_conversion_stops_at_its_markup_budget() -> None:
    markup = b"<h1>Top</h1>" + b"<p>filler paragraph</p>" * 5000 + b"<p>LAST</p>"
    title, content, cut = html_to_markdown(markup, "http://h/", max_markup=10_000)
    assert cut is True
    assert title == "Top"
    assert content.startswith("# Top")
    assert "LAST" not in content
    assert len(content) < 10_000
    _, whole, cut = html_to_markdown(markup, "http://h/")
    assert cut is False
    assert whole.endswith("LAST")
