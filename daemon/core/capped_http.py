"""A cap on each answer read through the HTTP clients roost does not read itself: httpx under the
ollama client and python-telegram-bot, httpx2 under the MCP SDK.

It is `bodies.read_capped` for those libraries: an answer whose declared length is past the cap
is refused before its body is read, and otherwise its bytes are counted as the library reads
them, the read failing the moment they pass the cap (the rest unread, the connection closed).
The failure is the library's own `DecodingError` (an `HTTPError`), so each library reports it
as it reports an answer it cannot read: a server gone wrong costs at most the cap, never a
crash. `too_large` tells it apart where the user should hear why.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import httpx

from daemon.core.bodies import MB

MARK = "roost_too_large"  # set on the error, which each library wraps in its own


def too_large(exc: BaseException | None) -> bool:
    """Whether `exc`, or an error it was raised from, is a capped answer's refusal."""
    seen = 0
    while exc is not None and seen < 8:
        if getattr(exc, MARK, False):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def capped_transport(limit: int, http: ModuleType = httpx, **transport: Any) -> Any:
    """A transport of `http` (httpx, or the MCP SDK's httpx2: same interface) whose answers are
    held to `limit` bytes; `transport` goes to its `AsyncHTTPTransport` (limits, http2...)."""
    capped, _ = _classes(http)
    return capped(limit, http.AsyncHTTPTransport(**transport))


def _refusal(http: ModuleType, limit: int, request: Any) -> Exception:
    error: Exception = http.DecodingError(
        f"an answer larger than {limit / MB:g} MB from {request.url.host} (not read)",
        request=request)
    setattr(error, MARK, True)
    return error


@functools.cache
def _classes(http: ModuleType) -> tuple[Any, Any]:
    """The capped transport and stream, as subclasses of `http`'s own (its clients call their
    methods, `__aenter__` and the like, and check a stream's class)."""

    class CappedTransport(http.AsyncBaseTransport):  # type: ignore[name-defined]
        def __init__(self, limit: int, inner: Any) -> None:
            self._limit, self._inner = limit, inner

        async def handle_async_request(self, request: Any) -> Any:
            response = await self._inner.handle_async_request(request)
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self._limit:
                await response.aclose()
                raise _refusal(http, self._limit, request)
            response.stream = CappedStream(response.stream, self._limit, request)
            return response

        async def aclose(self) -> None:
            await self._inner.aclose()

    class CappedStream(http.AsyncByteStream):  # type: ignore[name-defined]
        def __init__(self, inner: Any, limit: int, request: Any) -> None:
            self._inner, self._limit, self._request = inner, limit, request

        async def __aiter__(self) -> AsyncIterator[bytes]:
            size = 0
            async for chunk in self._inner:
                size += len(chunk)
                if size > self._limit:
                    await self._inner.aclose()
                    raise _refusal(http, self._limit, self._request)
                yield chunk

        async def aclose(self) -> None:
            await self._inner.aclose()

    return CappedTransport, CappedStream
