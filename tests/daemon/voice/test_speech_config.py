"""`[speech]`: off by default, each key checked and named when wrong, the key a secret."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.core.config import SpeechSettings, load_settings
from daemon.core.errors import ConfigError


def load(tmp_path: Path, text: str, **env: str) -> SpeechSettings:
    path = tmp_path / "roost.toml"
    path.write_text(text)
    return load_settings(path, env={"STATE_DIRECTORY": str(tmp_path / "state"), **env}).speech


def test_off_by_default(tmp_path: Path) -> None:
    speech = load(tmp_path, "")
    assert speech.backend == "off" and speech.max_duration == 60.0 and speech.key is None
    assert speech.url == "http://127.0.0.1:8000/v1/audio/speech"


def test_the_keys_are_read_and_the_key_comes_from_the_environment(tmp_path: Path) -> None:
    speech = load(tmp_path, '[speech]\nbackend = "http"\nurl = "http://10.0.0.5:8880/v1"\n'
                  'model = "kokoro"\nvoice = "af_bella"\nspeed = 1\nmax_duration = "90s"\n'
                  'timeout = "30s"\nqueue_with_model = false\n', ROOST_SPEECH_KEY="sk-local")
    assert (speech.backend, speech.url, speech.model, speech.voice, speech.speed) == (
        "http", "http://10.0.0.5:8880/v1", "kokoro", "af_bella", 1.0)
    assert (speech.max_duration, speech.timeout, speech.queue_with_model) == (90.0, 30.0, False)
    assert speech.key == "sk-local" and "sk-local" not in repr(speech)


def test_espeak_ng_takes_its_voice_and_speed(tmp_path: Path) -> None:
    speech = load(tmp_path, '[speech]\nbackend = "espeak-ng"\nvoice = "en-us+f3"\nspeed = 1.3\n')
    assert (speech.backend, speech.voice, speech.speed) == ("espeak-ng", "en-us+f3", 1.3)


@pytest.mark.parametrize(("line", "key", "problem"), [
    ('backend = "piper"', "speech.backend", "must be one of"),
    ('url = "localhost:8000"', "speech.url", "http:// or https://"),
    # A voice is passed to espeak-ng as `-v <voice>`: one that reads as an option is refused.
    ('voice = "--stdin"', "speech.voice", "a voice name"),
    ('voice = "en us"', "speech.voice", "a voice name"),
    ("speed = 3", "speech.speed", "0.5 to 2.0"),
    ('speed = "fast"', "speech.speed", "a number"),
    ('max_duration = "0s"', "speech.max_duration", "1s to 10m"),
    ('max_duration = "1h"', "speech.max_duration", "1s to 10m"),
    ('key = "sk-in-the-file"', "speech.key", "ROOST_SPEECH_KEY"),
    ('modle = "tts-1"', "speech.modle", "unknown key"),
])
def test_a_bad_value_names_the_key(tmp_path: Path, line: str, key: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, f"[speech]\n{line}\n")
    assert caught.value.key == key and problem in caught.value.problem, caught.value
