"""The `web` capability: web_fetch (a page's main content, paged) and, when a search service
is configured, web_search. Without one there is no web_search tool at all (never a tool that
always fails).

Pages and results are untrusted text: they reach the model only as tool results, labelled
(`daemon.tools.untrusted`). A pasted link is an ordinary message; the model decides whether to
fetch it. A long page is split into pages of about `PAGE_CHARS`, not cut; the extracted pages
of the last few URLs are kept for a while so that page 2 does not fetch again.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from daemon.core.config import WebSettings
from daemon.core.errors import DocumentError, WebError
from daemon.parsing.pool import WorkerPool, shared_pool
from daemon.tools.builtin import ToolContext
from daemon.tools.registry import Capability, Registry, Tool
from daemon.tools.untrusted import labelled
from daemon.tools.web.fetch import fetch
from daemon.tools.web.guard import Resolve, guard_of, system_resolve
from daemon.tools.web.search import search

PAGE_CHARS = 6_000
CACHE_SIZE = 16
CACHE_SECONDS = 900.0
_HTML = ("text/html", "application/xhtml+xml")
_TEXT = ("application/json", "application/xml", "text/xml")


@dataclass(frozen=True)
class _Page:
    fetched: float
    url: str
    title: str | None
    pages: tuple[str, ...]


def split_pages(text: str, size: int = PAGE_CHARS) -> tuple[str, ...]:
    """`text` in pieces of at most about `size` characters, split between paragraphs where it
    can be, else between lines, else anywhere; never an empty tuple."""
    pages: list[str] = []
    rest = text.strip()
    while len(rest) > size:
        cut = rest.rfind("\n\n", size // 2, size)
        if cut < 0:
            cut = rest.rfind("\n", size // 2, size)
        if cut < 0:
            cut = rest.rfind(" ", size // 2, size)
        if cut < 0:
            cut = size
        pages.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    pages.append(rest)
    return tuple(pages)


class Web:
    """The handlers, with the guard's resolver and the cache of extracted pages."""

    def __init__(self, settings: WebSettings, resolve: Resolve = system_resolve,
                 pool: WorkerPool | None = None) -> None:
        self.settings = settings
        self.guard = guard_of(settings, resolve)
        self._pool = pool
        self._cache: OrderedDict[str, _Page] = OrderedDict()

    async def web_fetch(self, ctx: ToolContext, url: str, page: int = 1) -> str:
        now = ctx.clock()
        try:
            got = self._cached(url, now) or await self._load(url, now)
        except WebError as exc:
            return f"ERROR: {url} was not fetched: {exc}"
        count = len(got.pages)
        if not 1 <= page <= count:
            plural = "s" if count > 1 else ""
            return f"ERROR: {url} has {count} page{plural}; there is no page {page}."
        body = got.pages[page - 1]
        titled = got.title and body.lstrip().lower().startswith(f"# {got.title.lower()}")
        head = f"# {got.title}\n\n" if got.title and page == 1 and not titled else ""
        moved = f" (redirected from {url})" if got.url != url else ""
        after = f"Page {page} of {count}."
        if page < count:
            after += f' Next: web_fetch("{url}", page={page + 1})'
        return labelled("web page", got.url + moved, head + body, after)

    async def web_search(self, ctx: ToolContext, query: str, limit: int = 5) -> str:
        try:
            hits = await search(self.settings, query, limit)
        except WebError as exc:
            return f"ERROR: the search failed: {exc}"
        if not hits:
            return f"No results for {query!r}; try other words."
        body = "\n".join(f"{n}. {hit.title}\n   {hit.url}\n   {hit.snippet}"
                         for n, hit in enumerate(hits, 1))
        return labelled("web search results", f"a search for {query!r}", body,
                        "web_fetch(url) reads a result.")

    def _cached(self, url: str, now: float) -> _Page | None:
        got = self._cache.get(url)
        if got is None or now - got.fetched > CACHE_SECONDS:
            return None
        self._cache.move_to_end(url)
        return got

    async def _load(self, url: str, now: float) -> _Page:
        page = await fetch(url, self.guard, seconds=self.settings.timeout,
                           max_bytes=self.settings.max_mb * 1024 * 1024)
        text = page.body.decode(page.charset or "utf-8", errors="replace")
        title: str | None = None
        if page.content_type in _HTML or (page.content_type == "" and "<html" in text[:1000]):
            pool = self._pool or shared_pool()
            try:
                extracted: dict[str, Any] = await asyncio.to_thread(
                    pool.call, "html_extract", text, page.url)
            except DocumentError as exc:
                raise WebError(f"the page could not be read: {exc}") from exc
            title, text = extracted["title"], extracted["text"]
        elif not (page.content_type.startswith("text/") or page.content_type in _TEXT):
            raise WebError(f"it is {page.content_type or 'of an unknown type'}, not a web page "
                           "or text; web_fetch reads only those")
        got = _Page(fetched=now, url=page.url, title=title,
                    pages=split_pages(text or "(the page has no readable text)"))
        self._cache[url] = got
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return got


def _schema(properties: dict[str, dict[str, str]], *required: str) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required)}


def register(registry: Registry, settings: WebSettings, *, resolve: Resolve = system_resolve,
             pool: WorkerPool | None = None) -> Web:
    """The `web` capability, loaded on demand; web_search only with a search service."""
    web = Web(settings, resolve, pool)
    timeout = settings.timeout + 30.0  # the fetch's own bound, then the extraction's
    tools = [Tool("web_fetch", "Fetch a web page (http/https) and return its main text as "
                  "Markdown, a page at a time.",
                  _schema({"url": {"type": "string"},
                           "page": {"type": "integer", "description": "1 first, 2 next, ..."}},
                          "url"), web.web_fetch, timeout, progress="reading a web page…")]
    if settings.search_backend:
        tools.append(Tool("web_search", "Search the web; returns titles, URLs and snippets.",
                          _schema({"query": {"type": "string"},
                                   "limit": {"type": "integer", "description": "results, 1-8"}},
                                  "query"), web.web_search, settings.timeout + 5.0,
                          progress="searching the web…"))
    description = "fetch web pages" + (" and search the web" if settings.search_backend else "")
    registry.register(Capability(name="web", group="web", description=description,
                                 tools=tuple(tools)))
    return web
