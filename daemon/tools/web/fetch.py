"""GET one web page for web_fetch: http and https only, through the address guard, at most
`MAX_REDIRECTS` redirects (each one checked like the first URL), a connect and a total timeout,
and a size cap counted on the decoded body, so that a compressed bomb stops at the cap too.
A page over the cap is refused rather than cut: half a page read as the whole one misleads."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp
from yarl import URL

from daemon.core.errors import WebError, WebRefused
from daemon.tools.web.guard import Guard, GuardedResolver, literal

MAX_REDIRECTS = 5
CONNECT_TIMEOUT = 10.0
USER_AGENT = "Mozilla/5.0 (compatible; roost web_fetch)"
_REDIRECTS = (301, 302, 303, 307, 308)


@dataclass(frozen=True)
class Fetched:
    url: str  # after redirects
    status: int
    content_type: str
    charset: str | None
    body: bytes


def checked_url(text: str) -> URL:
    """The URL if it is http(s) with a host; WebRefused otherwise (file:, ftp:, data:, ...)."""
    try:
        url = URL(text.strip())
    except (ValueError, TypeError) as exc:
        raise WebRefused(f"{text!r} is not a URL") from exc
    if url.scheme not in ("http", "https") or not url.host:
        raise WebRefused(f"{text!r} is not an http:// or https:// URL; web_fetch reads only those")
    if url.user or url.password:
        raise WebRefused("a URL with a user name or password in it is not fetched")
    return url


async def fetch(text: str, guard: Guard, *, seconds: float, max_bytes: int) -> Fetched:
    """The page at `text`, or WebError (WebRefused for the guard) with a reason."""
    url = checked_url(text)
    connector = aiohttp.TCPConnector(resolver=GuardedResolver(guard), use_dns_cache=False,
                                     limit=2)
    timeouts = aiohttp.ClientTimeout(total=seconds, sock_connect=min(CONNECT_TIMEOUT, seconds))
    async with aiohttp.ClientSession(connector=connector, timeout=timeouts,
                                     headers={"User-Agent": USER_AGENT}) as session:
        try:
            async with asyncio.timeout(seconds):
                for _ in range(MAX_REDIRECTS + 1):
                    if literal(url.host or "") is not None:  # aiohttp resolves no literal
                        await guard.addresses(url.host or "", url.port or 0)
                    async with session.get(url, allow_redirects=False) as response:
                        if response.status in _REDIRECTS and "Location" in response.headers:
                            url = checked_url(str(url.join(URL(response.headers["Location"]))))
                            continue
                        return await _read(response, url, max_bytes)
        except TimeoutError:
            raise WebError(f"{url.host} did not answer within {seconds:.0f} s") from None
        except aiohttp.ClientConnectorError as exc:
            raise WebError(f"could not connect to {url.host}: {exc.os_error.strerror or exc}") \
                from None
        except aiohttp.ClientError as exc:
            raise WebError(f"fetching {url} failed: {exc}") from None
    raise WebError(f"more than {MAX_REDIRECTS} redirects; stopped at {url}")


async def _read(response: aiohttp.ClientResponse, url: URL, max_bytes: int) -> Fetched:
    if response.status >= 400:
        raise WebError(f"{url} answered {response.status} {response.reason or ''}".strip())
    too_large = WebError(f"the page is larger than {max_bytes // (1024 * 1024)} MB "
                         "(web.max_mb), so it was not read")
    if response.content_length is not None and response.content_length > max_bytes:
        raise too_large
    body = bytearray()
    async for chunk in response.content.iter_chunked(1 << 16):
        body += chunk
        if len(body) > max_bytes:
            raise too_large
    return Fetched(url=str(url), status=response.status,
                   content_type=response.content_type, charset=response.charset,
                   body=bytes(body))
