"""A fake of the two web search services web_search speaks to: SearXNG's JSON API
(`GET /search?q=...&format=json`, 403 for a format its settings do not enable, as SearXNG
answers) and Ollama's web search API (`POST /api/web_search` with a Bearer key, body
`{"query", "max_results"}`, answer `{"results": [{"title", "url", "content"}]}`).
Every request is recorded. `flood` set makes both answer with more than any page of
results (tests/fakes/flood.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.flood import Flood

RESULTS = [
    {"title": "Roost keeps a diary", "url": "https://example.org/diary",
     "content": "A daemon that bridges chats to a local model.", "engine": "duckduckgo"},
    {"title": "Home GPU boxes", "url": "https://example.org/gpu",
     "content": "What to run on a  home\nGPU box.", "engine": "brave"},
]
KEY = "ollama-test-key"


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any = None


@dataclass
class FakeSearch:
    results: list[dict[str, Any]] = field(default_factory=lambda: list(RESULTS))
    json_enabled: bool = True
    requests: list[Request] = field(default_factory=list)
    port: int = 0
    flood: Flood | None = None
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> FakeSearch:
        app = web.Application()
        app.router.add_get("/search", self._searxng)
        app.router.add_post("/api/web_search", self._ollama)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _searxng(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(Request("GET", request.path, dict(request.query),
                                     dict(request.headers)))
        if self.flood is not None:
            return await self.flood.send(request)
        if request.query.get("format") != "json" or not self.json_enabled:
            raise web.HTTPForbidden()
        return web.json_response({"query": request.query.get("q", ""),
                                  "number_of_results": len(self.results),
                                  "results": self.results, "answers": [], "suggestions": []})

    async def _ollama(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(Request("POST", request.path, dict(request.query),
                                     dict(request.headers), body))
        if self.flood is not None:
            return await self.flood.send(request)
        if request.headers.get("Authorization") != f"Bearer {KEY}":
            return web.json_response({"error": "unauthorized"}, status=401)
        limit = int(body.get("max_results") or 5)
        return web.json_response({"results": [
            {"title": r["title"], "url": r["url"], "content": r["content"]}
            for r in self.results[:limit]]})
