"""An Ollama-wire server in front of a real model: SmolLM2-135M-Instruct on llama.cpp's CPU build.

The model runs in one Node process (``worker.mjs``, node-llama-cpp); this module speaks Ollama's
HTTP API to roost on 127.0.0.1 (port 0) and records every request. ``ServerThread`` runs it on
its own event loop in a thread, so that one server serves tests of any event loop.

What it copies from Ollama 0.33 (checked against tag v0.33.0-rc2 of github.com/ollama/ollama):

- ``num_ctx`` is ``options.num_ctx``, else 4096, the CPU/low-VRAM default (``server/routes.go``
  Serve: ``defaultNumCtx`` below 23 GiB of VRAM), at least 4 and capped at the GGUF's
  ``<arch>.context_length`` (``server/sched.go`` getRunner, ``effectiveContext``). A changed
  ``num_ctx`` reloads the model (a new llama.cpp context; ``reloads`` counts them).
- ``think: true`` for a model without the ``thinking`` capability: 400 ``"<model>" does not support
  thinking``, checked before tools (``server/routes.go`` ChatHandler). Non-empty ``tools``
  without the ``tools`` capability: 400 ``<full name> does not support tools``, the full name as
  ``model.ParseName(...).String()`` spells it, ``registry.ollama.ai/library/smollm2:135m``
  (``server/images.go`` CheckCapabilities, ``server/routes.go`` scheduleRunner and
  handleScheduleError). An unknown model: 404 ``model "<name>" not found, try pulling it first``.
- Capabilities as ``server/images.go`` derives them for a GGUF: ``tools`` when the chat template
  contains ``tools`` or ``tool_call``, ``thinking`` when it has ``<think>`` and ``</think>``, then
  ``completion`` (no ``pooling_type``). SmolLM2's template gives ``["completion"]``.
- The prompt is the GGUF's own ``tokenizer.chat_template`` (a GGUF with no Go template runs in
  ``chatExecutionModeNative``: llama-server renders it with jinja; here jinja2 does).
- ``truncate`` true or absent: whole messages are dropped from the front until the rendered
  prompt's tokens are ``<= num_ctx``, system messages and the last message always kept
  (``server/routes.go`` truncateNativeChatMessages, the same loop as ``server/prompt.go``
  chatPrompt). What still does not fit below ``num_ctx`` is cut inside the tokens with context
  shift on (keep ``num_keep`` = 4, drop the oldest of the rest down to
  ``num_ctx - (num_ctx - num_keep) / 2``), and refused with ``shift: false`` (400 "the prompt is
  longer than the context length currently available to the model; ...") (``llm/llama_server.go``
  completionPromptForRequest, contextShiftPromptLimit).
- ``truncate: false`` and a prompt of ``num_ctx`` tokens or more: llama-server's 400, passed
  through by Ollama as the raw body inside ``error`` (``llm/llama_server.go`` Chat and
  statusErrorMessage, ``server/routes.go`` writeChatResponse/streamResponse): ``{"error":
  "{\\"error\\":{\\"code\\":400,\\"message\\":\\"request (N tokens) exceeds the available context
  size (M tokens), try increasing it\\",\\"type\\":\\"exceed_context_size_error\\",
  \\"n_prompt_tokens\\":N,\\"n_ctx\\":M}}"}``. (The plain "the input length exceeds the context
  length" is Ollama's wording for embeddings and for the Go runners before llama-server.)
- ``shift: false``: generation stops when prompt and reply fill ``num_ctx``, ``done_reason``
  ``"length"``; so does ``num_predict`` (llama-server ``stop_type`` "limit" ->
  ``DoneReasonLength``, ``llm/llama_server.go``). ``num_predict`` < 0 is 10 x ``num_ctx``
  (boundedNumPredict). ``num_predict`` and ``temperature`` default to this server's Modelfile-style
  parameters (64 and 0: greedy, so answers are stable); a request's options win.
- The KV cache: the previous prompt and reply stay; the common token prefix of the next prompt
  is reused, at least one prompt token evaluated (llama-server). The final object has
  ``prompt_eval_count`` = cached + evaluated, the whole prompt (``llamaServerTimings.
  promptEvalCount`` = ``cache_n + prompt_n``, ollama/ollama#16428, since 0.30.x) and
  ``prompt_eval_cached_count`` = ``cache_n`` (``api/types.go`` Metrics as ollama/ollama commit
  6e65d95ef, PR #16916, adds it; upstream made it a pointer, so 0 is sent, not omitted), with
  ``eval_count``, the durations (ns) and ``done_reason``; other zero counts are omitted
  (``omitempty``). ``messages`` empty: ``done_reason`` ``"load"``.
- ``/api/show``: ``model_info`` is the GGUF's key/values without ``general.name`` and
  ``tokenizer.chat_template``, arrays longer than 5 emptied unless ``verbose``
  (``server/routes.go`` GetModelInfo, getModelData); SmolLM2 has ``llama.vocab_size`` (49152),
  and ``tokenizer.ggml.tokens`` in full with ``verbose``. ``template`` is the chat template
  (selectedModelTemplate). No ``tensors`` list (not needed by roost).
- ``/api/version`` is ``0.33.0``; ``/api/tags`` and ``/api/ps`` list the one model.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2.sandbox
from aiohttp import web

HERE = Path(__file__).resolve().parent
VERSION = "0.33.0"
DEFAULT_NUM_CTX = 4096  # Ollama 0.33 below 23 GiB of VRAM (server/routes.go Serve)
NUM_KEEP = 4  # api.DefaultOptions


@dataclass
class Record:
    """One request the server got and what it answered."""

    path: str
    body: dict[str, Any]
    status: int = 200
    error: str | None = None
    num_ctx: int | None = None
    prompt: str | None = None  # the rendered prompt, after any cut of whole messages
    kept_messages: int | None = None  # messages left after the cut
    prompt_eval_count: int | None = None
    prompt_eval_cached_count: int | None = None
    eval_count: int | None = None
    done_reason: str | None = None
    content: str = ""


class Worker:
    """The Node process holding the model: JSON lines out, answers read by request id."""

    def __init__(self, model_path: Path, threads: int = 1) -> None:
        self.model_path = model_path
        self.threads = threads
        self.metadata: dict[str, Any] = {}
        self.load_ms = 0.0
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Queue[dict[str, Any]]] = {}
        self._next = 0

    async def start(self) -> None:
        env = {**os.environ, "ROOST_LLAMA_THREADS": str(self.threads)}
        self._proc = await asyncio.create_subprocess_exec(
            shutil.which("node") or "node", str(HERE / "worker.mjs"), str(self.model_path),
            cwd=HERE, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            limit=1 << 26)  # the ready line carries the 49k-token vocabulary
        assert self._proc.stdout is not None
        ready = json.loads(await self._proc.stdout.readline() or b"{}")
        if not ready.get("ready"):
            raise RuntimeError("llama worker did not start (see its stderr)")
        self.metadata = ready["metadata"]
        self.load_ms = ready["load_ms"]
        self._reader = asyncio.create_task(self._read())

    async def stop(self) -> None:
        if self._proc is None:
            return
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        try:
            await asyncio.wait_for(self._proc.wait(), 10)
        except TimeoutError:
            self._proc.kill()
            await self._proc.wait()
        if self._reader is not None:
            await self._reader

    async def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        async for line in self._proc.stdout:
            answer = json.loads(line)
            queue = self._pending.get(answer.get("id", -1))
            if queue is not None:
                queue.put_nowait(answer)

    async def _ask(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        assert self._proc is not None and self._proc.stdin is not None
        self._next += 1
        rid = self._next
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._pending[rid] = queue
        self._proc.stdin.write(json.dumps({**request, "id": rid}).encode() + b"\n")
        try:
            while True:
                answer = await queue.get()
                if "error" in answer:
                    raise RuntimeError(answer["error"])
                yield answer
                if "tokens" in answer or answer.get("done"):
                    return
        finally:
            del self._pending[rid]

    async def tokenize(self, text: str) -> list[int]:
        async for answer in self._ask({"op": "tokenize", "text": text}):
            return list(answer["tokens"])
        raise RuntimeError("no tokens")

    def generate(self, tokens: list[int], **options: Any) -> AsyncIterator[dict[str, Any]]:
        return self._ask({"op": "generate", "tokens": tokens, **options})


class OllamaWire:
    """The aiohttp app: Ollama 0.33's /api/chat, /api/show, /api/tags, /api/ps, /api/version."""

    def __init__(self, worker: Worker, *, name: str = "smollm2:135m", num_predict: int = 64,
                 temperature: float = 0.0) -> None:
        self.worker = worker
        self.name = _full(name)
        self.num_predict = num_predict
        self.temperature = temperature
        self.requests: list[Record] = []
        self.reloads = 0
        self.loaded_ctx: int | None = None
        meta = worker.metadata
        self.arch = str(meta["general.architecture"])
        self.context_length = int(meta[f"{self.arch}.context_length"])
        self.template_text = str(meta.get("tokenizer.chat_template", ""))
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self.template = env.from_string(self.template_text)
        self.capabilities = _capabilities(self.template_text, meta)
        self._lock = asyncio.Lock()  # one sequence, as Ollama's OLLAMA_NUM_PARALLEL=1

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/api/chat", self.chat)
        app.router.add_post("/api/show", self.show)
        app.router.add_get("/api/tags", self.tags)
        app.router.add_get("/api/ps", self.ps)
        app.router.add_get("/api/version", self.version)
        return app

    def render(self, messages: list[dict[str, Any]]) -> str:
        """The prompt as the GGUF's chat template renders these messages."""
        meta = self.worker.metadata
        tokens = meta.get("tokenizer.ggml.tokens")
        special = {}
        if isinstance(tokens, list):
            for key in ("bos", "eos"):
                index = meta.get(f"tokenizer.ggml.{key}_token_id")
                if isinstance(index, int) and index < len(tokens):
                    special[f"{key}_token"] = tokens[index]
        return self.template.render(messages=messages, add_generation_prompt=True, **special)

    async def count(self, text: str) -> int:
        """Tokens of a text as the server counts a prompt (special tokens parsed)."""
        return len(await self._tokens(text))

    async def _tokens(self, text: str) -> list[int]:
        tokens = await self.worker.tokenize(text)
        if self.worker.metadata.get("tokenizer.ggml.add_bos_token"):
            bos = self.worker.metadata.get("tokenizer.ggml.bos_token_id")
            if isinstance(bos, int):
                tokens.insert(0, bos)
        return tokens

    async def chat(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic_ns()
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "invalid request body")
        record = Record("/api/chat", body)
        self.requests.append(record)
        name = str(body.get("model", ""))
        if _full(name) != self.name:
            return _fail(record, 404, f'model "{name}" not found, try pulling it first')
        if body.get("think") is True and "thinking" not in self.capabilities:
            return _fail(record, 400, f'"{name}" does not support thinking')
        if body.get("tools") and "tools" not in self.capabilities:
            return _fail(record, 400, f"{self.name} does not support tools")
        options = body.get("options") or {}
        num_ctx = min(max(int(options.get("num_ctx") or DEFAULT_NUM_CTX), 4), self.context_length)
        record.num_ctx = num_ctx
        messages = list(body.get("messages") or [])
        async with self._lock:
            if self.loaded_ctx not in (None, num_ctx):
                self.reloads += 1
            self.loaded_ctx = num_ctx
            if not messages:
                record.done_reason = "load"
                return web.json_response(self._final("load", {}, started, ""))
            truncate = body.get("truncate") is not False
            shift = body.get("shift") is not False
            kept = await self._fit(messages, num_ctx) if truncate else messages
            record.kept_messages = len(kept)
            record.prompt = self.render(kept)
            tokens = await self._tokens(record.prompt)
            if len(tokens) >= num_ctx and not truncate:
                return _fail(record, 400, _overflow(len(tokens), num_ctx))
            if len(tokens) > num_ctx - 1:
                if not shift:
                    return _fail(record, 400, _PROMPT_TOO_LONG)
                tokens = _shift_cut(tokens, num_ctx, int(options.get("num_keep", NUM_KEEP)))
            pieces = self.worker.generate(
                tokens, num_ctx=num_ctx, shift=shift,
                num_predict=int(options.get("num_predict", self.num_predict)),
                temperature=float(options.get("temperature", self.temperature)),
                seed=int(options.get("seed", 0)))
            if body.get("stream") is False:
                return await self._whole(pieces, record, started)
            return await self._stream(request, pieces, record, started)

    async def _fit(self, messages: list[dict[str, Any]], num_ctx: int) -> list[dict[str, Any]]:
        """Ollama's cut: drop whole messages from the front until the prompt fits, keeping
        system messages and the last message (truncateNativeChatMessages)."""
        last = len(messages) - 1
        if last < 1:
            return messages
        for i in range(last + 1):
            system = [m for m in messages[:i] if m.get("role") == "system"]
            candidate = system + messages[i:]
            if i == last or await self.count(self.render(candidate)) <= num_ctx:
                return candidate
        return messages  # not reached: i == last returns

    async def _whole(self, pieces: AsyncIterator[dict[str, Any]], record: Record,
                     started: int) -> web.Response:
        final: dict[str, Any] = {}
        async for answer in pieces:
            if answer.get("done"):
                final = answer
            else:
                record.content += answer["piece"]
        return web.json_response(self._finish(record, final, started))

    async def _stream(self, request: web.Request, pieces: AsyncIterator[dict[str, Any]],
                      record: Record, started: int) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        async for answer in pieces:
            if answer.get("done"):
                line = self._finish(record, answer, started)
            else:
                record.content += answer["piece"]
                line = {"model": record.body["model"], "created_at": _now(),
                        "message": {"role": "assistant", "content": answer["piece"]},
                        "done": False}
            await response.write(json.dumps(line).encode() + b"\n")
        await response.write_eof()
        return response

    def _finish(self, record: Record, final: dict[str, Any], started: int) -> dict[str, Any]:
        record.prompt_eval_count = final["prompt_n"] + final["cache_n"]
        record.prompt_eval_cached_count = final["cache_n"]
        record.eval_count = final["eval_n"]
        record.done_reason = final["done_reason"]
        content = record.content if record.body.get("stream") is False else ""
        return self._final(final["done_reason"], final, started, content)

    def _final(self, reason: str, final: dict[str, Any], started: int,
               content: str) -> dict[str, Any]:
        answer: dict[str, Any] = {
            "model": self.name.rpartition("/")[2], "created_at": _now(),
            "message": {"role": "assistant", "content": content}, "done": True,
            "done_reason": reason, "total_duration": time.monotonic_ns() - started,
            "load_duration": 0,
        }
        if final:
            answer.update({
                "prompt_eval_count": final["prompt_n"] + final["cache_n"],
                "prompt_eval_cached_count": final["cache_n"],
                "prompt_eval_duration": int(final["prompt_ms"] * 1e6),
                "eval_count": final["eval_n"],
                "eval_duration": int(final["predict_ms"] * 1e6),
            })
        return {k: v for k, v in answer.items()
                if v != 0 or k == "prompt_eval_cached_count"}  # omitempty, but a *int

    async def show(self, request: web.Request) -> web.Response:
        body = await request.json()
        name = str(body.get("model") or body.get("name") or "")
        self.requests.append(Record("/api/show", body))
        if _full(name) != self.name:
            return _error(404, f"model '{name}' not found")
        verbose = bool(body.get("verbose"))
        info = {k: (v if verbose or not isinstance(v, list) or len(v) <= 5 else [])
                for k, v in self.worker.metadata.items()
                if k not in ("general.name", "tokenizer.chat_template")}
        parameters = "\n".join(f"{k:<30} {v}" for k, v in
                               (("num_predict", self.num_predict),
                                ("temperature", self.temperature)))
        return web.json_response({
            "license": str(self.worker.metadata.get("general.license", "")),
            "modelfile": f'# Modelfile generated by "ollama show"\nFROM {self.worker.model_path}\n',
            "parameters": parameters, "template": self.template_text,
            "details": self._details(), "model_info": info,
            "capabilities": self.capabilities, "modified_at": _now(),
        })

    async def tags(self, request: web.Request) -> web.Response:
        short = self.name.rpartition("/")[2]
        return web.json_response({"models": [{
            "name": short, "model": short, "modified_at": _now(),
            "size": self.worker.model_path.stat().st_size, "digest": "", "details": self._details(),
        }]})

    async def ps(self, request: web.Request) -> web.Response:
        if self.loaded_ctx is None:
            return web.json_response({"models": []})
        short = self.name.rpartition("/")[2]
        return web.json_response({"models": [{
            "name": short, "model": short, "size": self.worker.model_path.stat().st_size,
            "digest": "", "details": self._details(), "expires_at": _now(), "size_vram": 0,
            "context_length": self.loaded_ctx,
        }]})

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VERSION})

    def _details(self) -> dict[str, Any]:
        meta = self.worker.metadata
        return {"parent_model": "", "format": "gguf", "family": self.arch,
                "families": [self.arch], "parameter_size": str(meta.get("general.size_label", "")),
                "quantization_level": "Q4_1"}


@dataclass
class ServerThread:
    """The worker and the server on an event loop of their own, in a daemon thread, so that
    tests on any event loop (or none) can use them. ``start()`` returns once the model is in."""

    model_path: Path
    num_predict: int = 64
    threads: int = 1
    url: str = ""
    server: OllamaWire | None = None
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None

    @property
    def requests(self) -> list[Record]:
        assert self.server is not None
        return self.server.requests

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop.run_forever, name="real-ollama",
                                        daemon=True)
        self._thread.start()
        self._call(self._start)

    def stop(self) -> None:
        if self._thread is None:
            return
        self._call(self._stop)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self._thread = None

    def count_tokens(self, text: str) -> int:
        """Tokens of a text as the server counts a rendered prompt."""
        assert self.server is not None
        server = self.server
        return self._call(lambda: server.count(text))

    def render(self, messages: list[dict[str, Any]]) -> str:
        """The prompt these messages render to with the model's chat template."""
        assert self.server is not None
        return self.server.render(messages)

    def _call(self, make: Callable[[], Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(make(), self._loop).result(timeout=600)

    async def _start(self) -> None:
        worker = Worker(self.model_path, self.threads)
        await worker.start()
        self.server = OllamaWire(worker, num_predict=self.num_predict)
        self._runner = web.AppRunner(self.server.app())
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self.server is not None:
            await self.server.worker.stop()


_PROMPT_TOO_LONG = (
    "the prompt is longer than the context length currently available to the model; shorten the"
    " prompt, adjust the context length in settings, or use a model with a longer context length")


def _full(name: str) -> str:
    """A model name as Ollama's ParseName(...).String() spells it."""
    if "/" not in name:
        name = f"registry.ollama.ai/library/{name}"
    if ":" not in name.rpartition("/")[2]:
        name += ":latest"
    return name


def _capabilities(template: str, meta: dict[str, Any]) -> list[str]:
    """server/images.go: chatTemplateCapabilities, then completion (or embedding)."""
    caps = []
    if "tools" in template or "tool_call" in template:
        caps.append("tools")
    if "<think>" in template and "</think>" in template:
        caps.append("thinking")
    caps.append("embedding" if "pooling_type" in meta else "completion")
    return caps


def _shift_cut(tokens: list[int], num_ctx: int, num_keep: int) -> list[int]:
    """llm/llama_server.go completionPromptForRequest with context shift on."""
    keep = min(len(tokens) if num_keep < 0 else num_keep, num_ctx - 1)
    limit = num_ctx - max((num_ctx - keep) // 2, 1)
    discard = len(tokens) - limit
    return tokens[:keep] + tokens[keep + discard:]


def _overflow(n_prompt: int, n_ctx: int) -> str:
    inner = {"code": 400, "message": f"request ({n_prompt} tokens) exceeds the available context"
             f" size ({n_ctx} tokens), try increasing it", "type": "exceed_context_size_error",
             "n_prompt_tokens": n_prompt, "n_ctx": n_ctx}
    return json.dumps({"error": inner}, separators=(",", ":"))


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _fail(record: Record, status: int, message: str) -> web.Response:
    record.status, record.error = status, message
    return _error(status, message)
