"""The speech backends: an OpenAI-compatible server over HTTP, or espeak-ng as a subprocess.

Each turns text into audio bytes in whatever format it produces (`daemon.voice.opus` makes the
voice note), or raises `VoiceError` with a plain reason ("unavailable": down or missing;
"failed": it refused). Neither blocks the event loop.

The HTTP request is OpenAI's `POST /v1/audio/speech`, JSON `{"model", "input", "voice",
"response_format", "speed"}`, answered with the audio bytes. roost asks for "opus" (Ogg Opus,
kept as it is); speaches answers 422 to it (its formats are mp3, flac, wav and pcm), so a 400 or
422 to "opus" is asked once more as "wav", which every server speaks, and remembered.
Kokoro-FastAPI, openedai-speech and LocalAI answer "opus" themselves.

espeak-ng runs as `espeak-ng --stdout --stdin -v <voice> -s <words a minute>`: the text goes
on stdin, never on the command line, so a reply starting with "-" is read, not taken as an
option; it is killed when it outlives the timeout. It gets an environment from the allow list
(`daemon.core.child_env`), never roost's own with its tokens, and starts through confine's
launcher (no read access to the credentials folder), as every child of roost does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from typing import Protocol
from urllib.parse import urlsplit

import aiohttp

from daemon.core import confine
from daemon.core.bodies import MB, answered, read_capped
from daemon.core.child_env import child_env
from daemon.core.config import SpeechSettings
from daemon.core.errors import VoiceError
from daemon.core.logs import voice_log as log
from daemon.core.redact import redact_url

_OUTAGE_STATUSES = (502, 503, 504)
_FORMAT_REFUSED = (400, 422)
ESPEAK = "espeak-ng"
ESPEAK_WPM = 175  # espeak-ng's own default rate, which speed = 1.0 keeps
DEFAULT_VOICES = {"http": "alloy", "espeak-ng": "en"}
# The widest audio an engine answers with: 48 kHz stereo 16-bit PCM (a WAV), in bytes a second.
_WIDEST_AUDIO = 48_000 * 2 * 2


def longest_note(settings: SpeechSettings) -> float:
    """Seconds of audio accepted for one reply. Generous: engines speak at their own pace; only
    a server gone wrong is cut."""
    return settings.max_duration * 1.5 + 5


def answer_cap(settings: SpeechSettings) -> int:
    """Bytes of one answer read at most: the longest note in the widest format, and 1 MB for
    the container around it (18 MB at the default 60 s)."""
    return int(longest_note(settings) * _WIDEST_AUDIO) + MB


class SpeechBackend(Protocol):
    """Turns text into audio bytes."""

    where: str  # how the user and the log are told which backend it is, without credentials

    async def synthesize(self, text: str) -> bytes:
        """The text spoken, in the backend's format; VoiceError with a plain reason."""
        ...

    async def close(self) -> None: ...


def build_speech_backend(settings: SpeechSettings) -> SpeechBackend | None:
    """The configured backend, or None when speech is off."""
    if settings.backend == "http":
        return HttpSpeech(settings)
    if settings.backend == "espeak-ng":
        return EspeakSpeech(settings)
    return None


def speech_endpoint(url: str) -> str:
    """`speech.url` as OpenAI clients take it (`http://host:8000/v1`, or the bare host) gets
    OpenAI's path; any other path is the endpoint itself."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    if path in ("", "/v1"):
        path = "/v1/audio/speech"
    return parts._replace(path=path).geturl()


class HttpSpeech:
    """An OpenAI-compatible speech server (see the module docstring)."""

    def __init__(self, settings: SpeechSettings) -> None:
        self.settings = settings
        self.url = speech_endpoint(settings.url)
        self.where = f"the speech server at {redact_url(self.url)}"
        self.format = "opus"  # "wav" once the server has refused opus
        self._session: aiohttp.ClientSession | None = None

    async def synthesize(self, text: str) -> bytes:
        status, body = await self._post(text, self.format)
        if status in _FORMAT_REFUSED and self.format == "opus":
            log.info("%s refused opus (%d): asking for wav", self.where, status)
            status, body = await self._post(text, "wav")
            if status == 200:
                self.format = "wav"
        if status == 200 and body:
            return body
        problem = _problem(body)
        log.warning("speech server answered %d: %s", status, problem)
        reason = "unavailable" if status in _OUTAGE_STATUSES else "failed"
        raise VoiceError(answered(self.where, status, problem)[:300], reason)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _post(self, text: str, response_format: str) -> tuple[int, bytes]:
        s = self.settings
        payload = {"model": s.model, "input": text, "voice": s.voice or DEFAULT_VOICES["http"],
                   "response_format": response_format, "speed": s.speed}
        headers = {"Authorization": f"Bearer {s.key}"} if s.key else {}
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        try:
            async with asyncio.timeout(s.timeout):
                async with self._session.post(self.url, json=payload,
                                              headers=headers) as response:
                    body = await read_capped(response, answer_cap(s))
        except TimeoutError as exc:
            raise VoiceError(f"{self.where} did not finish within {s.timeout:g}s",
                             "unavailable") from exc
        except (aiohttp.ClientError, OSError) as exc:
            log.warning("speech server unreachable: %s", redact_url(str(exc)))
            raise VoiceError(f"{self.where} is not answering", "unavailable") from exc
        if body is None:
            log.warning("speech server answered %d with more than %d bytes: refused unread",
                        response.status, answer_cap(s))
            raise VoiceError(f"{self.where} sent more than {answer_cap(s) / MB:.0f} MB for one "
                             "reply, more than a voice note can hold", "failed")
        return response.status, body


def _problem(body: bytes) -> str:
    """What an error body says: OpenAI's `{"error": {"message"}}`, FastAPI's `{"detail"}`."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace").strip() or "an empty answer"
    if isinstance(doc, dict):
        error = doc.get("error") or doc.get("detail")
        if isinstance(error, dict):
            error = error.get("message", error)
        if error:
            return str(error)[:200]
    return "an answer that is not audio"


class EspeakSpeech:
    """espeak-ng from the distribution's packages (see the module docstring)."""

    def __init__(self, settings: SpeechSettings) -> None:
        self.settings = settings
        self.where = "espeak-ng"

    async def synthesize(self, text: str) -> bytes:
        s = self.settings
        program = shutil.which(ESPEAK)
        if program is None:
            raise VoiceError("espeak-ng is not installed (apt install espeak-ng)", "unavailable")
        # A voice from the config file (checked there): a name that cannot read as an option.
        voice = s.voice or DEFAULT_VOICES["espeak-ng"]
        argv = confine.wrapped([program, "--stdout", "--stdin", "-v", voice,
                                "-s", str(round(ESPEAK_WPM * s.speed))])
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            # A voice set from elsewhere than the distribution's folder still loads.
            env=child_env(keep=("ESPEAK_DATA_PATH",)))
        try:
            async with asyncio.timeout(s.timeout):
                out, err = await process.communicate(text.encode("utf-8"))
        except TimeoutError as exc:
            raise VoiceError(f"espeak-ng did not finish within {s.timeout:g}s",
                             "unavailable") from exc
        finally:
            if process.returncode is None:  # timed out or cancelled: it does not live on
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        if process.returncode != 0 or not out:
            why = err.decode("utf-8", "replace").strip().splitlines()
            raise VoiceError(f"espeak-ng failed (exit {process.returncode}): "
                             f"{why[-1] if why else 'no audio'}"[:300], "failed")
        return out

    async def close(self) -> None:
        return None
