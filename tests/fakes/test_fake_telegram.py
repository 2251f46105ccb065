"""The Bot API fake, driven by a real python-telegram-bot ``Bot`` over loopback HTTP."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from telegram import Bot, BotCommand, InlineKeyboardButton, InlineKeyboardMarkup, Update
from telegram.constants import ChatAction, ParseMode
from telegram.error import (
    BadRequest,
    Conflict,
    EndPointNotFound,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
)
from telegram.ext import AIORateLimiter, ApplicationBuilder, ContextTypes, MessageHandler, filters

from tests.fakes.telegram import FakeTelegram, parse_html

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "telegram"
CHAT = 1111111


def fixture(name: str) -> dict[str, Any]:
    with (FIXTURES / name).open(encoding="utf-8") as handle:
        data: dict[str, Any] = json.load(handle)
    return data


@pytest.fixture(autouse=True)
def ptb_timedelta(monkeypatch: pytest.MonkeyPatch) -> None:
    """Opt in to PTB 23's timedelta ``retry_after``: PTB 22.8 reads its own deprecated int
    ``retry_after`` while building every ``RetryAfter``, which warns (an error here) otherwise."""
    monkeypatch.setenv("PTB_TIMEDELTA", "true")


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(started=[CHAT]) as fake:
        yield fake


@pytest.fixture
async def bot(tg: FakeTelegram) -> AsyncIterator[Bot]:
    async with Bot(tg.token, base_url=tg.api_base, base_file_url=tg.file_base) as b:
        yield b


async def test_get_me_describes_the_bot(tg: FakeTelegram, bot: Bot) -> None:
    me = await bot.get_me()
    assert me.is_bot and me.username == "roost_test_bot" and me.id == 123456
    assert me.can_join_groups is True
    # `async with Bot` already called getMe once (Bot.initialize).
    assert [c.method for c in tg.calls] == ["getMe", "getMe"]


async def test_plain_send_message_is_recorded_and_numbered_per_chat(
    tg: FakeTelegram, bot: Bot
) -> None:
    tg.start_chat(2222222)
    first = await bot.send_message(CHAT, "hello")
    second = await bot.send_message(CHAT, "again")
    other = await bot.send_message(2222222, "elsewhere")
    assert (first.message_id, second.message_id, other.message_id) == (1, 2, 1)
    assert first.text == "hello" and first.chat.id == CHAT and first.chat.type == "private"
    assert first.from_user is not None and first.from_user.is_bot
    assert abs(first.date.timestamp() - time.time()) < 5
    assert [m["text"] for m in tg.sent_messages] == ["hello", "again", "elsewhere"]
    assert tg.sent_messages[0]["chat_id"] == CHAT  # JSON-decoded: an int, not "1111111"
    await bot.send_message(CHAT, "42", disable_notification=True)
    assert tg.sent_messages[-1] == {"chat_id": CHAT, "text": "42", "disable_notification": True}


async def test_html_message_with_keyboard(tg: FakeTelegram, bot: Bot) -> None:
    keyboard = InlineKeyboardMarkup([[InlineKeyboardButton("Yes", callback_data="y")]])
    sent = await bot.send_message(
        CHAT,
        "<b>bold</b> &amp; <a href='https://x.org'>link</a>",
        parse_mode=ParseMode.HTML,
        reply_markup=keyboard,
    )
    assert sent.text == "bold & link"
    assert sent.reply_markup == keyboard
    params = tg.calls_to("sendMessage")[0].params
    assert params["parse_mode"] == "HTML"
    assert params["reply_markup"] == {"inline_keyboard": [[{"text": "Yes", "callback_data": "y"}]]}


async def test_bad_html_is_refused_like_telegram(tg: FakeTelegram, bot: Bot) -> None:
    # PTB drops "Bad Request: " and str.capitalize()s the rest: "Can't parse entities: unsup..."
    with pytest.raises(BadRequest, match=r"(?i)can't parse entities") as caught:
        await bot.send_message(CHAT, "a <br> b", parse_mode=ParseMode.HTML)
    assert caught.value.message.endswith('unsupported start tag "br" at byte offset 2')
    with pytest.raises(BadRequest, match=r"(?i)can't find end tag corresponding to start tag"):
        await bot.send_message(CHAT, "<b>open", parse_mode=ParseMode.HTML)
    assert tg.sent_messages == []
    assert len(tg.calls_to("sendMessage")) == 2  # refused calls are still recorded


@pytest.mark.parametrize(
    ("html", "error"),
    [
        ("<b>x</i>", 'Unmatched end tag at byte offset 4, expected "</b>", found "</i>"'),
        ("x</b>", "Unexpected end tag at byte offset 1"),
        ("é <b", "Unclosed start tag at byte offset 3"),  # offsets are UTF-8 bytes
        ("<span>x</span>", 'Tag "span" must have class "tg-spoiler" at byte offset 0'),
    ],
)
def test_html_errors_use_telegrams_wording(html: str, error: str) -> None:
    with pytest.raises(Exception, match="can't parse entities") as caught:
        parse_html(html)
    assert str(caught.value).endswith(error)


def test_valid_html_becomes_plain_text() -> None:
    html = (
        '<b>b</b><i>i</i><u>u</u><s>s</s><tg-spoiler>p</tg-spoiler><span class="tg-spoiler">'
        '</span><code>c</code><pre><code class="language-py">x</code></pre>'
        "<blockquote expandable>q</blockquote> &lt;&gt;&quot;&#65;&#x42; &nbsp; a & b"
    )
    assert parse_html(html) == 'biuspcxq <>"AB &nbsp; a & b'


async def test_text_over_4096_characters_is_too_long(tg: FakeTelegram, bot: Bot) -> None:
    await bot.send_message(CHAT, "<b>" + "x" * 4096 + "</b>", parse_mode=ParseMode.HTML)
    with pytest.raises(BadRequest, match=r"(?i)message is too long"):
        await bot.send_message(CHAT, "x" * 4097)


async def test_text_over_32768_bytes_is_refused_before_parsing(
        tg: FakeTelegram, bot: Bot) -> None:
    link = '<a href="https://example.org/' + "p" * 63 + '">s</a>\n'  # 100 bytes, 2 shown
    await bot.send_message(CHAT, link * 327, parse_mode=ParseMode.HTML)  # 32,700 bytes
    with pytest.raises(BadRequest, match=r"(?i)message is too long"):
        await bot.send_message(CHAT, link * 328, parse_mode=ParseMode.HTML)
    with pytest.raises(BadRequest, match=r"(?i)message is too long"):
        await bot.send_message(CHAT, "é" * 4000 + "x" * 24_769)  # 32,769 bytes, no markup


async def test_429_raises_retry_after(tg: FakeTelegram, bot: Bot) -> None:
    tg.fail_next(
        "sendMessage", status=429, description="Too Many Requests: retry after 3", retry_after=3
    )
    with pytest.raises(RetryAfter) as caught:
        await bot.send_message(CHAT, "hi")
    assert caught.value.retry_after == timedelta(seconds=3)
    assert (await bot.send_message(CHAT, "hi")).text == "hi"  # the fault was used up


async def test_403_raises_forbidden(tg: FakeTelegram, bot: Bot) -> None:
    tg.fail_next("sendMessage", status=403, description="Forbidden: bot was blocked by the user")
    with pytest.raises(Forbidden, match="bot was blocked by the user"):
        await bot.send_message(CHAT, "hi")


async def test_a_bot_cannot_write_first_or_to_a_user_who_blocked_it(
        tg: FakeTelegram, bot: Bot) -> None:
    stranger = 2222222
    with pytest.raises(Forbidden, match="bot can't initiate conversation with a user"):
        await bot.send_message(stranger, "hello?")
    with pytest.raises(Forbidden, match="bot can't initiate conversation with a user"):
        await bot.send_chat_action(stranger, ChatAction.TYPING)
    # Once the user writes (an update from them), the chat is open.
    update = fixture("private_text_start.json")
    update["message"]["from"]["id"] = update["message"]["chat"]["id"] = stranger
    tg.queue_update(update)
    assert (await bot.send_message(stranger, "hello")).chat.id == stranger
    tg.block(stranger)
    with pytest.raises(Forbidden, match="bot was blocked by the user"):
        await bot.send_message(stranger, "still there?")
    tg.unblock(stranger)
    assert (await bot.send_message(stranger, "welcome back")).text == "welcome back"
    assert (await bot.send_message(-1001234567890, "groups are open")).chat.type == "supergroup"
    assert [m["text"] for m in tg.sent_messages] == ["hello", "welcome back", "groups are open"]


async def test_dropped_connection_raises_network_error(tg: FakeTelegram, bot: Bot) -> None:
    tg.drop_next("sendMessage")
    with pytest.raises(NetworkError):
        await bot.send_message(CHAT, "hi")
    assert len(tg.calls_to("sendMessage")) == 1  # httpx did not retry behind PTB's back
    assert (await bot.send_message(CHAT, "hi")).message_id == 1


async def test_wrong_token_and_unknown_method(tg: FakeTelegram, bot: Bot) -> None:
    with pytest.raises(InvalidToken):
        async with Bot("999:WRONG", base_url=tg.api_base, base_file_url=tg.file_base):
            pass
    with pytest.raises(EndPointNotFound):
        await bot.do_api_request("no_such_method")
    assert tg.calls[-1].method == "noSuchMethod"  # PTB camel-cases the endpoint


async def test_webhook_round_trip(tg: FakeTelegram, bot: Bot) -> None:
    url = "https://bot.example.org/webhooks/telegram"
    assert await bot.set_webhook(
        url, secret_token="s3cret_-X", allowed_updates=["message", "edited_message"]
    )
    assert tg.webhook is not None and tg.webhook["secret_token"] == "s3cret_-X"
    assert tg.webhook["allowed_updates"] == ["message", "edited_message"]
    info = await bot.get_webhook_info()
    assert info.url == url and info.allowed_updates == ("message", "edited_message")
    with pytest.raises(Conflict):
        await bot.get_updates()
    tg.queue_update(fixture("private_text_start.json"))
    assert await bot.delete_webhook(drop_pending_updates=True)
    assert tg.webhook is None and tg.calls_to("deleteWebhook")[0].params["drop_pending_updates"]
    info = await bot.get_webhook_info()
    assert info.url == "" and info.pending_update_count == 0


async def test_webhook_needs_https_and_a_clean_secret(bot: Bot) -> None:
    with pytest.raises(BadRequest, match=r"(?i)https url must be provided"):
        await bot.set_webhook("http://bot.example.org/hook")
    with pytest.raises(BadRequest, match=r"(?i)secret token contains unallowed characters"):
        await bot.set_webhook("https://bot.example.org/hook", secret_token="no spaces")


async def test_get_updates_long_polls_and_honours_offset(tg: FakeTelegram, bot: Bot) -> None:
    poll = asyncio.create_task(bot.get_updates(timeout=30))
    await tg.wait_for("getUpdates")
    tg.queue_update(fixture("private_text_start.json"))
    (update,) = await asyncio.wait_for(poll, 2)  # answered as soon as the update came
    assert update.update_id == 10000
    assert update.message is not None and update.message.text == "/start"
    assert update.effective_user is not None and update.effective_user.id == CHAT

    again = await bot.get_updates(timeout=0)
    assert [u.update_id for u in again] == [10000]  # not confirmed yet
    tg.queue_update({"message": fixture("private_text_start.json")["message"] | {"text": "2"}})
    later = await bot.get_updates(offset=10001, timeout=0)
    assert [(u.update_id, u.message.text if u.message else None) for u in later] == [(10001, "2")]


async def test_get_updates_gives_up_after_the_cap(tg: FakeTelegram, bot: Bot) -> None:
    tg.long_poll_cap = 0.1
    started = time.monotonic()
    assert await bot.get_updates(timeout=30) == ()
    assert time.monotonic() - started < 1
    assert tg.calls_to("getUpdates")[0].params["timeout"] == 30


async def test_get_updates_limit_and_allowed_updates(tg: FakeTelegram, bot: Bot) -> None:
    message = fixture("private_text_start.json")["message"]
    for _ in range(3):
        tg.queue_update({"message": message})  # update_ids 1, 2, 3
    assert [u.update_id for u in await bot.get_updates(limit=2)] == [1, 2]
    # allowed_updates applies to updates created after it; pending ones are still delivered.
    pending = await bot.get_updates(offset=3, allowed_updates=["edited_message"])
    assert [u.update_id for u in pending] == [3]
    tg.queue_update({"message": message})  # never created
    tg.queue_update(fixture("edited_message.json"))  # update_id 10000
    updates = await bot.get_updates(offset=4)
    assert [u.update_id for u in updates] == [10000]
    assert updates[0].edited_message is not None


async def test_get_file_and_download(tg: FakeTelegram, bot: Bot) -> None:
    tg.add_file("photo-1", b"\x89PNG fake bytes", "photos/file_1.png")
    file = await bot.get_file("photo-1")
    assert file.file_size == 15
    assert file.file_path == f"{tg.file_base}{tg.token}/photos/file_1.png"  # PTB makes it a URL
    assert await file.download_as_bytearray() == bytearray(b"\x89PNG fake bytes")
    with pytest.raises(BadRequest, match=r"(?i)invalid file_id"):
        await bot.get_file("nope")


async def test_uploads_are_recorded_and_downloadable(tg: FakeTelegram, bot: Bot) -> None:
    photo = await bot.send_photo(CHAT, b"image bytes", caption="<i>look</i>", parse_mode="HTML")
    document = await bot.send_document(CHAT, b"%PDF", filename="report.pdf")
    call = tg.calls_to("sendPhoto")[0]
    assert call.files == {"photo": b"image bytes"} and call.params["caption"] == "<i>look</i>"
    assert photo.caption == "look" and photo.photo[0].file_size == 11
    assert tg.calls_to("sendDocument")[0].files == {"document": b"%PDF"}
    assert document.document is not None
    downloaded = await (await bot.get_file(document.document.file_id)).download_as_bytearray()
    assert downloaded == bytearray(b"%PDF")


async def test_commands_chat_action_edit_and_delete(tg: FakeTelegram, bot: Bot) -> None:
    assert await bot.set_my_commands([BotCommand("new", "Start a new conversation")])
    assert tg.commands == [{"command": "new", "description": "Start a new conversation"}]
    assert await bot.send_chat_action(CHAT, ChatAction.TYPING)
    assert tg.calls_to("sendChatAction")[0].params == {"chat_id": CHAT, "action": "typing"}

    sent = await bot.send_message(CHAT, "draft")
    edited = await bot.edit_message_text("final", chat_id=CHAT, message_id=sent.message_id)
    assert isinstance(edited, type(sent)) and edited.text == "final" and edited.edit_date
    with pytest.raises(BadRequest, match=r"(?i)message is not modified"):
        await bot.edit_message_text("final", chat_id=CHAT, message_id=sent.message_id)
    assert await bot.delete_message(CHAT, sent.message_id)
    with pytest.raises(BadRequest, match=r"(?i)message to delete not found"):
        await bot.delete_message(CHAT, sent.message_id)


async def test_rate_limiter_waits_out_a_429(tg: FakeTelegram) -> None:
    app = (
        ApplicationBuilder()
        .token(tg.token)
        .base_url(tg.api_base)
        .base_file_url(tg.file_base)
        .updater(None)
        .rate_limiter(AIORateLimiter(max_retries=2))
        .build()
    )
    tg.fail_next(
        "sendMessage", status=429, description="Too Many Requests: retry after 1", retry_after=1
    )
    async with app:
        sent = await app.bot.send_message(CHAT, "patience")
    first, second = tg.calls_to("sendMessage")
    assert sent.text == "patience" and [m["text"] for m in tg.sent_messages] == ["patience"]
    assert second.time - first.time >= 1.0  # retry_after + 0.1 s in PTB's limiter


async def test_an_application_polls_and_replies(tg: FakeTelegram) -> None:
    app = ApplicationBuilder().token(tg.token).base_url(tg.api_base).build()

    async def echo(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.message is not None
        await update.message.reply_text(f"<i>{update.message.text}</i>", parse_mode="HTML")

    # A MessageHandler: the fixture's "/start" has no bot_command entity, so a CommandHandler
    # would not fire (real Telegram sends one).
    app.add_handler(MessageHandler(filters.TEXT, echo))
    tg.queue_update(fixture("private_text_start.json"))
    async with app:
        await app.start()
        assert app.updater is not None
        await app.updater.start_polling(timeout=10)
        await tg.wait_for("sendMessage")
        await app.updater.stop()
        await app.stop()
    assert tg.sent_messages == [{"chat_id": CHAT, "text": "<i>/start</i>", "parse_mode": "HTML"}]
    assert [c.method for c in tg.calls[:3]] == ["getMe", "deleteWebhook", "getUpdates"]


async def test_send_message_draft_is_taken_in_a_private_chat_and_its_topics(
        tg: FakeTelegram, bot: Bot) -> None:
    assert await bot.send_message_draft(CHAT, 7, "<b>half</b> an answer",
                                        parse_mode=ParseMode.HTML) is True
    assert await bot.send_message_draft(CHAT, 7, "in a topic", message_thread_id=3) is True
    assert await bot.send_message_draft(CHAT, 7, "") is True  # "Thinking..."
    assert [(d["draft_id"], d["text"]) for d in tg.drafts] == [
        (7, "half an answer"), (7, "in a topic"), (7, "")]
    assert tg.drafts[1]["message_thread_id"] == 3
    assert tg.sent_messages == [] and tg.messages == {}  # a draft is no message


@pytest.mark.parametrize(("chat", "draft_id", "text", "description"), [
    (-100123, 1, "hi", "TEXTDRAFT_PEER_INVALID"),
    (-123, 1, "hi", "TEXTDRAFT_PEER_INVALID"),
    (CHAT, 0, "hi", "draft_id must be non-zero"),
    (CHAT, 1, "x" * 4097, "Message is too long"),
    (CHAT, 1, "<b>open", "Can't parse entities"),
])
async def test_send_message_draft_refusals(tg: FakeTelegram, bot: Bot, chat: int,
                                           draft_id: int, text: str, description: str) -> None:
    with pytest.raises(BadRequest, match=f"(?i){description}"):
        await bot.send_message_draft(chat, draft_id, text,
                                     parse_mode=ParseMode.HTML if "<" in text else None)
    assert tg.drafts == []


async def test_send_message_draft_to_a_user_who_never_started_the_bot_is_403(
        tg: FakeTelegram, bot: Bot) -> None:
    with pytest.raises(Forbidden):
        await bot.send_message_draft(2222222, 1, "hi")
