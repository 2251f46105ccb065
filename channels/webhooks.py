"""What every channel's webhook route shares: reading a body without trusting its size."""

from __future__ import annotations

from aiohttp import web


async def read_at_most(request: web.Request, limit: int) -> bytes | None:
    """The body, or None when it is larger than `limit` (a chunked body has no
    Content-Length). The HTTP guard has read it already, within the app's client_max_size and
    its deadline; this is the channel's own, smaller limit."""
    if request.content_length is not None and request.content_length > limit:
        return None
    body = await request.read()
    return None if len(body) > limit else body
