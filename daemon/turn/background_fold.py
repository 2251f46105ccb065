"""The background fold: after a turn is saved, fold old history into the rolling summary.

Rules (the pure decisions are in `daemon/context/fold.py`):

* One fold in flight per conversation; `schedule()` after a turn never waits for it.
* A fold that can wait never delays a turn: its model call is a background call, which waits
  while a turn waits and is cancelled (`Preempted`) when a turn needs the model.
* A fold that cannot wait always lands: once a conversation's request reached its budget
  (`schedule(urgent=True)`), the fold is owed, and unless a background try lands it first, the
  chat's next turn runs it (`land()`) before building its request when the model is otherwise
  idle. While other chats are answered, that turn goes on without it (leaving messages out) and
  the fold then goes in the lane: queued with the turns' calls, never preempted, one fold at a
  time, so that a waiting turn has at most one fold call ahead of it and under any load a busy
  chat's folds still land.
* Folds never think (`think: false`): a thinking model would spend the answer's tokens on thought.
* It uses the conversation's model and num_ctx (`daemon.turn.models`: a chat's /model, an
  automation's own), so Ollama never reloads the model for it and it is sized for that window,
  and the conversation's host (`daemon.turn.routes`: with several Ollama hosts, the one its
  turns go to).
* It re-reads the conversation before writing: if another fold won meanwhile, or the message the
  plan pinned is gone, it writes nothing. Turns append to message segments and never write the
  summary file, so a turn that landed meanwhile is never clobbered.
* Its answer is checked first (`fold_problem`): one cut at its limit is asked again with more
  room, and an empty one, an echo of the prompt or of roost's instructions, or one that is no
  summary of its messages is not stored but tried again later. Condensed notes that are not
  the user's own words (`notes_problem`) are not used: the notes stay the user's messages.
* A failed fold leaves the raw history as it was and is tried again after a backoff, for as
  long as its conversation is active; once it is archived, no more.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from daemon.context.budget import Vocabulary, vocabulary_of
from daemon.context.fold import (
    fold_messages,
    fold_problem,
    folded_state,
    merge_user_notes,
    notes_cap_tokens,
    notes_need_condensing,
    notes_problem,
    parse_fold_reply,
    plan_fold,
    summary_cap_tokens,
    trim_notes,
    whole_sentences,
)
from daemon.core.config import Settings
from daemon.core.conversations import Conversation, Message, SummaryState
from daemon.core.errors import LLMError, Preempted, StoreError
from daemon.core.logs import fold_log as log
from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.store.event_log import Records
from daemon.turn.models import model_of
from daemon.turn.routes import route_of

FOLD_PROMPT_SHARE = 4
COMPACT_MAX_FOLDS = 12  # /compact folds at most this many batches at once (as Flint's @compact)
LENGTH_RETRY_ROOM = 2  # a fold cut at its limit is asked again with twice the room
RETRY_AFTER_PREEMPTION = 5.0
RETRY_AFTER_FAILURE = 60.0
RETRY_MAX = 3600.0


@dataclass(frozen=True)
class FoldOutcome:
    folded: int  # messages folded by this call (0: nothing to fold or nothing written)
    state: SummaryState | None
    reason: str = ""
    folds: int = 0  # folds that landed (more than one for /compact)
    more: bool = False  # /compact stopped at its most folds with more left to fold


class BackgroundFold:
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
        retry_after_failure: float = RETRY_AFTER_FAILURE,
    ) -> None:
        self.settings = settings
        self.store = store
        self.llm = llm
        self.records = records
        self.clock = clock
        self.fold_call = FoldCall(settings=settings, store=store, llm=llm, records=records,
                                  clock=clock, on_fold=on_fold)
        self.retry_after_failure = retry_after_failure  # the first pause; doubled up to RETRY_MAX
        self._tasks: dict[str, asyncio.Task[FoldOutcome]] = {}
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._owed: set[str] = set()  # conversations whose next turn must fold first
        self._landing: dict[str, int] = {}  # turns waiting in `land` for the fold in flight
        # An owed fold waits for a quiet model rather than delay other chats (`land`); off,
        # it always lands first (the bench's baseline).
        self.defer_when_busy = True
        # Held by the one owed fold among the turns' calls (`_owed_fold`), so that a turn that
        # waits has at most one fold call ahead of it: folds that come later queue behind it.
        self._turnstile = asyncio.Lock()
        self.turns_without_owed_fold = 0  # for the benchmark: they left messages out
        self._went_on: set[str] = set()  # conversations whose turn went on without its fold
        self._stopped = False

    @property
    def calls(self) -> int:
        """Model calls spent on folds (for /status and the benchmark)."""
        return self.fold_call.calls

    def busy(self, conversation_id: str) -> bool:
        task = self._tasks.get(conversation_id)
        return task is not None and not task.done()

    def retry_pending(self, conversation_id: str) -> bool:
        """Whether a failed or preempted fold of the conversation waits to be tried again."""
        return conversation_id in self._timers

    def schedule(self, conversation_id: str, *, urgent: bool = False) -> None:
        """Fold the conversation in the background if it needs it; never waits.

        `urgent` (the last request reached its budget, or nearly) folds down to the low-water
        mark without waiting for the high-water mark, and makes the fold owed: if no background
        try lands it, the chat's next turn does (`land`).
        """
        if urgent:
            self._owed.add(conversation_id)
        if self._stopped or self.busy(conversation_id):
            return
        if self._pausing(conversation_id):
            return
        if conversation_id in self._went_on and conversation_id in self._owed:
            # Its turn went on without the fold it owed (`land`): the fold goes in the lane,
            # now that the turn is answered, behind it rather than ahead of it.
            self._went_on.discard(conversation_id)
            self._start(conversation_id, force=True, lane=True)
            return
        self._start(conversation_id, force=urgent)

    def owes(self, conversation_id: str) -> bool:
        return conversation_id in self._owed

    def waiting_to_land(self, conversation_id: str) -> bool:
        """Whether a turn waits in `land` for the conversation's fold in flight (a test of a
        cancellation there waits on this, so that it cannot pass before the wait began)."""
        return conversation_id in self._landing

    async def land(self, conversation_id: str) -> FoldOutcome:
        """Run an owed fold now, as part of the chat's own turn (the caller holds the turn's
        model hold, so the call is not preempted), unless other chats are being answered: then
        the turn goes on without it, as it does while other folds wait in the fold lane, and
        its fold goes there once the turn is answered (`schedule`, `_owed_fold`). A failure is
        logged and the turn goes on: its request still fits, by leaving messages out."""
        if self.defer_when_busy and (self.llm.gate.others_answering()
                                     or self._turnstile.locked()):
            # Their replies do not wait for this chat's fold (issue 48: one turn a chat waited
            # 60 s behind 20 folds), nor does this turn wait for the folds in the lane: it
            # leaves messages out once more.
            self.turns_without_owed_fold += 1
            self._went_on.add(conversation_id)  # `schedule` puts the fold in the lane
            return FoldOutcome(0, None, "other chats are being answered; it folds in the lane")
        running = self._tasks.get(conversation_id)
        if running is not None and not running.done():
            # asyncio.wait, not await: the fold's own end (even cancelled) is not ours, but a
            # cancellation of this turn (shutdown, /stop) must stop it here, not run a fold.
            self._landing[conversation_id] = self._landing.get(conversation_id, 0) + 1
            try:
                await asyncio.wait([running])
            finally:
                if left := self._landing.pop(conversation_id) - 1:
                    self._landing[conversation_id] = left
        if conversation_id not in self._owed:
            return FoldOutcome(0, None, "a background fold landed it")
        if self._pausing(conversation_id):
            # Its last try failed (a small model that echoes the prompt fails every time):
            # each turn paying a whole fold call for it made every reply slow. The try after
            # the pause comes in the background, or from the first turn after it.
            return FoldOutcome(0, None, "its last try failed; tried again later")
        try:
            outcome = await self._owed_fold(conversation_id)
        except LLMError as exc:
            failures = self._failures.get(conversation_id, 0) + 1
            self._failures[conversation_id] = failures
            delay = min(self.retry_after_failure * 2 ** (failures - 1), RETRY_MAX)
            log.warning("owed fold of %s failed (%s); the turn goes on, retry in %.0fs",
                        conversation_id, exc, delay)
            self._retry_later(conversation_id, delay, urgent=True)
            return FoldOutcome(0, None, f"the fold failed: {exc}")
        self._settled(conversation_id)
        self._retry_at.pop(conversation_id, None)
        return outcome

    async def fold_now(self, conversation_id: str) -> FoldOutcome:
        """Fold everything but the newest exchange now (`/compact`), waiting for it: one fold
        after another (each takes at most a batch) until nothing is left to fold, at most
        `COMPACT_MAX_FOLDS`. The outcome counts them all; its reason says why it stopped
        when a fold did not land."""
        folded = folds = 0
        last: FoldOutcome | None = None
        while folds < COMPACT_MAX_FOLDS:
            running = self._tasks.get(conversation_id)
            if running is not None and not running.done():
                # asyncio.wait, not await: that fold is its own boundary (`_guarded` logs how
                # it failed), and its end is not this call's.
                await asyncio.wait([running])
            last = await self._start(conversation_id, force=True, keep_tokens=0)
            if not last.folded:
                break
            folded += last.folded
            folds += 1
        assert last is not None
        more = folds == COMPACT_MAX_FOLDS
        # A fold that did not land has no state; "nothing to fold yet" is the loop's end.
        stopped = not folded or (not last.folded and last.state is None)
        return FoldOutcome(folded, last.state, last.reason if stopped else "", folds=folds,
                           more=more)

    async def wait(self, conversation_id: str) -> None:
        """Wait for a fold in flight (for tests and shutdown)."""
        task = self._tasks.get(conversation_id)
        if task is not None:
            await asyncio.wait([task])  # as in land: our own cancellation is not suppressed

    async def stop(self, unwind: float = 2.0) -> None:
        """Cancel the folds in flight (a fold writes nothing until it is complete) and wait up
        to `unwind` seconds for them to finish."""
        self._stopped = True
        for timer in self._timers.values():
            timer.cancel()
        tasks = [t for t in self._tasks.values() if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=unwind)
            if pending:
                log.warning("%d folds did not stop within %.1fs of being cancelled",
                            len(pending), unwind)

    def _start(
        self, conversation_id: str, force: bool, keep_tokens: int | None = None,
        retry: bool = False, lane: bool = False,
    ) -> asyncio.Task[FoldOutcome]:
        task = asyncio.create_task(
            self._guarded(conversation_id, force, keep_tokens, retry, lane),
            name=f"roost-fold-{conversation_id}")
        self._tasks[conversation_id] = task
        # A finished fold is forgotten, so months of conversations do not pile up here.
        task.add_done_callback(lambda done: self._tasks.get(conversation_id) is done
                               and self._tasks.pop(conversation_id))
        return task

    async def _guarded(
        self, conversation_id: str, force: bool, keep_tokens: int | None, retry: bool = False,
        lane: bool = False,
    ) -> FoldOutcome:
        """The boundary of a background fold: it may fail, but never takes anything down."""
        if retry and not await self._retry_wanted(conversation_id):
            return FoldOutcome(0, None, "the conversation is archived; not retried")
        try:
            if lane:
                outcome = await self._owed_fold(conversation_id)
            else:
                outcome = await self.fold_call.fold(conversation_id, force, keep_tokens)
        except Preempted:
            if await self._retry_wanted(conversation_id):
                self._retry_later(conversation_id, RETRY_AFTER_PREEMPTION, urgent=force)
            return FoldOutcome(0, None, "the model was needed for a reply; will fold later")
        except Exception as exc:
            if not await self._retry_wanted(conversation_id, failed=exc):
                return FoldOutcome(0, None, f"the fold failed: {exc}; not retried")
            failures = self._failures.get(conversation_id, 0) + 1
            self._failures[conversation_id] = failures
            delay = min(self.retry_after_failure * 2 ** (failures - 1), RETRY_MAX)
            if isinstance(exc, LLMError):
                log.warning("fold of %s failed (%s); retry in %.0fs", conversation_id, exc, delay)
            else:
                log.exception("fold of %s failed; retry in %.0fs", conversation_id, delay)
            self._retry_later(conversation_id, delay, urgent=force)
            return FoldOutcome(0, None, f"the fold failed: {exc}")
        self._failures.pop(conversation_id, None)
        self._retry_at.pop(conversation_id, None)
        if force:
            self._settled(conversation_id)
        if outcome.folded and not force:
            # A backlog is folded a batch at a time: look again once this task is done.
            asyncio.get_running_loop().call_soon(self.schedule, conversation_id)
        return outcome

    async def _owed_fold(self, conversation_id: str) -> FoldOutcome:
        """An owed fold, landed by the chat's turn (`land`) or in the lane (a chat whose turn
        went on without it): it queues with the turns' calls and is not preempted, so it lands
        however busy the model stays (queued behind every call that waits, the fold of a busy
        chat waited for a gap that never came); one at a time (`_turnstile`, first come first
        served), so that each turn waiting for the model has at most this one fold call ahead
        of it. Without `defer_when_busy` (the bench's baseline) they do not take turns."""
        async with self._turnstile if self.defer_when_busy else contextlib.nullcontext():
            return await self.fold_call.fold(conversation_id, force=True, keep_tokens=None,
                                             foreground=True)

    def _settled(self, conversation_id: str) -> None:
        """An owed fold landed: nothing is owed, and a preempted try's retry is needless."""
        self._owed.discard(conversation_id)
        timer = self._timers.pop(conversation_id, None)
        if timer is not None:
            timer.cancel()

    def _pausing(self, conversation_id: str) -> bool:
        """Whether its last fold failed and the pause before the next try is not over."""
        return bool(self._failures.get(conversation_id)
                    and time.monotonic() < self._retry_at.get(conversation_id, 0.0))

    async def _retry_wanted(self, conversation_id: str,
                            failed: BaseException | None = None) -> bool:
        """Whether a fold that did not land is worth another try: only while its conversation
        is active. An archived one gets no more turns, so nothing is owed to it, and retrying
        a fold that keeps failing would call the model every hour for ever."""
        try:
            conversation = await asyncio.to_thread(self.store.get_conversation, conversation_id)
        except StoreError as exc:  # cannot tell: retry as before, the next try looks again
            log.warning("fold of %s: cannot read its conversation (%s)", conversation_id, exc)
            return True
        if conversation is not None and conversation.status == "active":
            return True
        self._failures.pop(conversation_id, None)
        self._owed.discard(conversation_id)
        why = f" (it failed: {failed})" if failed is not None else ""
        log.info("fold of %s not retried: the conversation is %s%s", conversation_id,
                 "archived" if conversation is not None else "gone", why)
        return False

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
        if urgent:
            self._owed.add(conversation_id)
        if self._stopped or self.busy(conversation_id):
            return
        self._start(conversation_id, force=urgent, retry=True)  # checks it is still active


class FoldCall:
    """One fold: read the conversation, plan, ask the model, check its answer, and write the
    summary if nothing changed meanwhile. `on_fold` is told which conversation got a new
    summary (the search index)."""

    def __init__(self, *, settings: Settings, store: Store, llm: ModelClient, records: Records,
                 clock: Callable[[], float], on_fold: Callable[[str], None] | None) -> None:
        self.settings = settings
        self.store = store
        self.llm = llm
        self.records = records
        self.clock = clock
        self.on_fold = on_fold
        self.calls = 0  # model calls spent on folds (for /status and the benchmark)

    async def fold(
        self, conversation_id: str, force: bool, keep_tokens: int | None,
        foreground: bool = False,
    ) -> FoldOutcome:
        conversation = await asyncio.to_thread(self.store.get_conversation, conversation_id)
        if conversation is None:
            return FoldOutcome(0, None, "no such conversation")
        history = await asyncio.to_thread(self.store.messages, conversation_id)
        with self.llm.routing(*route_of(conversation, history)):
            return await self._fold(conversation, history, force, keep_tokens, foreground)

    async def _fold(
        self, conversation: Conversation, history: list[Message], force: bool,
        keep_tokens: int | None, foreground: bool,
    ) -> FoldOutcome:
        conversation_id = conversation.id
        model = await asyncio.to_thread(model_of, self.store, self.settings,
                                        conversation.chat_key)
        num_ctx = await self.llm.num_ctx(model)
        ratio = conversation.token_ratio
        vocabulary = vocabulary_of((await self.llm.model_info(model)).vocabulary_size)
        plan = plan_fold(history, conversation.summary, num_ctx, ratio, force=force,
                         keep_tokens=keep_tokens, vocabulary=vocabulary)
        if plan is None:
            return FoldOutcome(0, conversation.summary, "nothing to fold yet")
        # The first user message is not copied: every request carries it whole (replay).
        first_seq = next((m.seq for m in history if m.role == "user"), None)
        notes = merge_user_notes(conversation.summary.user_notes, plan.messages, first_seq,
                                 self.settings.daemon.tz)
        condense = notes_need_condensing(notes, num_ctx, ratio, vocabulary)
        # Room for the answer: the summary's cap, and the notes' cap when they are condensed.
        answer_tokens = (summary_cap_tokens(num_ctx) + (notes_cap_tokens(num_ctx) if condense
                                                        else 0) + 64)
        # The prompt is held to a quarter of the window: a fold evaluates all of it uncached,
        # so its size is most of what a fold costs. Excerpts carry the gist, the store the rest.
        messages = fold_messages(
            conversation.summary, plan, notes=notes, condense_notes=condense, window=num_ctx,
            prompt_budget=min(num_ctx // FOLD_PROMPT_SHARE, num_ctx - answer_tokens), ratio=ratio,
            vocabulary=vocabulary,
        )
        started = time.monotonic()
        reply = await self._answer(conversation_id, model, messages, answer_tokens, foreground)
        summary, condensed = await self._checked(conversation_id, parse_fold_reply(
            reply, num_ctx, condense, ratio), messages, conversation.summary.summary, notes)
        kept_notes = await self._kept_notes(conversation_id, condensed or notes, num_ctx, ratio,
                                            vocabulary)
        state = folded_state(conversation.summary, plan, summary, kept_notes, self.clock())
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
        return FoldOutcome(len(plan.messages), state, folds=1)

    async def _checked(self, conversation_id: str, answer: tuple[str, str | None],
                       prompt: list[dict[str, str]], previous: str,
                       notes: str) -> tuple[str, str | None]:
        """The fold's (summary, condensed notes) once checked: a summary that must not be
        stored (`fold_problem`) raises, and the fold is tried again later; condensed notes not
        drawn from the user's own (`notes_problem`) are dropped, since they go under "in my
        own words": the notes then stay the user's messages (trimmed to their cap)."""
        summary, condensed = answer
        problem = fold_problem(summary, prompt, previous)
        if problem:
            # Also what a model that spent num_predict on thinking returns: never saved. The
            # tail stays verbatim and the fold is tried again later.
            await asyncio.to_thread(self.records.event, self.clock(), "fold-rejected",
                                    conversation_id, f"not stored: {problem}")
            raise LLMError(f"{problem}; not stored")
        why = notes_problem(condensed, notes, prompt) if condensed else ""
        if why:
            await asyncio.to_thread(self.records.event, self.clock(), "notes-rejected",
                                    conversation_id, f"condensed notes not used: {why}")
            return summary, None
        return summary, condensed

    async def _kept_notes(self, conversation_id: str, notes: str, num_ctx: int,
                          ratio: float, vocabulary: Vocabulary) -> str:
        """The user notes within their cap; the ones left out are recorded as an event."""
        kept_notes, trimmed = trim_notes(notes, num_ctx, ratio, vocabulary)
        if trimmed:
            await asyncio.to_thread(
                self.records.event, self.clock(), "notes-trimmed", conversation_id,
                f"{trimmed} user notes left the prompt, trivia first (cap "
                f"{notes_cap_tokens(num_ctx)} tokens; the model did not condense them); the "
                "messages stay in the store")
        return kept_notes

    async def _answer(self, conversation_id: str, model: str, messages: list[dict[str, str]],
                      answer_tokens: int, foreground: bool) -> str:
        """The fold call's answer. One cut at its limit (`done_reason: "length"`) is asked
        once more with twice the room; cut again, only its whole sentences are kept."""
        result = None
        for room in (answer_tokens, answer_tokens * LENGTH_RETRY_ROOM):
            self.calls += 1
            result = await self.llm.chat(messages, model=model, num_predict=room,
                                         background=not foreground, think=False)
            if result.done_reason != "length":
                return result.content
            log.info("fold of %s stopped at its limit of %d tokens", conversation_id, room)
        assert result is not None
        return whole_sentences(result.content)

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
