"""HTML to markdown for web_extract: cut out code and styling, convert the rest.

markdownify on BeautifulSoup's stdlib parser (both imported lazily, from the ``web``
extra). CPU-bound: callers run it in a worker thread.
"""

from __future__ import annotations

import re
from urllib.parse import urljoin

# Markup converted per page, once scripts and styles are cut out: parsing and converting
# are pure Python, a few seconds per MB of dense markup on a small machine, and the GIL
# makes pages convert one at a time. Nearly every real page fits well inside this.
MAX_HTML_CONVERT_BYTES = 1024 * 1024

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
