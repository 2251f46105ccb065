"""One turn: the chat's pending messages in, one reply out.

The turn is a thin coordinator over the store, the pure context functions and the model client:

1. route the chat to its active conversation and append the pending user messages, each marked
   with its inbox id, so they are on disk before the model is called (and appended only once,
   however often the turn is retried);
2. build the request (pure: prefix + history fitted to the budget);
3. call Ollama, streaming deltas to the channel, retrying with backoff while it is unreachable;
4. save the reply, put it in the outbox and only then clear the inbox items.

A crash between any two steps is finished on the next start: inbox items stay pending until a
reply that names them is saved, and a saved reply whose outbox item is missing is queued again.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

from channels.base import Inbound, Outbound
from daemon.config import Settings
from daemon.context.budget import calibrated_ratio, estimate_messages, request_budget
from daemon.context.prefix import system_prefix
from daemon.context.replay import DoesNotFit, build_request
from daemon.conversations import Conversation, Message
from daemon.errors import LLMError, LLMTimeout, LLMUnavailable, ModelNotFound
from daemon.llm import ChatResult, ModelClient
from daemon.logs import turn_log as log
from daemon.router import Router
from daemon.store import Store

MAX_BACKOFF = 60.0
EMPTY_REPLY = "(The model returned an empty reply.)"


class Outcome(enum.Enum):
    ANSWERED = "answered"  # a reply is in the outbox
    FAILED = "failed"  # the user got a notice; the messages stay in the conversation
    PARKED = "parked"  # the model server is down; the messages wait in the inbox


@dataclass(frozen=True)
class TurnResult:
    outcome: Outcome
    outbound: Outbound | None = None


Notify = Callable[[str, str], Awaitable[None]]  # (chat_key, text) -> notice delivered
StreamDelta = Callable[[str, str], None]  # (chat_key, delta)


class TurnRunner:
    """Runs turns; `notify` sends a notice to a chat, `stream` shows reply pieces as they come."""

    def __init__(
        self,
        *,
        settings: Settings,
        store: Store,
        llm: ModelClient,
        router: Router,
        notify: Notify,
        stream: StreamDelta,
        clock: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.store = store
        self.llm = llm
        self.router = router
        self.notify = notify
        self.stream = stream
        self.clock = clock

    async def run(
        self, chat_key: str, items: Sequence[Inbound], *, announce_outage: bool = True
    ) -> TurnResult:
        """Answer `items` (the chat's pending messages) in one model call."""
        conversation, answered = await asyncio.to_thread(
            self._record_user_messages, chat_key, items
        )
        if answered is not None:
            # A reply to these messages was saved before a crash: queue it, do not ask again.
            outbound = await asyncio.to_thread(self._requeue, conversation, answered, items)
            return TurnResult(Outcome.ANSWERED, outbound)
        history = await asyncio.to_thread(self.store.messages, conversation.id)
        try:
            num_ctx = await self.llm.num_ctx()
            budget = request_budget(num_ctx, self.settings.model.response_reserve)
            request = build_request(
                system_prefix(conversation.kind), history, budget, conversation.token_ratio
            )
            result = await self._call_model(chat_key, request.messages, announce_outage)
        except DoesNotFit as exc:
            return await self._fail(chat_key, items, (
                f"Your message is too long for the model's context window ({exc.needed} tokens "
                f"needed, {exc.budget} available). Please send it in parts."))
        except ModelNotFound as exc:
            return await self._fail(chat_key, items, (
                f"The model {exc.model!r} is not available on the Ollama server at "
                f"{self.llm.host}. Pull it there with: ollama pull {exc.model}"))
        except (LLMUnavailable, LLMTimeout):
            return TurnResult(Outcome.PARKED)
        except LLMError as exc:
            log.warning("turn for %s failed: %s", conversation.id, exc)
            return await self._fail(chat_key, items, (
                f"The model server answered with an error: {exc}. Your message is saved; "
                "send another message to try again."))
        ratio = conversation.token_ratio
        if result.prompt_eval_count:
            ratio = calibrated_ratio(result.prompt_eval_count, estimate_messages(request.messages))
        outbound = await asyncio.to_thread(
            self._save_reply, conversation, replace(conversation, token_ratio=ratio), items, result
        )
        log.info("turn for %s answered (%s prompt tokens, %s omitted)",
                 conversation.id, result.prompt_eval_count, request.omitted)
        return TurnResult(Outcome.ANSWERED, outbound)

    async def _call_model(
        self, chat_key: str, messages: list[dict[str, str]], announce_outage: bool
    ) -> ChatResult:
        """Call the model, retrying with backoff while it is unreachable; tell the user once."""
        model = self.settings.model
        for attempt in range(model.retry_attempts):
            try:
                return await self.llm.chat(messages, on_delta=lambda d: self.stream(chat_key, d))
            except (LLMUnavailable, LLMTimeout) as exc:
                log.warning("Ollama at %s unreachable (attempt %d of %d): %s",
                            self.llm.host, attempt + 1, model.retry_attempts, exc)
                if attempt == 0 and announce_outage:
                    await self.notify(chat_key, (
                        f"The model server at {self.llm.host} is not answering. Your message "
                        "is saved; I will keep trying and answer when it is back."))
                if attempt + 1 == model.retry_attempts:
                    raise
                await asyncio.sleep(min(model.retry_backoff * 2**attempt, MAX_BACKOFF))
        raise AssertionError("retry_attempts is at least 1")

    async def _fail(self, chat_key: str, items: Sequence[Inbound], text: str) -> TurnResult:
        await self.notify(chat_key, text)
        await asyncio.to_thread(self.store.inbox_done, [i.id for i in items])
        return TurnResult(Outcome.FAILED)

    # Synchronous steps, run in a worker thread ---------------------------------------------

    def _record_user_messages(
        self, chat_key: str, items: Sequence[Inbound]
    ) -> tuple[Conversation, Message | None]:
        """Append the items not yet in the conversation; return any reply already saved to them."""
        now = self.clock()
        conversation = self.router.conversation_for(chat_key, now).conversation
        recent = self.store.messages(conversation.id)[-(len(items) + 50):]
        present = {m.meta.get("inbox_id") for m in recent if m.role == "user"}
        wanted = {i.id for i in items}
        for message in reversed(recent):
            if message.role == "assistant" and wanted <= set(message.meta.get("inbox_ids", ())):
                return conversation, message
        for item in items:
            if item.id in present:
                continue
            meta = {"inbox_id": item.id, **({"platform_id": item.platform_id}
                                            if item.platform_id else {})}
            self.store.append_message(
                conversation.id, "user", item.text, created=item.received,
                channel_message_ids=(item.platform_id,) if item.platform_id else (),
                attachments=item.attachments, meta=meta,
            )
        conversation = conversation.touched(now)
        self.store.save_conversation(conversation)
        return conversation, None

    def _save_reply(
        self,
        before: Conversation,
        after: Conversation,
        items: Sequence[Inbound],
        result: ChatResult,
    ) -> Outbound:
        now = self.clock()
        meta = {
            "inbox_ids": [i.id for i in items],
            "prompt_eval_count": result.prompt_eval_count,
            "eval_count": result.eval_count,
            "done_reason": result.done_reason,
            "num_ctx": result.num_ctx,
        }
        text = result.content.strip() or EMPTY_REPLY
        message = self.store.append_message(before.id, "assistant", text, created=now, meta=meta)
        outbound = self._outbound_for(after, message)
        self.store.outbox_add(outbound.to_doc())
        self.store.inbox_done([i.id for i in items])
        self.store.save_conversation(after.touched(now))
        return outbound

    def _requeue(
        self, conversation: Conversation, message: Message, items: Sequence[Inbound]
    ) -> Outbound:
        outbound = self._outbound_for(conversation, message)
        if not any(o["id"] == outbound.id for o in self.store.outbox_pending()):
            self.store.outbox_add(outbound.to_doc())
        self.store.inbox_done([i.id for i in items])
        return outbound

    def _outbound_for(self, conversation: Conversation, message: Message) -> Outbound:
        # The outbox id is the message id, so a reply is queued at most once.
        return Outbound(
            chat_key=conversation.chat_key, text=message.content, created=message.created,
            kind="reply", id=message.id, conversation_id=conversation.id,
            message_id=message.id,
        )
