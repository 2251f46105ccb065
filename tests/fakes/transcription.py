"""A loopback fake of an OpenAI-compatible transcription server, for roost's tests.

It follows OpenAI's `POST /v1/audio/transcriptions` (what speaches, LocalAI and whisper.cpp's
`whisper-server --inference-path /v1/audio/transcriptions` serve):

* the request is `multipart/form-data` with a `file` part (the recording, with its file name
  and content type), `model`, and optionally `response_format` (`json` by default, `text`,
  `verbose_json`), `language`, `prompt`, `temperature`;
* `json` answers `{"text": "..."}`; `text` answers the bare text (text/plain); `verbose_json`
  answers `{"task": "transcribe", "language", "duration", "text", "segments": []}`;
* errors are `{"error": {"message", "type": "invalid_request_error", "param", "code"}}` with a
  4xx status (400 for a missing file or model, 401 for a wrong key) or a 5xx.

Every request is recorded (`requests`), with the time it spent "transcribing" (`delay`), so a
bench can tell the backend's own time from what roost adds. `fail_next` scripts faults;
`flood_next` makes the next answer larger than any transcript (tests/fakes/flood.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import BodyPartReader, web

from tests.fakes.flood import Flood

PATH = "/v1/audio/transcriptions"


@dataclass
class Request:
    fields: dict[str, str]  # the form's text parts: model, response_format, language...
    file_name: str | None
    file_type: str | None
    file: bytes
    authorization: str
    busy: float = 0.0  # seconds the fake spent "transcribing"
    time: float = field(default_factory=time.monotonic)  # when it arrived
    finished: float = 0.0  # when the fake had transcribed it (time.monotonic())


@dataclass
class FakeTranscriber:
    text: str = "Please remind me to water the plants tomorrow."
    key: str | None = None  # the bearer key required, if any
    delay: float = 0.0  # seconds each transcription takes
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

    def flood_next(self, size: int) -> Flood:
        """Answer the next request with `size` bytes of JSON-looking text, streamed."""
        self.flood = Flood(size, content_type="application/json")
        return self.flood

    async def __aenter__(self) -> FakeTranscriber:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post(PATH, self._transcribe)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _transcribe(self, request: web.Request) -> web.StreamResponse:
        if self.flood is not None and not self.flood.done:
            return await self.flood.send(request)
        if not request.content_type.startswith("multipart/form-data"):
            return _error(400, "Expected multipart/form-data", "file")
        fields: dict[str, str] = {}
        file_name = file_type = None
        data = b""
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            assert isinstance(part, BodyPartReader)
            if part.name == "file":
                file_name, file_type = part.filename, part.headers.get("Content-Type")
                data = bytes(await part.read())
            elif part.name:
                fields[part.name] = await part.text()
        recorded = Request(fields, file_name, file_type, data,
                           request.headers.get("Authorization", ""))
        self.requests.append(recorded)
        if self.key is not None and recorded.authorization != f"Bearer {self.key}":
            return _error(401, "Incorrect API key provided.", None, "invalid_api_key")
        if self._faults:
            status, body = self._faults.popleft()
            if body is None:
                return _error(status, f"fake failure {status}", None)
            return web.json_response(body, status=status)
        if not data or not file_name:
            return _error(400, "No file was uploaded.", "file")
        if "model" not in fields:
            return _error(400, "you must provide a model parameter", "model")
        started = time.monotonic()
        if self.delay:
            await asyncio.sleep(self.delay)
        recorded.finished = time.monotonic()
        recorded.busy = recorded.finished - started
        fmt = fields.get("response_format", "json")
        if fmt == "text":
            return web.Response(text=self.text + "\n", content_type="text/plain")
        if fmt == "verbose_json":
            return web.json_response({"task": "transcribe",
                                      "language": fields.get("language", "english"),
                                      "duration": 0.0, "text": self.text, "segments": []})
        if fmt != "json":
            return _error(400, f"Unsupported response_format {fmt!r}", "response_format")
        return web.json_response({"text": self.text})


def _error(status: int, message: str, param: str | None,
           code: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param,
                      "code": code}}
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")
