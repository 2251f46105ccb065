"""The battery: a few short requests that show what one model does on this Ollama.

First /api/ps says whether the model is loaded already. Then, in order, each request with a low
`num_predict` and the same `num_ctx` (model.window capped at the model's context_length, as
roost sends it: another value would reload the model):

1. speed: a fixed mixed text (prose, digits, code, a non-Latin line) as the system message and
   a short question. The first request loads the model, so its `load_duration` is the cold
   load (unless the model was loaded already: then there is none to time); its first piece
   gives `first_token_s`, eval_count/eval_duration `tokens_per_s`, and `prompt_eval_count`
   against roost's own estimate (the turn's estimator with the model's vocabulary) gives
   `estimate_error`.
2. cache: the same system message, another question: the share of the prompt Ollama read from
   its cache (`prompt_eval_cached_count`, where the server says it).
3. tools (only with the `tools` capability): one harmless tool and a request to use it, with
   `think: false` as roost sends tools. A structured `tool_calls` is "native", the call written
   out as JSON in the content "text" (daemon.context.text_calls, as the turn reads it).
4. thinking: a question that wants one number. With the `thinking` capability, `think: true`
   and the tool offered: thinking in `message.thinking` is "separate"; thinking and no content
   although the model stopped by itself is "empty-with-tools". Without it (and only when the
   speed answer did not show it already), the question as it is. Either way, reasoning in the
   content is "inline": between `<think>` tags, or worked out in plain words before the number
   (`reasons_in_plain_words`).
5. truncation: a prompt of about twice num_ctx with `truncate: false`: refused, or cut.
6. vision (only with the `vision` capability): a small red and blue PNG, seen when the answer
   names one of its colours.

Then /api/ps says how much memory the loaded model takes. The quick battery (`quick=True`, the
daemon's quiet probe of a model without a card) leaves out 2., 5. and 6.: it says no cache
share and no vision, and takes truncation from the Ollama version.

Every request goes through `through` when one is given: the daemon passes its model gate, so
the battery's requests yield to chats (a preempted one raises Preempted, out of `probe`).
"""

from __future__ import annotations

import asyncio
import base64
import io
import math
import re
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from PIL import Image

from daemon.context.budget import estimate_tokens, vocabulary_of
from daemon.context.compact import request_tokens
from daemon.context.replay import ChatMessage
from daemon.context.text_calls import looks_like_text_tool_call
from daemon.core.config import ModelSettings
from daemon.core.redact import redact_url
from daemon.llm.client import TRUNCATE_SINCE, ModelClient, ModelInfo, _version_numbers
from daemon.models.card import Card, ThinkingStyle, ToolStyle, TruncateStyle
from daemon.models.wire import Answer, ProbeFailed, ProbeWire

SHORT = 16  # num_predict of the requests whose answer is not read
TOOL_PREDICT = 96  # room for a call written out as JSON
THINK_PREDICT = 256  # room to think a little and still answer
# Room to show reasoning begun: a tag comes first, plain reasoning is read even cut off, and a
# model that does as asked stops after a token or two.
INLINE_PREDICT = 128
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
THINK_ANSWER = "42"
FILLER = "The river runs past the old mill and the children count the boats going by. "
THINK_TAGS = ("<think>", "</think>")
VISION_QUESTION = "What colour is this picture? One word."
# The picture's colours (_tiny_png), as a model that sees it may name them.
PICTURE_COLOURS = re.compile(r"\b(red|reddish|scarlet|crimson|blue|bluish|blueish|navy)\b",
                             re.IGNORECASE)
# Words that open or join the steps of reasoning written out (okay, let me, first, so...). An
# answer to THINK_QUESTION ("the number only") needs none; a model that works it out before
# answering uses several. Counted as distinct words, so one "so" is not a chain of thought.
REASONING_WORDS = re.compile(
    r"\b(okay|alright|hmm|wait|let me|let's|let us|i need to|i'll|first|then|next|so|"
    r"therefore|thus|step|carry|check|verify|think|tens|ones)\b", re.IGNORECASE)
MIN_REASONING_WORDS = 12  # words before the answer ("The sum of 17 and 25 is": five)
MIN_REASONING_MARKERS = 3  # distinct REASONING_WORDS among them
T = TypeVar("T")


class Through(Protocol):
    """How the battery makes a model request: handed a factory of the request, it awaits it
    once the request may go. The daemon's is `lambda make: llm.gate.call(make,
    background=True)` (a coroutine factory, as the gate makes a task of it)."""

    def __call__(self, make: Callable[[], Coroutine[Any, Any, T]], /) -> Awaitable[T]: ...


async def _directly(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return await make()


@dataclass(frozen=True)
class Target:
    """One model to probe and the window it is probed at."""

    info: ModelInfo
    num_ctx: int

    @property
    def name(self) -> str:
        return self.info.name


class Battery:
    """Runs the battery against one Ollama; `llm` answers /api/tags and /api/show, and each
    model request goes `through` (see the module docstring)."""

    def __init__(self, settings: ModelSettings, through: Through | None = None) -> None:
        self.llm = ModelClient(settings)
        self.wire = ProbeWire(settings.host, settings.timeout)
        self.host = redact_url(settings.host)  # where the battery's requests go (`wire`)
        self.through: Through = through or _directly

    async def close(self) -> None:
        await self.wire.close()
        await self.llm.close()

    async def target(self, name: str) -> Target:
        info = await self.llm.model_info(name)
        return Target(info, await self.llm.num_ctx(name))

    async def probe(self, target: Target, ollama_version: str, *, quick: bool = False) -> Card:
        """The card of one model; ProbeFailed names the probe that could not be made. `quick`:
        only the cheap parts (see the module docstring)."""
        info = target.info
        already_loaded = await self._running(target.name) is not None
        speed = await self._speed(target)
        cache = None if quick else await self._ok("cache", target, _mixed(
            target, "And what is 2 + 2?"))
        tools = await self._tools(target) if info.tools else "none"
        thinking = await self._thinking(target) if info.thinks else await self._inline(
            target, speed)
        truncate = _truncate_of(ollama_version) if quick else await self._truncate(target)
        sees = not quick and "vision" in info.capabilities
        vision = await self._vision(target) if sees else None
        return Card(
            name=target.name, ollama_version=ollama_version,
            probed_at=datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
            context=info.context_length, num_ctx=target.num_ctx, tools=tools, thinking=thinking,
            truncate=truncate, estimate_error=_estimate_error(target, speed),
            load_s=None if already_loaded else _round(speed.seconds("load_duration")),
            first_token_s=_round(speed.first_token_s), tokens_per_s=_rate(speed),
            cached_share=_cached_share(cache) if cache is not None else None, vision=vision,
            **await self._memory(target.name), already_loaded=already_loaded, quick=quick,
            host=self.host)

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
        return "inline" if _reasons_inline(answer) else "none"

    async def _inline(self, target: Target, speed: Answer) -> ThinkingStyle:
        """Whether a model without the thinking capability reasons in its content anyway: some
        always do, with tags (seen in the speed answer); others only for a question that asks
        for working out, with tags or in plain words."""
        if any(tag in speed.content for tag in THINK_TAGS):
            return "inline"
        answer = await self._ok("thinking", target, _body(
            target, [{"role": "user", "content": THINK_QUESTION}], INLINE_PREDICT, think=False))
        return "inline" if _reasons_inline(answer) else "none"

    async def _truncate(self, target: Target) -> TruncateStyle:
        repeats = math.ceil(OVER_WINDOW * target.num_ctx / estimate_tokens(FILLER))
        body = _body(target, [{"role": "user", "content": FILLER * repeats}], 1, think=False)
        answer = await self._chat("truncation", body | {"truncate": False, "shift": False})
        if answer.status == 200:
            return "cuts"
        if answer.status == 400 and "context" in answer.error:
            return "refuses"
        raise ProbeFailed("truncation", f"Ollama answered {answer.status}: {answer.error}")

    async def _vision(self, target: Target) -> bool:
        image = await asyncio.to_thread(_tiny_png)
        answer = await self._ok("vision", target, _body(target, [{
            "role": "user", "content": VISION_QUESTION, "images": [image]}], SHORT,
            think=False))
        # Any answer is not sight: a model may say it cannot see, or guess a colour.
        return PICTURE_COLOURS.search(answer.content) is not None

    async def _memory(self, name: str) -> dict[str, int | None]:
        entry = await self._running(name) or {}
        size, vram = entry.get("size"), entry.get("size_vram")
        return {"memory": size if isinstance(size, int) else None,
                "memory_vram": vram if isinstance(vram, int) else None}

    async def _running(self, name: str) -> Mapping[str, Any] | None:
        """The model's entry in /api/ps, None when it is not loaded."""
        # Like Ollama, a name without a tag means ":latest" (/api/ps says it in full).
        names = {name, name if ":" in name else f"{name}:latest"}
        return next((m for m in await self.wire.running()
                     if {m.get("name"), m.get("model")} & names), None)

    async def _ok(self, probe: str, target: Target, body: Mapping[str, Any]) -> Answer:
        answer = await self._chat(probe, body)
        if answer.status != 200:
            raise ProbeFailed(probe, f"Ollama answered {answer.status}: {answer.error}")
        return answer

    async def _chat(self, probe: str, body: Mapping[str, Any]) -> Answer:
        return await self.through(lambda: self.wire.chat(probe, body))


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


def _reasons_inline(answer: Answer) -> bool:
    return any(tag in answer.content for tag in THINK_TAGS) or reasons_in_plain_words(
        answer.content, finished=answer.final.get("done_reason") != "length")


def reasons_in_plain_words(content: str, *, finished: bool = True) -> bool:
    """Whether an answer to THINK_QUESTION works the sum out in words before giving it, as a
    model that reasons without tags does ("Okay, let me work this out. 17 plus 25... First the
    tens... So the answer is 42."). What counts is the text before the answer's first mention:
    42, or (when the model stopped by itself, `finished`) the last number written, a wrong sum
    too. So a bare number, an equation, or an answer explained after it ("42. First, ...") is
    not reasoning; an answer cut at num_predict before any of those counts whole. Conservative
    on purpose: a "none" leaves roost as it is, an "inline" changes how answers are read.
    """
    text = content.replace("\N{RIGHT SINGLE QUOTATION MARK}", "'")
    numbers = list(re.finditer(r"\d+", text))
    answers = {THINK_ANSWER} | ({numbers[-1].group()} if numbers and finished else set())
    before = text[:next((n.start() for n in numbers if n.group() in answers), len(text))]
    words = re.findall(r"[^\W\d_]+(?:'[^\W\d_]+)?", before)
    markers = {m.lower() for m in REASONING_WORDS.findall(before)}
    return len(words) >= MIN_REASONING_WORDS and len(markers) >= MIN_REASONING_MARKERS


def _truncate_of(ollama_version: str) -> TruncateStyle:
    """The quick battery's truncation, from the version alone: a server older than `truncate`
    (or one that does not say its version) cuts, one that takes it refuses."""
    version = _version_numbers(ollama_version)
    return "refuses" if version and version >= TRUNCATE_SINCE else "cuts"


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
