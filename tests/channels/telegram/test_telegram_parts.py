"""The Telegram channel's parts on their own: parsing, the gate, photo choice, resumable delivery,
the typing indicator, and what start-up refuses."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from telegram import Bot, PhotoSize

from channels.formatting import split_telegram, split_text
from channels.telegram.delivery import SMALLER_PIECE, TelegramChannel, visible_text
from channels.telegram.media import best_photo
from channels.telegram.parse import (
    BotIdentity,
    NotAnUpdate,
    address_of,
    admit,
    chat_key,
    message_of,
    message_text,
    parse_update,
)
from channels.wording import edit_text
from daemon.app.serve import serve
from daemon.core.errors import DeliveryError, StoreError
from daemon.core.ids import inbound_id
from daemon.core.messages import Outbound
from daemon.store import Store
from tests.conftest import FIXTURES, SettingsFactory, wait_until
from tests.daemon.app.test_app import free_port
from tests.daemon.voice.recordings import OPUS
from tests.fakes.ollama import FakeOllama
from tests.fakes.telegram import FakeTelegram

BOT = BotIdentity(id=123456, username="roost_test_bot")
USER = 1111111
GROUP = {"id": -100777, "type": "supergroup", "title": "Family"}


def update(text: str | None = "hi", *, user: int = USER, is_bot: bool = False,
           chat: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    message: dict[str, Any] = {
        "message_id": 5, "date": 1, "chat": chat or {"id": user, "type": "private"},
        "from": {"id": user, "is_bot": is_bot, "first_name": "T"}, **fields}
    if text is not None:
        message["text"] = text
    return {"update_id": 1, "message": message}


# ---- parsing and the gate ------------------------------------------------------------------------


def test_recorded_updates_without_is_bot_are_read() -> None:
    payload = json.loads((FIXTURES / "telegram" / "private_text_start.json").read_text("utf-8"))
    parsed = parse_update(payload)
    found = message_of(parsed)
    assert found is not None
    message, edited = found
    assert not edited and message.text == "/start"
    assert message.from_user is not None and message.from_user.is_bot is False
    assert "is_bot" not in payload["message"]["from"]  # what is stored stays as received


@pytest.mark.parametrize("payload", [
    [1, 2], "text", {"message": {}}, {"update_id": True}, {"update_id": "5"},
    {"update_id": 5, "message": {"message_id": 1}},
    {"update_id": 5, "message": "not an object"},
])
def test_what_is_not_an_update(payload: object) -> None:
    with pytest.raises(NotAnUpdate):
        parse_update(payload)


def test_an_update_of_another_kind_carries_no_message() -> None:
    assert message_of(parse_update({"update_id": 3})) is None


def gate(payload: dict[str, Any], allow: tuple[int, ...] = (USER,)) -> tuple[bool, str]:
    found = message_of(parse_update(payload))
    assert found is not None
    verdict = admit(found[0], BOT, allow)
    return verdict.admitted, verdict.reason


def test_the_gate() -> None:
    assert gate(update()) == (True, "")
    assert gate(update(user=999)) == (False, "unknown sender")
    assert gate(update(is_bot=True)) == (False, "sent by a bot")
    assert gate(update("hello all", chat=GROUP))[0] is False
    assert gate(update("hey @Roost_Test_Bot, lunch?", chat=GROUP)) == (True, "")
    assert gate(update("/status@roost_test_bot", chat=GROUP)) == (True, "")
    assert gate(update("@roost_test_bot2 hi", chat=GROUP))[0] is False  # another bot
    bot = {"id": BOT.id, "is_bot": True, "first_name": "Roost"}
    replied = update("and?", chat=GROUP,
                     reply_to_message={"message_id": 4, "date": 1, "chat": GROUP, "from": bot})
    assert gate(replied) == (True, "")
    stranger = update("@roost_test_bot hi", user=999, chat=GROUP)
    assert gate(stranger) == (False, "unknown sender")


def test_text_drops_the_mention_and_commands_keep_working() -> None:
    def text(payload: dict[str, Any]) -> str:
        found = message_of(parse_update(payload))
        assert found is not None
        return message_text(found[0], BOT)

    assert text(update("@roost_test_bot what is 2+2?", chat=GROUP)) == "what is 2+2?"
    assert text(update("/new@roost_test_bot", chat=GROUP)) == "/new"
    assert text(update(None, caption="look @roost_test_bot")) == "look"


def test_edit_text_quotes_every_line() -> None:
    assert edit_text(9, "one\ntwo") == (
        "[The user edited their earlier message (id 9); it now reads:]\n> one\n> two")


def test_chat_keys_and_ids() -> None:
    assert chat_key(-100777) == "telegram:-100777"
    assert address_of("telegram:-100777") == (-100777, None)
    assert address_of(chat_key(-100777, 42)) == (-100777, 42)
    with pytest.raises(ValueError, match="not a Telegram chat key"):
        address_of("whatsapp:1")


def test_inbound_ids_are_fixed_by_the_update() -> None:
    now = time.time()
    first = inbound_id(now, "telegram:update:1")
    assert first == inbound_id(now, "telegram:update:1")
    assert first != inbound_id(now, "telegram:update:2")
    assert len(first) == 26 and first < inbound_id(now + 1, "telegram:update:0")


def test_the_largest_photo_under_the_limit_is_chosen() -> None:
    sizes = [PhotoSize("s", "s", 90, 60, 1_000), PhotoSize("m", "m", 800, 600, 90_000),
             PhotoSize("l", "l", 4000, 3000, 3_000_000)]
    assert best_photo(sizes, 20_000_000).file_id == "l"  # type: ignore[union-attr]
    assert best_photo(sizes, 100_000).file_id == "m"  # type: ignore[union-attr]
    assert best_photo(sizes, 10) is None


# ---- delivery ---------------------------------------------------------------------------------


@pytest.fixture
async def bot(fake_telegram: FakeTelegram) -> AsyncIterator[Bot]:
    async with Bot(fake_telegram.token, base_url=fake_telegram.api_base,
                   base_file_url=fake_telegram.file_base) as b:
        yield b


@pytest.fixture
def store(state_dir: Path) -> Iterator[Store]:
    with Store.open(state_dir) as opened:
        yield opened


def outbound(text: str, store: Store) -> Outbound:
    item = Outbound(chat_key=f"telegram:{USER}", text=text, created=time.time())
    store.outbox_add(item.to_doc())
    return item


async def test_send_resumes_after_the_last_part_sent(
        bot: Bot, store: Store, fake_telegram: FakeTelegram) -> None:
    text = "\n\n".join(f"Paragraph {i}. " + "word " * 300 for i in range(12))
    parts = split_telegram(text)
    assert len(parts) >= 4
    channel = TelegramChannel(bot, store)
    item = outbound(text, store)
    store.outbox_update(item.id, parts_sent=2)  # a crash after two parts were delivered
    fake_telegram.drop_next("sendMessage")
    with pytest.raises(DeliveryError) as failed:  # as the engine does: read from the outbox
        await channel.send(Outbound.from_doc(store.outbox_pending()[0]))
    assert not failed.value.permanent
    assert store.outbox_pending()[0]["parts_sent"] == 2
    await channel.send(Outbound.from_doc(store.outbox_pending()[0]))
    assert [m["text"] for m in fake_telegram.sent_messages] == parts[2:]
    assert store.outbox_pending()[0]["parts_sent"] == len(parts)


async def test_a_voice_note_telegram_took_is_not_sent_again_after_a_restart(
        bot: Bot, state_dir: Path, fake_telegram: FakeTelegram) -> None:
    # The process dies the moment the channel hands the voice note back to the engine (before
    # the engine marks the item sent); the next process finds the item in the outbox.
    note = state_dir / "note.ogg"
    await asyncio.to_thread(state_dir.mkdir, parents=True, exist_ok=True)
    await asyncio.to_thread(shutil.copyfile, OPUS, note)
    item = Outbound(chat_key=f"telegram:{USER}", text="spoken", created=time.time(),
                    kind="voice", audio=str(note), seconds=1.5)
    with Store.open(state_dir) as first:
        first.outbox_add(item.to_doc())
        await TelegramChannel(bot, first).send(item)
    with Store.open(state_dir) as second:  # the restart: only what is on disk
        (left,) = second.outbox_pending()
        await TelegramChannel(bot, second).send(Outbound.from_doc(left))
    assert len(fake_telegram.calls_to("sendVoice")) == 1


async def test_the_message_ids_of_every_part_are_recorded_across_a_resume(
        bot: Bot, store: Store, fake_telegram: FakeTelegram) -> None:
    text = "\n\n".join(f"Paragraph {i}. " + "word " * 300 for i in range(4))
    assert len(split_telegram(text)) == 2
    item = outbound(text, store)
    store.outbox_update(item.id, parts_sent=1, platform_ids=["41"])  # a crash after part one
    await TelegramChannel(bot, store).send(Outbound.from_doc(store.outbox_pending()[0]))
    (sent,) = [message_id for chat, message_id in fake_telegram.messages if chat == USER]
    assert store.outbox_pending()[0]["platform_ids"] == ["41", str(sent)]


async def test_pieces_of_a_refused_part_already_sent_are_not_sent_again(
        bot: Bot, store: Store, fake_telegram: FakeTelegram) -> None:
    text = "\n\n".join(f"Paragraph {i}. " + "word " * 80 for i in range(8))
    (part,) = split_telegram(text)
    pieces = split_text(visible_text(part), SMALLER_PIECE)
    assert len(pieces) >= 3
    # Refused as HTML and as plain text, so it goes in pieces; the second piece stalls and
    # then fails (a transient 502), after the first reached the chat.
    fake_telegram.fail_next("sendMessage", status=400,
                            description="Bad Request: message is too long", times=2)
    fake_telegram.hold("sendMessage", after=3)
    sending = asyncio.create_task(TelegramChannel(bot, store).send(outbound(text, store)))
    await fake_telegram.wait_for("sendMessage", 4)
    fake_telegram.fail_next("sendMessage", status=502, description="Bad Gateway")
    fake_telegram.release()
    with pytest.raises(DeliveryError) as failed:
        await sending
    assert not failed.value.permanent
    # The engine tries again later, here as a new process would: from the outbox alone.
    await TelegramChannel(bot, store).send(Outbound.from_doc(store.outbox_pending()[0]))
    assert [m["text"] for m in fake_telegram.sent_messages] == pieces
    ids = [str(message_id) for chat, message_id in fake_telegram.messages if chat == USER]
    assert store.outbox_pending()[0]["platform_ids"] == ids


async def test_a_disk_that_refuses_a_piece_record_does_not_resend_that_piece(
        bot: Bot, store: Store, fake_telegram: FakeTelegram,
        monkeypatch: pytest.MonkeyPatch) -> None:
    text = "\n\n".join(f"Paragraph {i}. " + "word " * 80 for i in range(8))
    (part,) = split_telegram(text)
    pieces = split_text(visible_text(part), SMALLER_PIECE)
    fake_telegram.fail_next("sendMessage", status=400,
                            description="Bad Request: message is too long", times=2)
    real = store.outbox_update
    refusals = [StoreError("cannot write outbox/x.json: No space left on device")]

    def full_disk(*args: Any, **kwargs: Any) -> None:
        if kwargs.get("pieces_sent") and refusals:  # after Telegram took the first piece
            raise refusals.pop()
        real(*args, **kwargs)

    monkeypatch.setattr(store, "outbox_update", full_disk)
    channel = TelegramChannel(bot, store)
    item = outbound(text, store)
    with pytest.raises(StoreError):
        await channel.send(item)
    await channel.send(Outbound.from_doc(store.outbox_pending()[0]))  # the engine's retry
    assert [m["text"] for m in fake_telegram.sent_messages] == pieces
    assert refusals == [] and store.outbox_pending()[0]["parts_sent"] == 1


async def test_a_blocked_bot_is_a_permanent_failure(
        bot: Bot, store: Store, fake_telegram: FakeTelegram) -> None:
    fake_telegram.fail_next("sendMessage", status=403,
                            description="Forbidden: bot was blocked by the user")
    with pytest.raises(DeliveryError, match="blocked") as failed:
        await TelegramChannel(bot, store).send(outbound("hi", store))
    assert failed.value.permanent


def test_the_plain_fallback_is_the_visible_text() -> None:
    assert visible_text('<b>a</b> &amp; <a href="x">b&lt;</a>') == "a & b<"


async def test_typing_stops_when_the_turn_fails_or_is_cancelled(
        bot: Bot, store: Store, fake_telegram: FakeTelegram) -> None:
    channel = TelegramChannel(bot, store, typing_interval=0.05)

    def typing_tasks() -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks() if t.get_name().startswith("roost-typing-")]

    with pytest.raises(RuntimeError):
        async with channel.working(f"telegram:{USER}"):
            await fake_telegram.wait_for("sendChatAction")
            raise RuntimeError("the turn failed")
    assert typing_tasks() == []

    async def turn() -> None:
        async with channel.working(f"telegram:{USER}"):
            await asyncio.sleep(10)

    task = asyncio.create_task(turn())
    await fake_telegram.wait_for("sendChatAction", 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert typing_tasks() == []

    def typing_in(chat_id: int) -> int:
        return sum(c.params["chat_id"] == chat_id for c in fake_telegram.calls_to("sendChatAction"))

    # Another chat's indicator, refreshed every interval, keeps the time: three of its
    # refreshes go by and this chat's indicator is never sent again.
    count = typing_in(USER)
    async with channel.working(f"telegram:{USER + 1}"):
        await wait_until(lambda: typing_in(USER + 1) >= 3)
    assert typing_in(USER) == count


# ---- start-up -----------------------------------------------------------------------------------


async def test_a_refused_token_is_a_config_error_and_an_unreachable_api_exit_69(
        fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
        make_settings: SettingsFactory) -> None:
    telegram = {"enabled": True, "mode": "polling", "api_base": fake_telegram.api_base,
                "file_base": fake_telegram.file_base, "token": "999:WRONG"}
    settings = make_settings(model={"host": fake_ollama.url}, telegram=telegram)
    assert await serve(settings) == 78
    nowhere = f"http://127.0.0.1:{free_port()}/bot"
    settings = make_settings(model={"host": fake_ollama.url},
                             telegram=telegram | {"api_base": nowhere, "token": "1:X"})
    assert await serve(settings) == 69


async def test_an_api_base_with_a_slash_too_many_names_the_404(
        fake_telegram: FakeTelegram, fake_ollama: FakeOllama, tmp_path: Path) -> None:
    config = tmp_path / "roost.toml"
    config.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nlisten = "127.0.0.1:{free_port()}"\n'
        f'[model]\nhost = "{fake_ollama.url}"\n'
        f'[telegram]\nenabled = true\nmode = "polling"\n'
        f'api_base = "{fake_telegram.api_base}/"\n')
    env = {**os.environ, "ROOST_TELEGRAM_TOKEN": fake_telegram.token}
    daemon = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "run", "--config", str(config), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(daemon.communicate(), 30)
    assert daemon.returncode == 78
    stderr = err.decode()
    assert "telegram.api_base" in stderr and "404 Not Found" in stderr
    assert "Traceback" not in stderr and "refused the bot token" not in stderr
    assert fake_telegram.token not in stderr
