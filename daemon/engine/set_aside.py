"""What each chat's worker is doing, so that an item that fails twice (an outbox item, or the
inbox items of a turn) is set aside in the store's quarantine and the chat carries on."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from daemon.core.logs import turn_log as log
from daemon.intake.quarantine import ATTEMPTS, error_text, set_aside
from daemon.store import Store
from daemon.turn.runner import Notify


class SetAside:
    """See the module docstring; `notify` tells a chat its message was set aside."""

    def __init__(self, store: Store, clock: Callable[[], float], notify: Notify) -> None:
        self.store = store
        self.clock = clock
        self.notify = notify
        self._current: dict[str, tuple[str, list[dict[str, Any]]]] = {}

    def doing(self, chat_key: str, kind: str, docs: list[dict[str, Any]]) -> None:
        self._current[chat_key] = (kind, docs)

    def done(self, chat_key: str) -> None:
        self._current.pop(chat_key, None)

    def what(self, chat_key: str) -> str:
        return self._current.get(chat_key, ("nothing",))[0]

    @contextlib.contextmanager
    def aside(self, chat_key: str) -> Iterator[None]:
        """Around a flush from inside a turn (a notice): what the worker was doing before is
        what it is doing again after, unless the flush raises (then its item is the culprit)."""
        previous = self._current.get(chat_key)
        yield
        if previous is None:
            self._current.pop(chat_key, None)
        else:
            self._current[chat_key] = previous

    async def failed(self, chat_key: str, exc: Exception, attempt: int) -> bool:
        """What the worker was doing failed (its `attempt`-th try); at the last try it is set
        aside. True when it could not be: the worker backs off rather than spin on it."""
        log.error("chat %s: processing %s failed (attempt %d of %d)", chat_key,
                  self.what(chat_key), attempt, ATTEMPTS, exc_info=exc)
        if attempt < ATTEMPTS:
            return False
        try:
            return not await self.set_aside(chat_key, exc)
        except Exception:  # still the boundary: the worker outlives this too
            log.exception("chat %s: quarantining failed", chat_key)
            return True

    async def set_aside(self, chat_key: str, exc: Exception) -> bool:
        """Quarantine what failed twice; False when it could not be."""
        current = self._current.get(chat_key)
        if current is None:
            return False
        kind, docs = current
        ids = [str(doc["id"]) for doc in docs]

        def done() -> None:
            if kind == "outbox":
                self.store.outbox_done(ids[0])
            else:
                self.store.inbox_done(ids)

        if not await set_aside(self.store, kind, list(zip(ids, docs, strict=True)),
                               error_text(exc), self.clock(), done,
                               f"{len(docs)} {kind} items of {chat_key} (failed twice)", log):
            return False
        if kind == "inbox":
            try:
                await self.notify(chat_key, (
                    "Something went wrong inside roost while answering. Please try again."))
            except Exception:  # still the worker's boundary: the chat may be what is broken
                log.exception("chat %s: telling the user of the quarantine failed", chat_key)
        return True
