"""What nio answers, as roost's errors: which refusals are final and which are worth a retry.

nio returns an `ErrorResponse` (with the Matrix `errcode` as `status_code` and the HTTP status
on `transport_response`) instead of raising; a connection that fails raises aiohttp's or
asyncio's errors once nio's own retries (`AsyncClientConfig.max_timeouts`) are spent. nio waits
out a 429 itself, `retry_after_ms` honoured, up to `max_limit_exceeded` times; one still limited
after that is a retryable `DeliveryError`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import aiohttp
from nio import ErrorResponse, LocalProtocolError, SendRetryError  # type: ignore[import-untyped]

from daemon.core.errors import DeliveryError

# The errcodes that mean the bot may not write in that room (any more): kicked, banned, or the
# person left their direct room. Retrying cannot help; the engine marks the chat.
_CHAT_REFUSED = frozenset({"M_FORBIDDEN", "M_NOT_FOUND"})
# The content itself was refused: this reply cannot go out in any form.
_CONTENT_REFUSED = frozenset({"M_TOO_LARGE", "M_BAD_JSON", "M_NOT_JSON", "M_INVALID_PARAM"})

# Raised by aiohttp or asyncio when the homeserver cannot be reached or stops answering.
NETWORK_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, TimeoutError, OSError)

def status_of(response: ErrorResponse) -> int | None:
    transport = response.transport_response
    return transport.status if transport is not None else None


def delivery_error(response: ErrorResponse, what: str) -> DeliveryError:
    """An error response as the engine's DeliveryError: permanent when retrying cannot help."""
    code = response.status_code or ""
    status = status_of(response)
    said = f"the homeserver refused {what}: {code or status} {response.message}".rstrip()
    if code in _CHAT_REFUSED or status == 403:
        return DeliveryError(said, permanent=True, chat_blocked=True)
    if code in _CONTENT_REFUSED or status == 413:
        return DeliveryError(said, permanent=True)
    if code == "M_LIMIT_EXCEEDED" or status == 429:
        wait = f" (asked to wait {response.retry_after_ms} ms)" if response.retry_after_ms else ""
        return DeliveryError(f"the homeserver is rate-limiting roost{wait}")
    return DeliveryError(said)


def checked(response: Any, what: str) -> Any:
    """The response, or the DeliveryError its refusal means."""
    if isinstance(response, ErrorResponse):
        raise delivery_error(response, what)
    return response


@contextlib.contextmanager
def network_errors(what: str) -> Iterator[None]:
    """A homeserver that cannot be reached, as a retryable DeliveryError; nio's own refusals
    to encrypt (devices not known yet) likewise, since the next sync usually settles them."""
    try:
        yield
    except NETWORK_ERRORS as exc:
        raise DeliveryError(f"cannot reach the homeserver to send {what}: {exc!r}") from exc
    except (SendRetryError, LocalProtocolError) as exc:
        raise DeliveryError(f"cannot send {what} yet: {exc}") from exc
