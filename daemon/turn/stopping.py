"""/stop: the part of a turn that talks to the model and runs tools, cancellable per chat.

That part runs as a task of its own (`Stops.run`), so that a stop cancels exactly it: the
streamed request to Ollama is closed (the model client leaves its stream on the cancellation and
frees its slot), and the turn goes on to save what was written. A task, not a cancel of the
chat's worker: a stop that comes just as the part ends finds the task done and changes nothing,
where a cancel of the worker would land in whatever it awaited next (the save). A shutdown
that cancels the worker cancels the part with it, and that is not a stop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from daemon.core.errors import Stopped

T = TypeVar("T")


class Stops:
    """The stoppable part of each chat's running turn."""

    def __init__(self) -> None:
        self._running: dict[str, asyncio.Task[Any]] = {}
        self._stopped: set[str] = set()

    def running(self, chat_key: str) -> bool:
        task = self._running.get(chat_key)
        return task is not None and not task.done()

    def stop(self, chat_key: str) -> bool:
        """Cancel the chat's running part; False when nothing runs (or it has just ended)."""
        task = self._running.get(chat_key)
        if task is None or task.done() or chat_key in self._stopped:
            return False
        self._stopped.add(chat_key)
        return task.cancel()

    async def run(self, chat_key: str, work: Coroutine[Any, Any, T]) -> T:
        """`work`, as the chat's stoppable part; `Stopped` when a stop cancelled it."""
        task = asyncio.create_task(work, name=f"roost-answer-{chat_key}")
        self._running[chat_key] = task
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if chat_key in self._stopped and task.cancelled() and not (
                    current is not None and current.cancelling()):
                raise Stopped(chat_key) from None
            raise
        finally:
            if self._running.get(chat_key) is task:
                del self._running[chat_key]
            self._stopped.discard(chat_key)
