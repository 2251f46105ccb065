"""The model's reminder tools: `schedule_reminder`, `list_reminders`, `cancel_reminder`, one
capability on the pending reminders (automations/reminders.py), for the chat the turn runs in.

A reminder asked for in a group is for the one who asked: it goes to their private chat with
roost, not to everyone in the group, when roost can write to them there (they are a person it
serves, have written to it privately, and have not blocked it). Otherwise it goes to the group,
and the tool's answer says why, so the model can tell them."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from automations.commands import unserved
from automations.reminders import Reminders, when_text
from automations.when import FORMS, parse_when
from daemon.core.platforms import CONSOLE_CHAT, ChatKey, is_person_chat, is_platform_chat
from daemon.store import Store
from daemon.tools.builtin import ToolContext
from daemon.tools.registry import Capability, Registry, Tool


def register(registry: Registry, reminders: Reminders) -> None:
    """The `reminders` capability, on the pending reminders of `reminders`."""

    async def schedule_reminder(ctx: ToolContext, when: str, text: str) -> str:
        chat_key = await _chat_of(ctx)
        if chat_key is None:
            return "ERROR: reminders can only be set from a chat with the user."
        now = datetime.fromtimestamp(ctx.clock(), reminders.tz)
        try:
            due = parse_when(when, now)
        except ValueError as exc:
            return f"ERROR: {exc}"
        if due <= now:
            return f"ERROR: {when_text(due.timestamp(), reminders.tz)} is in the past."
        if not text.strip():
            return "ERROR: the reminder needs a text."
        to, where = await asyncio.to_thread(_recipient, ctx, chat_key)
        doc = await reminders.add(to, due.timestamp(), text, by="model",
                                  set_in=chat_key if to != chat_key else None)
        return (f"Reminder {doc['id']} set for {when_text(doc['due'], reminders.tz)} "
                f"({ctx.settings.daemon.timezone}).{where}")

    async def list_reminders(ctx: ToolContext) -> str:
        chat_key = await _chat_of(ctx)
        docs = await reminders.pending(chat_key) if chat_key else []
        if not docs:
            return "No reminders are pending for this chat."
        return "\n".join(f"- {d['id']} at {when_text(d['due'], reminders.tz)}: {d['text']}"
                         + (f" (to {d['chat_key']}, privately)" if d["chat_key"] != chat_key
                            else "") for d in docs)

    async def cancel_reminder(ctx: ToolContext, id: str) -> str:
        chat_key = await _chat_of(ctx)
        if chat_key and await reminders.cancel(id, chat_key):
            return f"Reminder {id} cancelled."
        return f"ERROR: no pending reminder {id!r} in this chat; list_reminders shows them."

    def schema(properties: dict[str, dict[str, str]], required: tuple[str, ...] = ()
               ) -> dict[str, Any]:
        return {"type": "object", "properties": properties, "required": list(required)}

    registry.register(Capability(
        name="reminders", group="automation",
        description="one-shot reminders sent to this chat",
        tools=(
            Tool("schedule_reminder", f"Send the user a reminder at a time: when is {FORMS}.",
                 schema({"when": {"type": "string", "description": "when it is due"},
                         "text": {"type": "string", "description": "what to remind of"}},
                        ("when", "text")), schedule_reminder, progress="setting a reminder…"),
            Tool("list_reminders", "The reminders pending for this chat.", schema({}),
                 list_reminders, progress="looking at your reminders…"),
            Tool("cancel_reminder", "Cancel a pending reminder by its id.",
                 schema({"id": {"type": "string"}}, ("id",)), cancel_reminder,
                 progress="cancelling a reminder…"),
        )))


async def _chat_of(ctx: ToolContext) -> str | None:
    """The chat the turn runs in, when it is one with people (not an automation's)."""
    conversation = await asyncio.to_thread(ctx.store.get_conversation, ctx.conversation_id)
    if conversation is None or not (is_platform_chat(conversation.chat_key)
                                    or conversation.chat_key == CONSOLE_CHAT):
        return None
    return conversation.chat_key


def _recipient(ctx: ToolContext, chat_key: str) -> tuple[str, str]:
    """Where a reminder asked for in `chat_key` goes, and what the answer adds about it (on a
    worker thread): a private chat's stays there; a group's goes to the private chat of who
    asked, when roost can write to them there, else to the group, saying why."""
    if is_person_chat(chat_key):
        return chat_key, ""
    private = asker_of(ctx.store, ctx.conversation_id, chat_key)
    if private is None or not is_person_chat(private):
        why = "who asked is not known"
    elif unserved(ctx.settings, private) is not None:
        why = "who asked is not someone I serve in a private chat"
    elif ctx.store.newest_conversation(private) is None:
        why = "who asked has never written to me privately, so I cannot write to them there"
    elif "undeliverable" in ctx.store.chat_flags(private):
        why = "who asked has blocked my messages in their private chat"
    else:
        return private, (" It goes to the private chat of the one who asked, not to this "
                         "group.")
    return chat_key, f" It goes to this group: {why}."


def asker_of(store: Store, conversation_id: str, chat_key: str) -> str | None:
    """The private chat (`<platform>:<sender>`) of whoever sent the newest message of the
    group's conversation: the one the turn answers. The sender is on the message's inbox item,
    which stays in the inbox until the turn that answers it ends. None: not known."""
    newest = next((m for m in reversed(store.messages(conversation_id)) if m.role == "user"),
                  None)
    if newest is None:
        return None
    item = next((d for d in store.inbox_pending(chat_key)
                 if d["id"] == newest.meta.get("inbox_id")), None)
    sender = item.get("sender") if item else None
    return f"{ChatKey.of(chat_key).kind}:{sender}" if sender else None
