"""A loopback fake of the Ollama HTTP API, for roost's tests.

It speaks the real wire protocol, so the official ``ollama.AsyncClient(host=fake.url)`` works
against it unchanged: ``/api/chat`` (streamed NDJSON or one JSON object), ``/api/show``,
``/api/tags``, ``/api/ps`` and ``/api/version``. Answers to ``/api/chat`` are scripted with
``Reply`` records; with none queued, ``default_reply`` echoes the last user message.

The fake's tokenizer (``count_tokens``) is deliberately *not* characters/4, so that roost's
per-conversation calibration has something to learn:

- every message costs 4 tokens of overhead, plus ceil(utf-8 bytes of its content / 3),
  plus 768 per image, plus ceil(bytes of its compact-JSON ``tool_calls`` / 3);
- the request's tool schemas cost ceil(bytes of their compact JSON, keys sorted / 3);
- a reply's ``eval_count`` is ceil(utf-8 bytes of content + thinking / 3) plus its tool calls.
- with ``tokenizer`` set (a real one from ``tests/fakes/tokenizers.py``), prompt texts are
  counted by it instead of bytes/3, as a real server would count them.

The behaviour follows Ollama 0.12.6 (``server/routes.go`` ChatHandler, ``server/prompt.go``
chatPrompt, ``runner/ollamarunner`` NewSequence, ``server/sched.go``), checked against its source:

- ``num_ctx`` is ``options.num_ctx`` (else ``default_num_ctx``, 2048) capped at the model's context
  length. A changed ``num_ctx`` for a loaded model counts in ``reloads``, since Ollama reloads.
- A prompt larger than ``num_ctx`` is silently cut (chatPrompt): whole old messages are dropped,
  oldest first, system messages and the last message always kept, a tool result never orphaned
  from the call before it. When what is left still does not fit, the runner cuts *inside* it
  (``truncate`` defaults to true: it keeps the first tokens and the end), so ``prompt_eval_count``
  is ``num_ctx``. ``cuts`` counts both. With ``refuse_overlong`` the fake answers instead with the
  nested HTTP 400 (``exceed_context_size_error``) that llama-server based builds send; ``overflows``
  counts it. A request with ``truncate: false`` (``api/types.go`` ChatRequest; chatPrompt then
  keeps every message and llama-server refuses what is over ``num_ctx``) gets that 400 without any
  cut; ``ignores_truncate`` makes the fake a server that cuts regardless (``predate_truncate()``
  also says an older version, 0.12.5, as such a server would; roost reads the version). With
  ``go_runner`` it is an Ollama from before #16031 (its Go runners, ``runner/ollamarunner``
  NewSequence): the refusal is a plain 400 ``the input length exceeds the context length``, no
  sizes in it. ``shift`` is
  taken and not acted on (no reply here runs past the window).
- Thinking: a model with the ``thinking`` capability thinks when ``think`` is unset (Ollama sets
  it to true), producing ``Reply.thinking`` or else ``FakeModel.default_thinking``; ``think: true``
  for a model without the capability is a 400 ``"<model>" does not support thinking``.
- ``num_predict`` counts thinking and content tokens together: a reply that runs out stops with
  ``done_reason: "length"``, its content cut (empty when the thinking used it all up).
- ``tools`` for a model without the ``tools`` capability is a 400 ``<model> does not support
  tools``.
- The prompt cache: a model keeps the messages (and tools) of its last prompt, after any cut;
  the next prompt's leading messages equal to those are cached (at least its last message is
  evaluated), and a reload empties it. With ``report_cached`` the final object says how many of
  ``prompt_eval_count`` were cached in ``prompt_eval_cached_count``, as Ollama does after
  ollama/ollama#17943; with ``uncached_only``, ``prompt_eval_count`` counts only the part that
  was not cached, as Ollama 0.30.x did before ollama/ollama#16428 (set ``version`` to a 0.30
  release too: ``/api/version`` is how roost tells).
- While ``busy`` (Ollama's queue is full, ``OLLAMA_MAX_QUEUE``), chats get a 503 ``server busy,
  please try again.  maximum pending requests exceeded``.

Kinds of model (``FakeModel`` fields, for ``roost models``; the defaults answer as before), checked
against Ollama 0.12.6 and its main branch (``api/types.go`` Message, ToolCall, Metrics,
ProcessModelResponse; ``server/routes.go`` ChatHandler; ``server/images.go`` Capabilities):

- ``tool_style``: with ``tools`` in the request and a last user message that asks for a tool,
  "native" answers with ``message.tool_calls`` (``{"function": {"index", "name", "arguments"}}``,
  as ChatHandler's tool parser sets ``res.Message.ToolCalls`` and clears the content), arguments
  filled from the first tool's required properties; "text" writes the same call as JSON in the
  content (``{"name", "arguments"}``: what reaches the client when Ollama's parser does not
  recognise the model's call); "never" and None answer as ``default_reply``.
- ``thinking_style``: "separate" is the thinking above (``message.thinking``); "inline" puts what
  the model thinks between ``<think>`` tags in the content, whatever ``think`` says (Ollama
  separates thinking only for a template whose tags it knows: such a model has no ``thinking``
  capability); "empty-with-tools" thinks and answers no content (``done_reason`` stop) when tools
  are offered. Two more reason only when the last user message asks for a sum ("What is 17 +
  25?"), and then answer it: "plain" works it out in words in the content before the number,
  no tags (as models without a reasoning template do when a question invites it), and
  "inline-when-asked" writes the same between ``<think>`` tags (in the content, never in
  ``message.thinking``, whatever ``think`` says); to anything else both answer as
  ``default_reply``.
- ``load_duration``: seconds the final object's ``load_duration`` says (nanoseconds on the wire,
  only in the final object, as ChatHandler sets it when ``r.Done``) for a request that loaded
  the model; one already loaded at that ``num_ctx`` says 1 ms.
- ``vision_reply``: the answer to a request whose messages carry ``images`` (give the model the
  ``vision`` capability too, as /api/show would).
- ``/api/ps`` says ``size`` and ``size_vram`` (ProcessModelResponse) for each loaded model.

Failures: ``refuse_connections`` (nothing listens), ``hang`` (requests accepted, none answered),
``busy`` (503 on chats), ``gateway_status`` (a proxy whose upstream is down answers every route),
and per ``Reply``: a status before streaming, or after some streamed pieces a dropped connection
(``drop_after_chunks``), an in-stream ``{"error": ...}`` line (``error_after_chunks``, as
``streamResponse`` in ``server/routes.go`` writes once the 200 is out), silence
(``stall_after_chunks``) or a pause that ``resume_paused()`` ends (``pause_after_chunks``: a
server stopped with SIGSTOP mid-answer and continued). ``Reply.tokens_per_second`` paces the
content a token at a time, as a GPU writes it; a client that closes the stream early (roost's
/stop) ends it there, as it ends generation in Ollama, and is counted in ``cancelled``
(``streaming`` is how many answers are being streamed now).

Order inside ``/api/chat``: record, 503 while ``busy``, wait while ``hang``, 404 for an unknown
model, 400 for tools or thinking the model lacks, load the model (``/api/ps``, ``reloads``), cut
or refuse the prompt, then take the next scripted reply (so a
404 or a 400 overflow does not use one up), sleep ``delay``, answer a scripted status, stream.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import math
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from typing import Any

from aiohttp import web

from tests.fakes.flood import Flood

VERSION = "0.12.6"


@dataclass
class FakeModel:
    """A model the fake has "pulled"."""

    name: str = "qwen3:4b"
    context_length: int = 32768
    # What /api/show says of the real qwen3:4b: it thinks by default unless told not to.
    capabilities: tuple[str, ...] = ("completion", "tools", "thinking")
    family: str = ""  # empty: derived from the name ("qwen3:4b" -> "qwen3")
    # `<arch>.vocab_size` in /api/show (SmolLM2's GGUF says 49152, Llama 3's 128256); None
    # leaves it out, as GGUFs converted without it do.
    vocab_size: int | None = None
    # What a thinking model thinks when the script gives no thinking (600 bytes: 200 tokens).
    default_thinking: str = "Let me think about what the user needs here. " * 13 + "Right, ok."
    # How it answers when nothing is scripted (module docstring, "Kinds of model"); the
    # defaults are the fake's behaviour from before these fields.
    tool_style: str | None = None  # "native", "text" or "never"; None: the default reply
    # or "inline", "empty-with-tools", "plain", "inline-when-asked"
    thinking_style: str = "separate"
    load_duration: float = 0.001  # seconds a cold load reports in `load_duration`
    vision_reply: str | None = None  # the answer to a request carrying `images`

    @property
    def arch(self) -> str:
        return self.family or self.name.split(":")[0].rsplit("/", 1)[-1]


@dataclass
class Reply:
    """One scripted answer to /api/chat."""

    content: str = ""
    tool_calls: list[dict[str, Any]] | None = None  # [{"function": {"name", "arguments"}}]
    thinking: str | None = None
    chunks: int = 4  # content is streamed in this many pieces
    delay: float = 0.0  # seconds before the first byte
    chunk_delay: float = 0.0  # seconds between streamed objects
    done_reason: str = "stop"  # or "length"
    status: int = 200  # non-200: answer {"error": error} with this status, before streaming
    error: str | None = None
    drop_after_chunks: int | None = None  # close the connection after this many streamed pieces
    # After this many streamed pieces, end the 200 stream with {"error": error} instead of the
    # final object, as Ollama's streamResponse does when the runner fails mid-answer.
    error_after_chunks: int | None = None
    stall_after_chunks: int | None = None  # after this many pieces, send nothing more (a hang)
    # After this many pieces, send nothing until `FakeOllama.resume_paused()`, then go on where
    # it stopped: a server stopped mid-answer (SIGSTOP) and continued (SIGCONT), the connection
    # open all the while.
    pause_after_chunks: int | None = None
    # Pace the content like a GPU: one token (3 bytes, the fake's tokenizer) per piece, this
    # many pieces a second (`chunks` and `chunk_delay` are then ignored).
    tokens_per_second: float | None = None


@dataclass(frozen=True)
class Recorded:
    """One request as the fake received it; ``time`` is ``time.monotonic()``."""

    method: str
    path: str
    body: dict[str, Any] | None
    time: float


def echo_reply(body: dict[str, Any]) -> Reply:
    """The default answer: "echo: " plus the first line (at most 200 characters) of the last
    user message; roost appends its clock to that message after a blank line, so the first line
    is what the user typed."""
    users = [m for m in body.get("messages") or [] if m.get("role") == "user"]
    last = str(users[-1].get("content") or "") if users else ""
    first_line = last.split("\n", 1)[0]
    return Reply(content="echo: " + first_line[:200])


def _compact(data: object, sort_keys: bool = False) -> str:
    return json.dumps(data, separators=(",", ":"), sort_keys=sort_keys, ensure_ascii=False)


def _tokens(text: str, tokenizer: Callable[[str], int] | None = None) -> int:
    return tokenizer(text) if tokenizer else math.ceil(len(text.encode("utf-8")) / 3)


def _message_tokens(message: dict[str, Any], tokenizer: Callable[[str], int] | None = None) -> int:
    n = 4 + _tokens(str(message.get("content") or ""), tokenizer)
    n += 768 * len(message.get("images") or [])
    if message.get("tool_calls"):
        n += _tokens(_compact(message["tool_calls"]), tokenizer)
    return n


def _tools_tokens(tools: list[Any] | None, tokenizer: Callable[[str], int] | None = None) -> int:
    return _tokens(_compact(tools, sort_keys=True), tokenizer) if tools else 0


def _now(ahead: timedelta = timedelta()) -> str:
    return (datetime.now(UTC) + ahead).isoformat().replace("+00:00", "Z")


def _json(data: object, status: int = 200) -> web.Response:
    # Compact like Go's encoding/json, so bodies match Ollama's byte for byte where it matters.
    return web.json_response(data, status=status, dumps=_compact)


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message}, status)


def _split(text: str, n: int) -> list[str]:
    n = max(1, n)
    return [p for i in range(n) if (p := text[i * len(text) // n : (i + 1) * len(text) // n])]


async def _read_json(request: web.Request) -> dict[str, Any] | None:
    raw = await request.read()
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


class FakeOllama:
    """A real aiohttp server on 127.0.0.1 that answers like Ollama; see the module docstring."""

    def __init__(
        self, models: list[FakeModel] | None = None, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.models = models if models is not None else [FakeModel()]
        self.host = host
        self.port = port
        self.requests: list[Recorded] = []
        self.default_reply: Callable[[dict[str, Any]], Reply] = echo_reply
        self.default_num_ctx = 2048
        self.cuts = 0
        self.overflows = 0
        self.busy = False  # answer every chat with 503, as Ollama does when its queue is full
        # A reverse proxy in front of Ollama whose upstream is down answers every route, /api/show
        # included, with this status (nginx: 502 Bad Gateway, or 503 while it is in maintenance).
        self.gateway_status: int | None = None
        self.refuse_overlong = False  # 400 instead of cutting inside an overlong last message
        self.ignores_truncate = False  # a server older than `truncate`: cuts even when told not to
        self.go_runner = False  # before #16031: refuses with the Go runner's words, no sizes
        self.reloads = 0
        self.loaded: dict[str, int] = {}  # model name -> num_ctx it is loaded with
        self.report_cached = False  # send prompt_eval_cached_count (Ollama after #17943)
        self.uncached_only = False  # prompt_eval_count without the cached part (0.30.x)
        # A real tokenizer's count of a text (tests/fakes/tokenizers.py) instead of bytes/3.
        self.tokenizer: Callable[[str], int] | None = None
        self.version = VERSION  # what /api/version says ("0.30.1" with uncached_only)
        self.cancelled = 0  # streams the client closed before their end
        # When each streamed answer wrote its first content: (time.monotonic(), the request).
        self.first_content: list[tuple[float, dict[str, Any]]] = []
        self.last_token: list[tuple[float, dict[str, Any]]] = []  # when a stream's end went out
        self.streaming = 0  # answers being streamed now
        self.flood: Flood | None = None  # the next chat's answer: a server gone wrong
        self.answering = 0  # /api/chat requests being answered now (waits and delays included)
        self.most_answered_at_once = 0
        self._cache: dict[str, tuple[list[dict[str, Any]], Any]] = {}  # model -> messages, tools
        self._queue: deque[Reply] = deque()
        self._released = asyncio.Event()  # set while not hanging
        self._released.set()
        self._resumed = asyncio.Event()  # set by resume_paused(): the paused answers go on
        self.paused = 0  # answers paused now (Reply.pause_after_chunks)
        self._chat_arrived = asyncio.Condition()
        self._runner: web.AppRunner | None = None

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        """Listen; with port 0 the first start picks a free port that later starts reuse."""
        app = web.Application(middlewares=[self._record])
        app.router.add_post("/api/chat", self._chat)
        app.router.add_post("/api/show", self._show)
        app.router.add_get("/api/tags", self._tags)
        app.router.add_get("/api/ps", self._ps)
        app.router.add_get("/api/version", self._version)
        # handler_cancellation: a client that gives up (timeout) ends a hung handler; a short
        # shutdown_timeout: stopping kills in-flight streams the way a dying Ollama would.
        runner = web.AppRunner(
            app, handler_cancellation=True, shutdown_timeout=0.05, access_log=None
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]

    async def stop(self) -> None:
        """Close the listener and every connection (in-flight answers are cut off)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def refuse_connections(self) -> None:
        """Stop listening, as if Ollama were down; the port is kept for accept_connections."""
        await self.stop()

    async def accept_connections(self) -> None:
        """Listen again on the same port."""
        if self._runner is None:
            await self.start()

    async def __aenter__(self) -> FakeOllama:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # -- scripting and inspection ----------------------------------------------------------

    def script(self, *replies: Reply | str) -> None:
        """Queue answers for the next /api/chat requests; a str means Reply(content=str)."""
        self._queue.extend(Reply(content=r) if isinstance(r, str) else r for r in replies)

    def predate_truncate(self) -> None:
        """An Ollama from before `truncate` (0.12.6, ollama/ollama#12582): it cuts an over-window
        prompt silently although told not to, and its version says so."""
        self.ignores_truncate = True
        self.version = "0.12.5"

    @property
    def hang(self) -> bool:
        """While True, /api/chat accepts requests and answers none of them."""
        return not self._released.is_set()

    @hang.setter
    def hang(self, value: bool) -> None:
        if value:
            self._released.clear()
        else:
            self._released.set()

    def resume_paused(self) -> None:
        """Let the answers paused now by `Reply.pause_after_chunks` go on (SIGCONT); later
        ones pause again."""
        resumed, self._resumed = self._resumed, asyncio.Event()
        resumed.set()

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        """Bodies of the /api/chat requests, in order of arrival."""
        return [r.body for r in self.requests if r.path == "/api/chat" and r.body is not None]

    # The contract names a timeout parameter: a test that waits should fail fast by default.
    async def wait_for_chats(self, n: int, timeout: float = 1.0) -> None:  # noqa: ASYNC109
        """Wait until at least n /api/chat requests have arrived (TimeoutError otherwise)."""
        async with asyncio.timeout(timeout), self._chat_arrived:
            await self._chat_arrived.wait_for(lambda: len(self.chat_requests) >= n)

    def count_tokens(self, messages: list[dict[str, Any]], tools: list[Any] | None = None) -> int:
        """The fake's "true" token count of a prompt (rule in the module docstring)."""
        return (sum(_message_tokens(m, self.tokenizer) for m in messages)
                + _tools_tokens(tools, self.tokenizer))

    def find_model(self, name: str) -> FakeModel | None:
        """The model called name; like Ollama, a missing tag means ":latest"."""
        wanted = name if ":" in name else f"{name}:latest"
        return next((m for m in self.models if m.name in (name, wanted)), None)

    # -- handlers --------------------------------------------------------------------------

    @web.middleware
    async def _record(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        body = await _read_json(request)
        self.requests.append(Recorded(request.method, request.path, body, time.monotonic()))
        if request.path == "/api/chat":
            async with self._chat_arrived:
                self._chat_arrived.notify_all()
        if self.gateway_status is not None:
            phrase = f"{self.gateway_status} {HTTPStatus(self.gateway_status).phrase}"
            return web.Response(status=self.gateway_status, content_type="text/html",
                                text=f"<html><head><title>{phrase}</title></head><body>"
                                     f"<center><h1>{phrase}</h1></center></body></html>\n")
        response: web.StreamResponse = await handler(request)
        return response

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        if self.flood is not None and not self.flood.done:
            return await self.flood.send(request)
        self.answering += 1
        self.most_answered_at_once = max(self.most_answered_at_once, self.answering)
        try:
            return await self._answer_chat(request)
        finally:
            self.answering -= 1

    async def _answer_chat(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic_ns()
        body = await _read_json(request)
        if body is None or not body.get("model"):
            return _error(400, "model is required" if body is not None else "invalid JSON body")
        if self.busy:
            return _error(503, "server busy, please try again.  maximum pending requests exceeded")
        await self._released.wait()
        name = str(body["model"])
        model = self.find_model(name)
        if model is None:
            return _error(404, f'model "{name}" not found, try pulling it first')
        if body.get("tools") and "tools" not in model.capabilities:
            return _error(400, f"registry.ollama.ai/library/{name} does not support tools")
        thinks = "thinking" in model.capabilities
        if body.get("think") is True and not thinks:
            return _error(400, f'"{name}" does not support thinking')
        options = body.get("options") or {}
        num_ctx = min(int(options.get("num_ctx") or self.default_num_ctx), model.context_length)
        messages: list[dict[str, Any]] = body.get("messages") or []
        if not messages and body.get("keep_alive") in (0, "0", "0s"):  # Ollama's unload request
            self.loaded.pop(model.name, None)
            return _json(self._final(name, "unload", 0, 0, started))
        load_ns = round(model.load_duration * 1e9) if self._load(model.name, num_ctx) \
            else 1_000_000
        if not messages:  # Ollama's load request
            return _json(self._final(name, "load", 0, 0, started, load_ns))
        truncate = body.get("truncate") is not False or self.ignores_truncate
        prompt_tokens, kept = self._fit(messages, body.get("tools"), num_ctx, truncate)
        if prompt_tokens > num_ctx:
            self.overflows += 1
            if self.go_runner:
                return _error(400, "the input length exceeds the context length")
            return _error(400, _overflow_text(prompt_tokens, num_ctx))
        cached = min(self._cached(model.name, kept, body.get("tools")), prompt_tokens - 1)
        self._cache[model.name] = (kept, body.get("tools"))
        reply = self._queue.popleft() if self._queue else self._own_reply(model, body)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.status != 200:
            return _error(reply.status, reply.error or HTTPStatus(reply.status).phrase)
        thinking = None
        if thinks and body.get("think") is not False:  # Ollama: think unset means true
            thinking = reply.thinking if reply.thinking is not None else model.default_thinking
        reply, thinking = _thinking_style(model, body, reply, thinking)
        content, done_reason = reply.content, reply.done_reason
        num_predict = options.get("num_predict")
        eval_count = _tokens(content + (thinking or ""))
        if reply.tool_calls:
            eval_count += _tokens(_compact(reply.tool_calls))
        if isinstance(num_predict, int) and num_predict >= 0 and eval_count > num_predict:
            # Thinking comes first and counts against num_predict like any other token.
            thought = _tokens(thinking or "")
            if thought >= num_predict:
                thinking = (thinking or "")[: num_predict * 3]
                content = ""
            else:
                content = content.encode()[: (num_predict - thought) * 3].decode(errors="ignore")
            reply = Reply(content=content, thinking=thinking, chunks=reply.chunks,
                          chunk_delay=reply.chunk_delay)
            eval_count, done_reason = num_predict, "length"
        final = self._final(name, done_reason,
                            prompt_tokens - cached if self.uncached_only else prompt_tokens,
                            eval_count, started, load_ns)
        if self.report_cached:
            final["prompt_eval_cached_count"] = cached
        if not body.get("stream", True):
            final["message"] = _message(content, thinking, reply.tool_calls)
            return _json(final)
        pieces = [_message("", thinking, None)] if thinking else []
        if reply.tokens_per_second:
            content_pieces = [reply.content[i:i + 3] for i in range(0, len(reply.content), 3)]
            reply = dataclasses.replace(reply, chunk_delay=1 / reply.tokens_per_second)
        else:
            content_pieces = _split(reply.content, reply.chunks)
        pieces += [_message(p, None, None) for p in content_pieces]
        if reply.tool_calls:
            pieces.append(_message("", None, reply.tool_calls))
        objects = [
            {"model": name, "created_at": _now(), "message": p, "done": False} for p in pieces
        ]
        return await self._stream(request, reply, [*objects, final], started, body)

    async def _stream(
        self, request: web.Request, reply: Reply, objects: list[dict[str, Any]], started: int,
        body: dict[str, Any],
    ) -> web.StreamResponse:
        self.streaming += 1
        try:
            return await self._stream_objects(request, reply, objects, started, body)
        except (asyncio.CancelledError, ConnectionResetError):
            self.cancelled += 1  # the client went away mid-answer: nothing more is generated
            raise
        finally:
            self.streaming -= 1

    async def _stream_objects(
        self, request: web.Request, reply: Reply, objects: list[dict[str, Any]], started: int,
        body: dict[str, Any],
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        written = False
        loop = asyncio.get_running_loop()
        begun = loop.time()
        for sent, obj in enumerate(objects):
            if sent == reply.drop_after_chunks and request.transport is not None:
                request.transport.close()  # the client sees the body end mid-stream
                return response
            if sent == reply.error_after_chunks:
                # server/routes.go streamResponse: once the status line is out, an error is one
                # more NDJSON line, {"error": "..."} (json.Encoder, so it ends in a newline),
                # and the stream ends there, with no final object.
                error = reply.error or "an error was encountered while running the model"
                await response.write(_compact({"error": error}).encode() + b"\n")
                await response.write_eof()
                return response
            if sent == reply.stall_after_chunks:
                await asyncio.Event().wait()  # until the client gives up (handler_cancellation)
            if sent == reply.pause_after_chunks:
                self.paused += 1
                try:
                    await self._resumed.wait()
                finally:
                    self.paused -= 1
            # Each piece at its time from the start, not a sleep after each: a sleep is at least
            # a millisecond, so 600 tokens a second came out at under 400.
            if sent and reply.chunk_delay and (due := begun + sent * reply.chunk_delay
                                                - loop.time()) > 0:
                await asyncio.sleep(due)
            if obj["done"]:  # the final object's clock includes the streaming
                obj |= {"created_at": _now(), "total_duration": time.monotonic_ns() - started}
            await response.write(_compact(obj).encode() + b"\n")
            if obj["done"]:
                self.last_token.append((time.monotonic(), body))
            if not written and obj.get("message", {}).get("content"):
                written = True
                self.first_content.append((time.monotonic(), body))
        await response.write_eof()
        return response

    def _load(self, name: str, num_ctx: int) -> bool:
        """Load the model at num_ctx; True when that took a load (it was not loaded so)."""
        previous = self.loaded.get(name)
        if previous is not None and previous != num_ctx:
            self.reloads += 1
            self._cache.pop(name, None)  # a reload starts with an empty KV cache
        self.loaded[name] = num_ctx
        return previous != num_ctx

    def _own_reply(self, model: FakeModel, body: dict[str, Any]) -> Reply:
        """The model's answer when nothing is scripted: a picture described, a tool called
        in the model's style when the last user message asks for a tool, else
        `default_reply`."""
        messages = body.get("messages") or []
        if model.vision_reply is not None and any(m.get("images") for m in messages):
            return Reply(content=model.vision_reply)
        summed = _sum_asked(body)
        if summed is not None and model.thinking_style in REASONS_WHEN_ASKED:
            return Reply(content=str(sum(summed)))
        tools = body.get("tools")
        users = [m for m in messages if m.get("role") == "user"]
        asked = bool(users) and "tool" in str(users[-1].get("content") or "").lower()
        if tools and asked and model.tool_style in ("native", "text"):
            call = _call_of(tools[0])
            if model.tool_style == "native":
                return Reply(tool_calls=[call])
            return Reply(content=_compact({"name": call["function"]["name"],
                                           "arguments": call["function"]["arguments"]}))
        return self.default_reply(body)

    def _cached(self, name: str, messages: list[dict[str, Any]], tools: list[Any] | None) -> int:
        """Tokens of the prompt's leading messages that the model's last prompt had too."""
        previous, previous_tools = self._cache.get(name, ([], None))
        if previous_tools != tools:
            return 0
        cached = 0
        for old, new in zip(previous, messages[:-1], strict=False):
            if old != new:
                break
            cached += _message_tokens(new, self.tokenizer)
        return cached + _tools_tokens(tools, self.tokenizer) if cached else 0

    def _fit(self, messages: list[dict[str, Any]], tools: list[Any] | None,
             num_ctx: int, truncate: bool = True) -> tuple[int, list[dict[str, Any]]]:
        """Tokens of the prompt Ollama would evaluate after cutting (> num_ctx: overflow), and
        the messages it kept."""
        total = self.count_tokens(messages, tools)
        if total <= num_ctx or not truncate:
            return total, messages
        last = len(messages) - 1
        dropped: set[int] = set()
        for i, message in enumerate(messages[:-1]):
            if message.get("role") == "system":
                continue
            total -= _message_tokens(message, self.tokenizer)
            dropped.add(i)
            # chatPrompt never starts on a tool result: its call goes with it.
            starts_on_tool = messages[i + 1].get("role") == "tool" and i + 1 < last
            if total <= num_ctx and not starts_on_tool:
                self.cuts += 1
                return total, [m for j, m in enumerate(messages) if j not in dropped]
        kept = [m for j, m in enumerate(messages) if j not in dropped]
        if self.refuse_overlong:
            return total, kept
        self.cuts += 1  # the runner keeps the start and the end of what is left
        return num_ctx, kept

    @staticmethod
    def _final(
        name: str, done_reason: str, prompt_tokens: int, eval_count: int, started: int,
        load_ns: int = 1_000_000,
    ) -> dict[str, Any]:
        return {
            "model": name,
            "created_at": _now(),
            "message": {"role": "assistant", "content": ""},
            "done": True,
            "done_reason": done_reason,
            "total_duration": time.monotonic_ns() - started,
            "load_duration": load_ns,
            "prompt_eval_count": prompt_tokens,
            "prompt_eval_duration": 20_000 * prompt_tokens,
            "eval_count": eval_count,
            "eval_duration": 10_000_000 * eval_count,
        }

    async def _show(self, request: web.Request) -> web.Response:
        body = await _read_json(request) or {}
        name = str(body.get("model") or body.get("name") or "")
        model = self.find_model(name)
        if model is None:
            return _error(404, f"model '{name}' not found")
        arch = model.arch
        return _json(
            {
                "modelfile": f"# Modelfile generated by the roost test fake\nFROM {model.name}\n",
                "parameters": 'stop                           "<|im_end|>"',
                "template": "{{ .Prompt }}",
                "details": _details(model),
                "model_info": {
                    "general.architecture": arch,
                    "general.parameter_count": 4_000_000_000,
                    f"{arch}.context_length": model.context_length,
                    f"{arch}.embedding_length": 2560,
                    # Ollama empties the arrays longer than 5 unless asked to be verbose
                    # (server/routes.go getModelData): the vocabulary itself never comes.
                    "tokenizer.ggml.tokens": [],
                    **({f"{arch}.vocab_size": model.vocab_size} if model.vocab_size else {}),
                },
                "capabilities": list(model.capabilities),
                "modified_at": _now(),
            }
        )

    async def _tags(self, request: web.Request) -> web.Response:
        return _json({"models": [_summary(m) for m in self.models]})

    async def _ps(self, request: web.Request) -> web.Response:
        expires = _now(timedelta(minutes=5))
        running = []
        for model in self.models:
            if model.name in self.loaded:
                entry = _summary(model)
                del entry["modified_at"]
                entry |= {
                    "expires_at": expires,
                    "size_vram": entry["size"],
                    "context_length": self.loaded[model.name],
                }
                running.append(entry)
        return _json({"models": running})

    async def _version(self, request: web.Request) -> web.Response:
        return _json({"version": self.version})


def _message(
    content: str, thinking: str | None, tool_calls: list[dict[str, Any]] | None
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if thinking:
        message["thinking"] = thinking
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def _call_of(tool: dict[str, Any]) -> dict[str, Any]:
    """A call of `tool` as Ollama's ToolCall (api/types.go): its required properties filled
    with a value of their type (an enum's first)."""
    function = tool.get("function") or {}
    schema = function.get("parameters") or {}
    properties = schema.get("properties") or {}
    samples = {"integer": 1, "number": 1.0, "boolean": True, "array": [], "object": {}}
    arguments = {}
    for key in schema.get("required") or []:
        spec = properties.get(key) or {}
        enum = spec.get("enum")
        arguments[key] = enum[0] if enum else samples.get(spec.get("type"), "Europe/Berlin")
    return {"function": {"index": 0, "name": function.get("name", ""), "arguments": arguments}}


REASONS_WHEN_ASKED = ("plain", "inline-when-asked")


def _sum_asked(body: dict[str, Any]) -> tuple[int, int] | None:
    """The two numbers of a sum the last user message asks for ("What is 17 + 25?")."""
    users = [m for m in body.get("messages") or [] if m.get("role") == "user"]
    # Bounded digits: an unbounded (\d+) backtracks quadratically over a long run of digits
    # (a pasted 20,000-digit number took 15 s).
    asked = re.search(r"(?<!\d)(\d{1,9})\s*\+\s*(\d{1,9})", str(users[-1].get("content") or "")) \
        if users else None
    return (int(asked[1]), int(asked[2])) if asked else None


def _thinking_style(model: FakeModel, body: dict[str, Any], reply: Reply,
                    thinking: str | None) -> tuple[Reply, str | None]:
    """The reply and its separate thinking as the model's thinking style makes them:
    "inline" writes what it thinks into the content between <think> tags (whatever `think`
    says: Ollama cannot tell it from the answer), "empty-with-tools" thinks and then answers
    nothing when tools are offered, "plain" and "inline-when-asked" work out a sum asked for
    before the answer, in words or between <think> tags."""
    if model.thinking_style == "inline":
        thought = thinking or (reply.thinking if reply.thinking is not None
                               else model.default_thinking)
        return dataclasses.replace(reply, content=f"<think>{thought}</think>\n\n"
                                   + reply.content), None
    summed = _sum_asked(body) if model.thinking_style in REASONS_WHEN_ASKED else None
    if summed is not None:
        first, second = summed
        working = (f"Okay, let me work this out. {first} plus {second}. First add the tens, "
                   f"then the ones. So the answer is {first + second}.")
        if model.thinking_style == "inline-when-asked":
            working = f"<think>{working}</think>"
        return dataclasses.replace(reply, content=f"{working}\n\n{reply.content}"), None
    if model.thinking_style == "empty-with-tools" and thinking and body.get("tools"):
        return dataclasses.replace(reply, content="", tool_calls=None, done_reason="stop"), \
            thinking
    return reply, thinking


def _overflow_text(n_prompt: int, n_ctx: int) -> str:
    """Ollama's 400 body for a prompt that cannot be cut to fit: a JSON string inside "error"."""
    message = (
        f"request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens),"
        " try increasing it"
    )
    inner = {
        "code": 400,
        "message": message,
        "type": "exceed_context_size_error",
        "n_prompt_tokens": n_prompt,
        "n_ctx": n_ctx,
    }
    return _compact({"error": inner})


def _details(model: FakeModel) -> dict[str, Any]:
    tag = model.name.partition(":")[2]
    return {
        "parent_model": "",
        "format": "gguf",
        "family": model.arch,
        "families": [model.arch],
        "parameter_size": tag.upper() if tag[:1].isdigit() else "",
        "quantization_level": "Q4_K_M",
    }


def _summary(model: FakeModel) -> dict[str, Any]:
    return {
        "name": model.name,
        "model": model.name,
        "modified_at": _now(),
        "size": 2_600_000_000,
        "digest": hashlib.sha256(model.name.encode()).hexdigest(),
        "details": _details(model),
    }
