"""Voice replies on WhatsApp, end to end: a voice note heard (the loopback transcriber), the
reply written by the fake Ollama, spoken by the speech stand-in, and sent through the real
outbox to the fake Graph API: the text, then the OGG/Opus file uploaded and sent as `audio` with
`voice: true` (plain audio above 512 KB), under the 24-hour rule like any reply."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from channels.telegram.channel import TelegramTuning
from daemon.app.serve import build_app
from tests.channels.whatsapp.test_whatsapp import APP_SECRET, FAST, KEY, USER, VERIFY, Daemon
from tests.conftest import SettingsFactory
from tests.daemon.voice.recordings import OPUS
from tests.fakes.graph import (
    API_VERSION,
    PHONE_NUMBER_ID,
    FakeGraph,
    sent_now,
    text_message,
    webhook,
)
from tests.fakes.ollama import FakeOllama
from tests.fakes.transcription import FakeTranscriber
from tests.fakes.voice_standin import VOICE_NOTE, SpeakingStandIn

Start = Callable[..., Awaitable[Daemon]]


@pytest.fixture
async def graph() -> AsyncIterator[FakeGraph]:
    async with FakeGraph() as fake:
        yield fake


@pytest.fixture
async def whisper() -> AsyncIterator[FakeTranscriber]:
    async with FakeTranscriber() as fake:
        yield fake


@pytest.fixture
def speech(make_settings: SettingsFactory) -> SpeakingStandIn:
    return SpeakingStandIn(make_settings().daemon.state_dir / "attachments")


@pytest.fixture
async def start(graph: FakeGraph, fake_ollama: FakeOllama, whisper: FakeTranscriber,
                make_settings: SettingsFactory,
                speech: SpeakingStandIn) -> AsyncIterator[Start]:
    running: list[web.AppRunner] = []

    async def run() -> Daemon:
        whatsapp = {"enabled": True, "phone_number_id": PHONE_NUMBER_ID, "api_base": graph.url,
                    "api_version": API_VERSION, "allow": (USER,), "token": graph.token,
                    "app_secret": APP_SECRET, "verify_token": VERIFY}
        settings = make_settings(model={"host": fake_ollama.url, "retry_backoff": 0.05},
                                 whatsapp=whatsapp,
                                 voice={"backend": "http", "url": whisper.url})
        app = build_app(settings, speaking=speech, tunings={
            "whatsapp": FAST, "telegram": TelegramTuning(poll_timeout=1, poll_backoff=0.05)})
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        running.append(runner)
        return Daemon(app, runner, f"http://127.0.0.1:{runner.addresses[0][1]}")

    yield run
    for runner in reversed(running):
        await runner.cleanup()


def voice_note(wamid: str, graph: FakeGraph, *, recorded: bool = True) -> bytes:
    """An audio message as Meta's webhook sends it: `voice` true for a recording made with
    WhatsApp's voice button, false for an audio file (both OGG/Opus here)."""
    graph.add_media(f"m-{wamid}", OPUS.read_bytes(), "audio/ogg; codecs=opus")
    voice: dict[str, Any] = {"from": USER, "id": wamid, "timestamp": sent_now(), "type": "audio",
                             "audio": {"id": f"m-{wamid}", "mime_type": "audio/ogg; codecs=opus",
                                       "voice": recorded}}
    return webhook(voice)


async def test_a_voice_note_is_answered_with_the_text_then_an_uploaded_voice_message(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama,
        speech: SpeakingStandIn) -> None:
    daemon = await start()
    fake_ollama.script("Water the plants at six.")
    assert await daemon.post(voice_note("wamid.v1", graph)) == 200
    await graph.wait_sent(2)
    await daemon.settle()
    text, audio = graph.sent
    assert text.body["type"] == "text" and graph.texts() == ["Water the plants at six."]
    (upload,) = graph.calls_of("upload")
    assert upload.body["messaging_product"] == "whatsapp" and upload.body["type"] == "audio/ogg"
    assert upload.body["content_type"] == "audio/ogg"
    assert upload.body["size"] == VOICE_NOTE.stat().st_size
    (sent,) = graph.audio_sent(USER)
    assert sent["voice"] is True and graph.media[sent["id"]][0] == VOICE_NOTE.read_bytes()
    assert audio.body["context"] == {"message_id": "wamid.v1"}  # it answers the voice note
    assert speech.texts == ["Water the plants at six."]
    assert daemon.store.outbox_pending() == []


async def test_a_voice_note_above_512_kb_goes_as_plain_audio(
        start: Start, graph: FakeGraph, speech: SpeakingStandIn, tmp_path: Path) -> None:
    big = tmp_path / "big.ogg"
    big.write_bytes(VOICE_NOTE.read_bytes() + bytes(600 * 1024))  # a long answer's size
    speech.source = big
    daemon = await start()
    assert await daemon.post(voice_note("wamid.v1", graph)) == 200
    await graph.wait_sent(2)
    await daemon.settle()
    (sent,) = graph.audio_sent(USER)
    assert "voice" not in sent  # WhatsApp would show a download arrow, not the play icon
    assert graph.calls_of("upload")[0].body["size"] > 512 * 1024


async def test_a_media_upload_error_gives_up_the_voice_note_and_keeps_the_text(
        start: Start, graph: FakeGraph) -> None:
    daemon = await start()
    graph.fail_next("upload", 131053)
    assert await daemon.post(voice_note("wamid.v1", graph)) == 200
    await graph.wait_sent(2)
    await daemon.settle()
    reply, notice = graph.texts()
    assert reply.startswith("echo: [voice note, 0:02]")
    assert notice.startswith("The voice note could not be delivered (WhatsApp refused it")
    assert notice.endswith("the reply is written above.")
    assert graph.audio_sent() == [] and daemon.store.outbox_pending() == []


async def test_after_24_hours_the_voice_note_waits_with_its_reply_for_the_user(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    graph.fail_next("send", 131047, times=2)  # the window is closed: the reply, then the voice
    fake_ollama.script("Late, but spoken.")
    assert await daemon.post(voice_note("wamid.v1", graph)) == 200
    await graph.wait_for("send", 2)
    await daemon.settle()
    held = daemon.store.outbox_pending(KEY)
    assert [d["kind"] for d in held] == ["reply", "voice"] and all(d["held"] for d in held)
    assert await daemon.post(webhook(text_message("wamid.w2", USER, "hello again"))) == 200
    await graph.wait_sent(3)
    await daemon.settle()
    assert [c.body["type"] for c in graph.sent] == ["text", "audio", "text"]
    assert graph.texts() == ["Late, but spoken.", "echo: hello again"]
    assert daemon.store.outbox_pending() == []


async def test_an_audio_file_is_heard_as_an_audio_file(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    assert await daemon.post(voice_note("wamid.a1", graph, recorded=False)) == 200
    await graph.wait_sent(1)
    await daemon.settle()
    assert graph.texts()[0].startswith("echo: [audio file, 0:02]")
