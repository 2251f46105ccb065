"""Voice replies on Telegram, end to end: a voice note heard (the loopback transcriber), the
reply written by the fake Ollama, spoken by the speech stand-in, and sent through the real
outbox and python-telegram-bot to the fake Bot API as sendMessage, then sendVoice."""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from daemon.app.serve import build_app
from daemon.engine.voice_replies import CUT_LINE, HOW_TO_TURN_ON
from daemon.store.console_keys import OWNER, ConsoleKeys
from daemon.voice.spoken import REST_IS_WRITTEN, spoken_text
from tests.channels.telegram.test_telegram import (
    CHAT_KEY,
    FAST,
    HOOK_URL,
    SECRET,
    USER,
    Daemon,
    message,
    texts,
)
from tests.conftest import SettingsFactory, wait_until
from tests.daemon.console.test_console import jar, sign_in
from tests.daemon.voice.recordings import OPUS
from tests.fakes.ollama import FakeOllama, Reply
from tests.fakes.telegram import FakeTelegram
from tests.fakes.transcription import FakeTranscriber
from tests.fakes.voice_standin import VOICE_NOTE, SpeakingStandIn

Start = Callable[..., Awaitable[Daemon]]


@pytest.fixture
async def whisper() -> AsyncIterator[FakeTranscriber]:
    async with FakeTranscriber() as fake:
        yield fake


@pytest.fixture
def speech(make_settings: SettingsFactory) -> SpeakingStandIn:
    return SpeakingStandIn(make_settings().daemon.state_dir / "attachments")


@pytest.fixture
async def start(fake_telegram: FakeTelegram, fake_ollama: FakeOllama, whisper: FakeTranscriber,
                make_settings: SettingsFactory) -> AsyncIterator[Start]:
    """roost with Telegram, transcription and the given speech (None: speech off)."""
    running: list[Daemon] = []

    async def run(speaking: SpeakingStandIn | None,
                  speech: dict[str, Any] | None = None) -> Daemon:
        telegram = {"enabled": True, "mode": "webhook", "webhook_url": HOOK_URL,
                    "api_base": fake_telegram.api_base, "file_base": fake_telegram.file_base,
                    "allow": (USER,), "token": fake_telegram.token, "secret": SECRET}
        settings = make_settings(model={"host": fake_ollama.url, "retry_backoff": 0.05},
                                 telegram=telegram,
                                 voice={"backend": "http", "url": whisper.url},
                                 speech=speech or {})
        app = build_app(settings, tunings={"telegram": FAST}, speaking=speaking)
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        daemon = Daemon(app, runner, f"http://127.0.0.1:{runner.addresses[0][1]}")
        running.append(daemon)
        return daemon

    yield run
    for daemon in reversed(running):
        await daemon.stop()


def voice_note(update_id: int, fake: FakeTelegram) -> dict[str, Any]:
    data = OPUS.read_bytes()
    fake.add_file(f"voice-{update_id}", data, f"voice/file_{update_id}.oga")
    voice = {"file_id": f"voice-{update_id}", "file_unique_id": f"u-{update_id}",
             "duration": 2, "mime_type": "audio/ogg", "file_size": len(data)}
    return message(update_id, None, voice=voice)


async def said(daemon: Daemon, fake: FakeTelegram, update: dict[str, Any], sends: int) -> None:
    """Post the update and wait until `sends` sendMessage calls were taken and the chat idles."""
    assert await daemon.post(update) == 200
    await fake.wait_for("sendMessage", sends)
    await daemon.settle()


async def test_a_voice_note_is_answered_with_the_text_then_a_voice_note_replying_to_it(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
        speech: SpeakingStandIn) -> None:
    daemon = await start(speech)
    fake_ollama.script("Water the **plants** at six.")
    await said(daemon, fake_telegram, voice_note(7, fake_telegram), 1)
    (voice,) = await fake_telegram.wait_for("sendVoice")
    await daemon.settle()
    assert texts(fake_telegram) == ["Water the plants at six."]  # the text, as ever
    assert fake_telegram.calls.index(voice) > fake_telegram.calls.index(
        fake_telegram.calls_to("sendMessage")[0])
    # The OGG/Opus file uploaded (multipart), in reply to the voice note, its length given.
    assert voice.files["voice"] == VOICE_NOTE.read_bytes()
    assert voice.params["chat_id"] == USER and voice.params["duration"] == 3
    assert voice.params["reply_parameters"]["message_id"] == 7
    sent = fake_telegram.messages[USER, 2]
    assert sent["voice"]["mime_type"] == "audio/ogg" and sent["voice"]["duration"] == 3
    assert speech.texts == ["Water the plants at six."]  # the words, not the markup
    assert daemon.store.outbox_pending() == []


async def test_the_console_plays_the_voice_reply_beside_its_reply(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
        speech: SpeakingStandIn) -> None:
    daemon = await start(speech)
    fake_ollama.script("Water the plants at six.")
    await said(daemon, fake_telegram, voice_note(7, fake_telegram), 1)
    await fake_telegram.wait_for("sendVoice")
    await daemon.settle()
    (conversation,) = daemon.store.list_conversations()
    state_dir = daemon.store.state_dir
    link = ConsoleKeys(state_dir).issue_link((OWNER,), 2e9 - 1)
    async with jar() as http:
        assert await sign_in(http, daemon.url, link) == 303
        async with http.get(f"{daemon.url}/console/c/{conversation.id}") as page:
            html = await page.text()
        reply = html[html.index("Water the plants at six."):]
        played = re.search(r'<audio controls[^>]* src="([^"]+)"', reply)
        assert played, "the voice reply is not playable beside its reply"
        assert "voice reply" in reply[:reply.index("</article>")]
        async with http.get(daemon.url + played.group(1)) as sound:
            assert sound.headers["Content-Type"] == "audio/ogg"
            assert await sound.read() == VOICE_NOTE.read_bytes()


async def test_a_typed_message_gets_no_voice_note_in_auto(
        start: Start, fake_telegram: FakeTelegram, speech: SpeakingStandIn) -> None:
    daemon = await start(speech)
    await said(daemon, fake_telegram, message(1, "hello"), 1)
    assert fake_telegram.calls_to("sendVoice") == [] and speech.texts == []


async def test_voice_off_answers_a_voice_note_in_text_only(
        start: Start, fake_telegram: FakeTelegram, speech: SpeakingStandIn) -> None:
    daemon = await start(speech)
    await said(daemon, fake_telegram, message(1, "/voice off"), 1)
    assert texts(fake_telegram)[-1] == "Voice replies: off (text only)."
    await said(daemon, fake_telegram, voice_note(2, fake_telegram), 2)
    assert fake_telegram.calls_to("sendVoice") == [] and speech.texts == []


async def test_voice_on_speaks_typed_messages_too_and_outlives_a_restart(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
        speech: SpeakingStandIn) -> None:
    daemon = await start(speech)
    await said(daemon, fake_telegram, message(1, "/voice on"), 1)
    await daemon.stop()
    daemon = await start(speech)
    await said(daemon, fake_telegram, message(2, "/voice"), 2)
    assert texts(fake_telegram)[-1] == ("Voice replies: on (every reply also comes as a voice "
                                        "note). Speech is set up.")
    fake_ollama.script("Typed, and spoken.")
    await said(daemon, fake_telegram, message(3, "say it"), 3)
    await fake_telegram.wait_for("sendVoice")
    assert speech.texts == ["Typed, and spoken."]


async def test_without_speech_voice_says_how_to_turn_it_on(
        start: Start, fake_telegram: FakeTelegram) -> None:
    daemon = await start(None)
    await said(daemon, fake_telegram, message(1, "/voice on"), 1)
    assert texts(fake_telegram) == [HOW_TO_TURN_ON]
    await said(daemon, fake_telegram, message(2, "/voice"), 2)
    assert texts(fake_telegram)[-1] == ("Voice replies: auto (a voice note is answered with a "
                                        f"voice note too). {HOW_TO_TURN_ON}")
    await said(daemon, fake_telegram, voice_note(3, fake_telegram), 3)
    assert fake_telegram.calls_to("sendVoice") == []


async def test_a_failed_synthesis_delivers_the_reply_and_one_line(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
        speech: SpeakingStandIn) -> None:
    speech.fail = "the speech server at 127.0.0.1:9 does not answer"
    daemon = await start(speech)
    fake_ollama.script("Here is the answer.")
    await said(daemon, fake_telegram, voice_note(1, fake_telegram), 2)
    assert texts(fake_telegram) == [
        "Here is the answer.",
        "I could not speak that reply (the speech server at 127.0.0.1:9 does not answer); it "
        "is written above."]
    assert fake_telegram.calls_to("sendVoice") == []
    assert daemon.store.outbox_pending() == []


async def test_a_long_reply_says_the_rest_is_written_and_stores_the_words_alone(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
        speech: SpeakingStandIn) -> None:
    daemon = await start(speech)
    long = " ".join(f"word{i}" for i in range(400))  # more than two minutes of speech
    fake_ollama.script(long)
    await said(daemon, fake_telegram, voice_note(1, fake_telegram), 1)
    await fake_telegram.wait_for("sendVoice")
    assert texts(fake_telegram)[-1].endswith(f"word399\n\n{CUT_LINE}")
    conversation = daemon.store.active_conversation(CHAT_KEY)
    assert conversation is not None
    assert daemon.store.messages(conversation.id)[-1].content == long
    # A minute at 2.5 words a second (speech.max_duration's default), then the pointer.
    assert speech.texts[0].startswith("word0 word1 ") and "word149" not in speech.texts[0]
    assert speech.texts[0].endswith(REST_IS_WRITTEN)


async def test_a_restart_between_the_reply_and_its_voice_note_sends_the_voice_note_once(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
        speech: SpeakingStandIn) -> None:
    speech.gate = asyncio.Event()  # the synthesis never ends: the daemon stops during it
    daemon = await start(speech)
    fake_ollama.script("Spoken after a restart.")
    assert await daemon.post(voice_note(1, fake_telegram)) == 200
    await fake_telegram.wait_for("sendMessage")
    await wait_until(lambda: speech.texts != [])
    await daemon.stop()
    assert [d["kind"] for d in daemon.store.outbox_pending()] == ["voice"]

    again = SpeakingStandIn(speech.attachments)
    daemon = await start(again)
    (voice,) = await fake_telegram.wait_for("sendVoice")
    await daemon.settle()
    assert again.texts == ["Spoken after a restart."]
    assert texts(fake_telegram) == ["Spoken after a restart."]  # the reply went once
    assert voice.params["reply_parameters"]["message_id"] == 1
    assert daemon.store.outbox_pending() == [] and len(fake_ollama.chat_requests) == 1


async def test_drafts_show_the_text_as_written_and_the_voice_note_follows_the_final_text(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
        speech: SpeakingStandIn) -> None:
    daemon = await start(speech)
    answer = " ".join(f"word{i}" for i in range(150))  # ~330 tokens: a second at 300 a second
    fake_ollama.script(Reply(content=answer, tokens_per_second=300))
    assert await daemon.post(voice_note(1, fake_telegram)) == 200
    await fake_telegram.wait_for("sendMessageDraft", timeout=10)
    assert fake_telegram.calls_to("sendVoice") == [] and speech.texts == []
    (voice,) = await fake_telegram.wait_for("sendVoice", timeout=20)
    await daemon.settle()
    assert fake_telegram.drafts[0]["text"] and fake_telegram.drafts[0]["text"] in answer
    (final,) = fake_telegram.calls_to("sendMessage")
    assert all(d.time <= final.time for d in fake_telegram.calls_to("sendMessageDraft"))
    assert final.time <= voice.time and texts(fake_telegram) == [answer]
    assert speech.texts == [spoken_text(answer, max_seconds=60).text]


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
async def test_espeak_ng_from_the_config_speaks_the_reply_as_a_real_voice_note(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    av = pytest.importorskip("av")
    daemon = await start(None, {"backend": "espeak-ng"})
    fake_ollama.script("Water the plants at six.")
    await said(daemon, fake_telegram, voice_note(7, fake_telegram), 1)
    (voice,) = await fake_telegram.wait_for("sendVoice", timeout=60)
    await daemon.settle()
    path = daemon.store.state_dir / "spoken.ogg"
    path.write_bytes(voice.files["voice"])
    with av.open(str(path)) as container:
        (stream,) = container.streams.audio
        assert stream.codec_context.name == "opus" and stream.codec_context.channels == 1
        assert container.duration is not None and container.duration > 500_000  # > 0.5 s
    assert voice.params["duration"] >= 1
    assert daemon.store.outbox_pending() == []
