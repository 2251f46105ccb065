"""The background fold: after a turn is saved, fold old history into the rolling summary.

Rules (the pure decisions are in `daemon/context/fold.py`):

* One fold in flight per conversation; `schedule()` after a turn never waits for it.
* It never delays a turn: its model call is a background call, which waits while a turn waits and
  is cancelled (`Preempted`) when a turn needs the model; it is simply tried again later.
* It uses the chat's model and num_ctx, so Ollama never reloads the model for it.
* It re-reads the conversation before writing: if another fold won meanwhile, or the message the
  plan pinned is gone, it writes nothing. Turns append to message segments and never write the
  summary file, so a turn that landed meanwhile is never clobbered.
* A failed fold leaves the raw history as it was and is tried again after a backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from daemon.config import Settings
from daemon.context.fold import (
    FOLD_KEEP,
    fold_messages,
    folded_state,
    merge_user_notes,
    notes_need_condensing,
    parse_fold_reply,
    plan_fold,
    summary_cap_chars,
)
from daemon.context.replay import PROTECT_LAST
from daemon.conversations import SummaryState
from daemon.errors import LLMError, Preempted
from daemon.llm import ModelClient
from daemon.logs import fold_log as log
from daemon.records import Records
from daemon.store import Store

# A request that had to drop messages: keep only the messages replay always protects, so the
# next requests fit without dropping and restoring messages turn after turn.
CROWDED_KEEP = PROTECT_LAST
RETRY_AFTER_PREEMPTION = 5.0
RETRY_AFTER_FAILURE = 60.0
RETRY_MAX = 3600.0


@dataclass(frozen=True)
class FoldOutcome:
    folded: int  # messages folded by this call (0: nothing to fold or nothing written)
    state: SummaryState | None
    reason: str = ""


class Folder:
    """Runs folds in the background; see the module docstring."""

    def __init__(
        self,
        *,
        settings: Settings,
        store: Store,
        llm: ModelClient,
        records: Records,
        clock: Callable[[], float] = time.time,
        on_fold: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.llm = llm
        self.records = records
        self.clock = clock
        self.on_fold = on_fold  # told which conversation got a new summary (the search index)
        self._tasks: dict[str, asyncio.Task[FoldOutcome]] = {}
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._stopped = False
        self.calls = 0  # model calls spent on folds (for /status and the benchmark)

    def busy(self, conversation_id: str) -> bool:
        task = self._tasks.get(conversation_id)
        return task is not None and not task.done()

    def schedule(self, conversation_id: str, *, urgent: bool = False) -> None:
        """Fold the conversation in the background if it needs it; never waits.

        `urgent` (the last request had to leave messages out) folds whatever lies before the
        verbatim tail without waiting for the threshold: the summary then carries what was
        left out, and the next requests stop dropping and restoring it turn by turn.
        """
        if self._stopped or self.busy(conversation_id):
            return
        if time.monotonic() < self._retry_at.get(conversation_id, 0.0):
            return
        self._start(conversation_id, force=urgent, keep=CROWDED_KEEP if urgent else FOLD_KEEP)

    async def fold_now(self, conversation_id: str) -> FoldOutcome:
        """Fold whatever lies before the verbatim tail now (`/compact`), waiting for it."""
        running = self._tasks.get(conversation_id)
        if running is not None and not running.done():
            with contextlib.suppress(Exception):
                await running
        return await self._start(conversation_id, force=True)

    async def wait(self, conversation_id: str) -> None:
        """Wait for a fold in flight (for tests and shutdown)."""
        task = self._tasks.get(conversation_id)
        if task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task

    async def stop(self) -> None:
        self._stopped = True
        for timer in self._timers.values():
            timer.cancel()
        tasks = [t for t in self._tasks.values() if not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _start(
        self, conversation_id: str, force: bool, keep: int = FOLD_KEEP
    ) -> asyncio.Task[FoldOutcome]:
        task = asyncio.create_task(self._guarded(conversation_id, force, keep),
                                   name=f"roost-fold-{conversation_id}")
        self._tasks[conversation_id] = task
        # A finished fold is forgotten, so months of conversations do not pile up here.
        task.add_done_callback(lambda done: self._tasks.get(conversation_id) is done
                               and self._tasks.pop(conversation_id))
        return task

    async def _guarded(self, conversation_id: str, force: bool, keep: int) -> FoldOutcome:
        """The boundary of a background fold: it may fail, but never takes anything down."""
        try:
            outcome = await self._fold(conversation_id, force, keep)
        except Preempted:
            self._retry_later(conversation_id, RETRY_AFTER_PREEMPTION, urgent=force)
            return FoldOutcome(0, None, "the model was needed for a reply; will fold later")
        except Exception as exc:
            failures = self._failures.get(conversation_id, 0) + 1
            self._failures[conversation_id] = failures
            delay = min(RETRY_AFTER_FAILURE * 2 ** (failures - 1), RETRY_MAX)
            if isinstance(exc, LLMError):
                log.warning("fold of %s failed (%s); retry in %.0fs", conversation_id, exc, delay)
            else:
                log.exception("fold of %s failed; retry in %.0fs", conversation_id, delay)
            self._retry_later(conversation_id, delay, urgent=force)
            return FoldOutcome(0, None, f"the fold failed: {exc}")
        self._failures.pop(conversation_id, None)
        self._retry_at.pop(conversation_id, None)
        if outcome.folded and not force:
            # A backlog is folded a batch at a time: look again once this task is done.
            asyncio.get_running_loop().call_soon(self.schedule, conversation_id)
        return outcome

    def _retry_later(self, conversation_id: str, delay: float, *, urgent: bool) -> None:
        self._retry_at[conversation_id] = time.monotonic() + delay
        previous = self._timers.pop(conversation_id, None)
        if previous is not None:
            previous.cancel()
        loop = asyncio.get_running_loop()
        self._timers[conversation_id] = loop.call_later(delay, self._retry, conversation_id,
                                                        urgent)

    def _retry(self, conversation_id: str, urgent: bool) -> None:
        self._timers.pop(conversation_id, None)
        self._retry_at.pop(conversation_id, None)
        self.schedule(conversation_id, urgent=urgent)

    async def _fold(self, conversation_id: str, force: bool, keep: int) -> FoldOutcome:
        conversation = await asyncio.to_thread(self.store.get_conversation, conversation_id)
        if conversation is None:
            return FoldOutcome(0, None, "no such conversation")
        history = await asyncio.to_thread(self.store.messages, conversation_id)
        num_ctx = await self.llm.num_ctx()
        ratio = conversation.token_ratio
        plan = plan_fold(history, conversation.summary, num_ctx, ratio, force=force, keep=keep)
        if plan is None:
            return FoldOutcome(0, conversation.summary, "nothing to fold yet")
        notes = merge_user_notes(conversation.summary.user_notes, plan.messages)
        condense = notes_need_condensing(notes, num_ctx, ratio)
        # Room for the answer: the summary cap, and as much again for condensed notes.
        answer_tokens = summary_cap_chars(num_ctx) // 4 * (2 if condense else 1) + 64
        messages = fold_messages(
            conversation.summary, plan, notes=notes, condense_notes=condense, window=num_ctx,
            prompt_budget=num_ctx - answer_tokens, ratio=ratio,
        )
        started = time.monotonic()
        self.calls += 1
        result = await self.llm.chat(messages, num_predict=answer_tokens, background=True)
        summary, condensed = parse_fold_reply(result.content, num_ctx, condense)
        if not summary:
            raise LLMError("the model returned an empty summary")
        state = folded_state(conversation.summary, plan, summary,
                             condensed if condensed else notes, self.clock())
        written = await asyncio.to_thread(self._write_if_unchanged, conversation_id,
                                          conversation.summary, plan.through_seq,
                                          plan.through_id, state)
        if not written:
            return FoldOutcome(0, None, "the conversation changed under the fold")
        if self.on_fold is not None:
            self.on_fold(conversation_id)
        elapsed = time.monotonic() - started
        detail = (f"folded {len(plan.messages)} messages through #{plan.through_seq} "
                  f"into {len(summary):,} characters of summary (fold {state.fold_count}, "
                  f"{len(state.user_notes):,} characters of user notes"
                  f"{', condensed' if condensed else ''}, {elapsed:.1f}s)")
        await asyncio.to_thread(self.records.event, self.clock(), "fold", conversation_id, detail)
        log.info("conversation %s: %s", conversation_id, detail)
        return FoldOutcome(len(plan.messages), state)

    def _write_if_unchanged(
        self, conversation_id: str, before: SummaryState, through_seq: int, through_id: str,
        state: SummaryState,
    ) -> bool:
        current = self.store.get_conversation(conversation_id)
        if current is None or current.summary != before:
            log.info("fold of %s dropped: another fold finished first", conversation_id)
            return False
        pinned = self.store.messages(conversation_id, through_seq, through_seq)
        if not pinned or pinned[0].id != through_id:
            log.warning("fold of %s dropped: message #%d is not the one it pinned",
                        conversation_id, through_seq)
            return False
        self.store.save_summary(conversation_id, state)
        return True
