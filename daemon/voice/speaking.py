"""A reply spoken as a voice note (README, "[speech]").

`Speaking.speak` takes the reply's text (its Markdown, or what `spoken_text` made of it: the
result is the same), makes the words to read aloud within `speech.max_duration`
(`daemon.voice.spoken`), has the backend synthesise them while holding a model slot (`hold`,
the model client's `slot`, as transcription does: chats first, since a speech server shares the
GPU with Ollama), then encodes the audio as OGG/Opus mono 48 kHz in a thread
(`daemon.voice.opus`) and stores it under `<state_dir>/attachments` as a "voice" attachment.
The encoding does not hold the slot: it is CPU work. Whatever goes wrong is a `VoiceError`
with a plain reason; the reply then goes as text only.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from daemon.core.config import SpeechSettings
from daemon.core.errors import VoiceError
from daemon.store import Store
from daemon.store.attachments import store_file
from daemon.voice.backends import Readiness
from daemon.voice.hearing import Hold, no_wait
from daemon.voice.opus import EXTRA, voice_note
from daemon.voice.speech_backends import SpeechBackend, build_speech_backend, longest_note
from daemon.voice.spoken import spoken_text

WORDS_PER_SECOND = 2.5  # a calm speaking rate at speed 1.0; espeak-ng's 175 a minute is faster
CHECK_TEXT = "Roost can speak."


@dataclass(frozen=True)
class VoiceNote:
    path: Path  # an OGG/Opus, mono, 48 kHz file stored under <state_dir>/attachments
    seconds: float  # its duration
    size: int  # bytes


class Speaking:
    """See the module docstring."""

    def __init__(self, settings: SpeechSettings, store: Store, backend: SpeechBackend, *,
                 hold: Hold = no_wait) -> None:
        self.settings = settings
        self.backend = backend
        self.hold = hold
        self.attachments_dir = store.state_dir / "attachments"

    async def speak(self, text: str) -> VoiceNote:
        """The reply as a stored voice note; VoiceError with a plain reason when it cannot be."""
        s = self.settings
        spoken = spoken_text(text, max_seconds=s.max_duration,
                             words_per_second=WORDS_PER_SECOND * s.speed)
        if not spoken.text:
            raise VoiceError("there is nothing in this reply to read aloud", "failed")
        async with self.hold():
            audio = await self.backend.synthesize(spoken.text)
        encoded = await asyncio.to_thread(voice_note, audio, longest_note(s))
        stored = await asyncio.to_thread(store_file, encoded.data, self.attachments_dir,
                                         name="voice-reply.ogg", mime="audio/ogg", kind="voice")
        return VoiceNote(stored.path, encoded.seconds, stored.size)

    async def check(self) -> Readiness:
        """For `roost doctor` (see `readiness`)."""
        ready = await readiness(self.settings, self.backend)
        assert ready is not None  # a backend was given
        return ready

    async def close(self) -> None:
        await self.backend.close()


async def readiness(settings: SpeechSettings,
                    backend: SpeechBackend | None = None) -> Readiness | None:
    """For `roost doctor`: a short sentence synthesised and encoded (nothing stored), or None
    when speech is off. Closes the backend."""
    backend = backend or build_speech_backend(settings)
    if backend is None:
        return None
    started = time.monotonic()
    try:
        audio = await backend.synthesize(CHECK_TEXT)
        encoded = await asyncio.to_thread(voice_note, audio, 30)
    except VoiceError as exc:
        return Readiness(False, str(exc), _fix(settings, exc))
    finally:
        await backend.close()
    return Readiness(True, f"{backend.where} spoke a test sentence ({encoded.seconds:.1f}s of "
                           f"Opus, {len(encoded.data):,} bytes) in "
                           f"{time.monotonic() - started:.1f}s")


def _fix(settings: SpeechSettings, exc: VoiceError) -> str:
    message = str(exc)
    if "PyAV" in message:
        return f"install the extra: {EXTRA}"
    if "espeak-ng is not installed" in message:
        return "install it: apt install espeak-ng (or dnf install espeak-ng)"
    if " 401" in message or " 403" in message:
        return "set ROOST_SPEECH_KEY (or $CREDENTIALS_DIRECTORY/ROOST_SPEECH_KEY) to the key " \
               "the server expects"
    if " 404" in message or " 405" in message:
        parts = urlsplit(settings.url)
        return (f"set speech.url to the server's base URL ({parts.scheme}://{parts.netloc}/v1) "
                "or its full endpoint (.../v1/audio/speech)")
    if exc.reason == "unavailable" and settings.backend == "http":
        return "start the speech server, or correct speech.url"
    return "check that speech.model and speech.voice name ones the engine has, and its log"


def build_speaking(settings: SpeechSettings, store: Store, *,
                   hold: Hold = no_wait) -> Speaking | None:
    """Speaking with the configured backend, or None when speech is off. `hold` is the model
    slot, waited for only when `speech.queue_with_model` (a server on another machine needs
    none)."""
    backend = build_speech_backend(settings)
    if backend is None:
        return None
    return Speaking(settings, store, backend, hold=hold if settings.queue_with_model else no_wait)
