"""A child of roost sees none of roost's secrets: espeak-ng (here a stand-in first on PATH that
writes down the environment it was given) runs while the channels' tokens and systemd's
hand-offs are set in roost's environment, and finds none of them, while what it needs to run
(PATH, the locale) still reaches it. The MCP server's case is in tests/daemon/tools/test_mcp.py;
tests/test_child_processes.py checks that every child is started this way."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.core.child_env import child_env
from daemon.core.config import SpeechSettings
from daemon.voice.speech_backends import build_speech_backend

SECRETS = {"ROOST_TELEGRAM_TOKEN": "123456:telegram-token",
           "ROOST_TELEGRAM_SECRET": "webhook-secret",
           "ROOST_WHATSAPP_TOKEN": "EAAG-whatsapp-token",
           "ROOST_WHATSAPP_APP_SECRET": "app-secret",
           "CREDENTIALS_DIRECTORY": "/run/credentials/roost.service",
           "NOTIFY_SOCKET": "/run/systemd/notify",
           "AWS_SECRET_ACCESS_KEY": "not-roosts-but-not-espeaks-either"}


def standin(folder: Path, dump: Path) -> Path:
    """An `espeak-ng` that writes its environment to `dump` and answers with a few bytes."""
    program = folder / "espeak-ng"
    folder.mkdir()
    program.write_text(f"#!/bin/sh\n/usr/bin/env > {dump}\ncat > /dev/null\nprintf 'RIFF'\n")
    program.chmod(0o755)
    return program


async def test_espeak_ng_is_started_without_roosts_secrets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dump = tmp_path / "environment"
    standin(tmp_path / "bin", dump)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.setenv("LANG", "de_DE.UTF-8")
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    backend = build_speech_backend(SpeechSettings(backend="espeak-ng"))
    assert backend is not None
    assert await backend.synthesize("Hello.") == b"RIFF"
    seen = dump.read_text()
    for name, value in SECRETS.items():
        assert name not in seen and value not in seen
    given = dict(line.split("=", 1) for line in seen.splitlines() if "=" in line)
    assert given["LANG"] == "de_DE.UTF-8" and given["PATH"].startswith(str(tmp_path / "bin"))


def test_the_allow_list_keeps_what_a_program_needs_and_the_caller_adds() -> None:
    parent = {**SECRETS, "PATH": "/usr/bin", "HOME": "/home/r", "LC_TIME": "de_DE.UTF-8",
              "TZ": "Europe/Berlin", "ESPEAK_DATA_PATH": "/opt/espeak",
              "HTTPS_PROXY": "http://user:password@proxy:3128",
              "BASH_FUNC_x%%": "() { curl x; }", "TERM": "() { evil; }"}
    env = child_env({"GITHUB_TOKEN": "given to this server", "PATH": "/opt/bin"},
                    keep=("ESPEAK_DATA_PATH",), environ=parent)
    assert env == {"PATH": "/opt/bin", "HOME": "/home/r", "LC_TIME": "de_DE.UTF-8",
                   "TZ": "Europe/Berlin", "ESPEAK_DATA_PATH": "/opt/espeak",
                   "GITHUB_TOKEN": "given to this server"}
