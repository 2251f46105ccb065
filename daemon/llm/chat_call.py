"""One chat call at one Ollama host: streamed, its counters kept, its errors translated.

The host's `ollama.AsyncClient` (`ollama_client`) runs on a transport that adds what the
library cannot send (`truncate` and `shift` false: Ollama never cuts) and keeps what it drops
(`prompt_eval_cached_count`). `ChatStreams.stream` sends one `ChatRequest` and collects its
answer as it streams (the answer and the thinking passed on to their callbacks, reasoning
written into the answer moved out of it) into a `ChatResult`. What the library raises becomes
roost's `LLMError` family (`translate`); anything else is a bug and travels as itself.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import httpx
import ollama

from daemon.core.bodies import MB
from daemon.core.capped_http import capped_transport, too_large
from daemon.core.errors import (
    ContextOverflow,
    LLMError,
    LLMTimeout,
    LLMUnavailable,
    ModelCrashed,
    ModelNotFound,
)
from daemon.core.logs import llm_log as log
from daemon.llm.inline_reasoning import ReasoningSplitter
from daemon.llm.pool import OLLAMA_ERRORS

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
# Any one answer: a streamed one costs about 150 bytes a token, so this holds the longest
# answer of the largest window with room; a server gone wrong costs no more.
ANSWER_CAP = 64 * MB

# A call's (on_delta, on_thinking): where its pieces of content and of thinking go.
Callbacks = tuple[Callable[[str], None] | None, Callable[[str], None] | None]


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
    host: str = ""  # the Ollama host that answered (its URL, credentials hidden)


@dataclass(frozen=True)
class ChatRequest:
    """One chat as it goes to a host: `options` carry its `num_ctx`; `inline_reasoning` (the
    model's card) moves reasoning the model writes into its answer out of it."""

    model: str
    messages: Sequence[Mapping[str, Any]]
    options: Mapping[str, Any]
    tools: Sequence[Mapping[str, Any]] | None = None
    think: bool | None = None
    keep_alive: str | int = "30m"
    inline_reasoning: bool = False


class ChatStreams:
    """Sends chats, adapting to a chat template that accepts a system message only at the
    start: later ones go as user messages, for that model until restart."""

    def __init__(self) -> None:
        self._system_only_first: set[str] = set()

    async def stream(self, client: ollama.AsyncClient, host: str, request: ChatRequest,
                     on: Callbacks) -> ChatResult:
        """`request` streamed to `client` (the host named `host`); its pieces go to `on`."""
        name = request.model
        if name in self._system_only_first:
            request = replace(request, messages=_late_system_as_user(request.messages))
        try:
            return await _stream(client, host, request, on)
        except LLMError as exc:
            if SYSTEM_FIRST_TEXT not in str(exc) or name in self._system_only_first:
                raise
            log.info("model %s wants its system message first only; adapting", name)
            self._system_only_first.add(name)
            return await _stream(client, host, replace(
                request, messages=_late_system_as_user(request.messages)), on)


async def _stream(client: ollama.AsyncClient, host: str, request: ChatRequest,
                  on: Callbacks) -> ChatResult:
    words = _Words(on, ReasoningSplitter(unopened=request.inline_reasoning))
    tool_calls: list[Mapping[str, Any]] = []
    final: Any = None
    counts = _FinalCounts()
    token = _final_counts.set(counts)

    def sent() -> Coroutine[Any, Any, AsyncIterator[ollama.ChatResponse]]:
        return client.chat(
            model=request.model,
            messages=list(request.messages),
            tools=list(request.tools) if request.tools else None,
            stream=True,
            think=request.think,
            options=dict(request.options),
            keep_alive=request.keep_alive,
        )

    try:
        # Closed on the way out, so a callback that raises does not leave the response open.
        async with contextlib.aclosing(_translated(sent, request.model)) as parts:
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
        num_ctx=int(request.options.get("num_ctx") or 0),
        sent_tools=bool(request.tools),
        host=host,
    )


class _Words:
    """A call's words as they stream: the answer and the thinking, each kept and passed on to
    its callback, with reasoning the model wrote into its answer moved to the thinking.
    roost's own code, outside the translation: a bug here is a bug."""

    def __init__(self, on: Callbacks, inline: ReasoningSplitter) -> None:
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
        raise translate(exc, model) from exc


def _late_system_as_user(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [
        {**m, "role": "user"} if i > 0 and m.get("role") == "system" else m
        for i, m in enumerate(messages)
    ]


def ollama_client(timeout: float, url: str) -> ollama.AsyncClient:
    """A host's client: its read timeout is the silence allowed between streamed pieces, not
    the whole reply; `_CountsTransport` keeps what the library drops and adds what it cannot
    send."""
    return ollama.AsyncClient(host=url, timeout=httpx.Timeout(timeout, connect=10.0),
                              transport=_CountsTransport())


def keep_alive(value: str) -> str | int:
    """Ollama parses keep_alive strings as Go durations; "-1" and "0" must go as numbers."""
    return int(value) if value.lstrip("-").isdigit() else value


def translate(exc: BaseException, model: str) -> LLMError:
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
