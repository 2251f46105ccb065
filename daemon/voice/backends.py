"""The transcription backends: an OpenAI-compatible server over HTTP, or faster-whisper in
this process.

Both take a stored recording and return its text, or raise `VoiceError` with a line for the
user. Neither blocks the event loop: the HTTP backend is aiohttp, and faster-whisper runs in
one worker thread of its own (CTranslate2 releases the GIL while it computes), loading its
model there on first use, so a transcription never delays a webhook's acknowledgement.

The HTTP request is OpenAI's `POST /v1/audio/transcriptions`: a multipart form with `file`,
`model`, `response_format=json` and, when set, `language`; the answer is `{"text": "..."}`.
speaches (formerly faster-whisper-server), LocalAI and whisper.cpp's `whisper-server` (started
with `--inference-path /v1/audio/transcriptions --convert`) speak it.
"""

from __future__ import annotations

import asyncio
import importlib
import io
import json
import time
import wave
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp

from daemon.core.bodies import MB, answered, read_capped
from daemon.core.config import VoiceSettings
from daemon.core.errors import VoiceError
from daemon.core.logs import voice_log as log
from daemon.core.redact import redact_url

_OUTAGE_STATUSES = (502, 503, 504)
# An answer is `{"text": ...}`: an hour of speech is well under 1 MB of JSON; past 4 MB it is
# a server gone wrong, refused before it costs more (the transcript is cut at 20,000 characters
# anyway, daemon/voice/hearing.py).
ANSWER_CAP = 4 * MB
EXTRA = "pip install 'roost[voice]'"  # what installs faster-whisper beside roost


@dataclass(frozen=True)
class Readiness:
    """What `roost doctor` says about the backend."""

    ok: bool
    detail: str
    fix: str = ""


class Backend(Protocol):
    """Turns a stored recording into text."""

    where: str  # how the user and the log are told which backend it is, without credentials

    async def transcribe(self, path: Path, *, name: str, mime: str) -> str:
        """The recording's text; VoiceError with a message for the user when it fails."""
        ...

    async def check(self) -> Readiness:
        """Whether it works now (a short real transcription, or loading the model)."""
        ...

    async def close(self) -> None: ...


def build_backend(settings: VoiceSettings) -> Backend | None:
    """The configured backend, or None when transcription is off."""
    if settings.backend == "http":
        return HttpBackend(settings)
    if settings.backend == "faster-whisper":
        return FasterWhisperBackend(settings)
    return None


def endpoint(url: str) -> str:
    """The transcription endpoint of `voice.url`: the server's base URL, as OpenAI clients take
    it (`http://host:8000/v1`, or the bare host), gets OpenAI's path; any other path is the
    endpoint itself (whisper.cpp's own, say)."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    if path in ("", "/v1"):
        path = "/v1/audio/transcriptions"
    return parts._replace(path=path).geturl()


def silence_wav(seconds: float = 0.5, rate: int = 16000) -> bytes:
    """A short silent WAV, for checking that a backend answers at all."""
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(b"\0\0" * int(seconds * rate))
    return out.getvalue()


class HttpBackend:
    """An OpenAI-compatible transcription server (see the module docstring)."""

    def __init__(self, settings: VoiceSettings) -> None:
        self.settings = settings
        self.url = endpoint(settings.url)
        self.where = f"the transcription server at {redact_url(self.url)}"
        self._session: aiohttp.ClientSession | None = None

    async def transcribe(self, path: Path, *, name: str, mime: str) -> str:
        data = await asyncio.to_thread(path.read_bytes)
        return await self._post(data, name, mime)

    async def check(self) -> Readiness:
        started = time.monotonic()
        try:
            await self._post(silence_wav(), "check.wav", "audio/wav")
        except VoiceError as exc:
            return Readiness(False, str(exc.args[0] if exc.args else exc), self._fix(exc))
        finally:
            await self.close()
        return Readiness(True, f"{redact_url(self.url)} transcribed a test recording "
                               f"in {time.monotonic() - started:.1f}s (model "
                               f"{self.settings.model})")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _post(self, data: bytes, name: str, mime: str) -> str:
        settings = self.settings
        form = aiohttp.FormData()
        form.add_field("file", data, filename=name, content_type=mime)
        form.add_field("model", settings.model)
        form.add_field("response_format", "json")
        if settings.language:
            form.add_field("language", settings.language)
        headers = {"Authorization": f"Bearer {settings.key}"} if settings.key else {}
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        try:
            async with asyncio.timeout(settings.timeout):
                async with self._session.post(self.url, data=form,
                                              headers=headers) as response:
                    status, body = response.status, await read_capped(response, ANSWER_CAP)
        except TimeoutError as exc:
            raise VoiceError(f"{self.where} did not finish within {settings.timeout:g}s",
                             "unavailable") from exc
        except (aiohttp.ClientError, OSError) as exc:
            log.warning("transcription server unreachable: %s", redact_url(str(exc)))
            raise VoiceError(f"{self.where} is not answering", "unavailable") from exc
        if body is None:
            log.warning("transcription server answered %d with more than %d bytes: refused "
                        "unread", status, ANSWER_CAP)
            raise VoiceError(f"{self.where} sent more than {ANSWER_CAP // MB} MB for one "
                             "transcript", "failed")
        text, problem = _read_answer(body)
        if status == 200 and text is not None:
            return text.strip()
        log.warning("transcription server answered %d: %s", status, problem)
        reason = "unavailable" if status in _OUTAGE_STATUSES else "failed"
        raise VoiceError(answered(self.where, status, problem)[:300], reason)

    def _fix(self, exc: VoiceError) -> str:
        message = str(exc)
        if " 401" in message or " 403" in message:
            return "set ROOST_VOICE_KEY (or $CREDENTIALS_DIRECTORY/ROOST_VOICE_KEY) to the key " \
                   "the server expects"
        if " 404" in message or " 405" in message:
            parts = urlsplit(self.url)
            base = f"{parts.scheme}://{parts.netloc}"
            return (f"set voice.url to the server's base URL ({base}/v1) or its full endpoint "
                    f"({base}/v1/audio/transcriptions); whisper.cpp: start whisper-server "
                    "with --inference-path /v1/audio/transcriptions")
        if exc.reason == "unavailable":
            return "start the transcription server (README, \"Voice notes\"), or correct voice.url"
        return "check voice.model names a model the server has, and the server's log"


def _read_answer(body: bytes) -> tuple[str | None, str]:
    """(text, problem) from a response body: OpenAI's `{"text": ...}`, its
    `{"error": {"message": ...}}`, or whisper.cpp's `{"error": "..."}` (which it sends with 200)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None, body[:200].decode("utf-8", "replace").strip() or "an empty answer"
    if not isinstance(doc, dict):
        return None, "an answer that is not a JSON object"
    error = doc.get("error")
    if error:
        message = error.get("message") if isinstance(error, dict) else error
        return None, str(message)[:200]
    text = doc.get("text")
    return (text, "") if isinstance(text, str) else (None, "an answer without a text field")


class FasterWhisperBackend:
    """faster-whisper in this process: one worker thread loads the model and transcribes."""

    def __init__(self, settings: VoiceSettings) -> None:
        self.settings = settings
        self.where = f"faster-whisper ({settings.model})"
        # One thread: transcriptions queue here (and for the GPU slot before it), and the model
        # is loaded once, by the thread that uses it.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="roost-whisper")
        self._model: Any = None

    async def transcribe(self, path: Path, *, name: str, mime: str) -> str:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._transcribe, path)

    async def check(self) -> Readiness:
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        try:
            await loop.run_in_executor(self._thread, self.load)
        except VoiceError as exc:
            return Readiness(False, str(exc), _load_fix(self.settings, exc))
        finally:
            await self.close()
        s = self.settings
        return Readiness(True, f"faster-whisper loaded {s.model} on {s.device} "
                               f"({s.compute_type}) in {time.monotonic() - started:.1f}s")

    async def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)

    def load(self) -> Any:
        """The model, loaded on first use (in the worker thread)."""
        if self._model is not None:
            return self._model
        s = self.settings
        try:
            module = importlib.import_module("faster_whisper")
        except ImportError as exc:
            raise VoiceError("faster-whisper is not installed", "unavailable") from exc
        started = time.monotonic()
        try:
            self._model = module.WhisperModel(s.model, device=s.device,
                                              compute_type=s.compute_type)
        # What loading raises: OSError (a missing directory; Hugging Face's download errors
        # derive from it), RuntimeError (CTranslate2: no CUDA, a bad compute type) and
        # ValueError (a bad device or size name).
        except (OSError, RuntimeError, ValueError) as exc:
            log.error("faster-whisper could not load %s: %s", s.model, exc)
            raise VoiceError(f"faster-whisper could not load the model {s.model!r}: "
                             f"{str(exc)[:200]}", "unavailable") from exc
        log.info("faster-whisper loaded %s on %s in %.1fs", s.model, s.device,
                 time.monotonic() - started)
        return self._model

    def _transcribe(self, path: Path) -> str:
        model = self.load()
        try:
            segments, _info = model.transcribe(str(path), language=self.settings.language)
            return " ".join(s.text.strip() for s in segments).strip()
        # PyAV's decoding errors derive from ValueError or OSError; CTranslate2's from
        # RuntimeError.
        except (OSError, RuntimeError, ValueError) as exc:
            log.warning("faster-whisper failed on %s: %s", path.name, exc)
            raise VoiceError(f"{self.where} could not transcribe it", "failed") from exc


def _load_fix(settings: VoiceSettings, exc: VoiceError) -> str:
    if "not installed" in str(exc):
        return f"install the extra: {EXTRA} (in roost's virtualenv)"
    return (f"voice.model must be a size name (tiny, base, small, medium, large-v3, ...) or a "
            f"directory holding a CTranslate2 Whisper model; a size name is downloaded from "
            f"Hugging Face on first load (needs the network once). With voice.device "
            f"{settings.device!r}: 'cuda' needs CUDA 12 and cuDNN 9, else set voice.device = "
            f"\"cpu\" and voice.compute_type = \"int8\"")
