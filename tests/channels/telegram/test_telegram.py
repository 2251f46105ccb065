"""The Telegram channel end to end: roost's real app on 127.0.0.1, the fake Bot API, fake Ollama.

Updates go through the real webhook route (or real polling), replies through the real outbox and
python-telegram-bot; nothing is patched.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import struct
import threading
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from PIL import Image

from channels.formatting import to_telegram_html
from channels.telegram.channel import (
    COMMANDS,
    SECRET_HEADER,
    WEBHOOK_PATH,
    Telegram,
    TelegramTuning,
)
from daemon.app.serve import ENGINE, PLATFORMS, STORE, build_app, serve
from daemon.core.conversations import Message
from daemon.core.errors import ConfigError, StoreError
from daemon.core.ids import inbound_id
from daemon.engine.chat_commands import GREETING, Commands
from daemon.engine.facts_commands import FactsCommands
from daemon.engine.workers import Engine
from daemon.store import Store
from tests.conftest import FIXTURES, SettingsFactory, wait_until
from tests.fakes.flood import Flood
from tests.fakes.ollama import FakeOllama, Reply
from tests.fakes.telegram import FakeTelegram, parse_html

SECRET = "s3cret_-X"
USER = 1111111
CHAT_KEY = f"telegram:{USER}"
HOOK_URL = "https://bot.example.org/webhooks/telegram"
FAST = TelegramTuning(album_window=0.3, typing_interval=0.1, download_backoff=0.01,
                      poll_timeout=1, poll_backoff=0.05)


def fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "telegram" / name).read_text("utf-8"))
    return data


def message(update_id: int, text: str | None = "hello", *, user: int = USER,
            chat: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """An update with a message, as real Telegram sends it."""
    body: dict[str, Any] = {
        "message_id": update_id, "date": int(time.time()),
        "chat": chat or {"id": user, "type": "private", "first_name": "Test"},
        "from": {"id": user, "is_bot": False, "first_name": "Test"}, **fields}
    if text is not None:
        body["text"] = text
    return {"update_id": update_id, "message": body}


def jpeg(width: int = 64, height: int = 48, colour: str = "red") -> bytes:
    out = BytesIO()
    Image.new("RGB", (width, height), colour).save(out, "JPEG")
    return out.getvalue()


def texts(fake: FakeTelegram) -> list[str]:
    """What the user saw of each sendMessage that Telegram accepted."""
    shown = []
    for params in fake.sent_messages:
        text = str(params["text"])
        shown.append(parse_html(text) if params.get("parse_mode") == "HTML" else text)
    return shown


@dataclass
class Daemon:
    app: web.Application
    runner: web.AppRunner
    url: str

    @property
    def store(self) -> Store:
        return self.app[STORE]

    @property
    def engine(self) -> Engine:
        return self.app[ENGINE]

    @property
    def telegram(self) -> Telegram:
        return self.app[PLATFORMS]["telegram"]

    async def post(self, update: object = None, *, secret: str | None = SECRET,
                   content_type: str = "application/json", body: bytes | None = None) -> int:
        headers = {"Content-Type": content_type}
        if secret is not None:
            headers[SECRET_HEADER] = secret
        data = body if body is not None else json.dumps(update).encode()
        async with aiohttp.ClientSession() as http, http.post(
                self.url + WEBHOOK_PATH, data=BytesIO(data), headers=headers) as reply:
            return reply.status

    async def settle(self, chat_key: str = CHAT_KEY) -> None:
        """Wait until every accepted update is processed and the chat has no turn running."""
        intake = self.telegram.intake
        assert intake is not None
        await asyncio.wait_for(intake.idle(), 5)
        await asyncio.wait_for(self.engine.wait_idle(chat_key), 5)

    def user_messages(self, chat_key: str = CHAT_KEY) -> list[Message]:
        conversation = self.store.active_conversation(chat_key)
        assert conversation is not None
        return [m for m in self.store.messages(conversation.id) if m.role == "user"]

    async def stop(self) -> None:
        await self.runner.cleanup()


Start = Callable[..., Awaitable[Daemon]]


async def start_roost(make_settings: SettingsFactory, fake_telegram: FakeTelegram,
                      fake_ollama: FakeOllama, tuning: TelegramTuning = FAST,
                      **sections: dict[str, Any]) -> Daemon:
    """roost with Telegram against these fakes; keyword groups override settings."""
    telegram = {"enabled": True, "mode": "webhook", "webhook_url": HOOK_URL,
                "api_base": fake_telegram.api_base, "file_base": fake_telegram.file_base,
                "allow": (USER,), "token": fake_telegram.token, "secret": SECRET}
    settings = make_settings(
        model={"host": fake_ollama.url, "retry_backoff": 0.05},
        telegram=telegram | sections.pop("telegram", {}), **sections)
    app = build_app(settings, tunings={"telegram": tuning})
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return Daemon(app, runner, f"http://127.0.0.1:{runner.addresses[0][1]}")


@pytest.fixture
async def start(fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
                make_settings: SettingsFactory) -> AsyncIterator[Start]:
    """Start roost with Telegram against the fakes; keyword groups override settings."""
    running: list[Daemon] = []

    async def run(tuning: TelegramTuning = FAST, **sections: dict[str, Any]) -> Daemon:
        daemon = await start_roost(make_settings, fake_telegram, fake_ollama, tuning,
                                   **sections)
        running.append(daemon)
        return daemon

    yield run
    for daemon in reversed(running):
        await daemon.stop()


# ---- the recorded fixtures through the webhook -------------------------------------------------


async def test_start_fixture_is_answered_with_the_greeting(
        start: Start, fake_telegram: FakeTelegram) -> None:
    daemon = await start()
    assert [c.method for c in fake_telegram.calls] == ["getMe", "setMyCommands", "setWebhook"]
    assert fake_telegram.webhook is not None
    assert fake_telegram.webhook["url"] == HOOK_URL
    assert fake_telegram.webhook["secret_token"] == SECRET
    assert fake_telegram.webhook["allowed_updates"] == ["message", "edited_message",
                                                        "callback_query"]
    every = Commands.names | FactsCommands.names
    assert {c["command"] for c in fake_telegram.commands} == every
    assert {c for c, _ in COMMANDS} == every

    # The fixture predates `is_bot` and has no bot_command entity: still a /start command.
    assert await daemon.post(fixture("private_text_start.json")) == 200
    await fake_telegram.wait_for("sendMessage")
    assert texts(fake_telegram) == [GREETING]
    assert fake_telegram.sent_messages[0]["chat_id"] == USER
    await daemon.settle()
    assert daemon.store.updates_pending("telegram") == []


async def test_edited_fixture_reaches_the_model_as_an_edit(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    original = message(9999, "Original text")
    original["message"]["message_id"] = 1365  # the message the fixture edits
    assert await daemon.post(original) == 200
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    fake_ollama.script("Noted, you changed it.")
    assert await daemon.post(fixture("edited_message.json")) == 200
    await fake_telegram.wait_for("sendMessage", 2)
    assert texts(fake_telegram) == ["echo: Original text", "Noted, you changed it."]
    last_user = [m for m in fake_ollama.chat_requests[-1]["messages"] if m["role"] == "user"][-1]
    assert "edited their earlier message (id 1365)" in last_user["content"]
    assert "> Edited text" in last_user["content"]
    await daemon.settle()
    assert [m.channel_message_ids for m in daemon.user_messages()] == [("1365",), ("1365",)]


async def test_an_edit_of_a_message_roost_never_saw_is_a_new_message(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    assert await daemon.post(fixture("edited_message.json")) == 200
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    assert texts(fake_telegram) == ["echo: Edited text"]
    (stored,) = daemon.user_messages()
    assert stored.content == "Edited text"
    assert "edit" not in stored.content


# ---- the webhook's door --------------------------------------------------------------------------


async def test_bad_requests_are_refused_and_never_processed(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    good = message(1, "the real one")
    assert await daemon.post(message(2, "no secret"), secret=None) == 403
    assert await daemon.post(message(3, "wrong secret"), secret="guess") == 403
    assert await daemon.post(message(4, "wrong secret"), secret=SECRET + "x") == 403
    assert await daemon.post(message(5, "form"), content_type="text/plain") == 415
    assert await daemon.post(body=b'{"update_id": 6, "message": ') == 400
    assert await daemon.post(body=b"[1, 2]") == 400
    assert await daemon.post({"update_id": "7"}) == 400
    # An update Telegram sent but roost cannot use: 200, or Telegram sends it for ever.
    assert await daemon.post({"update_id": 8, "message": {"text": "no chat"}}) == 200
    big = message(9, "x" * (FAST.max_body + 10))
    assert await daemon.post(big) == 413
    # Chunked: no Content-Length, the body is counted as it arrives.

    async def chunks() -> AsyncIterator[bytes]:
        payload = json.dumps(big).encode()
        for i in range(0, len(payload), 65536):
            yield payload[i:i + 65536]

    async with aiohttp.ClientSession() as http, http.post(
            daemon.url + WEBHOOK_PATH, data=chunks(),
            headers={"Content-Type": "application/json", SECRET_HEADER: SECRET}) as reply:
        assert reply.status == 413

    assert await daemon.post(good) == 200
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    assert texts(fake_telegram) == ["echo: the real one"]
    assert len(fake_ollama.chat_requests) == 1
    assert [m.content for m in daemon.user_messages()] == ["the real one"]


async def test_the_same_update_posted_twice_gets_one_reply(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    update = message(42, "once please")
    assert await daemon.post(update) == 200
    assert await daemon.post(update) == 200  # Telegram redelivers when it missed our 200
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    assert await daemon.post(update) == 200
    await daemon.settle()
    assert texts(fake_telegram) == ["echo: once please"]
    assert len(fake_ollama.chat_requests) == 1


async def test_a_redelivery_after_a_restart_is_still_dropped(
        start: Start, fake_telegram: FakeTelegram) -> None:
    daemon = await start()
    update = message(77, "before the restart")
    assert await daemon.post(update) == 200
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    await daemon.stop()
    again = await start()
    assert await again.post(update) == 200
    await again.settle()
    assert texts(fake_telegram) == ["echo: before the restart"]


# ---- delivery ---------------------------------------------------------------------------------


def long_markdown(target: int = 10_000) -> str:
    blocks: list[str] = []
    n = 0
    while sum(len(b) + 2 for b in blocks) < target:
        n += 1
        blocks.append(f"## Section {n}\n\nParagraph {n} has **bold**, _italic_, `code` and a "
                      f"[link](https://example.org/{n}) & <angle> brackets. " + "More words. " * 20)
        if n % 3 == 0:
            blocks.append("```python\n" + "\n".join(f"print({i})  # line {i}"
                                                    for i in range(40)) + "\n```")
        if n % 4 == 0:
            blocks.append("\n".join(f"- item {i} of list {n}" for i in range(10)))
    return "\n\n".join(blocks)


async def test_a_10000_character_answer_arrives_in_valid_parts(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    answer = long_markdown()
    assert 10_000 <= len(answer) < 11_000
    daemon = await start()
    fake_ollama.script(answer)
    assert await daemon.post(message(1, "tell me everything")) == 200
    await daemon.settle()
    sent = fake_telegram.sent_messages
    assert len(sent) >= 3
    # Every part was accepted by the fake's HTML check (else it would not be in sent_messages).
    assert all(p["parse_mode"] == "HTML" for p in sent)
    shown = texts(fake_telegram)
    assert all(len(text) <= 4096 for text in shown)
    whole = parse_html(to_telegram_html(answer))
    assert " ".join(shown).split() == whole.split()  # only whitespace is dropped at the cuts
    assert daemon.store.outbox_pending(CHAT_KEY) == []


async def test_a_429_storm_delays_but_loses_nothing(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    fake_telegram.fail_next("sendMessage", status=429, retry_after=1, times=3,
                            description="Too Many Requests: retry after 1")
    began = time.monotonic()
    assert await daemon.post(message(1, "flooded")) == 200
    await fake_telegram.wait_for("sendMessage", 4, timeout=10)
    await daemon.settle()
    assert time.monotonic() - began >= 3  # each retry_after waited out
    assert texts(fake_telegram) == ["echo: flooded"]
    assert len(fake_telegram.calls_to("sendMessage")) == 4
    assert daemon.store.outbox_pending() == []


async def test_unparseable_html_is_resent_as_plain_text(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    fake_ollama.script("Use **bold** & <care>")
    fake_telegram.fail_next("sendMessage", status=400, description=(
        "Bad Request: can't parse entities: unsupported start tag \"care\" at byte offset 17"))
    assert await daemon.post(message(1, "format")) == 200
    await fake_telegram.wait_for("sendMessage", 2)
    await daemon.settle()
    first, second = fake_telegram.calls_to("sendMessage")
    assert first.params["parse_mode"] == "HTML"
    assert "parse_mode" not in second.params
    assert second.params["text"] == "Use bold & <care>"
    assert len(fake_telegram.sent_messages) == 1


async def test_a_blocked_bot_marks_the_chat_and_stops_retrying(
        start: Start, fake_telegram: FakeTelegram) -> None:
    daemon = await start()
    fake_telegram.fail_next("sendMessage", status=403,
                            description="Forbidden: bot was blocked by the user")
    assert await daemon.post(message(1, "then I block you")) == 200
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    assert "undeliverable" in daemon.store.chat_flags(CHAT_KEY)
    # The worker idle (settle) with the outbox empty: there is nothing left to retry.
    assert daemon.store.outbox_pending() == []
    assert len(fake_telegram.calls_to("sendMessage")) == 1
    assert fake_telegram.sent_messages == []


async def test_a_dropped_connection_is_retried_and_delivered_once(
        start: Start, fake_telegram: FakeTelegram) -> None:
    daemon = await start()
    fake_telegram.drop_next("sendMessage")
    assert await daemon.post(message(1, "shaky line")) == 200
    await fake_telegram.wait_for("sendMessage", 2)
    await daemon.settle()
    assert texts(fake_telegram) == ["echo: shaky line"]


async def test_a_send_whose_answer_was_lost_goes_twice_and_is_counted(
        start: Start, fake_telegram: FakeTelegram) -> None:
    # Telegram took the message, the connection dropped before its answer: roost cannot know,
    # sends it again (at least once), and /metrics says so.
    daemon = await start()
    fake_telegram.drop_next("sendMessage", done=True)
    assert await daemon.post(message(1, "shaky line")) == 200
    await fake_telegram.wait_for("sendMessage", 2)
    await daemon.settle()
    assert texts(fake_telegram) == ["echo: shaky line", "echo: shaky line"]
    async with aiohttp.ClientSession() as http, http.get(daemon.url + "/metrics") as reply:
        metrics = await reply.text()
    assert 'roost_parts_resent_total{channel="telegram"} 1.0' in metrics


async def test_typing_is_shown_while_a_turn_runs_and_not_after(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    fake_ollama.script(Reply(content="thought about it", delay=0.6))
    assert await daemon.post(message(1, "think hard")) == 200
    (reply,) = await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    # The typing task ended with the turn: no typing can come after the reply.
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("roost-typing-")]
    typing = fake_telegram.calls_to("sendChatAction")
    assert len(typing) >= 3
    assert all(c.params == {"chat_id": USER, "action": "typing"} for c in typing)
    assert all(c.time < reply.time for c in typing)


@contextlib.contextmanager
def remote_fakes() -> Iterator[tuple[FakeTelegram, FakeOllama]]:
    """The fake Bot API and Ollama on an event loop of their own, answering as remote servers
    do: in step with each other, not with roost's loop."""
    loop = asyncio.new_event_loop()
    fakes = (FakeTelegram(started=[USER]), FakeOllama())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    for fake in fakes:
        asyncio.run_coroutine_threadsafe(fake.__aenter__(), loop).result(10)
    try:
        yield fakes
    finally:
        for fake in fakes:
            asyncio.run_coroutine_threadsafe(fake.__aexit__(None, None, None), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


async def test_hundreds_of_quick_turns_leave_the_bot_api_connections_free(
        make_settings: SettingsFactory) -> None:
    """Each turn ends its "typing…" while the chat action may still be on the wire. Cancelled
    there, httpx lost the connection (encode/httpcore#1093): after as many turns as the pool
    has connections (256 for real, 4 here) no reply could be sent any more."""
    with remote_fakes() as (fake_telegram, fake_ollama):
        daemon = await start_roost(
            make_settings, fake_telegram, fake_ollama,
            dataclasses.replace(FAST, connection_pool_size=4),
            access={"rate_limit": 1000})  # pacing is not the point here
        try:
            for turn in range(1, 41):
                assert await daemon.post(message(turn, f"quick {turn}")) == 200
                # Polled: the fake's own waiting lives on the other thread's loop.
                async with asyncio.timeout(10):
                    while len(fake_telegram.calls_to("sendMessage")) < turn:  # noqa: ASYNC110
                        await asyncio.sleep(0.01)
            assert texts(fake_telegram) == [f"echo: quick {turn}" for turn in range(1, 41)]
        finally:
            await daemon.stop()


# ---- media ------------------------------------------------------------------------------------


def photo_message(update_id: int, file_id: str, caption: str | None = None,
                  **fields: Any) -> dict[str, Any]:
    sizes = [
        {"file_id": f"{file_id}-thumb", "file_unique_id": "t", "width": 90, "height": 67,
         "file_size": 900},
        {"file_id": file_id, "file_unique_id": "b", "width": 640, "height": 480,
         "file_size": 30_000},
        {"file_id": f"{file_id}-huge", "file_unique_id": "h", "width": 8000, "height": 6000,
         "file_size": 25 * 1024 * 1024},  # over the Bot API's download limit
    ]
    if caption is not None:
        fields["caption"] = caption
    return message(update_id, None, photo=sizes, **fields)


async def test_a_photo_reaches_the_model_as_an_image(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    fake_ollama.models[0].capabilities += ("vision",)
    daemon = await start()
    fake_telegram.add_file("photo-1", jpeg(), "photos/file_1.jpg")
    assert await daemon.post(photo_message(1, "photo-1", "what is this?")) == 200
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    assert [c.params["file_id"] for c in fake_telegram.calls_to("getFile")] == ["photo-1"]
    (stored,) = daemon.user_messages()
    assert stored.content == "what is this?"
    (image,) = stored.attachments
    assert image["kind"] == "image" and image["mime"] == "image/jpeg"
    assert (image["width"], image["height"]) == (64, 48)
    assert (daemon.store.state_dir / image["path"]).is_file()


async def test_a_corrupt_photo_gets_a_clear_message_and_the_caption_still_goes(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    fake_telegram.add_file("photo-bad", b"\xff\xd8\xff\xe0 not really a jpeg", "photos/bad.jpg")
    assert await daemon.post(photo_message(1, "photo-bad", "and this?")) == 200
    await fake_telegram.wait_for("sendMessage", 2)
    await daemon.settle()
    notice, reply = texts(fake_telegram)
    assert "could not be read as an image" in notice
    assert reply == "echo: and this?"
    (stored,) = daemon.user_messages()
    assert stored.attachments == ()


def png_bomb(width: int = 40_000, height: int = 40_000) -> bytes:
    """A tiny PNG whose header declares a huge image: a decompression bomb."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))


@pytest.mark.parametrize(("data", "as_document", "expected"), [
    (png_bomb(), False, "too many pixels"),
    (jpeg(640, 480)[:900], False, "damaged"),
    (b"Dear diary,\nthis is plain text, not a picture.\n", True, "not in an image format"),
], ids=["decompression bomb", "truncated jpeg", "text renamed .png"])
async def test_a_bad_image_gets_a_clear_reply_and_harms_nothing_else(
        start: Start, fake_telegram: FakeTelegram, data: bytes, as_document: bool,
        expected: str) -> None:
    daemon = await start()
    fake_telegram.add_file("bad", data, "photos/bad.png")
    if as_document:
        document = {"file_id": "bad", "file_unique_id": "b", "file_name": "holiday.png",
                    "mime_type": "image/png", "file_size": len(data)}
        update = message(1, None, document=document, caption="look at this")
    else:
        update = photo_message(1, "bad", "look at this")
    assert await daemon.post(update) == 200
    await fake_telegram.wait_for("sendMessage", 2)
    await daemon.settle()
    notice, reply = texts(fake_telegram)
    assert expected in notice.lower()
    assert reply == "echo: look at this"
    # The next message is answered as usual.
    assert await daemon.post(message(2, "still there?")) == 200
    await fake_telegram.wait_for("sendMessage", 3)
    await daemon.settle()
    assert texts(fake_telegram)[-1] == "echo: still there?"


async def test_an_album_arrives_as_one_user_message(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    fake_ollama.models[0].capabilities += ("vision",)
    daemon = await start()
    fake_telegram.add_file("a1", jpeg(colour="red"))
    fake_telegram.add_file("a2", jpeg(colour="blue"))
    assert await daemon.post(photo_message(1, "a1", "two pics", media_group_id="g1")) == 200
    assert await daemon.post(photo_message(2, "a2", media_group_id="g1")) == 200
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    (stored,) = daemon.user_messages()
    assert stored.content == "two pics"
    assert [a["kind"] for a in stored.attachments] == ["image", "image"]
    assert len(fake_ollama.chat_requests) == 1
    assert [t for t in texts(fake_telegram) if t.startswith("echo:")] == ["echo: two pics"]


async def test_a_message_after_an_album_keeps_its_place(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    fake_ollama.models[0].capabilities += ("vision",)
    fake_ollama.hang = True  # both arrive while the first turn is still waiting
    daemon = await start()
    fake_telegram.add_file("b1", jpeg())
    assert await daemon.post(photo_message(1, "b1", "holiday", media_group_id="g2")) == 200
    assert await daemon.post(message(2, "what do you think?")) == 200
    intake = daemon.telegram.intake
    assert intake is not None
    await asyncio.wait_for(intake.idle(), 5)
    fake_ollama.hang = False
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    assert [(m.content, len(m.attachments)) for m in daemon.user_messages()] == [
        ("holiday", 1), ("what do you think?", 0)]


async def test_a_sticker_gets_told_what_roost_can_read(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    sticker = {"file_id": "st", "file_unique_id": "st", "type": "regular", "width": 512,
               "height": 512, "is_animated": False, "is_video": False}
    assert await daemon.post(message(1, None, sticker=sticker)) == 200
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    assert "I can read text, photos" in texts(fake_telegram)[0]
    assert fake_ollama.chat_requests == []


async def test_documents_and_voice_notes_become_attachment_references(
        start: Start, fake_telegram: FakeTelegram) -> None:
    daemon = await start()
    fake_telegram.add_file("doc-1", b"line one\nline two\n", "documents/notes.txt")
    fake_telegram.add_file("voice-1", b"OggS fake opus", "voice/file_2.oga")
    document = {"file_id": "doc-1", "file_unique_id": "d", "file_name": "notes.txt",
                "mime_type": "text/plain", "file_size": 18}
    voice = {"file_id": "voice-1", "file_unique_id": "v", "duration": 2,
             "mime_type": "audio/ogg", "file_size": 14}
    assert await daemon.post(message(1, None, document=document, caption="my notes")) == 200
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    assert await daemon.post(message(2, None, voice=voice)) == 200
    await fake_telegram.wait_for("sendMessage", 2)
    await daemon.settle()
    first, second = daemon.user_messages()
    (doc,) = first.attachments
    assert first.content == "my notes"
    assert (doc["kind"], doc["name"], doc["line_count"]) == ("document", "notes.txt", 2)
    (note,) = second.attachments
    assert (note["kind"], note["mime"]) == ("voice", "audio/ogg")


async def test_a_file_whose_message_gives_no_size_is_held_to_the_download_limit(
        start: Start, fake_telegram: FakeTelegram) -> None:
    daemon = await start()
    fake_telegram.add_file("big", b"\0" * (21 * 1024 * 1024), "documents/big.bin")
    document = {"file_id": "big", "file_unique_id": "b", "file_name": "big.bin",
                "mime_type": "application/octet-stream"}  # no file_size: getFile says 21 MB
    assert await daemon.post(message(1, None, document=document, caption="keep this")) == 200
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    assert any('The document "big.bin" is too large for me to download' in t
               for t in texts(fake_telegram)), texts(fake_telegram)
    assert fake_telegram.downloads == []  # refused on getFile's size, not read first
    assert not daemon.user_messages()[0].attachments


async def test_a_download_past_the_size_getfile_gave_is_cut_at_the_limit(
        start: Start, fake_telegram: FakeTelegram) -> None:
    # A Bot API gone wrong (or a local one) says 1 KB and sends 200 MB: PTB reads a download
    # whole, so roost's cap on its answers is what stops it (issue 48 item 6).
    daemon = await start()
    fake_telegram.add_file("liar", b"\0" * 1024, "documents/liar.bin")
    fake_telegram.download_flood = flood = Flood(200 * 1024 * 1024)
    document = {"file_id": "liar", "file_unique_id": "l", "file_name": "liar.bin",
                "mime_type": "application/octet-stream", "file_size": 1024}
    assert await daemon.post(message(1, None, document=document, caption="keep this")) == 200
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    assert any('The document "liar.bin" is too large for me to download' in t
               for t in texts(fake_telegram)), texts(fake_telegram)
    await wait_until(lambda: flood.done, 10)
    assert flood.cut and flood.sent < 100 * 1024 * 1024, flood  # roost hung up at its cap
    assert fake_telegram.downloads == ["documents/liar.bin"]  # tried once, not again
    kept = daemon.user_messages()[0]
    assert kept.content == "keep this" and not kept.attachments


# Bot API before 4.5 had no file_unique_id; public test data (the Bot API page "Testing your bot
# with updates") still sends files in that shape: a file_id and its size only.
OLD_PHOTO = [{"file_id": "old-photo-s", "width": 90, "height": 67, "file_size": 900},
             {"file_id": "old-photo", "width": 640, "height": 480, "file_size": 30_000}]
OLD_DOCUMENT = {"file_id": "AwADBAADbXXXXXXXXXXXGBdhD2l6_XX", "file_name": "Testfile.txt",
                "mime_type": "text/plain", "file_size": 18}


async def test_files_without_file_unique_id_go_through_with_their_captions(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    fake_ollama.models[0].capabilities += ("vision",)
    daemon = await start()
    fake_telegram.add_file("old-photo", jpeg(), "photos/file_9.jpg")
    fake_telegram.add_file(OLD_DOCUMENT["file_id"], b"line one\nline two\n", "documents/t.txt")
    assert await daemon.post(message(1, None, photo=OLD_PHOTO, caption="an old photo")) == 200
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    assert await daemon.post(message(2, None, document=OLD_DOCUMENT, caption="an old file")) == 200
    await fake_telegram.wait_for("sendMessage", 2)
    await daemon.settle()
    assert texts(fake_telegram) == ["echo: an old photo", "echo: an old file"]
    photo, document = daemon.user_messages()
    (image,) = photo.attachments
    assert image["kind"] == "image" and (image["width"], image["height"]) == (64, 48)
    (doc,) = document.attachments
    assert (doc["kind"], doc["name"]) == ("document", "Testfile.txt")
    assert daemon.store.quarantined() == []


async def test_an_edit_whose_sender_says_is_bot_as_a_string_is_answered(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    original = message(9999, "Original text")
    original["message"]["message_id"] = 1365
    assert await daemon.post(original) == 200
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    edit = fixture("edited_message.json")
    edit["edited_message"]["from"]["is_bot"] = "False"  # as some clients send it
    assert await daemon.post(edit) == 200
    await fake_telegram.wait_for("sendMessage", 2)
    await daemon.settle()
    assert "edited their earlier message (id 1365)" in daemon.user_messages()[-1].content
    # "True" as a string is a bot all the same: not answered.
    bot_edit = fixture("edited_message.json")
    bot_edit["update_id"] = 10001
    bot_edit["edited_message"]["from"]["is_bot"] = "True"
    assert await daemon.post(bot_edit) == 200
    await daemon.settle()
    assert len(daemon.user_messages()) == 2


# ---- who may talk -------------------------------------------------------------------------------


async def test_in_a_group_only_mentions_and_replies_are_answered(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    group = {"id": -1001234567890, "type": "supergroup", "title": "Family"}
    key = "telegram:-1001234567890"
    bot = {"id": 123456, "is_bot": True, "first_name": "Roost", "username": "roost_test_bot"}
    assert await daemon.post(message(1, "dinner at eight?", chat=group)) == 200
    assert await daemon.post(message(2, "@roost_test_bot what is 2+2?", chat=group)) == 200
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle(key)
    reply_to_bot = {"message_id": 1, "date": 1, "chat": group, "from": bot, "text": "4"}
    assert await daemon.post(message(3, "and 3+3?", chat=group,
                                     reply_to_message=reply_to_bot)) == 200
    await fake_telegram.wait_for("sendMessage", 2)
    await daemon.settle(key)
    assert {p["chat_id"] for p in fake_telegram.sent_messages} == {-1001234567890}
    assert [m.content for m in daemon.user_messages(key)] == [
        "[From Test]\nwhat is 2+2?",
        '[From Test]\n[Replying to you: "4"]\nand 3+3?']
    assert daemon.store.active_conversation(CHAT_KEY) is None  # the group has its own


async def test_an_unknown_sender_is_ignored_and_logged(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
        caplog: pytest.LogCaptureFixture) -> None:
    daemon = await start(access={"unknown_senders": "ignore"})  # "pair": tests/daemon/test_pairing
    caplog.set_level(logging.INFO, "roost.telegram")
    assert await daemon.post(message(1, "let me in", user=999)) == 200
    assert await daemon.post(message(2, "it's me")) == 200
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    await daemon.settle("telegram:999")
    assert texts(fake_telegram) == ["echo: it's me"]
    assert len(fake_ollama.chat_requests) == 1
    assert daemon.store.active_conversation("telegram:999") is None
    logged = [r.getMessage() for r in caplog.records if r.name == "roost.telegram"]
    assert any("unknown Telegram user 999" in line for line in logged)
    assert not any("let me in" in line for line in logged)  # no message bodies in the log
    # Nothing is left running for a chat that wrote once.
    await wait_until(lambda: not [t for t in asyncio.all_tasks()
                                  if t.get_name() == "roost-telegram-999"])


# ---- start-up, polling and restarts ------------------------------------------------------------


async def test_webhook_mode_without_a_secret_is_refused_at_start(
        fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
        make_settings: SettingsFactory) -> None:
    base = {"enabled": True, "webhook_url": HOOK_URL, "api_base": fake_telegram.api_base,
            "file_base": fake_telegram.file_base, "token": fake_telegram.token}
    for secret in (None, "has spaces", "x" * 257):
        settings = make_settings(model={"host": fake_ollama.url},
                                 telegram=base | {"secret": secret})
        runner = web.AppRunner(build_app(settings))
        with pytest.raises(ConfigError, match=r"telegram\.secret"):
            await runner.setup()
        await runner.cleanup()
        assert await serve(settings) == 78
    assert fake_telegram.calls == []


async def test_polling_deletes_the_webhook_then_polls_and_replies(
        start: Start, fake_telegram: FakeTelegram) -> None:
    fake_telegram.queue_update(message(5, "polled hello"))
    daemon = await start(telegram={"mode": "polling", "webhook_url": None, "secret": None})
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    assert texts(fake_telegram) == ["echo: polled hello"]
    methods = [c.method for c in fake_telegram.calls]
    assert methods.index("deleteWebhook") < methods.index("getUpdates")
    assert "setWebhook" not in methods
    assert await daemon.post(message(6, "webhook?")) == 404  # never both modes
    await daemon.stop()
    assert daemon.store.updates_pending("telegram") == []


async def test_polling_confirms_an_update_only_once_it_is_stored(
        start: Start, fake_telegram: FakeTelegram, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_telegram.queue_update(message(7, "kept through a full disk"))
    daemon = await start(telegram={"mode": "polling", "webhook_url": None, "secret": None})
    real = daemon.store.updates_accept_many
    failures = [StoreError("cannot write index.json: No space left on device")]

    def full_disk_once(*args: Any, **kwargs: Any) -> bool:
        if failures:
            raise failures.pop()
        return real(*args, **kwargs)

    monkeypatch.setattr(daemon.store, "updates_accept_many", full_disk_once)
    await fake_telegram.wait_for("sendMessage", timeout=15)
    await daemon.settle()
    assert texts(fake_telegram) == ["echo: kept through a full disk"]
    offsets = [c.params.get("offset") for c in fake_telegram.calls_to("getUpdates")]
    # Asked again from the same place after the failed store, then past the update.
    assert offsets[:2] == [None, None] and 8 in offsets
    await daemon.stop()


async def test_updates_left_by_a_crash_are_processed_at_the_next_start(
        start: Start, fake_telegram: FakeTelegram, state_dir: Path) -> None:
    with Store.open(state_dir) as store:
        store.updates_add("telegram", "telegram:update:9", message(9, "left behind"),
                          time.time())
    daemon = await start()
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    assert texts(fake_telegram) == ["echo: left behind"]
    assert daemon.store.updates_pending("telegram") == []


async def test_an_update_submitted_just_before_a_crash_is_not_submitted_again(
        start: Start, fake_telegram: FakeTelegram, state_dir: Path) -> None:
    # A crash after engine.submit and before the raw update was marked done: the message may
    # still wait in the inbox or (as here) be answered already; either way it is not submitted
    # again, since its inbox id follows from the stored update.
    daemon = await start()
    update = message(11, "submitted once")
    assert await daemon.post(update) == 200
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    (first,) = daemon.user_messages()
    await daemon.stop()
    key = "telegram:update:11"
    assert first.meta["inbox_id"] == inbound_id(first.created, key)
    with Store.open(state_dir) as store:  # the raw update as the crash would have left it
        store.updates_add("telegram", key, update, first.created)
    again = await start()
    await again.settle()
    # The stored update handled and the chat idle with nothing queued: a second reply, were
    # there one, would wait in the inbox or the outbox.
    assert again.store.updates_pending("telegram") == []
    assert again.store.inbox_pending() == [] and again.store.outbox_pending() == []
    assert texts(fake_telegram) == ["echo: submitted once"]
    assert len(again.user_messages()) == 1


# ---- groups, topics and what the model learns of them ------------------------------------------

GROUP = {"id": -1001234567890, "type": "supergroup", "title": "Family", "is_forum": True}
GROUP_KEY = "telegram:-1001234567890"
BOT = {"id": 123456, "is_bot": True, "first_name": "Roost", "username": "roost_test_bot"}


async def test_a_reply_in_a_forum_topic_stays_in_the_topic_and_threads_to_the_question(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    fake_ollama.script(Reply(content="Pasta.", delay=0.3))
    asked = message(7, "@roost_test_bot what's for dinner?", chat=GROUP,
                    message_thread_id=42, is_topic_message=True)
    assert await daemon.post(asked) == 200
    (sent,) = await fake_telegram.wait_for("sendMessage")
    key = f"{GROUP_KEY}:42"
    await daemon.settle(key)
    assert sent.params["chat_id"] == GROUP["id"]
    assert sent.params["message_thread_id"] == 42
    assert sent.params["reply_parameters"] == {"message_id": 7,
                                               "allow_sending_without_reply": True}
    assert all(c.params.get("message_thread_id") == 42
               for c in fake_telegram.calls_to("sendChatAction"))
    # Each topic is its own conversation; the General topic (no thread) is the group's.
    assert daemon.store.active_conversation(key) is not None
    assert daemon.store.active_conversation(GROUP_KEY) is None
    assert await daemon.post(message(8, "@roost_test_bot and in general?", chat=GROUP)) == 200
    await fake_telegram.wait_for("sendMessage", 2)
    await daemon.settle(GROUP_KEY)
    general = fake_telegram.calls_to("sendMessage")[1].params
    assert "message_thread_id" not in general
    assert general["reply_parameters"]["message_id"] == 8


async def test_a_private_reply_is_not_threaded(
        start: Start, fake_telegram: FakeTelegram) -> None:
    daemon = await start()
    assert await daemon.post(message(3, "hi")) == 200
    (sent,) = await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    assert "reply_parameters" not in sent.params and "message_thread_id" not in sent.params


async def test_the_model_learns_who_speaks_what_is_quoted_and_where_a_forward_is_from(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    group = {"id": -100555, "type": "supergroup", "title": "Friends"}
    key = "telegram:-100555"
    long_answer = "The tides follow the moon. " * 20  # 540 characters
    answered = {"message_id": 4, "date": 1, "chat": group, "from": BOT, "text": long_answer}
    alice = {"id": USER, "is_bot": False, "first_name": "Alice", "last_name": "Smith",
             "username": "alice"}
    asked = message(5, "why twice a day?", chat=group, reply_to_message=answered)
    asked["message"]["from"] = alice
    assert await daemon.post(asked) == 200
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle(key)
    forwarded = message(6, "look at this", forward_origin={
        "type": "user", "date": 1, "sender_user": {"id": 77, "is_bot": False,
                                                    "first_name": "Bob"}})
    assert await daemon.post(forwarded) == 200
    hidden = message(7, "and this", forward_origin={"type": "hidden_user", "date": 1,
                                                    "sender_user_name": "Carol"})
    assert await daemon.post(hidden) == 200
    await fake_telegram.wait_for("sendMessage", 2)
    await daemon.settle()
    quote = " ".join(long_answer.split())[:199].rstrip() + "…"
    assert [m.content for m in daemon.user_messages(key)] == [
        f'[From Alice Smith (@alice)]\n[Replying to you: "{quote}"]\nwhy twice a day?']
    assert [m.content for m in daemon.user_messages()] == [
        "[Forwarded from Bob]\nlook at this", "[Forwarded from Carol]\nand this"]
    seen = "\n".join(m["content"] for m in fake_ollama.chat_requests[-1]["messages"]
                     if m["role"] == "user")
    assert "[Forwarded from Bob]\nlook at this" in seen


async def test_a_refused_reply_is_retried_plain_then_smaller_then_reported_and_chat_goes_on(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    fake_ollama.script("**first** answer " * 100, "second answer")
    # Refused as HTML, as plain text, and as a smaller piece: this reply cannot go out.
    fake_telegram.fail_next("sendMessage", status=400,
                            description="Bad Request: message is too long", times=3)
    assert await daemon.post(message(1, "one")) == 200
    await fake_telegram.wait_for("sendMessage", 4)
    await daemon.settle()
    calls = fake_telegram.calls_to("sendMessage")
    assert calls[0].params["parse_mode"] == "HTML"
    assert "parse_mode" not in calls[1].params
    assert len(calls[1].params["text"]) > 1024 >= len(calls[2].params["text"])
    assert texts(fake_telegram) == [
        "A reply could not be delivered (Telegram refused it: Message is too long). Ask again "
        "if you need it; the conversation goes on."]
    assert "undeliverable" not in daemon.store.chat_flags(CHAT_KEY)
    assert await daemon.post(message(2, "two")) == 200
    await fake_telegram.wait_for("sendMessage", 5)
    await daemon.settle()
    assert texts(fake_telegram)[-1] == "second answer"


async def test_a_reply_refused_as_html_but_fine_as_plain_is_delivered_once(
        start: Start, fake_telegram: FakeTelegram) -> None:
    daemon = await start()
    fake_telegram.fail_next("sendMessage", status=400,
                            description="Bad Request: entities too long")
    assert await daemon.post(message(1, "plain please")) == 200
    await fake_telegram.wait_for("sendMessage", 2)
    await daemon.settle()
    assert texts(fake_telegram) == ["echo: plain please"]


async def test_a_link_heavy_answer_is_split_under_the_byte_limit_and_delivered(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    links = "\n".join(f"- [source](https://example.org/research/archive/{i:04d}/a-rather-long"
                      f"-article-slug?ref=list)" for i in range(400))
    fake_ollama.script(links)
    assert await daemon.post(message(1, "sources?")) == 200
    await fake_telegram.wait_for("sendMessage", 2)
    await daemon.settle()
    calls = fake_telegram.calls_to("sendMessage")
    assert len(fake_telegram.sent_messages) == len(calls) >= 2  # none refused
    assert sum(texts(fake_telegram)[i].count("source") for i in range(len(calls))) == 400


async def test_a_disk_that_refuses_the_progress_record_does_not_resend_the_reply(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Every part from the outbox, one record each (streamed, the finished parts would go
    # out early and be taken over in one record).
    daemon = await start(telegram={"streaming": "off"})
    fake_ollama.script("\n\n".join(f"Part {i}. " + "word " * 700 for i in range(3)))
    real = daemon.store.outbox_update
    refusals = [StoreError("cannot write outbox/x.json: No space left on device")] * 3

    def full_disk(*args: Any, **kwargs: Any) -> None:
        if "parts_sent" in kwargs and refusals:  # after Telegram took the part
            raise refusals.pop()
        real(*args, **kwargs)

    monkeypatch.setattr(daemon.store, "outbox_update", full_disk)
    assert await daemon.post(message(1, "a long answer please")) == 200
    await fake_telegram.wait_for("sendMessage", 3, timeout=20)
    await daemon.settle()  # the worker idle with the outbox empty: no resend can come
    assert [t.split(".")[0] for t in texts(fake_telegram)] == ["Part 0", "Part 1", "Part 2"]
    assert refusals == [] and daemon.store.outbox_pending() == []
