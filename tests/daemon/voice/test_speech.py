"""Replies spoken as voice notes: espeak-ng and an OpenAI-compatible server (the loopback fake)
make real OGG/Opus, mono, 48 kHz files under the state directory; failures are plain reasons;
hostile text is read, never taken as options; `roost doctor` checks the backend."""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from daemon.core.config import SpeechSettings
from daemon.core.errors import VoiceError
from daemon.store import Store
from daemon.voice.opus import voice_note
from daemon.voice.speaking import Speaking, VoiceNote, build_speaking, readiness
from tests.conftest import wait_until
from tests.daemon.cli.test_doctor import doctor, failed, write_config
from tests.fakes.ollama import FakeOllama
from tests.fakes.speech import FakeSpeaker, tone

pytestmark = pytest.mark.skipif(importlib.util.find_spec("av") is None,
                                reason="needs PyAV ('.[speech]' or '.[test]')")
needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                  reason="needs espeak-ng (apt install espeak-ng)")
REPLY = "The **meeting** is at 3 pm. Bring the [agenda](https://example.com/a/b/c/agenda.pdf)."


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "state")


@pytest.fixture
async def server() -> AsyncIterator[FakeSpeaker]:
    async with FakeSpeaker() as fake:
        yield fake


_MADE: list[Speaking] = []


@pytest.fixture(autouse=True)
async def _closed() -> AsyncIterator[None]:
    yield
    while _MADE:
        await _MADE.pop().close()


def speaking(store: Store, **values: object) -> Speaking:
    built = build_speaking(SpeechSettings(**values), store)  # type: ignore[arg-type]
    assert built is not None
    _MADE.append(built)
    return built


def opened(note: VoiceNote, store: Store) -> tuple[str, str, int, int, float]:
    """(container, codec, channels, rate, seconds) of a stored note, as PyAV reads it; the file
    must lie under the state directory's attachments."""
    import av

    assert note.path.is_relative_to(store.state_dir / "attachments")
    assert note.size == note.path.stat().st_size > 0
    with av.open(str(note.path)) as container:
        stream = container.streams.audio[0]
        return (container.format.name, stream.codec_context.name, stream.channels,
                stream.rate, (container.duration or 0) / 1_000_000)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@needs_espeak
async def test_espeak_ng_speaks_a_reply_as_an_ogg_opus_voice_note(store: Store) -> None:
    note = await speaking(store, backend="espeak-ng").speak(REPLY)
    container, codec, channels, rate, seconds = opened(note, store)
    assert (container, codec, channels, rate) == ("ogg", "opus", 1, 48_000)
    assert 2 < seconds < 15 and abs(note.seconds - seconds) < 0.1


@pytest.mark.parametrize("text", ["-v xx --stdout /etc/passwd", "--help", "-w /tmp/x -s 900"])
@needs_espeak
async def test_text_that_looks_like_options_is_read_aloud(store: Store, text: str) -> None:
    # On the command line "--help" would print help and no audio: on stdin it is spoken.
    note = await speaking(store, backend="espeak-ng").speak(text)
    assert opened(note, store)[:2] == ("ogg", "opus") and note.seconds > 0.1


@needs_espeak
async def test_100_kb_of_text_is_spoken_only_up_to_max_duration(store: Store) -> None:
    text = "This is one sentence of a very long answer. " * 2300  # ~100 KB
    note = await speaking(store, backend="espeak-ng", max_duration=20).speak(text)
    assert 5 < opened(note, store)[4] <= 35


@needs_espeak
async def test_control_characters_and_nul_bytes_do_not_break_speech(store: Store) -> None:
    note = await speaking(store, backend="espeak-ng").speak("Hello\x00 there\x1b[2J.\x07\x7f")
    assert opened(note, store)[:2] == ("ogg", "opus") and note.seconds > 0.3


async def test_a_reply_with_nothing_to_read_is_a_plain_reason(store: Store) -> None:
    with pytest.raises(VoiceError, match="nothing in this reply to read aloud"):
        await speaking(store, backend="espeak-ng").speak("---\n")


async def test_espeak_ng_killed_on_timeout(store: Store, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in espeak-ng that never answers: the time bound ends it.
    fake = tmp_path / "bin" / "espeak-ng"
    fake.parent.mkdir()
    pid_file = tmp_path / "pid"
    fake.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 60\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    with pytest.raises(VoiceError, match=r"did not finish within 0\.5s") as caught:
        await speaking(store, backend="espeak-ng", timeout=0.5).speak("Hello.")
    assert caught.value.reason == "unavailable"
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left running
        import os
        os.kill(pid, 0)


async def test_the_http_request_is_openais_json_and_opus_is_kept_as_sent(
        store: Store, server: FakeSpeaker) -> None:
    note = await speaking(store, backend="http", url=server.url, model="kokoro",
                          voice="af_bella", speed=1.2).speak(REPLY)
    (sent,) = server.requests
    assert sent.body == {"model": "kokoro", "voice": "af_bella", "response_format": "opus",
                         "speed": 1.2,
                         "input": "The meeting is at 3 pm. Bring the agenda."}
    assert sent.headers["Content-Type"] == "application/json" and not sent.authorization
    assert opened(note, store)[:4] == ("ogg", "opus", 1, 48_000)


def test_a_servers_opus_above_a_voice_bitrate_is_encoded_again() -> None:
    # 96 kb/s would put a one-minute reply over WhatsApp's 512 KB for a voice bubble.
    kept = voice_note(tone(10, "opus"), 60)
    big = tone(10, "opus", bit_rate=96_000)
    again = voice_note(big, 60)
    assert kept.kept and not again.kept
    assert len(again.data) < len(big) / 2 and abs(again.seconds - 10) < 0.1


async def test_a_server_refusing_opus_is_asked_for_wav_which_is_encoded(
        store: Store, server: FakeSpeaker) -> None:
    server.formats = ("mp3", "wav")  # speaches: 422 for "opus"
    voice = speaking(store, backend="http", url=server.url)
    first = await voice.speak("One two three four five.")
    second = await voice.speak("Six seven.")
    asked = [r.body["response_format"] for r in server.requests]
    assert asked == ["opus", "wav", "wav"]  # refused once, then remembered
    for note in (first, second):
        assert opened(note, store)[:4] == ("ogg", "opus", 1, 48_000)
    assert abs(first.seconds - 2.0) < 0.1  # five words at the fake's 2.5 a second


async def test_the_key_is_sent_as_bearer_and_a_refused_key_is_a_plain_reason(
        store: Store, server: FakeSpeaker) -> None:
    server.key = "sk-speech"
    await speaking(store, backend="http", url=server.url, key="sk-speech").speak("Hi.")
    with pytest.raises(VoiceError) as caught:
        await speaking(store, backend="http", url=server.url, key="sk-wrong").speak("Hi.")
    assert [r.authorization for r in server.requests] == ["Bearer sk-speech", "Bearer sk-wrong"]
    assert "answered 401: Incorrect API key provided" in str(caught.value)
    assert caught.value.reason == "failed" and "sk-wrong" not in str(caught.value)


@pytest.mark.parametrize(("status", "reason"), [(500, "failed"), (503, "unavailable")])
async def test_a_server_error_is_a_plain_reason(store: Store, server: FakeSpeaker,
                                                status: int, reason: str) -> None:
    server.fail_next(status)
    with pytest.raises(VoiceError) as caught:
        await speaking(store, backend="http", url=server.url).speak("Hello.")
    assert str(caught.value).startswith(f"the speech server at {server.url} answered {status}")
    assert caught.value.reason == reason
    assert not list((store.state_dir / "attachments").rglob("*.ogg"))  # nothing half-stored


async def test_a_slow_server_is_given_up_after_the_timeout(store: Store,
                                                           server: FakeSpeaker) -> None:
    server.delay = 5.0
    with pytest.raises(VoiceError, match=r"did not finish within 0\.3s") as caught:
        await speaking(store, backend="http", url=server.url, timeout=0.3).speak("Hello.")
    assert caught.value.reason == "unavailable"


async def test_a_server_that_is_down_is_not_answering(store: Store) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    with pytest.raises(VoiceError, match="is not answering") as caught:
        await speaking(store, backend="http", url=url).speak("Hello.")
    assert caught.value.reason == "unavailable"


async def test_an_answer_that_is_not_audio_is_a_plain_reason(store: Store,
                                                             server: FakeSpeaker) -> None:
    server.fail_next(200, {"ok": True})  # a 200 with JSON, not audio
    with pytest.raises(VoiceError, match="not audio I can read") as caught:
        await speaking(store, backend="http", url=server.url).speak("Hello.")
    assert caught.value.reason == "failed"


async def test_synthesis_holds_the_model_slot_and_encoding_does_not(
        store: Store, server: FakeSpeaker) -> None:
    seen: list[tuple[str, int]] = []

    @contextlib.asynccontextmanager
    async def hold() -> AsyncIterator[None]:
        seen.append(("held", len(server.requests)))
        yield
        seen.append(("released", len(server.requests)))

    settings = SpeechSettings(backend="http", url=server.url)
    voice = build_speaking(settings, store, hold=hold)
    assert voice is not None
    _MADE.append(voice)
    await voice.speak("Hello there.")
    assert seen == [("held", 0), ("released", 1)]
    seen.clear()
    elsewhere = build_speaking(SpeechSettings(backend="http", url=server.url,
                                              queue_with_model=False), store, hold=hold)
    assert elsewhere is not None
    _MADE.append(elsewhere)
    await elsewhere.speak("Hello there.")
    assert seen == []  # a server on another machine waits for no slot


async def test_readiness_says_what_to_fix(server: FakeSpeaker) -> None:
    assert await readiness(SpeechSettings()) is None
    ready = await readiness(SpeechSettings(backend="http", url=server.url))
    assert ready is not None and ready.ok and "spoke a test sentence" in ready.detail
    server.key = "sk-speech"
    ready = await readiness(SpeechSettings(backend="http", url=server.url))
    assert ready is not None and not ready.ok and "ROOST_SPEECH_KEY" in ready.fix


async def test_roost_doctor_checks_the_speech_backend(tmp_path: Path,
                                                      fake_ollama: FakeOllama) -> None:
    async with FakeSpeaker(key="sk-speech") as server:
        config = write_config(tmp_path, fake_ollama.url)
        config.write_text(config.read_text()
                          + f'[speech]\nbackend = "http"\nurl = "{server.url}"\n')
        status, out = await doctor(config, ROOST_SPEECH_KEY="sk-speech")
        assert status == 0, out
        assert "ok   speech (http): the speech server at " in out
        assert "spoke a test sentence" in out
        status, out = await doctor(config)  # no key
        (line,) = failed(out)
        assert line.startswith("FAIL speech (http): the speech server at")
        assert "answered 401" in line and "-> fix: set ROOST_SPEECH_KEY" in line
    status, out = await doctor(config, ROOST_SPEECH_KEY="sk-speech")  # the server is gone
    (line,) = failed(out)
    assert "is not answering -> fix: start the speech server" in line
    assert "sk-speech" not in out


@pytest.mark.parametrize("declared", [False, True], ids=["chunked", "with-length"])
async def test_a_50_mb_answer_is_refused_without_being_read(
        store: Store, server: FakeSpeaker, declared: bool) -> None:
    flood = server.flood_next(50 * 1024 * 1024, declared=declared)
    with pytest.raises(VoiceError, match=r"sent more than 3 MB for one reply") as caught:
        await speaking(store, backend="http", url=server.url, max_duration=5).speak("Hello.")
    assert caught.value.reason == "failed"
    await wait_until(lambda: flood.done, 10)
    # roost hung up at its cap: the server could not get its 50 MB out.
    assert flood.cut and flood.sent < 10 * 1024 * 1024, flood
    assert not list((store.state_dir / "attachments").rglob("*.ogg"))
