"""What every channel's webhook route shares: reading a body without trusting its size."""

from __future__ import annotations

from aiohttp import web


async def read_at_most(request: web.Request, limit: int) -> bytes | None:
    """The body, or None once it grows past `limit` (a chunked body has no Content-Length)."""
    if request.content_length is not None and request.content_length > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
