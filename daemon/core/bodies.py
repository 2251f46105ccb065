"""Reading an HTTP answer from outside with a cap on its size.

`response.read()` and `response.json()` take whatever a server sends into memory before anyone
can look at its size: a speech or search server gone wrong (or hostile) answering 50 MB costs
50 MB and the time to receive it, and one answering without end costs everything. So every
body roost reads from another server goes through `read_capped`: it refuses at once an answer
whose declared length is past the cap, reads the rest in bounded chunks, and stops (closing the
connection, never draining it) the moment one more chunk would pass the cap. The caller says
what the cap is and what the user hears when it is passed.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

import aiohttp

from daemon.core.errors import RoostError

CHUNK = 64 * 1024
MB = 1024 * 1024
_REASONS = {status.value: status.phrase for status in HTTPStatus}


async def read_capped(response: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The body, or None when it is longer than `limit` bytes (then the connection is closed
    with the rest unread)."""
    if response.content_length is not None and response.content_length > limit:
        response.close()
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(CHUNK):
        size += len(chunk)
        if size > limit:
            response.close()  # the rest stays unread: not drained into the connection pool
            return None
        chunks.append(chunk)
    return b"".join(chunks)


class TooLarge(RoostError, ValueError):
    """A JSON answer past its cap (a ValueError, as a body that is not JSON is)."""


async def json_capped(response: aiohttp.ClientResponse, limit: int) -> Any:
    """The body as JSON; TooLarge past `limit` bytes, ValueError when it is not JSON."""
    body = await read_capped(response, limit)
    if body is None:
        raise TooLarge(f"an answer larger than {limit / MB:g} MB")
    return json.loads(body)


def answered(where: str, status: int, problem: str) -> str:
    """`where answered STATUS: problem`, the problem left out where it only repeats the status
    (aiohttp's and many servers' plain-text error pages are "404: Not Found")."""
    words = problem.strip()
    redundant = words.lower().removeprefix(str(status)).strip(" :-").lower()
    if not words or redundant in ("", _REASONS.get(status, "").lower()):
        reason = _REASONS.get(status)
        return f"{where} answered {status}" + (f" {reason}" if reason else "")
    return f"{where} answered {status}: {words}"
