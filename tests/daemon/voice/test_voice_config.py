"""`[voice]`: off by default, each key checked and named when wrong, the key a secret."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.core.config import VoiceSettings, load_settings
from daemon.core.errors import ConfigError


def load(tmp_path: Path, text: str, **env: str) -> VoiceSettings:
    path = tmp_path / "roost.toml"
    path.write_text(text)
    return load_settings(path, env={"STATE_DIRECTORY": str(tmp_path / "state"), **env}).voice


def test_off_by_default(tmp_path: Path) -> None:
    voice = load(tmp_path, "")
    assert voice.backend == "off" and voice.max_duration == 600.0 and voice.key is None


def test_the_keys_are_read_and_the_key_comes_from_the_environment(tmp_path: Path) -> None:
    voice = load(tmp_path, '[voice]\nbackend = "http"\nurl = "http://10.0.0.5:8080/inference"\n'
                 'model = "whisper-1"\nlanguage = "de"\nmax_duration = "90s"\ntimeout = "30s"\n'
                 "queue_with_model = false\n", ROOST_VOICE_KEY="sk-local")
    assert (voice.backend, voice.url, voice.model, voice.language) == (
        "http", "http://10.0.0.5:8080/inference", "whisper-1", "de")
    assert (voice.max_duration, voice.timeout, voice.queue_with_model) == (90.0, 30.0, False)
    assert voice.key == "sk-local" and "sk-local" not in repr(voice)


@pytest.mark.parametrize(("line", "key", "problem"), [
    ('backend = "whisper"', "voice.backend", "must be one of"),
    ('url = "localhost:8000"', "voice.url", "http:// or https://"),
    ('language = "German"', "voice.language", "a language code"),
    ('device = "gpu"', "voice.device", "must be one of"),
    ('max_duration = "0s"', "voice.max_duration", "longer than zero"),
    ('key = "sk-in-the-file"', "voice.key", "ROOST_VOICE_KEY"),
    ('modle = "small"', "voice.modle", "unknown key"),
])
def test_a_bad_value_names_the_key(tmp_path: Path, line: str, key: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, f"[voice]\n{line}\n")
    assert caught.value.key == key and problem in caught.value.problem, caught.value
