"""Voice notes from the phone to the model and back, through the real daemon: Telegram's and
WhatsApp's webhooks, the loopback transcription server, the fake Ollama, /transcript and
/metrics."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from channels.telegram.channel import TelegramTuning
from channels.whatsapp.channel import WEBHOOK_PATH as WHATSAPP_PATH
from daemon.app.serve import INDEX, build_app
from tests.channels.telegram.test_telegram import (
    Daemon,
    message,
    start_roost,
    texts,
)
from tests.channels.whatsapp.test_whatsapp import APP_SECRET, FAST, USER, VERIFY
from tests.conftest import SettingsFactory
from tests.daemon.voice.recordings import OPUS, opus_lasting
from tests.fakes.graph import API_VERSION, PHONE_NUMBER_ID, FakeGraph, sent_now, sign, webhook
from tests.fakes.ollama import FakeOllama
from tests.fakes.telegram import FakeTelegram
from tests.fakes.transcription import FakeTranscriber


@pytest.fixture
async def whisper() -> AsyncIterator[FakeTranscriber]:
    async with FakeTranscriber() as fake:
        yield fake


Start = Callable[..., Awaitable[Daemon]]


@pytest.fixture
async def start(fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
                make_settings: SettingsFactory) -> AsyncIterator[Start]:
    running: list[Daemon] = []

    async def run(**sections: dict[str, Any]) -> Daemon:
        daemon = await start_roost(make_settings, fake_telegram, fake_ollama, **sections)
        running.append(daemon)
        return daemon

    yield run
    for daemon in reversed(running):
        await daemon.stop()


def voice_update(update_id: int, file_id: str, size: int, **extra: Any) -> dict[str, Any]:
    voice = {"file_id": file_id, "file_unique_id": f"u-{file_id}", "duration": 2,
             "mime_type": "audio/ogg", "file_size": size}
    return message(update_id, None, voice=voice, **extra)


def last_user_content(fake_ollama: FakeOllama) -> str:
    users = [m for m in fake_ollama.chat_requests[-1]["messages"] if m["role"] == "user"]
    return str(users[-1]["content"])


async def scrape(daemon: Daemon) -> str:
    async with aiohttp.ClientSession() as http, http.get(daemon.url + "/metrics") as reply:
        return await reply.text()


async def test_a_telegram_voice_note_is_heard_answered_replayed_and_quoted_by_transcript(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
        whisper: FakeTranscriber) -> None:
    daemon = await start(voice={"backend": "http", "url": whisper.url, "model": "base"})
    data = OPUS.read_bytes()
    fake_telegram.add_file("voice-1", data, "voice/file_1.oga")
    assert await daemon.post(voice_update(1, "voice-1", len(data))) == 200
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    (sent,) = whisper.requests
    assert sent.file == data and sent.fields["model"] == "base"
    heard = f"[voice note, 0:02] {whisper.text}"
    assert last_user_content(fake_ollama).startswith(heard)
    assert "its transcript is the text above" in last_user_content(fake_ollama)
    assert len(texts(fake_telegram)) == 1  # the reply, and no notice
    (stored,) = daemon.user_messages()
    assert stored.content == heard and stored.attachments[0]["kind"] == "voice"
    assert (daemon.store.state_dir / stored.attachments[0]["path"]).read_bytes() == data
    # memory_search (recall) finds the spoken words.
    hits = await asyncio.to_thread(daemon.app[INDEX].search, "water the plants", 8,
                                   daemon.store)
    assert any(hit.role == "user" and "water" in hit.snippet for hit in hits), hits

    # The next turn replays it as the user's words; /transcript shows what was heard.
    assert await daemon.post(message(2, "what did I just ask?")) == 200
    await fake_telegram.wait_for("sendMessage", 2)
    await daemon.settle()
    users = [m["content"] for m in fake_ollama.chat_requests[-1]["messages"]
             if m["role"] == "user"]
    assert any(str(u).startswith(heard) for u in users[:-1])
    assert await daemon.post(message(3, "/transcript")) == 200
    await fake_telegram.wait_for("sendMessage", 3)
    await daemon.settle()
    assert texts(fake_telegram)[-1] == f"Your last voice note (0:02), as I heard it:\n" \
                                       f"{whisper.text}"
    assert len(whisper.requests) == 1
    metrics = await scrape(daemon)
    assert 'roost_transcriptions_total{outcome="heard"} 1.0' in metrics
    assert "roost_transcription_seconds_count 1.0" in metrics


@pytest.mark.parametrize("case", ["two-hours", "server-down", "off", "broken"])
async def test_a_telegram_voice_note_not_heard_gets_one_line_and_the_model_the_note(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
        whisper: FakeTranscriber, case: str) -> None:
    voice = {} if case == "off" else {"backend": "http", "url": whisper.url}
    daemon = await start(voice=voice)
    data = {"two-hours": opus_lasting(7200), "broken": OPUS.read_bytes()[:200]}.get(
        case, OPUS.read_bytes())
    if case == "server-down":
        await whisper.__aexit__(None, None, None)
    fake_telegram.add_file("voice-1", data, "voice/file_1.oga")
    assert await daemon.post(voice_update(1, "voice-1", len(data))) == 200
    await fake_telegram.wait_for("sendMessage", 2)
    await daemon.settle()
    notice, _reply = texts(fake_telegram)
    expected = {"two-hours": "That voice note is 2:00:00 long; I transcribe recordings of up "
                             "to 10:00",
                "server-down": "I could not transcribe that voice note: the transcription "
                               "server at",
                "off": "I cannot listen to voice notes here: transcription is off",
                "broken": "That voice note could not be read as audio"}[case]
    assert notice.startswith(expected), notice
    content = last_user_content(fake_ollama)
    assert "[voice: voice-note.ogg, audio/ogg" in content  # the reference note, as before
    assert "[voice note," not in content
    if case != "server-down":
        assert whisper.requests == []
    (stored,) = daemon.user_messages()
    assert stored.attachments[0]["kind"] == "voice"
    assert daemon.store.quarantined() == []


async def test_a_whatsapp_voice_note_is_heard(
        graph: FakeGraph, fake_ollama: FakeOllama, whisper: FakeTranscriber,
        make_settings: SettingsFactory) -> None:
    whatsapp = {"enabled": True, "phone_number_id": PHONE_NUMBER_ID, "api_base": graph.url,
                "api_version": API_VERSION, "allow": (USER,), "token": graph.token,
                "app_secret": APP_SECRET, "verify_token": VERIFY}
    settings = make_settings(model={"host": fake_ollama.url, "retry_backoff": 0.05},
                             whatsapp=whatsapp, voice={"backend": "http", "url": whisper.url})
    app = build_app(settings, tunings={"whatsapp": FAST,
                                 "telegram": TelegramTuning(poll_timeout=1, poll_backoff=0.05)})
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        graph.add_media("m-voice", OPUS.read_bytes(), "audio/ogg; codecs=opus")
        voice = {"from": USER, "id": "wamid.v1", "timestamp": sent_now(), "type": "audio",
                 "audio": {"id": "m-voice", "mime_type": "audio/ogg; codecs=opus",
                           "voice": True}}
        body = webhook(voice)
        async with aiohttp.ClientSession() as http, http.post(
                url + WHATSAPP_PATH, data=body,
                headers={"Content-Type": "application/json",
                         "X-Hub-Signature-256": sign(APP_SECRET, body)}) as reply:
            assert reply.status == 200
        await graph.wait_sent(1)
        async with asyncio.timeout(10):
            while not fake_ollama.chat_requests:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert last_user_content(fake_ollama).startswith(f"[voice note, 0:02] {whisper.text}")
        (sent,) = whisper.requests
        assert sent.file == OPUS.read_bytes() and sent.file_type == "audio/ogg"
        assert json.loads(json.dumps(graph.texts()))  # a reply reached the user
    finally:
        await runner.cleanup()


@pytest.fixture
async def graph() -> AsyncIterator[FakeGraph]:
    async with FakeGraph() as fake:
        yield fake


async def test_typing_shows_while_the_voice_note_is_transcribed(
        start: Start, fake_telegram: FakeTelegram, whisper: FakeTranscriber) -> None:
    whisper.delay = 0.5  # a GPU's time; "typing…" is sent every 0.1 s in these tests
    daemon = await start(voice={"backend": "http", "url": whisper.url})
    data = OPUS.read_bytes()
    fake_telegram.add_file("voice-1", data, "voice/file_1.oga")
    assert await daemon.post(voice_update(1, "voice-1", len(data))) == 200
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    (heard,) = whisper.requests
    typing = [c.time for c in fake_telegram.calls_to("sendChatAction")
              if c.params.get("action") == "typing"]
    assert any(heard.time <= t <= heard.finished for t in typing), (heard, typing)
