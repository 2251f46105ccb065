"""One turn: the chat's pending messages in, one reply out.

The turn is a thin coordinator over the store, the pure context functions and the model client,
sequencing the steps its parts own:

1. route the chat to its active conversation and append the pending user messages, each marked
   with its inbox id, so they are on disk before the model is called (and appended only once,
   however often the turn is retried) (`Journal`, daemon/turn/journal.py);
2. if the last request reached its budget and no background fold landed since, fold first, as
   the chat's own work (`BackgroundFold.land`); then build the request (`Prompting`: prefix +
   summary preamble + tail, fitted to the budget);
3. call Ollama, streaming the reply to the channel's sink for the turn (with a line about
   thinking and tools), in a part of the turn that /stop can cancel, retrying while it is
   unreachable, refitting once after an overflow rejection or a silent cut (`ModelCall`,
   daemon/turn/model_call.py); then the tool calls and continuations (`ToolLoop`);
4. calibrate the token ratio from Ollama's `prompt_eval_count` (`ModelCall.calibrate`);
5. save the reply, put it in the outbox and only then clear the inbox items (`Journal`).

A stopped turn (/stop) keeps what was written as its reply, marked "(stopped)", saved and
queued like any other. A crash between any two steps is finished on the next start: inbox items
stay pending until a reply that names them is saved, and a saved reply whose outbox item is
missing is queued again.
"""

from __future__ import annotations

import asyncio
import enum
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from daemon.core.config import Settings
from daemon.core.conversations import Conversation, Message
from daemon.core.errors import (
    ContextOverflow,
    DoesNotFit,
    LLMError,
    LLMTimeout,
    LLMUnavailable,
    ModelCrashed,
    ModelNotFound,
    ModelNowhere,
    PromptCut,
    Stopped,
)
from daemon.core.logs import turn_log as log
from daemon.core.messages import UNSEEN, Inbound, ReplySink
from daemon.core.platforms import automation_name
from daemon.llm.client import ChatResult, ModelClient
from daemon.store import Store
from daemon.store.event_log import Records
from daemon.store.facts import FactsBook
from daemon.store.search_index import SearchIndex
from daemon.tools.builtin import ToolContext
from daemon.tools.facts import confirmed
from daemon.tools.registry import Registry
from daemon.tools.roles import keeps_household
from daemon.tools.scope import person_of, recall_scope
from daemon.turn.approvals import Approvals, Ask
from daemon.turn.background_fold import BackgroundFold
from daemon.turn.journal import Journal
from daemon.turn.model_call import MAX_BACKOFF as MAX_BACKOFF
from daemon.turn.model_call import ModelCall, Notify, Outage, Site, Working, not_shown
from daemon.turn.owners import Owners
from daemon.turn.prompting import Prepared, Prompting
from daemon.turn.reply_stream import ReplyStream, Silence
from daemon.turn.router import Router
from daemon.turn.routes import route_of
from daemon.turn.stopping import Stops
from daemon.turn.streaming import STOPPED_MARK, Streaming, not_streamed
from daemon.turn.tool_loop import SAFETY_NET_LINE, LoopParts, LoopResult, ToolLoop

FILES_CAPABILITY = "files"
NEW_CONVERSATION_LINE = (
    "(New conversation: the last one was idle, so it is archived; it stays searchable.)"
)
# A request this full of its budget will have to leave messages out next turn: fold now instead,
# so the next request shrinks once (a fold) rather than dropping and restoring turn by turn.
CROWDED_SHARE = 0.9
# Above a reply whose first try the user saw being written, then dropped: the server had cut
# the prompt, so the model had answered without part of the conversation.
REDONE_LINE = ("(I asked the model again: its first answer was written without the start of "
               "our conversation, which the server had cut. This answer replaces it.)")
MOVED_LINE = ("(The model server stopped in the middle of this answer, and another one wrote it "
              "again from the start. This answer replaces what you saw being written.)")
TOO_LARGE = ("This turn grew larger than the model's context window, even after I shortened it "
             "and tried again. Your message is saved; send /compact (or /new) and ask again, "
             "or ask in smaller steps.")


class Outcome(enum.Enum):
    ANSWERED = "answered"  # a reply is in the outbox
    FAILED = "failed"  # the user got a notice; the messages stay in the conversation
    PARKED = "parked"  # the model server is down; the messages wait in the inbox


@dataclass(frozen=True)
class TurnResult:
    outcome: Outcome
    conversation_id: str | None = None
    # The request had to leave messages out, or nearly: fold now rather than at the threshold.
    crowded: bool = False


@dataclass(frozen=True)
class _Turn:
    """One turn's state between its recorded messages and its reply."""

    site: Site
    items: Sequence[Inbound]
    recorded: Conversation  # as recorded: what a turn without a reply saves
    conversation: Conversation  # as answered: after a fold landed, with the tools loaded
    history: Sequence[Message]
    intro: str  # the line above the reply, for the user only
    context: ToolContext
    new_images: bool  # this turn's messages carry a photo
    sink: ReplySink


def _person(chat_key: str, items: Sequence[Inbound]) -> str | None:
    """Who may approve this turn's tool calls: the sender of its last message
    (`<channel>:<id>`), or the chat itself where there is no sender (the console). An
    automation's run has nobody to ask."""
    if automation_name(chat_key) is not None:
        return None
    sender = items[-1].sender if items else None
    return f"{chat_key.split(':', 1)[0]}:{sender}" if sender else chat_key


class TurnRunner:
    """Runs turns; `notify` sends a notice to a chat, `streaming` gives the channel's sink that
    shows the reply as it comes; `stops.stop(chat_key)` stops the chat's running turn."""

    def __init__(
        self,
        *,
        settings: Settings,
        store: Store,
        llm: ModelClient,
        router: Router,
        prompting: Prompting,
        registry: Registry,
        index: SearchIndex | None,
        records: Records,
        notify: Notify,
        clock: Callable[[], float],
        streaming: Streaming = not_streamed,
        folder: BackgroundFold | None = None,
        working: Working = not_shown,
        facts: FactsBook | None = None,
        approvals: Approvals | None = None,
        ask: Ask | None = None,
    ) -> None:
        """`ask` sends a question with buttons to a chat; without it (an automation's run)
        a tool that needs the user's yes runs only on a standing "Always"."""
        self.approvals = approvals
        self.ask = ask
        self.settings = settings
        self.facts = facts
        self.folder = folder
        self.store = store
        self.llm = llm
        self.registry = registry
        self.index = index
        self.records = records
        self.notify = notify
        self.streaming = streaming
        self.clock = clock
        self.stops = Stops()
        self.roles = prompting.roles
        self.owners = Owners(self.roles, settings, store)  # who approves a shared tool
        self.journal = Journal(settings=settings, store=store, router=router, clock=clock,
                               facts=facts)
        self.model_call = ModelCall(settings=settings, store=store, llm=llm, prompting=prompting,
                                    records=records, notify=notify, clock=clock,
                                    working=working)

    async def run(
        self, chat_key: str, items: Sequence[Inbound], *, announce_outage: bool = True,
        model: str | None = None,
    ) -> TurnResult:
        """Answer `items` (the chat's pending messages): one model call, or a few with tools.

        `model` (an automation's own, or the chat's /model) is the model every call of the turn
        goes to, and the one whose window and capabilities the request is fitted to; by default
        `model.name`."""
        # The sink is left before the worker sends the reply: no preview follows the reply.
        async with self.llm.turn(), self.streaming(chat_key) as sink:
            outage = Outage(self.notify, chat_key, self.llm.host, announce_outage)
            return await self._run(chat_key, items, outage, model or self.settings.model.name,
                                   sink)

    async def keep(self, chat_key: str, items: Sequence[Inbound], notice: str) -> TurnResult:
        """Keep `items` in their conversation without a model call and tell the chat `notice`
        (a guest past their day's turns): what they said is never lost."""
        conversation, items = await asyncio.to_thread(
            self.journal.record_user_messages, chat_key, items)
        if not items:
            return TurnResult(Outcome.ANSWERED, conversation.id)
        return await self._fail(conversation, items, notice)

    async def _run(
        self, chat_key: str, items: Sequence[Inbound], outage: Outage, model: str,
        sink: ReplySink,
    ) -> TurnResult:
        conversation, items = await asyncio.to_thread(
            self.journal.record_user_messages, chat_key, items
        )
        if not items:  # every one was answered before a crash; the replies are queued again
            return TurnResult(Outcome.ANSWERED, conversation.id)
        turn = await self._begin(chat_key, model, conversation, items, sink, outage)
        # Every call of the turn goes to the conversation's host (daemon/turn/routes.py).
        with self.llm.routing(*route_of(turn.conversation, turn.history)):
            try:
                answer = await self.stops.run(chat_key, self._answer(turn))
            except Stopped:
                return await self._stopped(turn)
            except (DoesNotFit, LLMError) as exc:
                return await self._failed(turn, exc)
            return await self._answered(turn, *answer)

    async def _begin(self, chat_key: str, model: str, conversation: Conversation,
                     items: Sequence[Inbound], sink: ReplySink, outage: Outage) -> _Turn:
        """The turn's state once its messages are recorded: a fold it owes landed, the history
        read, the reply stream opened, the tools the messages call for loaded."""
        recorded = conversation  # touched, not yet saved: see Journal.record_user_messages
        if self.folder is not None and self.folder.owes(conversation.id):
            # The last request reached its budget and no background fold landed since: fold
            # now, as this chat's own work, so this request does not drop messages again.
            await self.folder.land(conversation.id)
            conversation = await asyncio.to_thread(self.journal.reread, conversation)
        history = await asyncio.to_thread(self.store.messages, conversation.id)
        intro = ""
        if conversation.after_idle and not any(m.role == "assistant" for m in history):
            intro = NEW_CONVERSATION_LINE + "\n\n"
        # Told of a silent model: in the sink's status line, and by a notice where the sink
        # shows none (streaming off, a group, WhatsApp); an automation's run is told nothing.
        tell = (functools.partial(self.notify, chat_key)
                if sink is UNSEEN and outage.pending else None)
        silence = Silence(self.settings.model.stall, self.llm.gate, tell)
        site = Site(chat_key, model, ReplyStream(sink, intro, silence), outage)
        answering = {i.id for i in items}
        sent = [a for m in history if m.role == "user" and m.meta.get("inbox_id") in answering
                for a in m.attachments]
        if FILES_CAPABILITY not in conversation.active_tools and any(
                a.get("kind") != "image" for a in sent):
            # The user sent a file (or a message so long it was kept as one): the model will
            # want file_read, so load it now rather than
            # spending two model calls on tool_activate.
            conversation = replace(conversation,
                                   active_tools=(*conversation.active_tools, FILES_CAPABILITY))
        context = ToolContext(store=self.store, settings=self.settings, registry=self.registry,
                              conversation_id=conversation.id, clock=self.clock,
                              index=self.index, active=list(conversation.active_tools),
                              scope=recall_scope(conversation, self.settings.automations,
                                                 self.settings.linked),
                              facts=self.facts,
                              person=person_of(conversation.chat_key, self.settings),
                              household=keeps_household(conversation.chat_key, self.roles))
        # The newest photo stays in every later request (as pixels, or as a note for a model
        # that cannot see): the user hears that it cannot be seen once, on the turn it came.
        new_images = any(a.get("kind") == "image" for a in sent)
        return _Turn(site, items, recorded, conversation, history, intro, context, new_images,
                     sink)

    async def _answer(self, turn: _Turn) -> tuple[Prepared, ChatResult, ToolLoop, LoopResult]:
        """The part of the turn /stop can cancel: the first call, then the tool loop."""
        prepared = await self.model_call.prepare(turn.site, turn.conversation, turn.history)
        first, prepared, messages = await self.model_call.answer(
            turn.site, turn.conversation, turn.history, prepared, turn.new_images)
        loop = await self._tool_loop(turn, prepared)
        return prepared, first, loop, await loop.run(messages, first)

    async def _tool_loop(self, turn: _Turn, prepared: Prepared) -> ToolLoop:
        chat_key, model = turn.site.chat_key, turn.site.model
        parts = LoopParts(
            registry=self.registry, context=turn.context, records=self.records,
            call=functools.partial(self.model_call.call, turn.site),
            save=functools.partial(self.journal.save_step, turn.conversation.id),
            clock=self.clock, status=turn.sink.status,
            approve=functools.partial(
                self.approvals.check, chat_key=chat_key, person=_person(chat_key, turn.items),
                ask=self.ask, released=self.llm.waiting_for_user, owners=self.owners)
            if self.approvals is not None else None,
            vision="vision" in (await self.llm.model_info(model)).capabilities,
            attachments=self.store.state_dir / "attachments",
            whole=self.llm.counts_whole_prompt,
            cuts=functools.partial(self.llm.cuts_silently, model),
            text_calls=self.llm.habits_of(model).text_tool_calls,
            retract=turn.site.stream.retract,
        )
        return ToolLoop(parts, max_calls=self.settings.model.max_calls, budget=prepared.budget,
                        num_ctx=prepared.num_ctx, ratio=prepared.ratio,
                        estimate=prepared.vocabulary.estimate)

    async def _stopped(self, turn: _Turn) -> TurnResult:
        """/stop: what was written so far is the reply, marked "(stopped)"."""
        conversation = turn.conversation
        kept = turn.site.stream.kept([t.name for c in self.registry.capabilities.values()
                                      for t in c.tools])
        after = replace(conversation, active_tools=tuple(turn.context.active))
        await asyncio.to_thread(
            self.journal.save_reply, conversation, after, turn.items, ChatResult(content=kept),
            f"{kept.rstrip()}\n\n{STOPPED_MARK}" if kept.strip() else STOPPED_MARK,
            turn.intro, 0)
        await asyncio.to_thread(self.records.event, self.clock(), "stopped",
                                conversation.id, f"stopped after {len(kept)} characters")
        log.info("turn for %s stopped by the user", conversation.id)
        return TurnResult(Outcome.ANSWERED, conversation.id)

    async def _failed(self, turn: _Turn, exc: DoesNotFit | LLMError) -> TurnResult:
        """A turn without a reply: parked while the model server is out, else a notice."""
        # What the turn's refusals taught stays with the conversation (`Lessons`).
        recorded = turn.site.lessons.kept_by(turn.recorded)
        items, noted = turn.items, turn.context.noted
        if isinstance(exc, DoesNotFit):
            # Messages are excerpted to fit, so only the fixed part can be too large: a window
            # too small for the setup, not a message too long.
            return await self._fail(recorded, items, (
                f"The model's context window is too small for this conversation's setup (about "
                f"{exc.needed:,} tokens needed, {exc.budget:,} available). Your message is "
                "saved; raise model.window or lower model.response_reserve."))
        if isinstance(exc, ModelNotFound):
            where = (f"any of the Ollama servers ({', '.join(exc.hosts)})"
                     if isinstance(exc, ModelNowhere) else f"the Ollama server at {self.llm.host}")
            return await self._fail(recorded, items, (
                f"The model {exc.model!r} is not available on {where}. Pull it there with: "
                f"ollama pull {exc.model}"))
        if isinstance(exc, (LLMUnavailable, LLMTimeout, ModelCrashed)):
            await asyncio.to_thread(self.journal.parked, recorded)
            return TurnResult(Outcome.PARKED, turn.conversation.id)
        if isinstance(exc, ContextOverflow):
            # Refitted and retried once already: the user gets a plain line, not Ollama's body.
            log.warning("turn for %s does not fit the window: %s", turn.conversation.id, exc)
            if isinstance(exc, PromptCut):  # the next message starts from what the cut proved
                recorded = replace(recorded, token_ratio=exc.ratio)
            return await self._fail(recorded, items, confirmed(TOO_LARGE, noted))
        log.warning("turn for %s failed: %s", turn.conversation.id, exc)
        # A fact kept before the error is still said (nothing is saved silently).
        return await self._fail(recorded, items, confirmed(
            f"The model server answered with an error: {exc}. Your message is saved; "
            "send another message to try again.", noted))

    async def _answered(self, turn: _Turn, prepared: Prepared, first: ChatResult,
                        loop: ToolLoop, done: LoopResult) -> TurnResult:
        """Calibrate, save and queue the reply, keep the turn's snapshot."""
        conversation, intro = turn.conversation, turn.intro
        ratio, _ = await self.model_call.calibrate(conversation, prepared, first)
        after = replace(turn.site.lessons.kept_by(conversation), token_ratio=ratio,
                        active_tools=tuple(turn.context.active))
        if loop.safety_net:  # the user hears why a long turn may have lost detail
            intro += f"({SAFETY_NET_LINE})\n\n"
        if turn.site.stream.retracted:  # what they saw being written is not this answer
            moved = turn.site.stream.retracted_for == "moved"
            intro += f"{MOVED_LINE if moved else REDONE_LINE}\n\n"
        await asyncio.to_thread(
            self.journal.save_reply, conversation, after, turn.items, first,
            confirmed(done.text, turn.context.noted), intro, loop.prompt_tokens,
            loop.safety_net, done.note,
            request_facts(turn.site, prepared, conversation, self.llm.host_of()))
        if self.index is not None:
            self.index.mark_dirty(conversation.id)
        await asyncio.to_thread(self.records.snapshot, self.clock(), conversation.id, {
            **prepared.accounting(), "call": 1, "prompt_eval_count": first.prompt_eval_count,
            "prompt_eval_cached_count": first.prompt_eval_cached_count,
            "model_calls": done.calls, "tool_calls": done.tool_calls,
        })
        log.info("turn for %s answered (%s prompt tokens, estimate %d of %d, %d model calls)",
                 conversation.id, first.prompt_eval_count, prepared.request.estimate,
                 prepared.budget, done.calls)
        crowded = (prepared.request.omitted > 0
                   or prepared.request.estimate > CROWDED_SHARE * prepared.budget)
        return TurnResult(Outcome.ANSWERED, conversation.id, crowded=crowded)

    async def _fail(self, conversation: Conversation, items: Sequence[Inbound],
                    text: str) -> TurnResult:
        await self.notify(conversation.chat_key, text)
        await asyncio.to_thread(self.journal.unanswered, conversation, items)
        return TurnResult(Outcome.FAILED)


def request_facts(site: Site, prepared: Prepared, conversation: Conversation,
                  host: str | None = None) -> dict[str, int | str]:
    """What roost knew of a turn's first request, beside what Ollama counted: the console's
    chart and table show one against the other (daemon/console/views.py); and the Ollama host
    the conversation is on (`host`: the route's hint after a restart, daemon/turn/routes.py)."""
    return {"estimate": prepared.request.estimate, "budget": prepared.budget,
            "refused": site.lessons.refused, "cut": site.lessons.cut,
            "redone": int(site.stream.retracted),
            "folds": conversation.summary.fold_count, **({"host": host} if host else {})}
