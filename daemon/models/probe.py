"""The battery: a few short requests that show what one model does on this Ollama.

In order, each with a low `num_predict` and the same `num_ctx` (model.window capped at the
model's context_length, as roost sends it: another value would reload the model):

1. speed: a fixed mixed text (prose, digits, code, a non-Latin line) as the system message and
   a short question. The first request loads the model, so its `load_duration` is the cold
   load; its first piece gives `first_token_s`, eval_count/eval_duration `tokens_per_s`, and
   `prompt_eval_count` against roost's own estimate (the turn's estimator with the model's
   vocabulary) gives `estimate_error`.
2. cache: the same system message, another question: the share of the prompt Ollama read from
   its cache (`prompt_eval_cached_count`, where the server says it).
3. tools (only with the `tools` capability): one harmless tool and a request to use it, with
   `think: false` as roost sends tools. A structured `tool_calls` is "native", the call written
   out as JSON in the content "text" (daemon.context.text_calls, as the turn reads it).
4. thinking (only with the `thinking` capability): `think: true` with the tool offered and a
   question that needs none. Thinking in `message.thinking` is "separate"; thinking and no
   content although the model stopped by itself is "empty-with-tools". A model that writes
   `<think>` into its content (asked here or in 1.) is "inline".
5. truncation: a prompt of about twice num_ctx with `truncate: false`: refused, or cut.
6. vision (only with the `vision` capability): a small PNG, described or not.

Then /api/ps says how much memory the loaded model takes.
"""

from __future__ import annotations

import asyncio
import base64
import io
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from PIL import Image

from daemon.context.budget import estimate_tokens, vocabulary_of
from daemon.context.compact import request_tokens
from daemon.context.replay import ChatMessage
from daemon.context.text_calls import looks_like_text_tool_call
from daemon.core.config import ModelSettings
from daemon.llm.client import ModelClient, ModelInfo
from daemon.models.card import Card, ThinkingStyle, ToolStyle, TruncateStyle
from daemon.models.wire import Answer, ProbeFailed, ProbeWire

SHORT = 16  # num_predict of the requests whose answer is not read
TOOL_PREDICT = 96  # room for a call written out as JSON
THINK_PREDICT = 256  # room to think a little and still answer
OVER_WINDOW = 2  # the truncation probe's prompt, in windows

# Mixed on purpose: each kind of text costs a tokenizer differently (daemon/context/budget.py).
MIXED_TEXT = (
    "You are a careful assistant. Keep answers short and plain.\n"
    "The meeting moved from 2025-03-14 09:30 to 2025-03-21 14:05; budget 1,234,567.89 EUR.\n"
    "def total(items: list[int]) -> int:\n    return sum(i * 2 for i in items if i > 0)\n"
    "Привет, как дела? 今日はいい天気ですね。\n"
)
TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "The current time in a time zone.",
    "parameters": {"type": "object", "required": ["timezone"], "properties": {
        "timezone": {"type": "string", "description": "An IANA name, e.g. Europe/Berlin"}}}}}
TOOL_QUESTION = "Use the get_time tool to tell me the time in Europe/Berlin."
THINK_QUESTION = "What is 17 + 25? Answer with the number only."
FILLER = "The river runs past the old mill and the children count the boats going by. "
THINK_TAGS = ("<think>", "</think>")


@dataclass(frozen=True)
class Target:
    """One model to probe and the window it is probed at."""

    info: ModelInfo
    num_ctx: int

    @property
    def name(self) -> str:
        return self.info.name


class Battery:
    """Runs the battery against one Ollama; `llm` answers /api/tags and /api/show."""

    def __init__(self, settings: ModelSettings) -> None:
        self.llm = ModelClient(settings)
        self.wire = ProbeWire(settings.host, settings.timeout)

    async def close(self) -> None:
        await self.wire.close()
        await self.llm.close()

    async def target(self, name: str) -> Target:
        info = await self.llm.model_info(name)
        return Target(info, await self.llm.num_ctx(name))

    async def probe(self, target: Target, ollama_version: str) -> Card:
        """The card of one model; ProbeFailed names the probe that could not be made."""
        info = target.info
        speed = await self._speed(target)
        cache = await self._ok("cache", target, _mixed(target, "And what is 2 + 2?"))
        tools = await self._tools(target) if info.tools else "none"
        inline = any(tag in speed.content for tag in THINK_TAGS)
        thinking = await self._thinking(target) if info.thinks else (
            "inline" if inline else "none")
        return Card(
            name=target.name, ollama_version=ollama_version,
            probed_at=datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
            context=info.context_length, num_ctx=target.num_ctx, tools=tools, thinking=thinking,
            truncate=await self._truncate(target),
            estimate_error=_estimate_error(target, speed),
            load_s=_round(speed.seconds("load_duration")),
            first_token_s=_round(speed.first_token_s),
            tokens_per_s=_rate(speed), cached_share=_cached_share(cache),
            vision=await self._vision(target) if "vision" in info.capabilities else None,
            **await self._memory(target.name),
        )

    async def _speed(self, target: Target) -> Answer:
        return await self._ok("speed", target, _mixed(target, "Say hello in five words."))

    async def _tools(self, target: Target) -> ToolStyle:
        answer = await self._ok("tool", target, _body(
            target, [{"role": "user", "content": TOOL_QUESTION}], TOOL_PREDICT, think=False,
            tools=[TOOL]))
        if answer.tool_calls:
            return "native"
        return "text" if looks_like_text_tool_call(answer.content, ["get_time"]) else "none"

    async def _thinking(self, target: Target) -> ThinkingStyle:
        tools = [TOOL] if target.info.tools else None
        answer = await self._ok("thinking", target, _body(
            target, [{"role": "user", "content": THINK_QUESTION}], THINK_PREDICT, think=True,
            tools=tools))
        if answer.thinking.strip():
            stopped = answer.final.get("done_reason") == "stop"
            if tools and stopped and not answer.content.strip() and not answer.tool_calls:
                return "empty-with-tools"
            return "separate"
        if any(tag in answer.content for tag in THINK_TAGS):
            return "inline"
        return "none"

    async def _truncate(self, target: Target) -> TruncateStyle:
        repeats = math.ceil(OVER_WINDOW * target.num_ctx / estimate_tokens(FILLER))
        body = _body(target, [{"role": "user", "content": FILLER * repeats}], 1, think=False)
        answer = await self.wire.chat("truncation", body | {"truncate": False, "shift": False})
        if answer.status == 200:
            return "cuts"
        if answer.status == 400 and "context" in answer.error:
            return "refuses"
        raise ProbeFailed("truncation", f"Ollama answered {answer.status}: {answer.error}")

    async def _vision(self, target: Target) -> bool:
        image = await asyncio.to_thread(_tiny_png)
        answer = await self._ok("vision", target, _body(target, [{
            "role": "user", "content": "What colour is this picture? One word.",
            "images": [image]}], SHORT, think=False))
        return bool(answer.content.strip())

    async def _memory(self, name: str) -> dict[str, int | None]:
        # Like Ollama, a name without a tag means ":latest" (/api/ps says it in full).
        names = {name, name if ":" in name else f"{name}:latest"}
        entry = next((m for m in await self.wire.running()
                      if {m.get("name"), m.get("model")} & names), {})
        size, vram = entry.get("size"), entry.get("size_vram")
        return {"memory": size if isinstance(size, int) else None,
                "memory_vram": vram if isinstance(vram, int) else None}

    async def _ok(self, probe: str, target: Target, body: Mapping[str, Any]) -> Answer:
        answer = await self.wire.chat(probe, body)
        if answer.status != 200:
            raise ProbeFailed(probe, f"Ollama answered {answer.status}: {answer.error}")
        return answer


def _body(target: Target, messages: list[ChatMessage], num_predict: int, *, think: bool,
          tools: list[Any] | None = None) -> dict[str, Any]:
    """A chat as roost would send it: `think` stated only to a model that thinks (Ollama
    answers 400 to `think: true` otherwise, and thinks when it is unset)."""
    body: dict[str, Any] = {"model": target.name, "messages": messages,
                            "options": {"num_ctx": target.num_ctx, "num_predict": num_predict,
                                        "temperature": 0}}
    if target.info.thinks:
        body["think"] = think
    if tools:
        body["tools"] = tools
    return body


def _mixed_messages(question: str) -> list[ChatMessage]:
    return [{"role": "system", "content": MIXED_TEXT}, {"role": "user", "content": question}]


def _mixed(target: Target, question: str) -> dict[str, Any]:
    return _body(target, _mixed_messages(question), SHORT, think=False)


def _estimate_error(target: Target, speed: Answer) -> float | None:
    """roost's estimate of the speed probe's prompt against the server's count, as the turn
    makes it (daemon.context.compact.request_tokens at ratio 1, the model's vocabulary)."""
    real = speed.count("prompt_eval_count")
    if not real:
        return None
    vocabulary = vocabulary_of(target.info.vocabulary_size)
    estimate = request_tokens(_mixed_messages("Say hello in five words."), 1.0,
                              vocabulary.estimate)
    return round(estimate / real - 1, 3)


def _rate(answer: Answer) -> float | None:
    count, seconds = answer.count("eval_count"), answer.seconds("eval_duration")
    return round(count / seconds, 1) if count and seconds else None


def _cached_share(answer: Answer) -> float | None:
    cached, whole = answer.count("prompt_eval_cached_count"), answer.count("prompt_eval_count")
    return round(cached / whole, 3) if cached is not None and whole else None


def _round(seconds: float | None) -> float | None:
    return round(seconds, 3) if seconds is not None else None


def _tiny_png() -> str:
    """A 64x64 picture, red on the left and blue on the right, base64 as Ollama takes it."""
    image = Image.new("RGB", (64, 64), (220, 30, 30))
    image.paste((30, 60, 220), (32, 0, 64, 64))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")
