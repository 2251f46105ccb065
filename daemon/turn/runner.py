"""One turn: the chat's pending messages in, one reply out.

The turn is a thin coordinator over the store, the pure context functions and the model client:

1. route the chat to its active conversation and append the pending user messages, each marked
   with its inbox id, so they are on disk before the model is called (and appended only once,
   however often the turn is retried);
2. if the last request reached its budget and no background fold landed since, fold first, as
   the chat's own work (`Folder.land`); then build the request (`Prompting`: prefix + summary
   preamble + tail, fitted to the budget);
3. call Ollama, streaming the reply to the channel's sink for the turn (with a line about
   thinking and tools), in a part of the turn that /stop can cancel, retrying with backoff
   while it is unreachable (a refused connection, a 502/503/504, or 500s: one is tried again
   at once, more are an outage; a 500 naming the request is reported);
   an overflow rejection (before anything streamed) recalibrates, refits and retries once;
   an answer to a prompt Ollama cut silently (a server that ignores `truncate: false`) is
   discarded, and the request rebuilt at the ratio the cut proves and sent once more;
4. calibrate the token ratio from Ollama's `prompt_eval_count`;
5. save the reply, put it in the outbox and only then clear the inbox items.

A stopped turn (/stop) keeps what was written as its reply, marked "(stopped)", saved and
queued like any other. A crash between any two steps is finished on the next start: inbox items
stay pending until a reply that names them is saved, and a saved reply whose outbox item is
missing is queued again.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from typing import Any

from daemon.context.budget import (
    RATIO_MIN,
    calibrated_ratio,
    estimate_tokens,
    overflow_ratio,
    recalibrate,
    request_budget,
)
from daemon.context.facts import facts_note
from daemon.context.replay import ChatMessage
from daemon.core.config import Settings
from daemon.core.conversations import Conversation, Message, Role
from daemon.core.errors import (
    AttachmentError,
    ContextOverflow,
    DoesNotFit,
    LLMError,
    LLMTimeout,
    LLMUnavailable,
    ModelCrashed,
    ModelNotFound,
    PromptCut,
    Stopped,
    StoreError,
)
from daemon.core.logs import turn_log as log
from daemon.core.messages import Inbound, Outbound, ReplySink
from daemon.llm.client import ChatResult, ModelClient
from daemon.store import Store
from daemon.store.attachments import read_image_base64, store_file
from daemon.store.event_log import Records
from daemon.store.facts import FactsBook, FrozenFacts, same_fact
from daemon.store.memory_index import MemoryIndex
from daemon.tools.builtin import ToolContext
from daemon.tools.facts import confirmed
from daemon.tools.registry import Registry
from daemon.tools.scope import person_of, recall_scope
from daemon.turn.approvals import Approvals, Ask
from daemon.turn.folder import Folder
from daemon.turn.prompting import Prepared, Prompting
from daemon.turn.reply_stream import ReplyStream
from daemon.turn.router import Router
from daemon.turn.stopping import Stops
from daemon.turn.streaming import STOPPED_MARK, Streaming, not_streamed
from daemon.turn.tool_loop import SAFETY_NET_LINE, LoopResult, ToolLoop

MAX_BACKOFF = 60.0
RESUME_LOOKBACK = 400  # messages searched for an item's own message or reply after a crash
FILES_CAPABILITY = "files"
EMPTY_REPLY = "(The model returned an empty reply.)"
NEW_CONVERSATION_LINE = (
    "(New conversation: the last one was idle, so it is archived; it stays searchable.)"
)
# The ratio a conversation starts from (bytes/4). A request that does not fit at a higher ratio
# is built once more at this one rather than refused: the ratio may be what is wrong.
RATIO_START = 1.0
# A request this full of its budget will have to leave messages out next turn: fold now instead,
# so the next request shrinks once (a fold) rather than dropping and restoring turn by turn.
CROWDED_SHARE = 0.9
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


Notify = Callable[[str, str], Awaitable[None]]  # (chat_key, text) -> notice delivered
# The channel's "working" context for a chat (typing...), entered while a
# call of the chat's turn holds the model, so it shows only for the chat being answered.
Working = Callable[[str], AbstractAsyncContextManager[None]]


def not_shown(chat_key: str) -> AbstractAsyncContextManager[None]:
    return contextlib.nullcontext()


class _Outage:
    """The outage notice of one turn, said at most once: by whichever call first finds the
    model server unreachable, the model lookup before the request is built (the first thing
    to fail after a start with Ollama down) or a model call."""

    def __init__(self, notify: Notify, chat_key: str, host: str, announce: bool) -> None:
        self.notify = notify
        self.chat_key = chat_key
        self.host = host
        self.pending = announce

    async def tell(self, exc: LLMError) -> None:
        if self.pending:
            self.pending = False
            state = ("keeps failing" if isinstance(exc, ModelCrashed) else "is not answering")
            await self.notify(self.chat_key, (
                f"The model server at {self.host} {state}. Your message is saved; "
                "I will keep trying and answer when it is back."))


def _person(chat_key: str, items: Sequence[Inbound]) -> str | None:
    """Who may approve this turn's tool calls: the sender of its last message
    (`<channel>:<id>`), or the chat itself where there is no sender (the console). An
    automation's run has nobody to ask."""
    if chat_key.startswith("automation:"):
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
        index: MemoryIndex | None,
        records: Records,
        notify: Notify,
        clock: Callable[[], float],
        streaming: Streaming = not_streamed,
        folder: Folder | None = None,
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
        self.working = working
        self.folder = folder
        self.store = store
        self.llm = llm
        self.router = router
        self.prompting = prompting
        self.registry = registry
        self.index = index
        self.records = records
        self.notify = notify
        self.streaming = streaming
        self.clock = clock
        self.stops = Stops()

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
            outage = _Outage(self.notify, chat_key, self.llm.host, announce_outage)
            return await self._run(chat_key, items, outage, model or self.settings.model.name,
                                   sink)

    async def _run(
        self, chat_key: str, items: Sequence[Inbound], outage: _Outage, model: str,
        sink: ReplySink,
    ) -> TurnResult:
        conversation, items = await asyncio.to_thread(
            self._record_user_messages, chat_key, items
        )
        if not items:  # every one was answered before a crash; the replies are queued again
            return TurnResult(Outcome.ANSWERED, conversation.id)
        recorded = conversation  # touched, not yet saved: see _record_user_messages
        if self.folder is not None and self.folder.owes(conversation.id):
            # The last request reached its budget and no background fold landed since: fold
            # now, as this chat's own work, so this request does not drop messages again.
            await self.folder.land(conversation.id)
            conversation = await asyncio.to_thread(self._reread, conversation)
        history = await asyncio.to_thread(self.store.messages, conversation.id)
        intro = ""
        if conversation.after_idle and not any(m.role == "assistant" for m in history):
            intro = NEW_CONVERSATION_LINE + "\n\n"
        stream = ReplyStream(sink, intro)
        answering = {i.id for i in items}
        # The newest photo stays in every later request (as pixels, or as a note for a model
        # that cannot see): the user hears that it cannot be seen once, on the turn it came.
        new_images = any(a.get("kind") == "image" for m in history
                         if m.role == "user" and m.meta.get("inbox_id") in answering
                         for a in m.attachments)
        if FILES_CAPABILITY not in conversation.active_tools and any(
                a.get("kind") != "image" for m in history
                if m.role == "user" and m.meta.get("inbox_id") in answering
                for a in m.attachments):
            # The user sent a file (or a message so long it was kept as one): the model will
            # want file_read, so load it now rather than
            # spending two model calls on tool_activate.
            conversation = replace(conversation,
                                   active_tools=(*conversation.active_tools, FILES_CAPABILITY))
        context = ToolContext(store=self.store, settings=self.settings, registry=self.registry,
                              conversation_id=conversation.id, clock=self.clock,
                              index=self.index, active=list(conversation.active_tools),
                              scope=recall_scope(conversation, self.settings.automations,
                                                 self.settings.identities),
                              facts=self.facts,
                              person=person_of(conversation.chat_key, self.settings))

        async def answer() -> tuple[Prepared, ChatResult, ToolLoop, LoopResult]:
            prepared = await self._prepare(chat_key, conversation, history, model, outage)
            first, prepared, messages = await self._answer(
                chat_key, conversation, history, prepared, stream, outage, model,
                new_images)
            loop = ToolLoop(
                registry=self.registry, context=context, records=self.records,
                call=lambda messages, tools: self._call_model(
                    chat_key, messages, tools, stream, outage, model),
                save=lambda role, content, **fields: self._save_step(
                    conversation.id, role, content, **fields),
                max_calls=self.settings.model.max_calls, budget=prepared.budget,
                num_ctx=prepared.num_ctx, ratio=prepared.ratio, clock=self.clock,
                status=sink.status,
                vision="vision" in (await self.llm.model_info(model)).capabilities,
                attachments=self.store.state_dir / "attachments",
                whole=self.llm.counts_whole_prompt,
                approve=functools.partial(
                    self.approvals.check, chat_key=chat_key, person=_person(chat_key, items),
                    ask=self.ask, released=self.llm.waiting_for_user)
                if self.approvals is not None else None,
            )
            return prepared, first, loop, await loop.run(messages, first)

        try:
            prepared, first, loop, done = await self.stops.run(chat_key, answer())
        except Stopped:
            kept = stream.kept([t.name for c in self.registry.capabilities.values()
                                for t in c.tools])
            after = replace(conversation, active_tools=tuple(context.active))
            await asyncio.to_thread(
                self._save_reply, conversation, after, items, ChatResult(content=kept),
                f"{kept.rstrip()}\n\n{STOPPED_MARK}" if kept.strip() else STOPPED_MARK,
                intro, 0)
            await asyncio.to_thread(self.records.event, self.clock(), "stopped",
                                    conversation.id, f"stopped after {len(kept)} characters")
            log.info("turn for %s stopped by the user", conversation.id)
            return TurnResult(Outcome.ANSWERED, conversation.id)
        except DoesNotFit as exc:
            # Messages are excerpted to fit, so only the fixed part can be too large: a window
            # too small for the setup, not a message too long.
            return await self._fail(recorded, items, (
                f"The model's context window is too small for this conversation's setup (about "
                f"{exc.needed:,} tokens needed, {exc.budget:,} available). Your message is "
                "saved; raise model.window or lower model.response_reserve."))
        except ModelNotFound as exc:
            return await self._fail(recorded, items, (
                f"The model {exc.model!r} is not available on the Ollama server at "
                f"{self.llm.host}. Pull it there with: ollama pull {exc.model}"))
        except (LLMUnavailable, LLMTimeout, ModelCrashed):
            await asyncio.to_thread(self.store.save_conversation, recorded)
            return TurnResult(Outcome.PARKED, conversation.id)
        except ContextOverflow as exc:
            # Refitted and retried once already: the user gets a plain line, not Ollama's body.
            log.warning("turn for %s does not fit the window: %s", conversation.id, exc)
            if isinstance(exc, PromptCut):  # the next message starts from what the cut proved
                recorded = replace(recorded, token_ratio=exc.ratio)
            return await self._fail(recorded, items, confirmed(TOO_LARGE, context.noted))
        except LLMError as exc:
            log.warning("turn for %s failed: %s", conversation.id, exc)
            # A fact kept before the error is still said (nothing is saved silently).
            return await self._fail(recorded, items, confirmed(
                f"The model server answered with an error: {exc}. Your message is saved; "
                "send another message to try again.", context.noted))
        ratio, _ = await self._calibrate(conversation, prepared, first)
        after = replace(conversation, token_ratio=ratio, active_tools=tuple(context.active))
        if loop.safety_net:  # the user hears why a long turn may have lost detail
            intro += f"({SAFETY_NET_LINE})\n\n"
        await asyncio.to_thread(
            self._save_reply, conversation, after, items, first,
            confirmed(done.text, context.noted), intro, loop.prompt_tokens, loop.safety_net)
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

    async def _answer(
        self, chat_key: str, conversation: Conversation, history: Sequence[Message],
        prepared: Prepared, stream: ReplyStream, outage: _Outage, model: str,
        new_images: bool,
    ) -> tuple[ChatResult, Prepared, list[ChatMessage]]:
        """The first model call, with exactly one refit and retry after an overflow rejection,
        and one after a silent cut; a second cut raises `PromptCut`."""
        result, prepared, messages = await self._first_call(
            chat_key, conversation, history, prepared, stream, outage, model, new_images)
        ratio, cut = await self._calibrate(conversation, prepared, result)
        if not cut:
            return result, prepared, messages
        # The model saw only part of the prompt (often without its system message): its answer
        # is not delivered or stored, and none of its tool calls run. Built again at the ratio
        # the cut proves, the request is sent once more.
        stream.discard()
        refit = await self.prompting.prepare(conversation, history, ratio=ratio, model=model)
        messages = await self._messages(chat_key, refit, model, notify=False)
        result = await self._call_model(chat_key, messages, [dict(t) for t in refit.tools] or None,
                                        stream, outage, model)
        again, cut = await self._calibrate(conversation, refit, result)
        if cut:
            raise PromptCut(result.prompt_eval_count or 0, refit.num_ctx, again)
        return result, refit, messages

    async def _first_call(
        self, chat_key: str, conversation: Conversation, history: Sequence[Message],
        prepared: Prepared, stream: ReplyStream, outage: _Outage, model: str,
        new_images: bool,
    ) -> tuple[ChatResult, Prepared, list[ChatMessage]]:
        """The first model call, with exactly one refit and retry after an overflow rejection."""
        try:
            messages = await self._messages(chat_key, prepared, model, notify=new_images)
            result = await self._call_model(chat_key, messages,
                                            [dict(t) for t in prepared.tools] or None,
                                            stream, outage, model)
            return result, prepared, messages
        except ContextOverflow as exc:
            # Ollama refused before streaming anything: learn the real size, refit, try once more.
            measured = exc.prompt_tokens
            ratio = overflow_ratio(prepared.ratio, stated=measured, raw=prepared.raw_estimate(),
                                   overhead=prepared.overhead(), num_ctx=prepared.num_ctx)
            await asyncio.to_thread(self.records.event, self.clock(), "overflow-retry",
                                    conversation.id,
                                    f"Ollama refused {measured} tokens (estimated "
                                    f"{prepared.request.estimate}); ratio {prepared.ratio:.2f} "
                                    f"-> {ratio:.2f}, refitted and retried once")
            refit = await self.prompting.prepare(conversation, history, ratio=ratio, model=model)
            messages = [dict(m) for m in refit.request.messages]
            if refit.request.images:  # already attached or noted on the first try
                messages = await self._messages(chat_key, refit, model, notify=False)
            result = await self._call_model(chat_key, messages,
                                            [dict(t) for t in refit.tools] or None,
                                            stream, outage, model)
            return result, refit, messages

    async def _call_model(
        self, chat_key: str, messages: list[ChatMessage], tools: list[dict[str, Any]] | None,
        stream: ReplyStream, outage: _Outage, name: str,
    ) -> ChatResult:
        """Call the model, retrying with backoff while it is unreachable (a refused connection,
        or a 502/503/504 from Ollama or a proxy); tell the user once. A 500 (a runner that
        crashed) is tried once more at once; failing on, it is handled as unreachable."""
        model = self.settings.model
        crashed = False
        attempt = 0  # tries while Ollama is out; the quiet try after a 500 is not one of them
        while True:
            stream.begin()
            try:
                result = await self.llm.chat(messages, model=name, tools=tools,
                                             on_delta=stream.delta, on_thinking=stream.thinking,
                                             while_held=lambda: self.working(chat_key))
            except ModelCrashed as exc:
                if not crashed:  # one failure is often the runner's alone: again, quietly
                    crashed = True
                    log.warning("Ollama failed on a request for %s (%s); trying once more",
                                chat_key, exc)
                    await asyncio.sleep(model.retry_backoff)
                    continue
                await self._unreachable(attempt, exc, outage)  # raises at the last attempt
                attempt += 1
                continue
            except (LLMUnavailable, LLMTimeout) as exc:
                await self._unreachable(attempt, exc, outage)
                attempt += 1
                continue
            stream.end(result, [t["function"]["name"] for t in tools or ()])
            return result

    async def _prepare(
        self, chat_key: str, conversation: Conversation, history: Sequence[Message], model: str,
        outage: _Outage,
    ) -> Prepared:
        """The first request of the turn, retried like a model call while Ollama is
        unreachable: building it asks `/api/show`, which nothing has cached yet after a start."""
        for attempt in range(self.settings.model.retry_attempts):
            try:
                try:
                    return await self.prompting.prepare(conversation, history, model=model)
                except DoesNotFit as exc:
                    return await self._refit_lower(conversation, history, model, exc)
            except (LLMUnavailable, LLMTimeout, ModelCrashed) as exc:
                await self._unreachable(attempt, exc, outage)
        raise AssertionError("retry_attempts is at least 1")

    async def _refit_lower(
        self, conversation: Conversation, history: Sequence[Message], model: str,
        exc: DoesNotFit,
    ) -> Prepared:
        """Only the prefix and summary were left, and they did not fit at the conversation's
        ratio: an overestimate must not lock the conversation. Build the request at the ratio
        where that part fits (it scales with the ratio), else at the starting one; Ollama's
        count of what is sent calibrates the ratio again. Raises `DoesNotFit` when even the
        starting ratio leaves no room: then the window is too small."""
        ratio = conversation.token_ratio
        fitting = max(ratio * exc.budget / exc.needed * 0.95, RATIO_MIN)
        tries = [r for r in (fitting, RATIO_START) if r < ratio]
        if not tries:
            raise exc
        for lower in sorted(set(tries), reverse=True):
            try:
                prepared = await self.prompting.prepare(conversation, history, model=model,
                                                        ratio=lower)
            except DoesNotFit as again:
                exc = again
                continue
            await asyncio.to_thread(
                self.records.event, self.clock(), "ratio-reset", conversation.id,
                f"the fixed part needed {exc.needed} of {exc.budget} tokens at ratio "
                f"{ratio:.2f}; built again at {lower:.2f}")
            log.warning("conversation %s: request did not fit at ratio %.2f; built at %.2f",
                        conversation.id, ratio, lower)
            return prepared
        raise exc

    async def _unreachable(self, attempt: int, exc: LLMError, outage: _Outage) -> None:
        """After a failed try: log, tell the user (once a turn), re-raise after the last try,
        else wait the backoff."""
        model = self.settings.model
        log.warning("Ollama at %s unreachable (attempt %d of %d): %s",
                    self.llm.host, attempt + 1, model.retry_attempts, exc)
        await outage.tell(exc)
        if attempt + 1 == model.retry_attempts:
            raise exc
        await asyncio.sleep(min(model.retry_backoff * 2**attempt, MAX_BACKOFF))

    async def _messages(
        self, chat_key: str, prepared: Prepared, model: str, *, notify: bool = True
    ) -> list[ChatMessage]:
        """The request's messages with the newest image's pixels, if the model can see them."""
        messages = [dict(m) for m in prepared.request.messages]
        if not prepared.request.images:
            return messages
        info = await self.llm.model_info(model)
        attachments = self.store.state_dir / "attachments"
        for index, images in prepared.request.images.items():
            if "vision" in info.capabilities:
                try:
                    messages[index]["images"] = [  # type: ignore[assignment]
                        await asyncio.to_thread(read_image_base64, dict(i), attachments)
                        for i in images]
                    continue
                except AttachmentError as exc:
                    log.warning("image of %s unreadable: %s", chat_key, exc)
            messages[index] = {**messages[index], "content": (
                f"{messages[index].get('content') or ''}\n[an image was sent; this model cannot "
                "see images, so it is not shown]").lstrip()}
            if notify:
                await self.notify(chat_key, (
                    f"The model {info.name} cannot see images, so I only know that you sent "
                    "one. Describe it in words, or use a vision model."))
        return messages

    async def _save_step(self, conversation_id: str, role: Role, content: str,
                         **fields: Any) -> int:
        """A tool call or tool result of this turn, saved as it happens; returns its seq."""
        message = await asyncio.to_thread(self.store.append_message, conversation_id, role,
                                          content, created=self.clock(), **fields)
        return message.seq

    async def _calibrate(
        self, conversation: Conversation, prepared: Prepared, result: ChatResult
    ) -> tuple[float, bool]:
        """The conversation's new token ratio from Ollama's count (`recalibrate`), and whether
        Ollama cut the prompt silently (recorded as an event). Whether the count includes the
        cached part is asked of the server only when the reading would lower the ratio or mark
        a cut."""
        count = result.prompt_eval_count
        raw = prepared.raw_estimate()
        if not count or prepared.request.images or raw <= 0:
            return prepared.ratio, False
        estimate = prepared.request.estimate + prepared.tool_tokens
        whole = (result.prompt_eval_cached_count is not None
                 or calibrated_ratio(count, raw, prepared.overhead()) >= prepared.ratio
                 or await self.llm.counts_whole_prompt())
        ratio, cut = recalibrate(prepared.ratio, count=count, raw=raw,
                                 overhead=prepared.overhead(), estimate=estimate,
                                 num_ctx=prepared.num_ctx, whole=whole)
        if cut:
            await asyncio.to_thread(self.records.event, self.clock(), "silent-cut",
                                    conversation.id,
                                    f"Ollama evaluated {count} tokens of about {estimate} sent "
                                    f"(num_ctx {prepared.num_ctx}); ratio {prepared.ratio:.2f} "
                                    f"-> {ratio:.2f}")
            log.warning("conversation %s: Ollama cut the prompt silently (%d of ~%d tokens)",
                        conversation.id, count, estimate)
        return ratio, cut

    async def _fail(self, conversation: Conversation, items: Sequence[Inbound],
                    text: str) -> TurnResult:
        await self.notify(conversation.chat_key, text)
        await asyncio.to_thread(self.store.save_conversation, conversation)
        await asyncio.to_thread(self.store.inbox_done, [i.id for i in items])
        return TurnResult(Outcome.FAILED)

    # Synchronous steps, run in a worker thread ---------------------------------------------

    def _reread(self, conversation: Conversation) -> Conversation:
        """The conversation with the summary a fold just wrote."""
        return self.store.get_conversation(conversation.id) or conversation

    def _record_user_messages(
        self, chat_key: str, items: Sequence[Inbound]
    ) -> tuple[Conversation, list[Inbound]]:
        """Append the items not yet in the conversation; return the ones still to answer.

        After a crash some items may already have a saved reply: that reply is queued again
        (unless it was delivered) instead of asking the model twice.
        """
        now = self.clock()
        conversation = self.router.conversation_for(chat_key, now)
        recent = self.store.messages(conversation.id)[-(len(items) + RESUME_LOOKBACK):]
        present = {m.meta.get("inbox_id") for m in recent if m.role == "user"}
        wanted = {i.id for i in items}
        answered: set[str] = set()
        for message in recent:
            replied = wanted & set(message.meta.get("inbox_ids", ()))
            if message.role == "assistant" and replied:
                self._requeue(conversation, message)
                answered |= replied
        if answered:
            self.store.inbox_done(sorted(answered))
        items = [i for i in items if i.id not in answered]
        appending = [i for i in items if i.id not in present]
        note = self._facts_changed(conversation) if appending else None
        for item in items:
            if item.id in present:
                continue
            meta = {**item.meta, "inbox_id": item.id,
                    **({"platform_id": item.platform_id} if item.platform_id else {})}
            if note is not None and item is appending[-1]:
                meta["facts_note"] = note[0]
            self.store.append_message(
                conversation.id, "user", item.text, created=item.received,
                channel_message_ids=(item.platform_id,) if item.platform_id else (),
                attachments=(*item.attachments, *self._as_file(item.text, conversation)),
                meta=meta,
            )
        if note is not None and self.facts is not None:
            # After the message that carries the line: a crash (or a write that fails) in
            # between announces it again on the next message (harmless), never not at all.
            try:
                self.facts.freeze(conversation.id, note[1])
            except StoreError as exc:
                log.warning("conversation %s: cannot note the facts change (%s)",
                            conversation.id, exc)
        if items:
            # Touched here, saved once per turn: with the reply (`_save_reply`), or when the
            # turn ends without one (`_fail`, parked). Until then the appended messages are
            # the activity on disk, and `Store.active_conversation` counts them, so a crash
            # in between rotates no sooner than if this had been saved.
            conversation = conversation.touched(now)
        return conversation, list(items)

    def _facts_changed(self, conversation: Conversation) -> tuple[str, FrozenFacts] | None:
        """The line announcing facts kept or forgotten since the conversation's block was
        made, and the frozen facts that know of them; None when nothing changed (or the
        conversation has no block yet: it is made from the facts as they are now)."""
        person = person_of(conversation.chat_key, self.settings)
        if self.facts is None or person is None:
            return None
        frozen = self.facts.frozen(conversation.id)
        if frozen is None or frozen.person != person.name:
            return None
        try:
            now = [f.text for f in self.facts.facts(person)]
        except StoreError as exc:  # unreadable: the conversation goes on without the news
            log.warning("facts of %s unreadable (%s)", person.name, exc)
            return None
        added = [t for t in now if not any(same_fact(t, k) for k in frozen.known)]
        removed = [k for k in frozen.known if not any(same_fact(k, t) for t in now)]
        if not added and not removed:
            return None
        return facts_note(added, removed), replace(frozen, known=tuple(now))

    def _as_file(self, text: str, conversation: Conversation) -> tuple[dict[str, Any], ...]:
        """A message too large for the whole window is also stored as a text file, so that the
        model, which gets its start and end, can read the rest with file_read. The message
        itself is kept whole in the conversation as always."""
        model = self.settings.model
        if estimate_tokens(text, conversation.token_ratio) <= request_budget(
                model.window, model.response_reserve):
            return ()
        stored = store_file(text.encode("utf-8"), self.store.state_dir / "attachments",
                            name="message.txt", mime="text/plain")
        return (stored.to_doc(),)

    def _save_reply(
        self,
        before: Conversation,
        after: Conversation,
        items: Sequence[Inbound],
        result: ChatResult,
        text: str,
        intro: str,
        prompt_tokens: int,
        safety_net: int = 0,
    ) -> None:
        now = self.clock()
        meta = {
            "inbox_ids": [i.id for i in items],
            "reply_to": items[-1].platform_id,  # where a group reply is threaded
            "prompt_eval_count": result.prompt_eval_count,  # the first call's
            "prompt_eval_cached_count": result.prompt_eval_cached_count,
            "prompt_tokens": prompt_tokens,  # all the turn's calls (tool calls, continuations)
            "eval_count": result.eval_count,
            "done_reason": result.done_reason,
            "num_ctx": result.num_ctx,
            **({"safety_net": safety_net} if safety_net else {}),  # passes, for /status
        }
        message = self.store.append_message(before.id, "assistant", text.strip() or EMPTY_REPLY,
                                            created=now, meta=meta)
        self.store.outbox_add(self._outbound_for(after, message, intro).to_doc())
        self.store.inbox_done([i.id for i in items])
        # Only the index record: a fold meanwhile wrote the summary to its own file.
        self.store.save_conversation(after.touched(now))

    def _requeue(self, conversation: Conversation, message: Message) -> None:
        outbound = self._outbound_for(conversation, message, "")
        queued = any(o["id"] == outbound.id for o in self.store.outbox_pending())
        if not queued and not self.store.was_sent(outbound.id):
            self.store.outbox_add(outbound.to_doc())

    def _outbound_for(self, conversation: Conversation, message: Message, intro: str) -> Outbound:
        # The outbox id is the message id, so a reply is queued at most once. The intro line is
        # for the user only; the stored message is the model's words.
        return Outbound(
            chat_key=conversation.chat_key, text=intro + message.content,
            created=message.created, kind="reply", id=message.id,
            conversation_id=conversation.id, message_id=message.id,
            reply_to=message.meta.get("reply_to"),
        )
