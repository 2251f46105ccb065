"""The Ollama client as roost uses it: one num_ctx per model, a gate, streaming, clear errors.

`num_ctx` is the configured window capped at the model's `context_length` from `/api/show`,
looked up once per model and then sent on every request: a different value makes Ollama reload
the model, which costs seconds and throws away its prompt cache.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import re
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Coroutine,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import ollama

from daemon.core.bodies import MB
from daemon.core.capped_http import capped_transport, too_large
from daemon.core.config import ModelSettings
from daemon.core.errors import (
    ContextOverflow,
    LLMError,
    LLMTimeout,
    LLMUnavailable,
    ModelCrashed,
    ModelNotFound,
)
from daemon.core.logs import llm_log as log
from daemon.core.redact import redact_url
from daemon.llm.gate import ModelGate
from daemon.llm.habits import HabitsOf, no_habits
from daemon.llm.inline_reasoning import ReasoningSplitter

SYSTEM_FIRST_TEXT = "System message must be at the beginning"
# llama-server's refusal (with sizes), Ollama's own, and its Go runners' before #16031 (no sizes).
_OVERFLOW_TEXTS = ("exceeds the available context size", "prompt is longer than the context length",
                   "input length exceeds the context length")
# A gateway in front of Ollama, or Ollama's own full queue ("server busy"): the server is out,
# not the request wrong, so it is handled like a refused connection.
_OUTAGE_STATUSES = (502, 503, 504)
# A 500 whose error is about this request, not the server (Ollama's ChatHandler answers 500 when
# the model's template cannot render the messages, or an image does not decode): sending it
# again cannot help, so it is reported rather than held as an outage.
_REQUEST_FAULT_TEXTS = ("template:", "image", "does not support", "unmarshal")
# What the ollama client raises, and lets through from httpx: its ResponseError/RequestError,
# ConnectionError for a refused connection (an OSError), httpx's transport errors (timeouts,
# dropped connections), and ValueError for a line or an answer that does not parse (json,
# pydantic). These alone become LLMErrors; anything else is a bug and travels as itself.
# Any one answer: a streamed one costs about 150 bytes a token, so this holds the longest
# answer of the largest window with room; a server gone wrong costs no more.
ANSWER_CAP = 64 * MB
OLLAMA_ERRORS: tuple[type[Exception], ...] = (
    ollama.ResponseError, ollama.RequestError, httpx.HTTPError, OSError, ValueError)

# A call's (on_delta, on_thinking): where its pieces of content and of thinking go.
_Callbacks = tuple[Callable[[str], None] | None, Callable[[str], None] | None]


@dataclass
class _FinalCounts:
    """Counters of a streamed chat's final object that the ollama client drops."""

    cached: int | None = None


# Set around one streamed call (`_stream`): the transport fills it from the raw final object.
_final_counts: contextvars.ContextVar[_FinalCounts | None] = contextvars.ContextVar(
    "roost_final_counts", default=None)


class _CountsStream(httpx.AsyncByteStream):
    """A chat's NDJSON body passed through unchanged, with `prompt_eval_cached_count` read
    from its final line on the way."""

    def __init__(self, inner: httpx.AsyncByteStream, counts: _FinalCounts) -> None:
        self._inner = inner
        self._counts = counts
        self._pending: list[bytes] = []  # the line begun, in pieces: joined once it ends

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            if b"\n" in chunk:
                first, *lines, rest = chunk.split(b"\n")
                for line in (b"".join((*self._pending, first)), *lines):
                    self._read(line)
                self._pending = [rest]
            else:
                # Not `pending += chunk`: a line that never ends (a server gone wrong) cost
                # a copy of all of it per chunk, minutes before the cap was reached.
                self._pending.append(chunk)
            yield chunk
        self._read(b"".join(self._pending))

    def _read(self, line: bytes) -> None:
        if b'"prompt_eval_cached_count"' not in line:
            return
        try:
            final = json.loads(line)
        except ValueError:
            return  # the ollama client reports a broken line itself
        value = final.get("prompt_eval_cached_count") if isinstance(final, dict) else None
        if isinstance(value, int):
            self._counts.cached = value

    async def aclose(self) -> None:
        await self._inner.aclose()


# Every chat tells Ollama never to cut: `truncate` false makes an over-window prompt an error
# (refitted and retried) instead of old messages dropped silently, `shift` false stops a long
# generation instead of sliding the window under the model (ChatRequest in api/types.go).
NEVER_CUT = {"truncate": False, "shift": False}
TRUNCATE_SINCE = (0, 12, 6)  # the first Ollama that takes `truncate` (ollama/ollama#12582)


def _never_cut(request: httpx.Request) -> httpx.Request:
    """The chat request with `NEVER_CUT` in its body; other requests as they are. Added here
    because the ollama client's `chat` (0.6.x) has no parameters for these fields."""
    if request.method != "POST" or not request.url.path.endswith("/api/chat"):
        return request
    try:
        body = json.loads(request.content)
    except ValueError:
        return request
    if not isinstance(body, dict):
        return request
    headers = httpx.Headers(request.headers)
    del headers["content-length"]
    return httpx.Request(request.method, request.url, headers=headers,
                         content=json.dumps({**body, **NEVER_CUT}).encode(),
                         extensions=request.extensions)


class _CountsTransport(httpx.AsyncBaseTransport):
    """httpx's own transport, keeping what the ollama client's response models drop: they ignore
    fields they do not declare, and Ollama newer than ollama/ollama#17943 reports how many of
    `prompt_eval_count` came from its cache in `prompt_eval_cached_count`. It also adds the
    request fields the client cannot send (`_never_cut`)."""

    def __init__(self) -> None:
        self._inner = capped_transport(ANSWER_CAP)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(_never_cut(request))
        counts = _final_counts.get()
        if counts is not None and isinstance(response.stream, httpx.AsyncByteStream):
            response.stream = _CountsStream(response.stream, counts)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass(frozen=True)
class ModelInfo:
    """What `/api/show` says about a model that matters to roost."""

    name: str
    context_length: int | None
    capabilities: tuple[str, ...] = ()
    vocabulary_size: int | None = None  # what another script costs (daemon.context.budget)

    @property
    def tools(self) -> bool:
        """Whether the model takes tools; Ollama answers 400 to tools sent to one that does not."""
        return "tools" in self.capabilities

    @property
    def thinks(self) -> bool:
        """Whether `think` means anything to the model (Ollama thinks by default if it can)."""
        return "thinking" in self.capabilities


@dataclass(frozen=True)
class ChatResult:
    """One finished model call: the whole streamed reply and Ollama's counters."""

    content: str
    thinking: str = ""
    tool_calls: tuple[Mapping[str, Any], ...] = ()
    prompt_eval_count: int | None = None
    # Of prompt_eval_count, the tokens Ollama took from its cache; None when the server does
    # not say (before ollama/ollama#17943), and then the count may be the uncached part only.
    prompt_eval_cached_count: int | None = None
    eval_count: int | None = None
    done_reason: str | None = None
    num_ctx: int = 0
    # Whether tool schemas went with the request: a model without the tools capability gets
    # none, whatever the caller offered, and Ollama's count then holds none either.
    sent_tools: bool = False


class ModelObserver(Protocol):
    """Told about each finished model call and turn (daemon.app.metrics counts them)."""

    def model_call(self, messages: Sequence[Mapping[str, Any]], result: ChatResult,
                   background: bool) -> None: ...

    def turn_done(self, seconds: float) -> None: ...


class ModelClient:
    """Wraps `ollama.AsyncClient`; owns the model gate (`model.concurrency` calls at once)."""

    def __init__(self, settings: ModelSettings, observer: ModelObserver | None = None) -> None:
        """`observer` hears of each call and each turn's hold (the daemon's /metrics)."""
        self.settings = settings
        self.host = redact_url(settings.host)  # for messages: never the URL's credentials
        self.observer = observer
        self._client = ollama.AsyncClient(
            host=settings.host,
            # Read timeout is the silence allowed between streamed pieces, not the whole reply.
            timeout=httpx.Timeout(settings.timeout, connect=10.0),
            transport=_CountsTransport(),
        )
        self.gate = ModelGate(settings.concurrency)
        self._info: dict[str, ModelInfo] = {}
        self._system_only_first: set[str] = set()
        self._server_version: tuple[int, ...] | None = None  # () once asked: not said
        # What the model's card says to do (daemon.models sets it once the cards are read).
        self.habits_of: HabitsOf = no_habits

    async def close(self) -> None:
        await self._client.close()

    async def pulled_models(self) -> list[str]:
        """Names of the models on the server (`/api/tags`); raises LLMUnavailable when down."""
        try:
            listed = await self._client.list()
        except OLLAMA_ERRORS as exc:
            raise _translate(exc, self.settings.name) from exc
        return [m.model for m in listed.models if m.model]

    async def model_info(self, model: str | None = None) -> ModelInfo:
        """`/api/show` for the model, cached for the life of the process."""
        name = model or self.settings.name
        cached = self._info.get(name)
        if cached is not None:
            return cached
        try:
            shown = await self._client.show(name)
        except OLLAMA_ERRORS as exc:
            raise _translate(exc, name) from exc
        info = ModelInfo(
            name=name,
            context_length=_architecture_value(shown.modelinfo or {}, "context_length"),
            capabilities=tuple(shown.capabilities or ()),
            vocabulary_size=_architecture_value(shown.modelinfo or {}, "vocab_size"),
        )
        self._info[name] = info
        log.info("model %s: context_length %s, capabilities %s",
                 name, info.context_length, ",".join(info.capabilities) or "-")
        return info

    async def model_info_anew(self, model: str) -> ModelInfo:
        """`/api/show` asked again, not from the cache: a chat switches to the model (/model),
        which may have been pulled anew since it was last asked about."""
        self._info.pop(model, None)
        return await self.model_info(model)

    async def counts_whole_prompt(self) -> bool:
        """Whether the server's `prompt_eval_count` counts the whole prompt, cached tokens
        included. Ollama 0.30.x counted only what it evaluated anew (ollama/ollama#16414, fixed
        by #16428), so there a count far below the prompt's size is the cache at work, not a
        cut. An unknown version counts as the whole prompt, as every other release does."""
        version = await self._version()
        return version is None or version[:2] != (0, 30)

    async def cuts_silently(self, model: str | None = None) -> bool:
        """Whether the server may cut a prompt although roost sends `truncate: false`: one
        older than the parameter (Ollama 0.12.6, ollama/ollama#12582), one that does not say
        its version (a proxy or another server speaking Ollama's API), or one that `model`'s
        card saw cut. A server that honours it refuses an over-window prompt instead, so its
        low counts are never cuts."""
        if self.habits_of(model or self.settings.name).cuts:
            return True
        version = await self._version()
        return version is None or version < TRUNCATE_SINCE

    @property
    def known_version(self) -> str | None:
        """The server's version as far as roost has asked it (never asks)."""
        return ".".join(map(str, self._server_version)) if self._server_version else None

    async def learn_version(self) -> None:
        """Ask the server's version, once (for the Health page; the calls ask it as needed)."""
        await self._version()

    async def _version(self) -> tuple[int, ...] | None:
        """The server's version from `/api/version`, asked once; None when unknown."""
        if self._server_version is None:
            try:
                async with httpx.AsyncClient(base_url=self.settings.host, timeout=10.0,
                                             transport=capped_transport(ANSWER_CAP)) as http:
                    response = await http.get("/api/version")
                    response.raise_for_status()
                    text = str(response.json().get("version", ""))
            except (httpx.HTTPError, ValueError, AttributeError) as exc:
                log.info("Ollama's version is unknown (%s)", exc)
                return None  # asked again next time: the server may be starting
            self._server_version = _version_numbers(text)
            log.info("Ollama's version: %s", text or "not said")
        return self._server_version or None

    async def num_ctx(self, model: str | None = None) -> int:
        """The window sent as `options.num_ctx`: configured window capped at context_length."""
        info = await self.model_info(model)
        window = self.settings.window
        return min(window, info.context_length) if info.context_length else window

    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        on_delta: Callable[[str], None] | None = None,
        on_thinking: Callable[[str], None] | None = None,
        num_predict: int | None = None,
        background: bool = False,
        think: bool | None = None,
        while_held: Callable[[], contextlib.AbstractAsyncContextManager[None]] | None = None,
    ) -> ChatResult:
        """One streamed chat call through the gate; deltas go to `on_delta` as they arrive,
        pieces of thinking to `on_thinking`. Cancelling the call closes its HTTP request, which
        stops Ollama generating, and frees the model for the next call.
        `while_held` is entered once the call holds the model (not while it waits for it).

        roost decides thinking: a background call never thinks, a turn thinks only with
        `model.think` (its tokens count against `num_predict`). `think` is always stated to a
        thinking model, since Ollama thinks when it is unset. Tools go only to a model whose
        capabilities list them. `think` False keeps a foreground call from thinking too.

        A `background` call (the fold) yields to turns: it waits while a turn waits, and a turn
        that finds the gate held by a background call cancels that call, which then raises
        `Preempted` and can be tried again later. So a slow fold never delays a reply.
        """
        name = model or self.settings.name
        num_ctx = await self.num_ctx(name)
        info = await self.model_info(name)
        options: dict[str, Any] = {"num_ctx": num_ctx}
        if num_predict is not None:
            options["num_predict"] = num_predict
        if not info.tools or self.habits_of(name).no_tools:
            tools = None
        if info.thinks:
            think = bool(self.settings.think and not background and think is not False
                         and not (tools and self.habits_of(name).no_thinking_with_tools))
        else:
            think = None
        # Made only once the call may go: a coroutine made earlier and cancelled while it
        # queued would never be awaited.
        call = functools.partial(self._observed, name, num_ctx, options, messages, tools,
                                 (on_delta, on_thinking), background, think)
        return await self.gate.call(call, background=background, while_held=while_held)

    # The gate's, kept here for the callers that hold the client (see daemon/llm/gate.py).

    def scheduled(self) -> contextlib.AbstractContextManager[None]:
        return self.gate.scheduled()

    def slot(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self.gate.slot()

    def turn(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Held for a whole turn (`ModelGate.turn`); the observer hears how long it took."""
        return self.gate.turn(self._turn_done)

    def waiting_for_user(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self.gate.waiting_for_user()

    @property
    def in_flight(self) -> int:
        return self.gate.in_flight

    @property
    def waiting(self) -> int:
        return self.gate.waiting

    @property
    def turns_active(self) -> int:
        return self.gate.turns_active

    @property
    def scheduled_waiting(self) -> int:
        return self.gate.scheduled_waiting

    def _turn_done(self, seconds: float) -> None:
        if self.observer is not None:
            self.observer.turn_done(seconds)

    async def _observed(
        self,
        name: str,
        num_ctx: int,
        options: Mapping[str, Any],
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        on: _Callbacks,
        background: bool,
        think: bool | None,
    ) -> ChatResult:
        """The call, told to the observer (daemon.app.metrics) once it finished."""
        result = await self._stream_adapting(name, num_ctx, options, messages, tools, on, think)
        if think and not result.content.strip() and not result.tool_calls:
            # Some models think and then say nothing (with tools offered, most often): the
            # answer is asked for again without thinking rather than shown empty.
            log.info("model %s thought and answered nothing; asked again without thinking",
                     name)
            result = await self._stream_adapting(name, num_ctx, options, messages, tools, on,
                                                 False)
        if self.observer is not None:
            self.observer.model_call(messages, result, background)
        return result

    async def _stream_adapting(
        self,
        name: str,
        num_ctx: int,
        options: Mapping[str, Any],
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        on: _Callbacks,
        think: bool | None,
    ) -> ChatResult:
        """Some chat templates accept a system message only at the start: resend with later
        ones as user messages, and keep doing that for the model until restart."""
        if name in self._system_only_first:
            messages = _late_system_as_user(messages)
        try:
            return await self._stream(name, num_ctx, options, messages, tools, on, think)
        except LLMError as exc:
            if SYSTEM_FIRST_TEXT not in str(exc) or name in self._system_only_first:
                raise
            log.info("model %s wants its system message first only; adapting", name)
            self._system_only_first.add(name)
            return await self._stream(name, num_ctx, options, _late_system_as_user(messages),
                                      tools, on, think)

    async def _stream(
        self,
        name: str,
        num_ctx: int,
        options: Mapping[str, Any],
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        on: _Callbacks,
        think: bool | None,
    ) -> ChatResult:
        words = _Words(on, ReasoningSplitter(unopened=self.habits_of(name).inline_reasoning))
        tool_calls: list[Mapping[str, Any]] = []
        final: Any = None
        counts = _FinalCounts()
        token = _final_counts.set(counts)

        def request() -> Coroutine[Any, Any, AsyncIterator[ollama.ChatResponse]]:
            return self._client.chat(
                model=name,
                messages=list(messages),
                tools=list(tools) if tools else None,
                stream=True,
                think=think,
                options=dict(options),
                keep_alive=_keep_alive(self.settings.keep_alive),
            )

        try:
            # Closed on the way out, so a callback that raises does not leave the response open.
            async with contextlib.aclosing(_translated(request, name)) as parts:
                async for part in parts:
                    if part.message.content:
                        words.content(part.message.content)
                    if part.message.thinking:
                        words.pass_on("", part.message.thinking)
                    for call in part.message.tool_calls or ():
                        tool_calls.append(call.model_dump(exclude_none=True))
                    if part.done:
                        final = part
            words.end()
        finally:
            _final_counts.reset(token)
        return ChatResult(
            content="".join(words.answer),
            thinking="".join(words.thinking),
            tool_calls=tuple(tool_calls),
            prompt_eval_count=getattr(final, "prompt_eval_count", None),
            prompt_eval_cached_count=counts.cached if final is not None else None,
            eval_count=getattr(final, "eval_count", None),
            done_reason=getattr(final, "done_reason", None),
            num_ctx=num_ctx,
            sent_tools=bool(tools),
        )


class _Words:
    """A call's words as they stream: the answer and the thinking, each kept and passed on to
    its callback, with reasoning the model wrote into its answer moved to the thinking.
    roost's own code, outside the translation: a bug here is a bug."""

    def __init__(self, on: _Callbacks, inline: ReasoningSplitter) -> None:
        self.on_delta, self.on_thinking = on
        self.inline = inline
        self.answer: list[str] = []
        self.thinking: list[str] = []

    def content(self, piece: str) -> None:
        self.pass_on(*self.inline.feed(piece))

    def end(self) -> None:
        self.pass_on(*self.inline.end())

    def pass_on(self, answer: str, reasoning: str) -> None:
        if answer:
            self.answer.append(answer)
            if self.on_delta is not None:
                self.on_delta(answer)
        if reasoning:
            self.thinking.append(reasoning)
            if self.on_thinking is not None:
                self.on_thinking(reasoning)


async def _translated(
    request: Callable[[], Coroutine[Any, Any, AsyncIterator[ollama.ChatResponse]]], model: str,
) -> AsyncGenerator[ollama.ChatResponse, None]:
    """The streamed parts of one chat, with the ollama client's errors (and httpx's) raised as
    LLMErrors. Only the library runs in here: what the caller does with a part (stream it to
    a channel) happens outside this generator, so its errors are never taken for the model's."""
    try:
        async for part in await request():
            yield part
    except OLLAMA_ERRORS as exc:
        raise _translate(exc, model) from exc


def _late_system_as_user(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [
        {**m, "role": "user"} if i > 0 and m.get("role") == "system" else m
        for i, m in enumerate(messages)
    ]


def _version_numbers(text: str) -> tuple[int, ...]:
    """`0.12.6` -> (0, 12, 6); `0.13.0-rc1` -> (0, 13, 0); () for what is no version."""
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    return tuple(int(g) for g in match.groups("0")) if match else ()


def _keep_alive(value: str) -> str | int:
    """Ollama parses keep_alive strings as Go durations; "-1" and "0" must go as numbers."""
    return int(value) if value.lstrip("-").isdigit() else value


def _architecture_value(model_info: Mapping[str, Any], key: str) -> int | None:
    """`<architecture>.<key>` from /api/show's model_info (`llama.context_length`,
    `qwen2.vocab_size`...): the GGUF's own metadata, which not every file carries."""
    arch = model_info.get("general.architecture")
    value = model_info.get(f"{arch}.{key}") if arch else None
    if value is None:
        value = next((v for k, v in model_info.items() if k.endswith(f".{key}")), None)
    return int(value) if isinstance(value, int | float) else None


def _translate(exc: BaseException, model: str) -> LLMError:
    """Map what httpx and the ollama client raise onto roost's LLMError family."""
    if isinstance(exc, LLMError):
        return exc
    if too_large(exc):
        return LLMError(f"Ollama's answer was too large: {exc}")
    if isinstance(exc, httpx.TimeoutException):
        return LLMTimeout(f"Ollama stopped answering: {type(exc).__name__}")
    if isinstance(exc, ConnectionError | httpx.ConnectError | httpx.RemoteProtocolError
                  | httpx.ReadError | httpx.WriteError):
        return LLMUnavailable(f"cannot reach Ollama: {exc}")
    if isinstance(exc, ollama.ResponseError):
        text = str(exc.error)
        if exc.status_code == 404 and "not found" in text:
            return ModelNotFound(model)
        if exc.status_code in _OUTAGE_STATUSES:
            return LLMUnavailable(f"Ollama answered {exc.status_code}: {text}")
        if exc.status_code == 500:
            if any(marker in text for marker in _REQUEST_FAULT_TEXTS):
                return LLMError(f"Ollama answered 500: {text}")
            return ModelCrashed(f"Ollama answered 500: {text}")
        if exc.status_code == -1:
            # The ollama client's mark for an {"error": ...} line inside a 200 stream: the runner
            # failed after the answer had begun. Like a 500, worth one more try.
            return ModelCrashed(f"Ollama stopped in the middle of the answer: {text}")
        if any(marker in text for marker in _OVERFLOW_TEXTS):
            prompt_tokens, context_size = _overflow_numbers(text)
            return ContextOverflow(text, prompt_tokens, context_size)
        return LLMError(f"Ollama answered {exc.status_code}: {text}")
    return LLMError(f"unexpected error talking to Ollama: {exc!r}")


def _overflow_numbers(text: str) -> tuple[int | None, int | None]:
    """n_prompt_tokens and n_ctx from Ollama's nested overflow body, or from its message."""
    try:
        nested = json.loads(text)
        inner = nested.get("error", nested) if isinstance(nested, dict) else {}
        if isinstance(inner, dict) and "n_prompt_tokens" in inner:
            return int(inner["n_prompt_tokens"]), int(inner.get("n_ctx", 0)) or None
    except (ValueError, TypeError):
        pass
    match = re.search(r"request \((\d+) tokens\) exceeds the available context size \((\d+)", text)
    if match:
        return int(match.group(1)), int(match.group(2))
    return None, None
