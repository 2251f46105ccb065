"""The reply as it is written, shown in a private Telegram chat with `sendMessageDraft`.

Bot API 9.5 lets every bot stream a draft to a private chat (and its topics): an ephemeral
preview (about 30 s) that the client animates while its `draft_id` stays the same; the finished
reply must still be sent with `sendMessage`. So a draft is never a record: the reply goes out
through the outbox as always (exactly once, resumable), and a draft that fails, or a process
that dies mid-stream, leaves nothing behind in the chat.

One `Draft` per turn. The first draft goes as soon as there is something to show, then at most
one per `interval` (one chat's drafts never pile up behind each other), each through
python-telegram-bot's rate limiter with every other call, so many chats at once stay under
Telegram's limits. Leaving the turn (`close`) sends no more drafts and cancels the one waiting
in the rate limiter or on the wire: the reply must not wait behind its own preview (a draft
answered after the reply went out changes nothing the user keeps; a draft is ephemeral).

What a draft shows: the reply so far rendered like the reply itself (markdown-it closes an
unclosed fence or emphasis, so the HTML is always balanced), cut like the reply into parts of
4,096 characters, of which the draft shows the part being written; a line about the work in
progress ("thinking…") after the text while no new text came. HTML that Telegram refuses goes
again as plain text; refused as that too, the turn's drafts stop (the reply is not touched).

A long answer: each part before the one being written is finished, and goes out as a message
at once (`send_part`), so the answer is readable while it is written. Those messages are the
reply's first parts: the channel records their ids (`keep`, a chat flag, so that a crash
mid-stream leaves a record) and, once the turn has saved the reply, hands them to the reply's
delivery, which sends only the parts after them (TelegramChannel.streaming and .send).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import itertools
import random
from collections.abc import Awaitable, Callable

from telegram import Bot
from telegram.constants import ParseMode
from telegram.error import BadRequest, Forbidden, TelegramError

from channels.formatting import TELEGRAM_LIMIT, html_visible_length, split_telegram
from channels.telegram.platform import log

# Telegram's answer for a chat that takes no drafts (a group, a channel): not tried again there.
NOT_HERE = "TEXTDRAFT_PEER_INVALID"

# A draft_id is a non-zero integer per reply; Telegram animates changes of one id.
_ids = itertools.count(random.randint(1, 2**30))


def next_draft_id() -> int:
    return next(_ids) % (2**31 - 1) + 1


class Draft:
    """One turn's draft in one private chat (see the module docstring); a `ReplySink`."""

    def __init__(self, bot: Bot, chat_id: int, topic: int | None, *, interval: float,
                 refused: Callable[[], None],
                 send_part: Callable[[str], Awaitable[str | None]] | None = None,
                 keep: Callable[[list[str]], Awaitable[None]] | None = None) -> None:
        self.bot = bot
        self.chat_id = chat_id
        self.topic = topic
        self.interval = interval
        self.refused = refused  # the chat takes no drafts at all
        self.send_part = send_part  # a finished part as a message: its id (None: refused)
        self.keep = keep  # the ids of the parts sent so far, written down
        self.parts: list[str] = []  # the finished parts sent as messages (HTML)
        self.part_ids: list[str] = []
        self._parts_refused = False
        self._part: asyncio.Task[bool] | None = None  # the finished part on its way, if any
        self.draft_id = next_draft_id()
        self.sent = 0  # drafts Telegram took
        self._moved: float | None = None  # loop time Telegram took the last draft
        self._text = ""
        self._line = ""
        self._shown = ""
        self._plain = False  # Telegram refused this turn's HTML once: plain text from then on
        self._wake = asyncio.Event()
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- the sink ----------------------------------------------------------------------------

    def write(self, delta: str) -> None:
        self._text += delta
        self._line = ""
        self._wake.set()

    def status(self, line: str) -> None:
        self._line = line
        self._wake.set()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"roost-draft-{self.chat_id}")

    async def close(self) -> None:
        """No more drafts: the one under way is cancelled at once. A finished part on its way
        as a message is waited for (PTB's timeouts bound it): cut off, it could reach the chat
        unrecorded, and the reply's delivery would send it again."""
        self._closing.set()
        self._wake.set()
        task, self._task = self._task, None
        if task is None:
            return
        if not task.done():
            task.cancel()
        await asyncio.wait([task])
        if self._part is not None:
            await asyncio.wait([self._part])
        for ended in (task, self._part):
            if ended is not None and not ended.cancelled() and ended.exception() is not None:
                # A bug in the preview must read as one, but never costs the reply.
                log.error("drafts for %d failed", self.chat_id, exc_info=ended.exception())

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            if self._closing.is_set():
                return
            self._wake.clear()
            parts = split_telegram(self._text) if self._text.strip() else []
            await self._send_finished(parts[:-1])
            if self._closing.is_set():
                return
            if not await self._send(self.preview(parts)):
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await self._closing.wait()
            if self._closing.is_set():
                return

    # -- what is shown -----------------------------------------------------------------------

    async def _send_finished(self, finished: list[str]) -> None:
        """The finished parts not sent yet, as messages, each recorded as it goes."""
        if self.send_part is None or self._parts_refused:
            return
        for part in finished[len(self.parts):]:
            # Shielded: closing cancels this task, never a part half sent or not yet recorded.
            self._part = asyncio.create_task(self._send_part(part, self.send_part))
            if not await asyncio.shield(self._part):
                return

    async def _send_part(self, part: str,
                         send_part: Callable[[str], Awaitable[str | None]]) -> bool:
        sent = await send_part(part)
        if sent is None:  # refused: the reply's delivery sends it, and all after it
            self._parts_refused = True
            return False
        self.parts.append(part)
        self.part_ids.append(sent)
        if self.keep is not None:
            await self.keep(list(self.part_ids))
        return True

    def preview(self, parts: list[str]) -> str:
        """The HTML the draft shows now: the part being written, and the line about work."""
        shown = parts[-1] if parts else ""
        if self._line:
            line = f"<i>{html.escape(self._line)}</i>"
            joined = f"{shown}\n\n{line}" if shown else line
            if html_visible_length(joined) <= TELEGRAM_LIMIT:
                shown = joined
        return shown

    async def _send(self, preview: str) -> bool:
        """One draft; False when drafts stop for this turn."""
        if not preview or preview == self._shown:
            return True
        text, mode = (_visible(preview), None) if self._plain else (preview, ParseMode.HTML)
        try:
            await self.bot.send_message_draft(self.chat_id, self.draft_id, text,
                                              message_thread_id=self.topic, parse_mode=mode)
        except Forbidden as exc:
            log.debug("draft to %d refused: %s", self.chat_id, exc.message)
            return False
        except BadRequest as exc:
            if NOT_HERE in exc.message.upper():  # PTB capitalises it: "Textdraft_peer_..."
                self.refused()
                return False
            if self._plain:
                log.info("Telegram refused a plain draft for %d (%s); no more drafts this "
                         "reply", self.chat_id, exc.message)
                return False
            log.info("Telegram refused a draft's HTML for %d (%s); plain from now on",
                     self.chat_id, exc.message)
            self._plain = True
            return await self._send(preview)
        except TelegramError as exc:  # a 429 after the limiter's retries, the network: skip it
            log.debug("draft to %d failed: %s", self.chat_id, exc)
            return True
        self._shown = preview
        self.sent += 1
        self._moved = asyncio.get_running_loop().time()
        return True

    def moved_within(self, seconds: float) -> bool:
        """Whether a draft went out in the last `seconds`. A draft that stands still (the
        model is silent, or thinks at length) is no sign of work: "typing…" goes on then."""
        return (self._moved is not None
                and asyncio.get_running_loop().time() - self._moved < seconds)


def _visible(part: str) -> str:
    return html.unescape(_tags_removed(part))


def _tags_removed(part: str) -> str:
    out, inside = [], False
    for char in part:
        if char == "<":
            inside = True
        elif char == ">" and inside:
            inside = False
        elif not inside:
            out.append(char)
    return "".join(out)
