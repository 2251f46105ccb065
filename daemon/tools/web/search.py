"""web_search's backends: SearXNG's JSON API (self-hosted, the home box's choice) or Ollama's
web search API (with ROOST_OLLAMA_API_KEY). Both give title, URL and snippet; the model
fetches what it needs. The backend is the owner's configured service, so these requests do
not go through the address guard (a SearXNG on the LAN is the usual case)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp

from daemon.core.bodies import MB, TooLarge, json_capped
from daemon.core.config import WebSettings
from daemon.core.errors import WebError

MAX_RESULTS = 8
SNIPPET_CHARS = 300
# A page of results is tens of KB of JSON (SearXNG's with infoboxes a few hundred); past 4 MB
# the service has gone wrong, and the rest is not read.
ANSWER_CAP = 4 * MB


@dataclass(frozen=True)
class Hit:
    title: str
    url: str
    snippet: str


async def search(settings: WebSettings, query: str, limit: int = 5) -> list[Hit]:
    """Up to `limit` results from the configured backend, or WebError with a reason."""
    limit = max(1, min(limit, MAX_RESULTS))
    timeouts = aiohttp.ClientTimeout(total=settings.timeout)
    try:
        async with aiohttp.ClientSession(timeout=timeouts) as session:
            if settings.searxng_url:
                return await _searxng(session, settings.searxng_url, query, limit)
            if settings.ollama_api_key:
                return await _ollama(session, settings, query, limit)
    except TimeoutError:
        raise WebError(f"the search service did not answer within {settings.timeout:.0f} s") \
            from None
    except aiohttp.ClientError as exc:
        raise WebError(f"the search service could not be reached: {exc}") from None
    raise WebError("no search service is configured (web.searxng_url or ROOST_OLLAMA_API_KEY)")


async def _searxng(session: aiohttp.ClientSession, base: str, query: str,
                   limit: int) -> list[Hit]:
    async with session.get(f"{base}/search", params={"q": query, "format": "json"}) as response:
        if response.status == 403:
            raise WebError("SearXNG refused the JSON format: add json to search.formats in "
                           "its settings.yml")
        body = await _json(response, "SearXNG")
    return _hits(body, limit)


async def _ollama(session: aiohttp.ClientSession, settings: WebSettings, query: str,
                  limit: int) -> list[Hit]:
    headers = {"Authorization": f"Bearer {settings.ollama_api_key}"}
    async with session.post(settings.ollama_search_url, headers=headers,
                            json={"query": query, "max_results": limit}) as response:
        if response.status in (401, 403):
            raise WebError("Ollama's web search refused the API key (ROOST_OLLAMA_API_KEY)")
        body = await _json(response, "Ollama's web search")
    return _hits(body, limit)


async def _json(response: aiohttp.ClientResponse, who: str) -> Any:
    if response.status >= 400:
        raise WebError(f"{who} answered {response.status}")
    try:
        return await json_capped(response, ANSWER_CAP)
    except TooLarge:
        raise WebError(f"{who} sent more than {ANSWER_CAP // MB} MB for one search") from None
    except ValueError as exc:
        raise WebError(f"{who} sent something that is not JSON") from exc


def _hits(body: Any, limit: int) -> list[Hit]:
    results = body.get("results") if isinstance(body, dict) else None
    if not isinstance(results, list):
        raise WebError("the search service sent no result list")
    hits = []
    for item in results:
        if not isinstance(item, dict) or not isinstance(item.get("url"), str):
            continue
        snippet = " ".join(str(item.get("content") or "").split())
        hits.append(Hit(title=" ".join(str(item.get("title") or "").split()),
                        url=item["url"], snippet=snippet[:SNIPPET_CHARS]))
        if len(hits) == limit:
            break
    return hits
