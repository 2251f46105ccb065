"""Telegram delivery (`TelegramChannel`): the reply in parts, a draft while it is written,
"typing…" while a turn runs.

`send` renders the model's Markdown to Telegram HTML, split at 4,096 visible characters, and
records after each part how many were sent, so a restart resumes after the last part delivered.
python-telegram-bot's `AIORateLimiter` keeps under the flood limits and waits out a 429's
`retry_after`; other failures become `DeliveryError`s for the engine to retry (or, when the user
blocked the bot, to give up and mark the chat).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import re
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import httpx
from telegram import Bot, InlineKeyboardButton, InlineKeyboardMarkup, ReplyParameters
from telegram.constants import ChatAction, ParseMode
from telegram.error import BadRequest, Forbidden, NetworkError, RetryAfter, TelegramError

from channels.formatting import split_telegram, split_text
from channels.progress import Progress
from channels.telegram.drafts import Draft
from channels.telegram.parse import address_of
from channels.telegram.platform import log
from channels.telegram.voice import send_voice
from channels.working import kept_up
from daemon.core.errors import DeliveryError
from daemon.core.messages import UNSEEN, Outbound, ReplySink
from daemon.store import Store

_TAG = re.compile(r"<[^>]*>")
SMALLER_PIECE = 1024  # characters: the last try for a part Telegram refused whole
# A chat flag: ids of a reply's parts sent while it was written, until its delivery takes them.
STREAMED_FLAG = "streamed_parts"


def visible_text(part: str) -> str:
    """The text a Telegram-HTML part shows: the plain fallback when Telegram rejects the HTML."""
    return html.unescape(_TAG.sub("", part))


class TelegramChannel:
    """Delivery to Telegram chats: HTML parts, resumable; "typing…" while a turn runs."""

    name = "telegram"

    def __init__(self, bot: Bot, store: Store, *, typing_interval: float = 4.0,
                 drafts: bool = True, draft_interval: float = 0.7,
                 on_resent: Callable[[], None] | None = None) -> None:
        self.bot = bot
        self.store = store
        self.progress = Progress(store, on_resent)
        self.typing_interval = typing_interval
        self.drafts = drafts  # telegram.streaming = "draft"
        self.draft_interval = draft_interval
        self._no_drafts: set[int] = set()  # chats whose drafts Telegram refused outright
        self._drafting: dict[str, Draft] = {}  # chat key -> its running turn's draft
        self._streamed: dict[str, list[str]] = {}  # reply id -> its parts sent while written

    @contextlib.asynccontextmanager
    async def streaming(self, chat_key: str) -> AsyncIterator[ReplySink]:
        """The reply as it is written, in a draft (channels/telegram/drafts.py) in private
        chats and their topics. Groups keep "typing…": the Bot API takes drafts only in
        private chats, and a preview message edited as it grows would be a second record of
        the reply beside the outbox, orphaned by a crash mid-stream."""
        chat_id, topic = address_of(chat_key)
        if not self.drafts or chat_id < 0 or chat_id in self._no_drafts:
            yield UNSEEN
            return
        where = _Destination(chat_id, topic, None)

        async def send_part(part: str) -> str | None:
            try:
                return await self._send_whole(where, part, chat_key)
            except TelegramError as exc:  # the reply's delivery sends it, and tells of errors
                log.info("a finished part for %s did not go out early: %s", chat_key, exc)
                return None

        async def keep(ids: list[str]) -> None:
            await asyncio.to_thread(self.store.set_chat_flag, chat_key, STREAMED_FLAG, ids)

        draft = Draft(self.bot, chat_id, topic, interval=self.draft_interval,
                      refused=lambda: self._no_drafts.add(chat_id), send_part=send_part,
                      keep=keep)
        draft.start()
        self._drafting[chat_key] = draft
        try:
            yield draft
        finally:
            if self._drafting.get(chat_key) is draft:
                del self._drafting[chat_key]
            await draft.close()
            if draft.part_ids:
                await self._hand_over(chat_key, draft.parts, draft.part_ids)

    async def _hand_over(self, chat_key: str, parts: list[str], ids: list[str]) -> None:
        """The parts sent while the reply was written become its first parts, when the turn
        saved a reply that begins with them (its delivery then sends only the rest); else
        (the turn failed, or the reply renders differently) they are deleted, and the reply,
        if any, goes out whole."""
        pending = await asyncio.to_thread(self.store.outbox_pending, chat_key)
        for doc in reversed(pending):
            reply = Outbound.from_doc(doc)
            if reply.kind == "reply" and reply.parts_sent == 0 and \
                    split_telegram(reply.text)[:len(parts)] == parts:
                self._streamed[reply.id] = ids
                return
        await self._delete(chat_key, ids)

    async def _delete(self, chat_key: str, ids: list[str]) -> None:
        chat_id, _ = address_of(chat_key)
        for message_id in ids:
            try:
                await self.bot.delete_message(chat_id, int(message_id))
            except TelegramError as exc:  # too old, or gone: nothing more to do about it
                log.info("could not delete an early part in %s: %s", chat_key, exc)
        await asyncio.to_thread(self.store.set_chat_flag, chat_key, STREAMED_FLAG, None)

    async def clear_orphans(self) -> None:
        """At start: parts a crash left sent while their reply was written, and not handed to
        a reply's delivery (their ids are in no outbox item), are deleted: the reply, written
        again or resumed from the outbox, goes out whole."""
        flagged = await asyncio.to_thread(self.store.chats_with_flag, STREAMED_FLAG)
        for chat_key, ids in flagged.items():
            pending = await asyncio.to_thread(self.store.outbox_pending, chat_key)
            recorded = {i for doc in pending for i in doc.get("platform_ids", ())}
            await self._delete(chat_key, [i for i in ids if i not in recorded])

    def working(self, chat_key: str) -> contextlib.AbstractAsyncContextManager[None]:
        chat_id, topic = address_of(chat_key)

        async def show() -> None:
            draft = self._drafting.get(chat_key)
            if draft is not None and draft.moved_within(self.typing_interval):
                return  # the draft shows the reply coming: "typing…" would be one call more
            try:
                await self.bot.send_chat_action(chat_id, ChatAction.TYPING,
                                                message_thread_id=topic)
            except TelegramError as exc:  # cosmetic: never worth failing a turn for
                log.debug("sendChatAction to %d failed: %s", chat_id, exc)

        return kept_up(show, self.typing_interval, f"roost-typing-{chat_key}")

    async def send(self, outbound: Outbound) -> None:
        """Send the parts not yet delivered, recording progress after each one."""
        if outbound.kind == "voice":  # a spoken reply: channels/telegram/voice.py
            await self._send_voice(outbound)
            return
        chat_id, topic = address_of(outbound.chat_key)
        parts = split_telegram(outbound.text)
        done, ids = self.progress.start(outbound)
        streamed = self._streamed.pop(outbound.id, None)
        if streamed and not done:  # its first parts went out while it was written
            done, ids = len(streamed), list(streamed)
            await self.progress.record(outbound, done, ids, more=done < len(parts))
            await asyncio.to_thread(self.store.set_chat_flag, outbound.chat_key, STREAMED_FLAG,
                                    None)
        for index in range(done, len(parts)):
            # In a group the answer quotes the message that asked, so everyone sees whom it
            # answers; sent anyway when that message has been deleted meanwhile.
            reply = (ReplyParameters(int(outbound.reply_to), allow_sending_without_reply=True)
                     if index == 0 and chat_id < 0 and outbound.reply_to else None)
            # An approval question's buttons go under its last part.
            markup = (InlineKeyboardMarkup([[InlineKeyboardButton(b.label, callback_data=b.id)]
                                            for b in outbound.buttons])
                      if outbound.buttons and index + 1 == len(parts) else None)
            where = _Destination(chat_id, topic, reply, markup)
            await self.progress.attempt(outbound, index)
            more = index + 1 < len(parts)
            with _delivery_errors(), _lost_answer(self.progress, outbound, index):
                pieces = self.progress.pieces_sent(outbound, index)
                if not pieces:  # else it was refused whole before: on with its next piece
                    sent = await self._send_whole(where, parts[index], outbound.chat_key)
                    if sent is not None:
                        ids.append(sent)
                        # First thing after Telegram's answer: a crash before this write
                        # sends it again.
                        await self.progress.record(outbound, index + 1, ids, more=more)
                        continue
                await self._send_pieces(outbound, where, index, parts[index], pieces, ids,
                                        more=more)

    async def _send_voice(self, outbound: Outbound) -> None:
        """The voice note as one part, recorded like a text part: it was the one send left
        unrecorded, so a crash before the engine forgot the item sent it again every time."""
        done, _ = self.progress.start(outbound)
        if done:  # Telegram took it before a crash or a failed write: not again
            return
        await self.progress.attempt(outbound, 0)
        with _delivery_errors(), _lost_answer(self.progress, outbound, 0):
            sent = await send_voice(self.bot, outbound)
        # First thing after Telegram's answer, as for a text part.
        await self.progress.record(outbound, 1, [sent], more=False)

    async def _send_whole(self, where: _Destination, part: str, chat_key: str) -> str | None:
        """One part, HTML first; its message_id, or None when Telegram refused the content
        (not the chat) as HTML and as plain text, so that it goes in smaller pieces."""
        try:
            return await self._send(where, part, ParseMode.HTML)
        except BadRequest as exc:
            # PTB drops "Bad Request: " and capitalises the rest.
            log.warning("Telegram refused a part for %s (%s); sending it as plain text",
                        chat_key, exc.message)
        try:
            return await self._send(where, visible_text(part), None)
        except BadRequest as exc:
            log.warning("Telegram refused the plain text for %s too (%s); sending it in "
                        "smaller pieces", chat_key, exc.message)
        return None

    async def _send_pieces(self, outbound: Outbound, where: _Destination, index: int,
                           part: str, done: int, ids: list[str], *, more: bool) -> None:
        """Part `index` as plain text in smaller pieces from piece `done` on, each recorded
        first thing after Telegram's answer, like a part: a failure or crash on one piece
        resumes with it, not with the pieces before. A piece refused too gives this reply up
        (the engine tells the user)."""
        pieces = split_text(visible_text(part), SMALLER_PIECE)
        for number in range(done, len(pieces)):
            ids.append(await self._send(where, pieces[number], None))
            if number + 1 < len(pieces):
                await self.progress.record_piece(outbound, index, number + 1, ids)
            else:  # the last piece completes the part
                await self.progress.record(outbound, index + 1, ids, more=more)

    async def _send(self, where: _Destination, text: str, parse_mode: str | None) -> str:
        message = await self.bot.send_message(where.chat_id, text, parse_mode=parse_mode,
                                              message_thread_id=where.topic,
                                              reply_parameters=where.reply,
                                              reply_markup=where.markup)
        return str(message.message_id)


@dataclass(frozen=True)
class _Destination:
    chat_id: int
    topic: int | None  # a forum topic's message_thread_id
    reply: ReplyParameters | None
    markup: InlineKeyboardMarkup | None = None


@contextlib.contextmanager
def _delivery_errors() -> Iterator[None]:
    """Telegram's refusals as the engine's DeliveryErrors. Only 403 (blocked, removed from the
    group) gives up on the chat; a 400 that is left (refused whatever its form) gives up on
    this reply; the rest are tried again later."""
    try:
        yield
    except Forbidden as exc:  # the user blocked the bot, or it was removed from the group
        raise DeliveryError(f"Telegram refused delivery: {exc.message}{_forbidden_hint(exc)}",
                            permanent=True, chat_blocked=True) from exc
    except BadRequest as exc:  # refused whatever its form: this reply cannot go out
        raise DeliveryError(f"Telegram refused it: {exc.message}", permanent=True) from exc
    except RetryAfter as exc:  # still flooded after the rate limiter's retries
        raise DeliveryError(f"Telegram flood control: {exc}") from exc
    except NetworkError as exc:
        raise DeliveryError(f"cannot reach Telegram: {exc}") from exc
    except TelegramError as exc:
        raise DeliveryError(f"Telegram error: {exc}") from exc


# httpx (python-telegram-bot's HTTP client) failing before the request left: nothing was sent.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@contextlib.contextmanager
def _lost_answer(progress: Progress, outbound: Outbound, index: int) -> Iterator[None]:
    """A network error after the request left (not a refused connection) may hide a message
    Telegram took: the retry is then a duplicate, which /metrics counts."""
    try:
        yield
    except NetworkError as exc:
        if not isinstance(exc, BadRequest) and not isinstance(exc.__cause__, _NOT_SENT):
            progress.answer_lost(outbound, index)
        raise


def _forbidden_hint(exc: Forbidden) -> str:
    """What the operator can do about a 403: a bot may not write first to a person, so one who
    never opened it (an automation's or reminder's target, say) has to start it once."""
    if "initiate conversation" in exc.message:
        return (" (this user has not started the bot: they must open it in Telegram and press "
                "Start once; later messages to them are dropped until they write)")
    return ""
