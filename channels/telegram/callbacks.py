"""Taps on roost's inline keyboard buttons (approval questions) as `callback_query` updates.

They are not messages: nothing is stored or queued. The button's data is an id roost chose
(`daemon.core.approval`); the tap goes to the approver with the chat it was made in and who
made it, and Telegram gets `answerCallbackQuery` with the approver's line (the client shows it
as a toast and stops its spinner). Once answered (or no longer waiting), the question loses its
keyboard, so nobody taps it again. Anything else gets a short "no longer in use".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from telegram import Bot
from telegram.error import TelegramError

from channels.telegram.parse import chat_key
from channels.telegram.platform import log
from daemon.core.approval import ACCEPTED, NOT_WAITING, Answer, Approver, parse

UNKNOWN = "This button is no longer in use."
ANSWER_LIMIT = 200  # characters answerCallbackQuery shows


class Callbacks:
    def __init__(self, bot: Bot, approver: Approver | None) -> None:
        self.bot = bot
        self.approver = approver

    async def handle(self, query: Mapping[str, Any]) -> None:
        """Answer one callback_query (never raises for what Telegram or the tapper sent)."""
        query_id = query.get("id")
        if not isinstance(query_id, str):
            return
        text = UNKNOWN
        sender = query.get("from")
        message = query.get("message")
        parsed = parse(query["data"]) if isinstance(query.get("data"), str) else None
        if (parsed is not None and self.approver is not None and isinstance(sender, dict)
                and type(sender.get("id")) is int and isinstance(message, dict)
                and isinstance(message.get("chat"), dict)
                and type(message["chat"].get("id")) is int):
            topic = message.get("message_thread_id") if message.get("is_topic_message") else None
            approval_id, choice = parsed
            text = await self.approver.answer(Answer(
                approval_id, choice, chat_key(message["chat"]["id"], topic),
                f"telegram:{sender['id']}"))
        try:
            await self.bot.answer_callback_query(query_id, text=text[:ANSWER_LIMIT])
        except TelegramError as exc:  # the toast only: the answer itself is taken
            log.info("answerCallbackQuery failed: %s", exc)
        if parsed is not None and (text in ACCEPTED or text == NOT_WAITING) \
                and isinstance(message, dict) and isinstance(message.get("chat"), dict) \
                and type(message.get("message_id")) is int:
            try:
                await self.bot.edit_message_reply_markup(message["chat"]["id"],
                                                         message["message_id"])
            except TelegramError as exc:  # cosmetic: the keyboard stays, a tap is answered
                log.info("removing the answered question's keyboard failed: %s", exc)
