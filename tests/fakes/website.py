"""A loopback web site for web_fetch: a real article, a redirect chain, a redirect loop, a
20 MB page (and one gzipped to 20 KB), a page that never answers, and redirects to places the
guard must refuse.

It listens on 127.0.0.1; `also_on("127.0.0.2")` starts a second listener on another loopback
address, the "private service" a redirect must not reach (it records every request, so a
test can show that nothing arrived). Every request is recorded as (host, path).
"""

from __future__ import annotations

import asyncio
import gzip
from pathlib import Path

from aiohttp import web

ARTICLE = (Path(__file__).resolve().parents[1] / "fixtures" / "web" /
           "wikipedia-tsne.html").read_bytes()
BIG = 20 * 1024 * 1024


class FakeSite:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.requests: list[tuple[str, str]] = []
        self.release = asyncio.Event()  # the slow page answers once this is set
        self.private_port = 0  # the port of the second listener, once started
        self._runners: list[web.AppRunner] = []
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/article", self._article)
        app.router.add_get("/plain.txt", self._plain)
        app.router.add_get("/file.zip", self._binary)
        app.router.add_get("/hop/{n}", self._hop)
        app.router.add_get("/loop", self._loop)
        app.router.add_get("/big", self._big)
        app.router.add_get("/bomb", self._bomb)
        app.router.add_get("/slow", self._slow)
        app.router.add_get("/missing", self._missing)
        app.router.add_get("/to/{where}", self._to)
        app.router.add_get("/secret", self._secret)
        return app

    async def start(self) -> None:
        self.port = await self._listen(self.host, 0)

    async def also_on(self, host: str) -> str:
        """Listen on another loopback address too; its base URL."""
        self.private_port = await self._listen(host, 0)
        return f"http://{host}:{self.private_port}"

    async def _listen(self, host: str, port: int) -> int:
        runner = web.AppRunner(self._app(), shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        self._runners.append(runner)
        return int(runner.addresses[0][1])

    async def stop(self) -> None:
        self.release.set()
        for runner in reversed(self._runners):
            await runner.cleanup()

    async def __aenter__(self) -> FakeSite:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def _record(self, request: web.Request) -> None:
        self.requests.append((request.host, request.path_qs))

    async def _article(self, request: web.Request) -> web.Response:
        self._record(request)
        return web.Response(body=ARTICLE, content_type="text/html", charset="utf-8")

    async def _plain(self, request: web.Request) -> web.Response:
        self._record(request)
        return web.Response(text="just some text\nover two lines\n")

    async def _binary(self, request: web.Request) -> web.Response:
        self._record(request)
        return web.Response(body=b"PK\x03\x04" + bytes(100), content_type="application/zip")

    async def _hop(self, request: web.Request) -> web.Response:
        self._record(request)
        n = int(request.match_info["n"])
        raise web.HTTPFound("/article" if n <= 1 else f"/hop/{n - 1}")

    async def _loop(self, request: web.Request) -> web.Response:
        self._record(request)
        raise web.HTTPFound("/loop")

    async def _big(self, request: web.Request) -> web.StreamResponse:
        self._record(request)
        response = web.StreamResponse(headers={"Content-Type": "text/html"})
        await response.prepare(request)  # chunked: no Content-Length to refuse it early by
        chunk = b"<p>" + b"x" * 65_530 + b"</p>"
        try:
            for _ in range(BIG // len(chunk) + 1):
                await response.write(chunk)
        except (ConnectionResetError, RuntimeError):
            pass  # the client stopped reading at its cap, as it should
        return response

    async def _bomb(self, request: web.Request) -> web.Response:
        """20 MB of HTML in about 20 KB of gzip: the cap must count what it unpacks to."""
        self._record(request)
        body = gzip.compress(b"<p>" + b" " * BIG + b"</p>", compresslevel=9)
        return web.Response(body=body, headers={"Content-Type": "text/html",
                                                "Content-Encoding": "gzip"})

    async def _slow(self, request: web.Request) -> web.Response:
        self._record(request)
        await self.release.wait()
        return web.Response(text="too late")

    async def _missing(self, request: web.Request) -> web.Response:
        self._record(request)
        raise web.HTTPNotFound()

    async def _to(self, request: web.Request) -> web.Response:
        """Redirect to `?url=` (the test names the refused place)."""
        self._record(request)
        raise web.HTTPFound(request.query["url"])

    async def _secret(self, request: web.Request) -> web.Response:
        self._record(request)
        return web.Response(text="the router admin password is hunter2")
