"""The voice step before a turn: what the message becomes when a recording is heard, and the
one short line the user gets when it is not (off, too long, broken, the server down)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from daemon.core.config import VoiceSettings
from daemon.core.messages import Inbound
from daemon.store import Store
from daemon.store.attachments import store_file
from daemon.voice.backends import HttpBackend
from daemon.voice.hearing import Hearing, last_transcript
from tests.daemon.voice.recordings import MP3, OPUS, nested_moov, opus_lasting
from tests.fakes.transcription import FakeTranscriber

CHAT = "telegram:1111111"


@pytest.fixture
def store(state_dir: Path) -> Iterator[Store]:
    with Store.open(state_dir) as opened:
        yield opened


@pytest.fixture
async def whisper() -> AsyncIterator[FakeTranscriber]:
    async with FakeTranscriber() as fake:
        yield fake


class Told:
    """The notices the user got, as the engine's notify would send them."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    async def __call__(self, chat_key: str, text: str) -> None:
        self.lines.append((chat_key, text))


def voice_item(store: Store, data: bytes, *, text: str = "", kind: str = "voice",
               name: str = "voice-note.ogg", mime: str = "audio/ogg") -> Inbound:
    stored = store_file(data, store.state_dir / "attachments", name=name, mime=mime, kind=kind)
    item = Inbound(chat_key=CHAT, text=text, received=1.0, platform_id="7",
                   attachments=(stored.to_doc(),))
    assert store.inbox_add(item.to_doc())
    return item


_OPEN: list[Hearing] = []


@pytest.fixture(autouse=True)
async def _close_backends() -> AsyncIterator[None]:
    yield
    while _OPEN:
        await _OPEN.pop().close()


def hearing(store: Store, url: str | None, observed: list[tuple[str, Any]] | None = None,
            **values: Any) -> Hearing:
    settings = VoiceSettings(backend="http" if url else "off", url=url or VoiceSettings.url,
                             **values)
    backend = HttpBackend(settings) if url else None
    voice = Hearing(settings, store, backend,
                    observe=(lambda o, s: observed.append((o, s))) if observed is not None
                    else None)
    _OPEN.append(voice)
    return voice


async def test_a_heard_voice_note_becomes_the_users_words_and_stays_an_attachment(
        store: Store, whisper: FakeTranscriber) -> None:
    item = voice_item(store, OPUS.read_bytes())
    told, observed = Told(), []
    voice = hearing(store, whisper.url, observed)
    (heard,) = await voice.hear([item], told)
    await voice.close()
    assert heard.text == f"[voice note, 0:02] {whisper.text}"
    (attachment,) = heard.attachments
    assert attachment["path"] == item.attachments[0]["path"]  # the recording stays
    assert attachment["kind"] == "voice"
    assert "its transcript is the text above" in attachment["note"]
    assert heard.meta["voice"] == [{"path": attachment["path"], "status": "heard",
                                    "duration": 1.88, "transcript": whisper.text}]
    assert told.lines == []
    assert [o for o, _ in observed] == ["heard"] and observed[0][1] is not None
    # Written back to the inbox: a turn tried again (an outage, a restart) hears it as is.
    (pending,) = store.inbox_pending(CHAT)
    assert pending["text"] == heard.text and pending["meta"]["voice"] == heard.meta["voice"]
    again = await hearing(store, whisper.url).hear([Inbound.from_doc(pending)], told)
    assert again[0].text == heard.text
    assert len(whisper.requests) == 1 and told.lines == []


async def test_the_caption_stays_and_the_transcript_follows_it(
        store: Store, whisper: FakeTranscriber) -> None:
    item = voice_item(store, MP3.read_bytes(), text="for the shopping list", kind="audio",
                      name="memo.mp3", mime="audio/mpeg")
    (heard,) = await hearing(store, whisper.url).hear([item], Told())
    assert heard.text == f"for the shopping list\n[audio file, 0:02] {whisper.text}"
    assert (whisper.requests[0].file_name, whisper.requests[0].file_type) == (
        "memo.mp3", "audio/mpeg")


async def test_text_and_photos_pass_untouched(store: Store, whisper: FakeTranscriber) -> None:
    plain = Inbound(chat_key=CHAT, text="hello", received=1.0)
    document = voice_item(store, b"notes\n", kind="document", name="n.txt", mime="text/plain")
    assert await hearing(store, whisper.url).hear([plain, document], Told()) == [plain, document]
    assert whisper.requests == []


@pytest.mark.parametrize(("case", "reason", "line"), [
    ("off", "off", "I cannot listen to voice notes here: transcription is off"),
    ("two-hours", "too_long", "That voice note is 2:00:00 long; I transcribe recordings of up to "
                              "10:00, so I only know you sent it."),
    ("broken", "unreadable", "That voice note could not be read as audio"),
    ("down", "unavailable", "I could not transcribe that voice note: the transcription server at "
                            "http://127.0.0.1:"),
    ("refused", "failed", "I could not transcribe that voice note: the transcription server at"),
])
async def test_not_heard_the_model_gets_the_note_as_before_and_the_user_one_line_why(
        store: Store, whisper: FakeTranscriber, case: str, reason: str, line: str) -> None:
    data = {"two-hours": opus_lasting(7200), "broken": OPUS.read_bytes()[:200]}.get(
        case, OPUS.read_bytes())
    item = voice_item(store, data)
    url = None if case == "off" else whisper.url
    if case == "down":
        await whisper.__aexit__(None, None, None)
    if case == "refused":
        whisper.fail_next(400)
    told, observed = Told(), []
    (kept,) = await hearing(store, url, observed).hear([item], told)
    assert kept.text == "" and kept.attachments == item.attachments  # the reference note
    assert kept.meta["voice"][0]["status"] == reason
    (notice,) = told.lines
    assert notice[0] == CHAT and notice[1].startswith(line), notice[1]
    assert len(notice[1]) < 300
    assert [o for o, _ in observed] == [reason]
    if case in ("two-hours", "broken"):
        assert whisper.requests == []  # refused before any backend is asked
    # Not told twice when the turn is tried again.
    (pending,) = store.inbox_pending(CHAT)
    await hearing(store, url).hear([Inbound.from_doc(pending)], told)
    assert len(told.lines) == 1


async def test_a_hostile_m4a_is_one_line_and_its_caption_is_answered(
        store: Store, whisper: FakeTranscriber) -> None:
    # 20,000 nested moov boxes made mutagen raise RecursionError, the batch failed twice and
    # was quarantined: the caption was never answered.
    item = voice_item(store, nested_moov(), text="what does he say?", kind="audio",
                      name="interview.m4a", mime="audio/mp4")
    told = Told()
    (kept,) = await hearing(store, whisper.url).hear([item], told)
    assert kept.text == "what does he say?"
    assert kept.meta["voice"][0]["status"] == "unreadable"
    assert told.lines == [(CHAT, told.lines[0][1])]
    assert told.lines[0][1].startswith("That audio file could not be read as audio")
    assert whisper.requests == []


async def test_a_huge_transcript_is_cut_and_says_how_much(
        store: Store, whisper: FakeTranscriber) -> None:
    # A 10 MB transcript became the message whole (188 MB of memory, a prompt past any window).
    # Past 4 MB the answer is refused unread (test_backends); under it, it is cut here.
    whisper.text = "blah " * 600_000
    told = Told()
    (heard,) = await hearing(store, whisper.url).hear([voice_item(store, OPUS.read_bytes())],
                                                      told)
    assert len(heard.text) < 21_000
    assert heard.text.startswith("[voice note, 0:02] blah blah")
    assert heard.text.endswith("[the transcript is cut here: 2,979,999 more characters]")
    assert heard.meta["voice"][0]["transcript"] == heard.text.removeprefix(
        "[voice note, 0:02] ")


async def test_the_cap_is_configurable(store: Store, whisper: FakeTranscriber) -> None:
    item = voice_item(store, opus_lasting(90))
    told = Told()
    await hearing(store, whisper.url, max_duration=60.0).hear([item], told)
    assert "is 1:30 long; I transcribe recordings of up to 1:00" in told.lines[0][1]


async def test_the_transcription_waits_for_the_slot_it_is_given(
        store: Store, whisper: FakeTranscriber) -> None:
    slot = asyncio.Lock()
    asked = asyncio.Event()

    @contextlib.asynccontextmanager
    async def hold() -> AsyncIterator[None]:
        asked.set()
        async with slot:
            yield

    settings = VoiceSettings(backend="http", url=whisper.url)
    voice = Hearing(settings, store, HttpBackend(settings), hold=hold)
    item = voice_item(store, OPUS.read_bytes())
    async with slot:  # a model call holds the GPU
        task = asyncio.create_task(voice.hear([item], Told()))
        await asyncio.wait_for(asked.wait(), 10)  # it waits for the slot: nothing sent yet
        assert whisper.requests == [] and not task.done()
    (heard,) = await asyncio.wait_for(task, 10)
    await voice.close()
    assert heard.text.startswith("[voice note, 0:02]")


async def test_transcript_after_an_audio_file_calls_it_an_audio_file(
        store: Store, whisper: FakeTranscriber) -> None:
    item = voice_item(store, MP3.read_bytes(), kind="audio", name="memo.mp3", mime="audio/mpeg")
    (heard,) = await hearing(store, whisper.url).hear([item], Told())
    conversation = store.create_conversation(CHAT, 1.0)
    store.append_message(conversation.id, "user", heard.text, created=2.0,  # as the turn does
                         attachments=heard.attachments, meta=heard.meta)
    assert last_transcript(store, CHAT) == (f"Your last audio file (0:02), as I heard it:\n"
                                            f"{whisper.text}")


def test_transcript_command_text(store: Store) -> None:
    assert last_transcript(store, CHAT).startswith(
        "No voice note or audio file in this conversation yet")
    conversation = store.create_conversation(CHAT, 1.0)
    store.append_message(conversation.id, "user", "[voice note, 0:42] buy milk", created=2.0,
                         meta={"voice": [{"status": "heard", "duration": 42.2,
                                          "transcript": "buy milk"}]})
    store.append_message(conversation.id, "assistant", "Noted.", created=3.0)
    store.append_message(conversation.id, "user", "thanks", created=4.0)
    assert last_transcript(store, CHAT) == ("Your last voice note (0:42), as I heard it:\n"
                                            "buy milk")
    store.append_message(conversation.id, "user", "", created=5.0, meta={"voice": [
        {"status": "too_long", "why": "That voice note is 2:00:00 long; ..."}]})
    assert last_transcript(store, CHAT) == ("Your last voice note was not transcribed. That "
                                            "voice note is 2:00:00 long; ...")


async def test_a_recording_no_longer_stored_is_a_line_not_a_crash(
        store: Store, whisper: FakeTranscriber) -> None:
    item = voice_item(store, OPUS.read_bytes())
    (store.state_dir / item.attachments[0]["path"]).unlink()
    told = Told()
    (kept,) = await hearing(store, whisper.url).hear([item], told)
    assert kept.meta["voice"][0]["status"] == "unreadable"
    assert told.lines == [(CHAT, "That voice note is no longer stored here; please send it "
                                 "again.")]
    assert whisper.requests == []


async def test_an_ogg_audio_file_is_an_audio_file_not_a_voice_note(
        store: Store, whisper: FakeTranscriber) -> None:
    """Only what the platform says was recorded with its voice button is a voice note: an OGG
    file sent as audio (a podcast clip, a recording from another app) is an audio file."""
    item = voice_item(store, OPUS.read_bytes(), kind="audio", name="clip.ogg", mime="audio/ogg")
    (heard,) = await hearing(store, whisper.url).hear([item], Told())
    assert heard.text.startswith("[audio file, 0:02]")
