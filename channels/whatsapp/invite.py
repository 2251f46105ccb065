"""The template that reopens a conversation after WhatsApp's 24 hours.

Outside the window Meta delivers only approved templates (a free-form reply is refused with
131047, and roost holds it until the person writes again). With `whatsapp.template` set, the
first reply held for a chat sends that template ("your report is ready; reply to see it"): the
person's answer reopens the window and the held replies follow. Templates cost money, so a chat
gets at most one per `template_interval` however many replies wait; each one sent is an event
(`whatsapp-template`, counted in /metrics) and a count on the chat (shown by /status).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

from channels.whatsapp.api import Failure, GraphClient, GraphError
from channels.whatsapp.platform import WhatsAppSettings, log
from daemon.core.messages import TEMPLATE_FLAG
from daemon.store import Store
from daemon.store.event_log import Records

REFUSED_PAUSE = 3600.0  # after Meta refused the template, the next try waits this long
PARAMETER_CHARS = 60
# Meta refuses a parameter with a newline, a tab or more than four spaces in a row.
_UNSENDABLE = re.compile(r"[\r\n\t]+| {4,}")


class Invitations:
    def __init__(self, client: GraphClient, store: Store, settings: WhatsAppSettings,
                 records: Records | None, clock: Callable[[], float]) -> None:
        self.client = client
        self.store = store
        self.settings = settings
        self.records = records
        self.clock = clock
        self._lock = asyncio.Lock()  # two held replies of one chat at once send one template

    async def invite(self, chat_key: str, to: str, held_text: str) -> bool:
        """Send the template for a reply just held, unless one went out within the interval;
        whether one was sent. A refused template is logged and noted, never raised: the reply
        stays held either way."""
        name = self.settings.template
        if not name:
            return False
        async with self._lock:
            flags = await asyncio.to_thread(self.store.chat_flags, chat_key)
            sent: dict[str, Any] = flags.get(TEMPLATE_FLAG) or {}
            now = self.clock()
            if (now - float(sent.get("last") or 0.0) < self.settings.template_interval
                    or now - float(sent.get("refused") or 0.0) < REFUSED_PAUSE):
                return False
            parameter = preview(held_text) if self.settings.template_parameter else None
            try:
                wamid = await self.client.send_template(to, name,
                                                        self.settings.template_language,
                                                        parameter)
            except GraphError as exc:
                if exc.maybe_sent:  # it may have gone out (and been billed): count it as sent
                    await self._sent(chat_key, sent, now, f"template {name} probably sent "
                                                          f"(its answer was lost: {exc})")
                    return True
                refused = exc.kind is Failure.REFUSED
                log.warning("WhatsApp %s the template %r for %s: %s",
                            "refused" if refused else "did not take", name, chat_key, exc)
                if refused:  # a wrong name or parameter: not again for a while
                    await asyncio.to_thread(self.store.set_chat_flag, chat_key, TEMPLATE_FLAG,
                                            {**sent, "refused": now})
                await self._note(chat_key, f"template {name} not sent: {exc}")
                return False
            await self._sent(chat_key, sent, now, f"template {name} sent ({wamid}); the reply "
                                                  "waits for the person's answer")
            return True

    async def _sent(self, chat_key: str, sent: dict[str, Any], now: float, detail: str) -> None:
        count = int(sent.get("count") or 0) + 1
        await asyncio.to_thread(self.store.set_chat_flag, chat_key, TEMPLATE_FLAG,
                                {"last": now, "count": count})
        await self._note(chat_key, detail)

    async def _note(self, chat_key: str, detail: str) -> None:
        if self.records is not None:
            await asyncio.to_thread(self.records.event, self.clock(), "whatsapp-template",
                                    chat_key, detail)


def preview(text: str) -> str:
    """The held reply's first words as a template parameter Meta accepts."""
    flat = _UNSENDABLE.sub(" ", text).strip() or "your reply"
    return flat if len(flat) <= PARAMETER_CHARS else flat[:PARAMETER_CHARS - 1].rstrip() + "…"
