"""Try twice, then set aside: the one quarantine of roost's stored queues.

The durable intake (a channel's payloads) and the engine (a chat's inbox and outbox) both process
items that are on disk. An item whose processing raises is tried once more; when it fails again
it is moved to the store's quarantine with its error (`roost doctor` lists it) and its queue
carries on without it, so that no stored item can stop a chat or the daemon starting. A full or
failing disk is not the item's fault: callers retry a StoreError themselves and never count it
here. Here, and not in the engine, because the intake may not import the engine.

A payload of the intake set aside this way was a message someone sent: the channel tells its
sender `UNREADABLE` (when the chat is one roost answers and the sender may talk), so that nobody
waits for an answer that will not come; the payload itself stays for the owner.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from daemon.core.errors import StoreError
from daemon.core.logs import outside
from daemon.store import Store

ATTEMPTS = 2  # an item that fails this often is quarantined
UNREADABLE = "I could not read that message."


def error_text(exc: BaseException) -> str:
    """The error as the quarantine records it: its type and message, no traceback."""
    return "".join(traceback.format_exception_only(exc)).strip()


async def set_aside(store: Store, kind: str, items: Sequence[tuple[str, Mapping[str, Any]]],
                    error: str, now: float, done: Callable[[], None], what: str,
                    log: logging.Logger) -> bool:
    """Move `items` (id, document) of `kind` to the quarantine with `error`, then `done()` (on
    the same worker thread) takes them off their queue. False, logged, when the store refuses:
    they stay where they were, to be tried again later."""

    def move() -> None:
        for key, doc in items:
            store.quarantine_add(kind, key, doc, error, now)
        done()

    try:
        await asyncio.to_thread(move)
    except StoreError as exc:
        log.error("cannot quarantine %s (%s); it stays pending, tried again later", what, exc)
        return False
    log.error("%s quarantined: %s", what, outside(error))  # the error may quote the payload
    return True
