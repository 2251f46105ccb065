"""How long a recording is, from its container: the real recordings, a two-hour one made
cheaply, and files that are not audio."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.core.errors import VoiceError
from daemon.voice.audio import clock, duration_of
from tests.daemon.voice.recordings import (
    MP3,
    OPUS,
    SECONDS,
    VORBIS,
    nested_moov,
    opus_lasting,
    write,
)


@pytest.mark.parametrize("path", [OPUS, VORBIS, MP3], ids=["opus", "vorbis", "mp3"])
def test_real_recordings_have_their_length_read_without_decoding(path: Path) -> None:
    assert duration_of(path) == pytest.approx(SECONDS, abs=0.01)


def test_a_two_hour_opus_stream_is_two_hours_long(tmp_path: Path) -> None:
    path = write(tmp_path, "long.ogg", opus_lasting(7200))
    assert path.stat().st_size < 10_000
    assert duration_of(path) == pytest.approx(7200)


@pytest.mark.parametrize("data", [
    OPUS.read_bytes()[:200],  # cut inside the Opus header
    OPUS.read_bytes()[:1000],  # headers whole, no audio page: a negative length
    b"OggS" + b"\x00" * 300,  # claims OGG, is not
    b"\x00\x01 not audio at all" * 40,
    b"",
], ids=["cut-header", "no-audio", "fake-ogg", "junk", "empty"])
def test_a_broken_file_is_a_clear_answer_for_the_user(tmp_path: Path, data: bytes) -> None:
    path = write(tmp_path, "broken.ogg", data)
    with pytest.raises(VoiceError) as caught:
        duration_of(path, "That voice note")
    assert caught.value.reason == "unreadable"
    assert str(caught.value).startswith("That voice note could not be read")


def test_a_hostile_m4a_that_overflows_the_parsers_stack_is_unreadable(tmp_path: Path) -> None:
    path = write(tmp_path, "nested.m4a", nested_moov())
    with pytest.raises(VoiceError) as caught:
        duration_of(path, "That audio file")
    assert caught.value.reason == "unreadable"
    assert str(caught.value).startswith("That audio file could not be read as audio")


@pytest.mark.parametrize(("seconds", "shown"), [
    (0.4, "0:00"), (42.4, "0:42"), (59.6, "1:00"), (605, "10:05"), (7200, "2:00:00")])
def test_clock(seconds: float, shown: str) -> None:
    assert clock(seconds) == shown
