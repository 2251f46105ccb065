"""The Ollama client as roost uses it: one num_ctx per model, a gate, streaming, clear errors.

`num_ctx` is the configured window capped at the model's `context_length` from `/api/show`,
looked up once per model and host and then sent on every request: a different value makes
Ollama reload the model, which costs seconds and throws away its prompt cache.

Every call goes to one host of the pool (daemon/llm/pool.py; `[model] host` alone is a pool of
one, and then everything below is as it always was). Which one is the route's: the callers set
it around their work with `routing(route, fold, hint)` (a context variable, so the turn's path
needs no argument for it): the turn and the fold of a conversation (its id), an automation's
run (`automation:NAME`). Without a route a call goes to the best host up. `chat`, `model_info`,
`num_ctx`, `pulled_models` and the version questions (`counts_whole_prompt`, `cuts_silently`,
`known_version`) all answer for the routed host; each `ChatResult` says which host answered
(`host`). A lookup (`/api/show`) that a host fails is asked of the next host at once; a chat
that fails is the caller's to move (`fail_over`, daemon/turn/model_call.py), since what it
streamed has to be taken back first.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from daemon.core.config import ModelSettings
from daemon.core.errors import LLMError, ModelNotFound, ModelNowhere, Preempted
from daemon.core.logs import llm_log as log
from daemon.llm.chat_call import ANSWER_CAP as ANSWER_CAP
from daemon.llm.chat_call import (
    Callbacks,
    ChatRequest,
    ChatResult,
    ChatStreams,
    keep_alive,
    ollama_client,
    translate,
)
from daemon.llm.gate import ModelGate
from daemon.llm.habits import HabitsOf, no_habits
from daemon.llm.pool import OLLAMA_ERRORS as OLLAMA_ERRORS
from daemon.llm.pool import Host, HostPool
from daemon.llm.pool import version_numbers as _version_numbers  # noqa: F401 (models.probe)
from daemon.llm.routing import OUTAGES, Routing

TRUNCATE_SINCE = (0, 12, 6)  # the first Ollama that takes `truncate` (ollama/ollama#12582)


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


class ModelObserver(Protocol):
    """Told about each finished model call and turn (daemon.app.metrics counts them)."""

    def model_call(self, messages: Sequence[Mapping[str, Any]], result: ChatResult,
                   background: bool, seconds: float | None = None) -> None: ...

    def model_failed(self, host: str, seconds: float | None = None) -> None: ...

    def turn_done(self, seconds: float) -> None: ...


class ModelClient:
    """One `ollama.AsyncClient` per host of the pool (`pool`, daemon/llm/pool.py), the route
    of each call (`routes`, daemon/llm/routing.py), and the model gate.

    The gate lets `model.concurrency` calls per host go at once: each host has its own request
    slots, so a pool of two serves two chats at once with `concurrency = 1`. (With a host down
    the others get its share: Ollama queues what it cannot run yet, and a turn waits there as it
    would here.)"""

    def __init__(self, settings: ModelSettings, observer: ModelObserver | None = None) -> None:
        """`observer` hears of each call and each turn's hold (the daemon's /metrics)."""
        self.settings = settings
        self.observer = observer
        self.pool = HostPool(settings.pool, functools.partial(ollama_client, settings.timeout),
                             slots=settings.concurrency)
        self.routes = Routing(self.pool)
        self.host = self.pool.hosts[0].name  # for messages: never the URL's credentials
        self.gate = ModelGate(settings.concurrency * len(self.pool.hosts))
        self._info: dict[tuple[str, str], ModelInfo] = {}  # (host URL, model) -> /api/show
        self._streams = ChatStreams()
        # What the model's card says to do (daemon.models sets it once the cards are read).
        self.habits_of: HabitsOf = no_habits

    def start(self) -> None:
        """Begin the pool's health check (several hosts only); the first call begins it too."""
        self.pool.start()

    async def close(self) -> None:
        await self.pool.close()

    # ---- routing: the pool's answers as names (daemon/llm/routing.py) ----------------------

    def routing(self, route: str, fold: int = 0,
                hint: str | None = None) -> contextlib.AbstractContextManager[None]:
        """Inside, every call goes to `route`'s host: a conversation's id around its turn and
        its folds, `automation:NAME` around an automation's run. `fold` is the conversation's
        fold count (a route a failure moved goes home only once it changed); `hint` the host
        that served it last (a reply's meta `host`), taken back by a route without a pin."""
        return self.routes.routing(route, fold, hint)

    @property
    def route(self) -> str | None:
        """The key of the route being served now, or None."""
        route = self.routes.route
        return route.key if route is not None else None

    def host_of(self, route: str | None = None) -> str | None:
        """The host `route` is pinned to (by default the route being served now), its URL with
        credentials hidden; None when it has none yet."""
        host = self.routes.host_of(route)
        return host.name if host is not None else None

    def fail_over(self, model: str | None, error: LLMError) -> str | None:
        """After `error` from a host (an outage: refused, 5xx, silence): that host is marked
        down and the route being served is pinned to the next host up that may serve `model`.
        Its name, or None when no other is left (a pool of one: always)."""
        to = self.routes.fail_over(model or self.settings.name, error)
        return to.name if to is not None else None

    # ---- what the routed host has and is ----------------------------------------------------

    async def pulled_models(self) -> list[str]:
        """Names of the models on the routed host (`/api/tags`); without a route and with
        several hosts, those of every host that answers (what `/model` may switch to, and
        whether the chat model is anywhere). Raises LLMUnavailable when none answers."""
        if self.route is not None or not self.pool.several:
            return await self._pulled(self.routes.asked())
        names: dict[str, None] = {}
        failed: LLMError | None = None
        for host in self.pool.hosts:
            try:
                names.update(dict.fromkeys(await self._pulled(host)))
            except LLMError as exc:
                failed = exc
        if not names and failed is not None:
            raise failed
        return list(names)

    async def _pulled(self, host: Host) -> list[str]:
        try:
            listed = await host.client.list()
        except OLLAMA_ERRORS as exc:
            raise self.routes.failed(host, translate(exc, self.settings.name)) from exc
        names = [m.model for m in listed.models if m.model]
        self.pool.listed(host, names)
        return names

    async def model_info(self, model: str | None = None) -> ModelInfo:
        """`/api/show` for the model at the routed host, cached for the life of the process.
        A host that fails it (or lacks the model, of several) is passed over at once."""
        name = model or self.settings.name
        for _ in range(len(self.pool.hosts) + 1):
            host = await self.routes.host(name)
            cached = self._info.get((host.url, name))
            if cached is not None:
                return cached
            try:
                shown = await host.client.show(name)
            except OLLAMA_ERRORS as exc:
                error = self.routes.failed(host, translate(exc, name))
                if not self._passed_over(host, name, error):
                    raise error from exc
                continue
            info = ModelInfo(
                name=name,
                context_length=_architecture_value(shown.modelinfo or {}, "context_length"),
                capabilities=tuple(shown.capabilities or ()),
                vocabulary_size=_architecture_value(shown.modelinfo or {}, "vocab_size"),
            )
            self._info[(host.url, name)] = info
            log.info("model %s%s: context_length %s, capabilities %s", name,
                     f" at {host.name}" if self.pool.several else "", info.context_length,
                     ",".join(info.capabilities) or "-")
            return info
        raise ModelNowhere(name, tuple(h.name for h in self.pool.hosts))

    def _passed_over(self, host: Host, model: str, error: LLMError) -> bool:
        """Whether a lookup `host` failed goes to another host: one of several that lacks the
        model, or one that is out while another may serve it."""
        if isinstance(error, ModelNotFound) and self.pool.several:
            self.pool.lacks(host, model)
            return True
        return isinstance(error, OUTAGES) and self.routes.fail_over(model, error) is not None

    async def model_info_anew(self, model: str) -> ModelInfo:
        """`/api/show` asked again, not from the cache: a chat switches to the model (/model),
        which may have been pulled anew since it was last asked about."""
        for key in [k for k in self._info if k[1] == model]:
            del self._info[key]
        return await self.model_info(model)

    async def counts_whole_prompt(self) -> bool:
        """Whether the server's `prompt_eval_count` counts the whole prompt, cached tokens
        included. Ollama 0.30.x counted only what it evaluated anew (ollama/ollama#16414, fixed
        by #16428), so there a count far below the prompt's size is the cache at work, not a
        cut. An unknown version counts as the whole prompt, as every other release does."""
        version = await self.pool.version(self.routes.asked())
        return version is None or version[:2] != (0, 30)

    async def cuts_silently(self, model: str | None = None) -> bool:
        """Whether the server may cut a prompt although roost sends `truncate: false`: one
        older than the parameter (Ollama 0.12.6, ollama/ollama#12582), one that does not say
        its version (a proxy or another server speaking Ollama's API), or one that `model`'s
        card saw cut. A server that honours it refuses an over-window prompt instead, so its
        low counts are never cuts."""
        if self.habits_of(model or self.settings.name).cuts:
            return True
        version = await self.pool.version(self.routes.asked())
        return version is None or version < TRUNCATE_SINCE

    @property
    def known_version(self) -> str | None:
        """The routed host's version as far as roost has asked it (never asks)."""
        version = self.routes.asked().version
        return ".".join(map(str, version)) if version else None

    async def learn_version(self) -> None:
        """Ask the routed host's version, once (for the Health page; calls ask as needed)."""
        await self.pool.version(self.routes.asked())

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
        habits = self.habits_of(name)
        if not info.tools or habits.no_tools:
            tools = None
        if info.thinks:
            think = bool(self.settings.think and not background and think is not False
                         and not (tools and habits.no_thinking_with_tools))
        else:
            think = None
        request = ChatRequest(name, messages, options, tools, think,
                              keep_alive(self.settings.keep_alive), habits.inline_reasoning)
        # Made only once the call may go: a coroutine made earlier and cancelled while it
        # queued would never be awaited.
        call = functools.partial(self._observed, request, (on_delta, on_thinking), background)
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

    async def _observed(self, request: ChatRequest, on: Callbacks,
                        background: bool) -> ChatResult:
        """The call at the routed host (chosen once it may go), told to the observer
        (daemon.app.metrics) once it finished."""
        host = await self.routes.host(request.model)
        began = time.monotonic()
        with self.pool.calling(host, routed=self.routes.route is not None):
            try:
                result = await self._streams.stream(host.client, host.name, request, on)
                if request.think and not result.content.strip() and not result.tool_calls:
                    # Some models think and then say nothing (with tools offered, most often):
                    # the answer is asked for again without thinking rather than shown empty.
                    log.info("model %s thought and answered nothing; asked again without "
                             "thinking", request.model)
                    result = await self._streams.stream(host.client, host.name,
                                                        replace(request, think=False), on)
            except LLMError as exc:
                if self.observer is not None and not isinstance(exc, Preempted):
                    self.observer.model_failed(host.name, time.monotonic() - began)
                raise self.routes.failed(host, exc)  # noqa: B904 (the error itself, named)
        self.pool.served(host, request.model)
        if self.observer is not None:
            self.observer.model_call(request.messages, result, background,
                                     time.monotonic() - began)
        return result


def _architecture_value(model_info: Mapping[str, Any], key: str) -> int | None:
    """`<architecture>.<key>` from /api/show's model_info (`llama.context_length`,
    `qwen2.vocab_size`...): the GGUF's own metadata, which not every file carries."""
    arch = model_info.get("general.architecture")
    value = model_info.get(f"{arch}.{key}") if arch else None
    if value is None:
        value = next((v for k, v in model_info.items() if k.endswith(f".{key}")), None)
    return int(value) if isinstance(value, int | float) else None
