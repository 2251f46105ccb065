"""The model's reminder tools: `schedule_reminder`, `list_reminders`, `cancel_reminder`, one
capability on the pending reminders (automations/reminders.py), for the chat the turn runs in."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from automations.reminders import Reminders, when_text
from automations.when import FORMS, parse_when
from daemon.core.platforms import CONSOLE_CHAT, is_platform_chat
from daemon.tools.builtin import ToolContext
from daemon.tools.registry import Capability, Registry, Tool


def register(registry: Registry, reminders: Reminders) -> None:
    """The `reminders` capability, on the pending reminders of `reminders`."""

    async def chat_of(ctx: ToolContext) -> str | None:
        conversation = await asyncio.to_thread(ctx.store.get_conversation, ctx.conversation_id)
        if conversation is None or not (is_platform_chat(conversation.chat_key)
                                        or conversation.chat_key == CONSOLE_CHAT):
            return None
        return conversation.chat_key

    async def schedule_reminder(ctx: ToolContext, when: str, text: str) -> str:
        chat_key = await chat_of(ctx)
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
        doc = await reminders.add(chat_key, due.timestamp(), text, by="model")
        return (f"Reminder {doc['id']} set for {when_text(doc['due'], reminders.tz)} "
                f"({ctx.settings.daemon.timezone}).")

    async def list_reminders(ctx: ToolContext) -> str:
        chat_key = await chat_of(ctx)
        docs = await reminders.pending(chat_key) if chat_key else []
        if not docs:
            return "No reminders are pending for this chat."
        return "\n".join(f"- {d['id']} at {when_text(d['due'], reminders.tz)}: {d['text']}"
                         for d in docs)

    async def cancel_reminder(ctx: ToolContext, id: str) -> str:
        chat_key = await chat_of(ctx)
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
