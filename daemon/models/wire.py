"""The probe's side of Ollama's HTTP API: one chat with everything its final object says.

roost's ModelClient (daemon.llm.client) hides what a probe needs to see: the durations
(`load_duration`, `eval_duration`), a request's own `truncate`, an answer's status. So the
battery sends its chats here, as plain NDJSON over httpx through the same capped transport
every Ollama client of roost uses, and reads /api/ps and /api/version beside them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from daemon.core.capped_http import capped_transport, too_large
from daemon.core.errors import LLMError, LLMTimeout, LLMUnavailable
from daemon.llm.client import ANSWER_CAP

NS = 1e9  # Ollama's durations are nanoseconds (Go's time.Duration)


class ProbeFailed(LLMError):
    """One probe of the battery could not be made; the message says which and why."""

    def __init__(self, probe: str, why: str) -> None:
        super().__init__(f"the {probe} probe failed: {why}")
        self.probe = probe


@dataclass(frozen=True)
class Answer:
    """One /api/chat answer: its status, the streamed message put together, the final object.
    `first_token_s` is the wall-clock time from sending to the first piece of the message."""

    status: int
    error: str = ""
    content: str = ""
    thinking: str = ""
    tool_calls: list[Any] = field(default_factory=list)
    final: Mapping[str, Any] = field(default_factory=dict)
    first_token_s: float | None = None

    def seconds(self, key: str) -> float | None:
        """A duration of the final object (`load_duration`...) in seconds; None if unsaid."""
        value = self.final.get(key)
        return value / NS if isinstance(value, int | float) else None

    def count(self, key: str) -> int | None:
        value = self.final.get(key)
        return value if isinstance(value, int) else None


class ProbeWire:
    """An httpx client for Ollama at `host`; `timeout` is the silence allowed while it answers
    (a cold load of a large model can take a minute before the first byte)."""

    def __init__(self, host: str, timeout: float) -> None:
        self._http = httpx.AsyncClient(base_url=host,
                                       timeout=httpx.Timeout(timeout, connect=10.0),
                                       transport=capped_transport(ANSWER_CAP))

    async def close(self) -> None:
        await self._http.aclose()

    async def version(self) -> str:
        """What /api/version says, "unknown" when it says nothing (a proxy, another server)."""
        data = await self._get("/api/version")
        version = data.get("version") if isinstance(data, dict) else None
        return str(version) if version else "unknown"

    async def running(self) -> list[Mapping[str, Any]]:
        """The models loaded now (/api/ps), each with its `size` and `size_vram` in bytes."""
        data = await self._get("/api/ps")
        models = data.get("models") if isinstance(data, dict) else None
        return [m for m in models if isinstance(m, dict)] if isinstance(models, list) else []

    async def chat(self, probe: str, body: Mapping[str, Any]) -> Answer:
        """One streamed chat; a status other than 200 comes back as an Answer, everything else
        that goes wrong as ProbeFailed (or LLMUnavailable when nothing answers)."""
        started = time.monotonic()
        try:
            async with self._http.stream("POST", "/api/chat", json=dict(body)) as response:
                if response.status_code != 200:
                    return Answer(response.status_code, _error_text(await response.aread()))
                return await _read_stream(probe, response, started)
        except httpx.ConnectError as exc:
            raise LLMUnavailable(f"cannot reach Ollama: {exc}") from exc
        except httpx.TimeoutException as exc:
            raise ProbeFailed(probe, f"Ollama stopped answering ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            why = "Ollama's answer was too large" if too_large(exc) else str(exc)
            raise ProbeFailed(probe, why or type(exc).__name__) from exc

    async def _get(self, path: str) -> Any:
        try:
            response = await self._http.get(path)
            response.raise_for_status()
            return response.json()
        except httpx.ConnectError as exc:
            raise LLMUnavailable(f"cannot reach Ollama: {exc}") from exc
        except httpx.TimeoutException as exc:
            raise LLMTimeout(f"Ollama did not answer {path}") from exc
        except (httpx.HTTPError, ValueError) as exc:
            raise LLMError(f"Ollama's {path} failed: {exc}") from exc


async def _read_stream(probe: str, response: httpx.Response, started: float) -> Answer:
    content: list[str] = []
    thinking: list[str] = []
    calls: list[Any] = []
    final: dict[str, Any] = {}
    first: float | None = None
    async for line in response.aiter_lines():
        if not line.strip():
            continue
        try:
            part = json.loads(line)
        except ValueError as exc:
            raise ProbeFailed(probe, f"a line of Ollama's answer does not parse: {exc}") from exc
        if not isinstance(part, dict):
            raise ProbeFailed(probe, "a line of Ollama's answer is not an object")
        if "error" in part:  # the runner failed once the 200 was out (streamResponse)
            raise ProbeFailed(probe, f"Ollama stopped in the middle: {part['error']}")
        message = part.get("message")
        if not isinstance(message, dict):
            message = {}
        content.append(str(message.get("content") or ""))
        thinking.append(str(message.get("thinking") or ""))
        calls += message.get("tool_calls") or []
        if first is None and (content[-1] or thinking[-1] or calls):
            first = time.monotonic() - started
        if part.get("done"):
            final = part
    if not final:
        raise ProbeFailed(probe, "Ollama's answer ended before its final object")
    return Answer(200, "", "".join(content), "".join(thinking), calls, final, first)


def _error_text(raw: bytes) -> str:
    """Ollama's `{"error": ...}`, or the start of whatever else came (a proxy's page)."""
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if isinstance(data, dict) and "error" in data:
        return str(data["error"])
    return raw.decode("utf-8", "replace").strip()[:200] or "(no body)"
