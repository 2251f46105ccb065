"""A loopback fake of an OpenAI-compatible speech server, for roost's tests.

It follows OpenAI's `POST /v1/audio/speech` (what Kokoro-FastAPI, openedai-speech, LocalAI and
speaches serve):

* the request is JSON: `model`, `input` (the text) and `voice` are required;
  `response_format` (`mp3` by default, `opus`, `aac`, `flac`, `wav`, `pcm`) and `speed` are
  optional;
* the answer is the audio bytes with the format's content type: `opus` is Ogg Opus, `wav` a
  RIFF WAVE (OpenAI's is 24 kHz mono 16-bit), `mp3` MPEG layer III;
* errors are `{"error": {"message", "type", "param", "code"}}` with 400 (a missing field) or
  401 (a wrong key), or any scripted status. A format the server does not make is refused as
  speaches refuses it (FastAPI's validation): 422 with `{"detail": [{"loc": ["body",
  "response_format"], "msg": ...}]}`; `formats` says which it makes.

The audio is real, made with PyAV: a tone lasting as long as the words take to say at
`words_per_second`, encoded in the asked format. Every request is recorded (`requests`: the
JSON body, headers, and `busy`, the seconds the fake spent making the audio, so a bench can
tell the backend's own time from roost's). `flood_next` makes the next answer a server gone
wrong: megabytes of "audio" streamed in chunks, recording how much it got out before the
client hung up (`flood`).
"""

from __future__ import annotations

import array
import asyncio
import io
import json
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.flood import Flood

PATH = "/v1/audio/speech"
FORMATS = ("mp3", "opus", "wav")
_CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "wav": "audio/wav"}
# PyAV's container and codec for each format, and the rate and layout OpenAI answers with.
_ENCODING = {"mp3": ("mp3", "libmp3lame", 24_000, "mono"),
             "opus": ("ogg", "libopus", 48_000, "mono"),
             "wav": ("wav", "pcm_s16le", 24_000, "mono")}


@dataclass
class Request:
    body: dict[str, Any]  # the JSON as sent
    headers: dict[str, str]
    busy: float = 0.0  # seconds the fake spent making the audio

    @property
    def authorization(self) -> str:
        return self.headers.get("Authorization", "")


@dataclass
class FakeSpeaker:
    key: str | None = None  # the bearer key required, if any
    formats: tuple[str, ...] = FORMATS  # what it makes; others are refused with 422
    words_per_second: float = 2.5
    delay: float = 0.0  # seconds before each answer, beside the making of the audio
    host: str = "127.0.0.1"
    port: int = 0
    requests: list[Request] = field(default_factory=list)
    _faults: deque[tuple[int, Any]] = field(default_factory=deque)
    flood: Flood | None = None
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{PATH}"

    def fail_next(self, status: int, body: Any = None) -> None:
        """Answer the next request with `status` and `body` (a JSON-able value, or None for an
        OpenAI-style error)."""
        self._faults.append((status, body))

    def flood_next(self, size: int, *, declared: bool = False) -> Flood:
        """Answer the next request with `size` bytes of audio/ogg, 64 KiB at a time."""
        self.flood = Flood(size, declared, "audio/ogg")
        return self.flood

    async def __aenter__(self) -> FakeSpeaker:
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_post(PATH, self._speak)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _speak(self, request: web.Request) -> web.StreamResponse:
        if self.flood is not None and not self.flood.done:
            return await self.flood.send(request)
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = {"unparsed": raw.decode("utf-8", "replace")}
        record = Request(body if isinstance(body, dict) else {"unparsed": body},
                         dict(request.headers))
        self.requests.append(record)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self._faults:
            status, fault = self._faults.popleft()
            if fault is None:
                return _error(status, f"scripted failure {status}", None)
            return web.json_response(fault, status=status)
        if self.key is not None and request.headers.get("Authorization") != f"Bearer {self.key}":
            return _error(401, "Incorrect API key provided", None, "invalid_api_key")
        for name in ("model", "input", "voice"):
            if not isinstance(record.body.get(name), str) or not record.body[name]:
                return _error(400, f"Missing required parameter: '{name}'.", name)
        fmt = record.body.get("response_format", "mp3")
        if fmt not in self.formats:
            allowed = " or ".join(repr(f) for f in self.formats)
            return web.json_response({"detail": [{
                "type": "literal_error", "loc": ["body", "response_format"],
                "msg": f"Input should be {allowed}", "input": fmt}]}, status=422)
        started = time.monotonic()
        seconds = max(0.5, len(record.body["input"].split()) / self.words_per_second)
        audio = await asyncio.to_thread(tone, seconds, fmt)
        record.busy = time.monotonic() - started
        return web.Response(body=audio, content_type=_CONTENT_TYPES[fmt])


def tone(seconds: float, fmt: str, bit_rate: int = 32_000) -> bytes:
    """`seconds` of a 220 Hz tone, encoded by PyAV as `fmt` ("mp3", "opus" or "wav"); a
    compressed format at `bit_rate` (32 kb/s: a voice's)."""
    import av

    container, codec, rate, layout = _ENCODING[fmt]
    out = io.BytesIO()
    with av.open(out, "w", format=container) as sink:
        stream: Any = sink.add_stream(codec, rate=rate, layout=layout)
        if fmt != "wav":
            stream.bit_rate = bit_rate
        total = int(seconds * rate)
        chunk = 4800
        for start in range(0, total, chunk):
            n = min(chunk, total - start)
            pcm = array.array("h", (int(9830 * math.sin(2 * math.pi * 220 * i / rate))
                                    for i in range(start, start + n)))
            frame = av.AudioFrame(format="s16", layout=layout, samples=n)
            frame.planes[0].update(pcm.tobytes())
            frame.sample_rate = rate
            frame.pts = start
            for packet in stream.encode(frame):
                sink.mux(packet)
        for packet in stream.encode(None):
            sink.mux(packet)
    return out.getvalue()


def _error(status: int, message: str, param: str | None,
           code: str | None = None) -> web.Response:
    kind = "invalid_request_error"
    return web.json_response({"error": {"message": message, "type": kind, "param": param,
                                        "code": code}}, status=status)
