"""Reminders: one-shot messages to a chat at a time, set by the model or by the command line.

Delivered exactly once: the reminder's outbox id is `reminder.<id>`, which `Engine.deliver`
queues at most once (and not at all once sent), and the reminder is recorded as done only
after that. A crash in between delivers nothing twice; it finishes the bookkeeping at the next
start. A reminder that came due while roost was down is delivered at start marked late when it
is less than `LATE_LIMIT` late, and otherwise reported to the chat as missed instead.

The model's tools (`schedule_reminder`, `list_reminders`, `cancel_reminder`) are one capability,
registered through the registry's `register()` like any other.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from automations.runner import Outlet
from automations.state import AutomationState
from automations.when import FORMS, parse_when
from daemon.core.conversations import kind_of
from daemon.core.ids import new_id
from daemon.core.logs import automation_log as log
from daemon.core.messages import Outbound
from daemon.tools.builtin import ToolContext
from daemon.tools.registry import Capability, Registry, Tool

LATE_LIMIT = 24 * 3600.0
LATE_AFTER = 60.0  # delivered more than this after its time: say so
MAX_TEXT = 1000
TARGET_KINDS = ("telegram", "whatsapp", "console")

Arm = Callable[[dict[str, Any]], None]


def new_reminder(chat_key: str, due: float, text: str, now: float, by: str) -> dict[str, Any]:
    """A pending reminder's record."""
    return {"id": new_id(now)[-10:].lower(), "chat_key": chat_key, "due": due,
            "text": text.strip()[:MAX_TEXT], "created": now, "by": by}


def when_text(moment: float, tz: ZoneInfo) -> str:
    return datetime.fromtimestamp(moment, tz).strftime("%a %Y-%m-%d %H:%M")


class Reminders:
    """Fires reminders through the engine's outbox; see the module docstring."""

    def __init__(self, outlet: Outlet, tz: ZoneInfo, state: AutomationState, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.outlet = outlet
        self.state = state
        self.clock = clock
        self.tz = tz
        self.arm: Arm = lambda doc: None  # set by the scheduler: put a reminder on its timer
        self._firing: dict[str, asyncio.Event] = {}  # reminder id -> set once it is handled

    async def add(self, chat_key: str, due: float, text: str, by: str) -> dict[str, Any]:
        doc = new_reminder(chat_key, due, text, self.clock(), by)
        await asyncio.to_thread(self.state.add_reminder, doc)
        self.arm(doc)
        log.info("reminder %s for %s at %s", doc["id"], chat_key, when_text(due, self.tz))
        return doc

    async def pending(self, chat_key: str | None = None) -> list[dict[str, Any]]:
        docs = await asyncio.to_thread(self.state.pending_reminders)
        return [d for d in docs if chat_key is None or d["chat_key"] == chat_key]

    async def cancel(self, reminder_id: str, chat_key: str | None = None) -> bool:
        for doc in await self.pending(chat_key):
            if doc["id"] == reminder_id.strip().lower():
                await asyncio.to_thread(self.state.finish_reminder, doc, "cancelled",
                                        self.clock())
                return True
        return False

    async def fire(self, reminder_id: str) -> None:
        """Deliver one reminder (the scheduler calls this at its time, and at start for the
        ones that came due while roost was down)."""
        if (running := self._firing.get(reminder_id)) is not None:
            # Fired twice at once (its timer and a scan): one delivers, and both return only
            # once it is handled.
            await running.wait()
            return
        self._firing[reminder_id] = done = asyncio.Event()
        try:
            docs = [d for d in await self.pending() if d["id"] == reminder_id]
            if docs:
                await self._deliver(docs[0])
        finally:
            del self._firing[reminder_id]
            done.set()

    async def _deliver(self, doc: dict[str, Any]) -> None:
        now = self.clock()
        late = now - doc["due"]
        if late > LATE_LIMIT:
            text = (f"While roost was not running, a reminder came due on "
                    f"{when_text(doc['due'], self.tz)}, more than a day ago, so it is not sent "
                    f"as a reminder now. It said: {doc['text']}")
            status = "missed"
        elif late > LATE_AFTER:
            text = f"⏰ Reminder (late: it was due {when_text(doc['due'], self.tz)}): {doc['text']}"
            status = "late"
        else:
            text = f"⏰ Reminder: {doc['text']}"
            status = "delivered"
        outbound = Outbound(chat_key=doc["chat_key"], text=text, created=now, kind="notice",
                            id=f"reminder.{doc['id']}")
        await self.outlet.deliver(outbound)
        await asyncio.to_thread(self.state.finish_reminder, doc, status, now)
        log.info("reminder %s for %s: %s", doc["id"], doc["chat_key"], status)


# ---- the model's tools -----------------------------------------------------------------------


def register_reminder_tools(registry: Registry, reminders: Reminders) -> None:
    """The `reminders` capability, through the same `register()` path as every tool."""

    async def chat_of(ctx: ToolContext) -> str | None:
        conversation = await asyncio.to_thread(ctx.store.get_conversation, ctx.conversation_id)
        if conversation is None or kind_of(conversation.chat_key) not in TARGET_KINDS:
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
        description="one-shot reminders sent to this chat at a time",
        tools=(
            Tool("schedule_reminder", f"Send the user a reminder at a time: when is {FORMS}.",
                 schema({"when": {"type": "string", "description": "when it is due"},
                         "text": {"type": "string", "description": "what to remind of"}},
                        ("when", "text")), schedule_reminder),
            Tool("list_reminders", "The reminders pending for this chat.", schema({}),
                 list_reminders),
            Tool("cancel_reminder", "Cancel a pending reminder by its id.",
                 schema({"id": {"type": "string"}}, ("id",)), cancel_reminder),
        )))
