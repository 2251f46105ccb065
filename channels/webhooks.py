"""What every channel's webhook route shares: reading a body without trusting its size, and
refusing JSON nested deeper than any real update (it would exhaust Python's recursion limit in
the parsers and the store further on)."""

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


def too_deep(value: object, limit: int) -> bool:
    """Whether a JSON value nests deeper than `limit` (checked without recursion)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(current, dict):
            stack.extend((v, depth + 1) for v in current.values())
        elif isinstance(current, list):
            stack.extend((v, depth + 1) for v in current)
    return False
