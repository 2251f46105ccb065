"""gzip for the console's pages and stylesheet, when the browser says it takes it.

A long conversation's page is mostly repeated markup, which gzip shrinks about six-fold; a
phone on a weak signal feels that. aiohttp compresses a response on its way out; left to
choose, it prefers deflate (the first coding it knows), which some clients still mishandle,
so the coding is named here: gzip, or nothing. Files (attachments) are not touched: pictures
and voice notes are compressed already.
"""

from __future__ import annotations

from aiohttp import hdrs, web
from aiohttp.web import ContentCoding

COMPRESSED_TYPES = frozenset({"text/html", "text/css"})


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header takes gzip (`gzip;q=0` refuses it)."""
    for part in accept_encoding.lower().split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip() not in ("gzip", "x-gzip"):
            continue
        q = params.strip().removeprefix("q=")
        try:
            return not params.strip().startswith("q=") or float(q) > 0
        except ValueError:
            return False
    return False


def compress(request: web.Request, response: web.StreamResponse) -> None:
    """Have `response` sent gzipped, if it is HTML or CSS and the client accepts gzip."""
    if not isinstance(response, web.Response) or response.content_type not in COMPRESSED_TYPES:
        return
    response.headers[hdrs.VARY] = hdrs.ACCEPT_ENCODING
    if accepts_gzip(request.headers.get(hdrs.ACCEPT_ENCODING, "")):
        response.enable_compression(ContentCoding.gzip)
