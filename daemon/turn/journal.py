"""The turn's journal: what a turn writes to the store, in an order that is safe across a crash.

The pending user messages are appended, each marked with its inbox id, before the model is
called (and appended only once, however often the turn is retried); the tool calls and results
of the turn as they happen; then the reply is saved, put in the outbox, and only then are the
inbox items cleared. A crash between any two steps is finished on the next start: inbox items
stay pending until a reply that names them is saved, and a saved reply whose outbox item is
missing is queued again (`record_user_messages`). The synchronous steps do file I/O: the runner
calls them in a worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from daemon.context.budget import estimate_tokens, request_budget
from daemon.context.echoes import without_framing
from daemon.context.facts import facts_note
from daemon.core.config import Settings
from daemon.core.conversations import Conversation, Message, Role
from daemon.core.errors import StoreError
from daemon.core.logs import turn_log as log
from daemon.core.messages import Inbound, Outbound
from daemon.llm.client import ChatResult
from daemon.store import Store
from daemon.store.attachments import store_file
from daemon.store.facts import HOUSEHOLD, FactsBook, FrozenFacts, same_fact
from daemon.tools.scope import person_of
from daemon.turn.router import Router


def _changes(known: Sequence[str], now: Sequence[str]) -> tuple[list[str], list[str]]:
    """The facts added to and removed from `known` to make `now`."""
    return ([t for t in now if not any(same_fact(t, k) for k in known)],
            [k for k in known if not any(same_fact(k, t) for t in now)])


RESUME_LOOKBACK = 400  # messages searched for an item's own message or reply after a crash
EMPTY_REPLY = "(The model returned an empty reply.)"


class Journal:
    """The store writes of a turn (see the module docstring)."""

    def __init__(self, *, settings: Settings, store: Store, router: Router,
                 clock: Callable[[], float], facts: FactsBook | None = None) -> None:
        self.settings = settings
        self.store = store
        self.router = router
        self.clock = clock
        self.facts = facts

    async def save_step(self, conversation_id: str, role: Role, content: str,
                         **fields: Any) -> int:
        """A tool call or tool result of this turn, saved as it happens; returns its seq."""
        message = await asyncio.to_thread(self.store.append_message, conversation_id, role,
                                          content, created=self.clock(), **fields)
        return message.seq

    def reread(self, conversation: Conversation) -> Conversation:
        """The conversation with the summary a fold just wrote."""
        return self.store.get_conversation(conversation.id) or conversation

    def record_user_messages(
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
            # Touched here, saved once per turn: with the reply (`save_reply`), or when the
            # turn ends without one (`unanswered`, `parked`). Until then the appended messages are
            # the activity on disk, and `Store.active_conversation` counts them, so a crash
            # in between rotates no sooner than if this had been saved.
            conversation = conversation.touched(now)
        return conversation, list(items)

    def _facts_changed(self, conversation: Conversation) -> tuple[str, FrozenFacts] | None:
        """The line announcing facts kept or forgotten (the person's, and the household's
        where the conversation shares them) since the conversation's blocks were made, and
        the frozen facts that know of them; None when nothing changed (or the conversation
        has no blocks yet: they are made from the facts as they are now)."""
        if self.facts is None:
            return None
        frozen = self.facts.frozen(conversation.id)
        person = person_of(conversation.chat_key, self.settings)
        if frozen is None or frozen.person != (person.name if person is not None else ""):
            return None
        try:
            now = [f.text for f in self.facts.facts(person)] if person is not None else []
            shared = ([f.text for f in self.facts.facts(HOUSEHOLD)] if frozen.shares
                      else list(frozen.household_known))
        except StoreError as exc:  # unreadable: the conversation goes on without the news
            log.warning("facts unreadable (%s)", exc)
            return None
        changes = (*_changes(frozen.known, now), *_changes(frozen.household_known, shared))
        if not any(changes):
            return None
        return facts_note(*changes), replace(frozen, known=tuple(now),
                                             household_known=tuple(shared))

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

    def save_reply(
        self,
        before: Conversation,
        after: Conversation,
        items: Sequence[Inbound],
        result: ChatResult,
        text: str,
        intro: str,
        prompt_tokens: int,
        safety_net: int = 0,
        outro: str = "",
        request: Mapping[str, int | str] | None = None,
    ) -> None:
        """Save the reply, queue it and clear its inbox items. `intro` and `outro` are roost's
        own lines above and below it, for the user only: the stored message is the model's
        words, which later turns replay. `request` is what roost knew of the first request
        (its estimate, budget, refusals, cuts, the host; `request_facts`), kept for the console."""
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
            **(request or {}),
        }
        message = self.store.append_message(before.id, "assistant",
                                            without_framing(text.strip()) or EMPTY_REPLY,
                                            created=now, meta=meta)
        self.store.outbox_add(self._outbound_for(after, message, intro, outro).to_doc())
        self.store.inbox_done([i.id for i in items])
        # Only the index record: a fold meanwhile wrote the summary to its own file.
        self.store.save_conversation(after.touched(now))

    def unanswered(self, conversation: Conversation, items: Sequence[Inbound]) -> None:
        """A turn ended without a reply (the user got a notice): the conversation is saved as
        recorded and the items leave the inbox; their messages stay in the conversation."""
        self.store.save_conversation(conversation)
        self.store.inbox_done([i.id for i in items])

    def parked(self, conversation: Conversation) -> None:
        """The model server is out: the conversation is saved as recorded; the items stay in
        the inbox and the turn is tried again when it is back."""
        self.store.save_conversation(conversation)

    def _requeue(self, conversation: Conversation, message: Message) -> None:
        outbound = self._outbound_for(conversation, message, "")
        queued = any(o["id"] == outbound.id for o in self.store.outbox_pending())
        if not queued and not self.store.was_sent(outbound.id):
            self.store.outbox_add(outbound.to_doc())

    def _outbound_for(self, conversation: Conversation, message: Message, intro: str,
                      outro: str = "") -> Outbound:
        # The outbox id is the message id, so a reply is queued at most once. The intro and
        # outro lines are for the user only; the stored message is the model's words.
        return Outbound(
            chat_key=conversation.chat_key, text=intro + message.content + outro,
            created=message.created, kind="reply", id=message.id,
            conversation_id=conversation.id, message_id=message.id,
            reply_to=message.meta.get("reply_to"),
        )
