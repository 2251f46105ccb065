"""A speech stand-in for delivery tests (daemon.voice.speaking's interface): each reply spoken
is a copy of the real voice-note fixture under the attachments folder, and a test can make it
fail or wait. The real backends are tested in tests/daemon/voice/test_speech*.py, and once
through the daemon in tests/channels/telegram/test_telegram_voice.py."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from daemon.core.errors import VoiceError
from daemon.voice.speaking import Speaking, VoiceNote
from tests.conftest import FIXTURES

VOICE_NOTE = FIXTURES / "media" / "voice-note.opus.ogg"


class SpeakingStandIn(Speaking):
    """Records the texts it was given; `fail` makes it refuse, `gate` makes it wait, `delay`
    stands for a backend's time (seconds)."""

    def __init__(self, attachments: Path, *, seconds: float = 3.0) -> None:
        self.attachments = attachments
        self.seconds = seconds
        self.texts: list[str] = []
        self.fail: str | None = None
        self.gate: asyncio.Event | None = None
        self.source = VOICE_NOTE
        self.delay = 0.0

    async def speak(self, text: str) -> VoiceNote:
        self.texts.append(text)
        if self.gate is not None:
            await self.gate.wait()
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise VoiceError(self.fail, "unavailable")
        self.attachments.mkdir(parents=True, exist_ok=True)
        path = self.attachments / f"spoken-{len(self.texts)}.ogg"
        await asyncio.to_thread(shutil.copyfile, self.source, path)
        return VoiceNote(path, self.seconds, path.stat().st_size)

    async def close(self) -> None:
        pass
