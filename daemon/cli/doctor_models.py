"""`roost doctor`'s checks of the model server: Ollama reachable, its version, the model pulled,
its capabilities and what roost does about each, the loaded runner's num_ctx, and the card of
each configured model with what roost does about it (daemon/models).

With several Ollama hosts (`[model] hosts`) each host has its line: reachable, its version,
which of the configured models it has, what it has loaded and the GPU memory that takes (its
/api/ps); a host that is down is a FAIL, and so is a chat model that no host has (naming each
host and the `ollama pull` line). The model's own checks then ask a host that has it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from http import HTTPStatus

import httpx
import ollama

from daemon.core.checks import Check
from daemon.core.config import ModelSettings, Settings
from daemon.core.errors import LLMError, ModelNotFound
from daemon.core.redact import redact_url
from daemon.llm.client import OLLAMA_ERRORS, ModelClient
from daemon.llm.pool import Host, tagged
from daemon.models.card import Card, all_cards
from daemon.models.strategy import (
    NOTHING_DIFFERENT,
    card_line,
    card_of,
    latest_card,
    what_roost_does,
)
from daemon.models.wire import ProbeWire

VERSION_TIMEOUT = 10.0  # seconds for Ollama's /api/version, which answers at once when up

# What roost does with or without each capability /api/show reports, and whether lacking it is
# a problem. roost adapts to each (a model without tools gets none), so none is.
CAPABILITIES = {
    "tools": ("roost offers the model its tools (memory_search, conversation_read, ...)",
              "roost sends this model no tools: it answers from the conversation alone, "
              "without searching its memory", False),
    "vision": ("images sent to roost are shown to the model",
               "images are not shown to the model; the sender is told so", False),
    "thinking": ("the model may think when model.think = true; roost keeps its thinking out "
                 "of the reply, and never lets a background call think",
                 "the model does not think", False),
}



async def ollama_checks(settings: Settings) -> list[Check]:
    model = settings.model
    if len(model.pool) > 1:
        return await _pool_checks(settings)
    host = redact_url(model.host)
    llm = ModelClient(model)
    try:
        try:
            pulled = await llm.pulled_models()
        except LLMError as exc:
            return [_ollama_refused(host, exc)]
        return [Check("ollama", True, f"reachable at {host}"),
                *await _model_checks(llm, model, host, pulled)]
    finally:
        await llm.close()


async def _pool_checks(settings: Settings) -> list[Check]:
    """Several hosts: a line for each, then the chat model's checks at the first host up that
    has it (by priority, then config order), its loaded runner at each that has it."""
    model = settings.model
    wanted = list(dict.fromkeys([model.name, *(a.model for a in settings.automations
                                               if a.model)]))
    ranked = any(h.priority for h in model.pool)
    clients = [ModelClient(dataclasses.replace(model, hosts=(h,))) for h in model.pool]
    try:
        found = await asyncio.gather(*(_host_check(c, wanted, ranked) for c in clients))
        checks = [check for check, _ in found]
        serving = sorted(((c, pulled) for c, (_, pulled) in zip(clients, found, strict=True)
                          if pulled is not None and c.pool.hosts[0].may_serve(model.name)),
                         key=lambda served: -served[0].pool.hosts[0].priority)
        if serving:
            llm, pulled = serving[0]
            return [*checks, *await _model_checks(llm, model, llm.pool.hosts[0].name, pulled,
                                                  [c.pool.hosts[0] for c, _ in serving])]
        if any(pulled is not None for _, pulled in found):
            checks.append(_nowhere(model.name, [(c.pool.hosts[0], pulled)
                                                for c, (_, pulled) in zip(clients, found,
                                                                          strict=True)]))
        return checks
    finally:
        for client in clients:
            await client.close()


async def _host_check(llm: ModelClient, wanted: Sequence[str],
                      ranked: bool) -> tuple[Check, list[str] | None]:
    """One host's line (`llm` is a client of it alone) and what it has pulled (None: down):
    reachable, its version and priority, which of the `wanted` models it may serve, what is
    loaded and the GPU memory that takes."""
    host = llm.pool.hosts[0]
    name = f"ollama {host.name}"
    try:
        pulled = await llm.pulled_models()
    except LLMError as exc:
        refused = _ollama_refused(host.name, exc, "start Ollama there (`ollama serve`), or take "
                                  "it out of model.hosts; meanwhile its conversations go to "
                                  "the other hosts")
        return dataclasses.replace(refused, name=name), None
    await llm.pool.check(host)  # its /api/ps and /api/version
    have = {tagged(m) for m in pulled}
    serves = [m for m in wanted if host.may_serve(m)]
    barred = [m for m in wanted if m not in serves and tagged(m) in have]  # its `models`
    lacks = [m for m in wanted if m not in serves and m not in barred]
    parts = [f"reachable, Ollama {host.version_text or 'of unknown version'}"
             + (f", priority {host.priority}" if ranked else "")]
    if serves:
        parts.append(f"has {', '.join(serves)}")
    if barred:
        parts.append(f"not serving {', '.join(barred)} (its models: "
                     f"{', '.join(sorted(host.allowed))})")
    if lacks:
        parts.append(f"lacks {', '.join(lacks)}")
    parts.append("loaded: " + (", ".join(_loaded(m, vram) for m, vram in host.loaded.items())
                               or "nothing"))
    pull = next((m for m in lacks if not host.allowed or tagged(m) in host.allowed), None)
    fix = f"to serve {pull} there too: OLLAMA_HOST={host.name} ollama pull {pull}" if pull \
        else ""
    return Check(name, True, "; ".join(parts), fix), pulled


def _loaded(model: str, vram: int | None) -> str:
    return model if vram is None else f"{model} ({vram / 1e9:.1f} GB in GPU memory)"


def _nowhere(model: str, hosts: Sequence[tuple[Host, list[str] | None]]) -> Check:
    """The chat model on no host that is up: what each has, and where to pull it."""
    said = []
    for host, pulled in hosts:
        if pulled is None:
            said.append(f"{host.name} is not reachable")
        elif tagged(model) in {tagged(m) for m in pulled}:
            said.append(f"{host.name} has it but may not serve it (its models)")
        else:
            said.append(f"{host.name} has {', '.join(sorted(pulled)) or 'no models'}")
    first = next(host for host, pulled in hosts if pulled is not None)
    return Check("model", False, f"{model} is on none of the Ollama hosts: {'; '.join(said)}",
                 f"pull it on one of them: OLLAMA_HOST={first.name} ollama pull {model}")


async def _model_checks(llm: ModelClient, model: ModelSettings, host: str,
                        pulled: Sequence[str], runners: Sequence[Host] = ()) -> list[Check]:
    """The chat model at `llm`'s one host (`host`, as named): pulled, its context length and
    capabilities, its loaded runner (at each of `runners`, of several hosts)."""
    try:
        info = await llm.model_info()
        num_ctx = await llm.num_ctx()
    except ModelNotFound:
        listed = ", ".join(sorted(pulled)) or "none"
        return [Check("model", False, f"{model.name} is not pulled on {host}; pulled there: "
                      f"{listed}", f"ollama pull {model.name}, or set model.name to a pulled one")]
    except LLMError as exc:
        return [Check("model", False, redact_url(str(exc)), "check `ollama list`")]
    length = info.context_length
    capped = f", capped from model.window {model.window}" if num_ctx < model.window else ""
    checks = [Check("model", True, f"{model.name}: context length {length or 'unknown'}, "
                    f"roost asks for num_ctx {num_ctx}{capped}")]
    for capability, (have, lack, needed) in CAPABILITIES.items():
        present = capability in info.capabilities
        checks.append(Check(f"model {capability}", present or not needed,
                            f"{'yes' if present else 'no'}: {have if present else lack}",
                            "" if present or not needed else
                            "pick a model with tool support (`ollama show MODEL` lists "
                            "its capabilities), e.g. qwen3"))
    if not runners:
        return [*checks, await _runner_check(llm.pool.hosts[0].url, model.name, num_ctx)]
    for runner in runners:
        check = await _runner_check(runner.url, model.name, num_ctx)
        checks.append(dataclasses.replace(check, detail=f"at {runner.name}: {check.detail}"))
    return checks


def _ollama_refused(host: str, exc: LLMError,
                    down_fix: str = "start it with `ollama serve`, or set model.host in the "
                                    "config") -> Check:
    cause = exc.__cause__
    status = cause.status_code if isinstance(cause, ollama.ResponseError) else None
    if status is None:
        return Check("ollama", False, f"not reachable at {host}: {redact_url(str(exc))}",
                     down_fix)
    # Something answers, so "start it" would be wrong. A body may be a proxy's HTML page:
    # the status says enough.
    try:
        phrase = f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        phrase = str(status)
    detail = f"{host} answered /api/tags with {phrase}"
    if status == 503:
        return Check("ollama", False, f"{detail}: Ollama is busy (its queue is full, "
                     "OLLAMA_MAX_QUEUE) or a proxy in front of it cannot reach it",
                     "if model.host is a proxy, start the Ollama behind it or fix the proxy's "
                     "upstream address; if it is Ollama itself, wait for its queue to drain "
                     "or raise OLLAMA_MAX_QUEUE")
    if status in (502, 504):
        return Check("ollama", False, f"{detail}: a proxy in front of Ollama cannot reach it",
                     "start the Ollama behind the proxy, or fix the proxy's upstream address")
    return Check("ollama", False, f"{detail}: {redact_url(str(exc))}",
                 "check that model.host is Ollama's address (`curl HOST/api/version`)")


async def _runner_check(host: str, name: str, num_ctx: int) -> Check:
    client = ollama.AsyncClient(host=host, timeout=httpx.Timeout(10.0))
    try:
        running = await client.ps()
    except OLLAMA_ERRORS as exc:  # the server's failure is a line; a bug in doctor is a bug
        return Check("loaded runner", False, f"/api/ps failed: {redact_url(str(exc))}",
                     "check the Ollama server's log")
    finally:
        await client.close()
    for entry in running.models:
        if entry.model in (name, f"{name}:latest") or entry.name in (name, f"{name}:latest"):
            loaded = entry.context_length
            if loaded is None or loaded == num_ctx:
                return Check("loaded runner", True, f"{name} is loaded with num_ctx {loaded}")
            return Check("loaded runner", False,
                         f"{name} is loaded with num_ctx {loaded}, roost asks for {num_ctx}: "
                         "every turn would reload it",
                         "another client (or OLLAMA_CONTEXT_LENGTH) loads it with another "
                         "num_ctx; set model.window to match, or stop that client")
    return Check("loaded runner", True, f"{name} is not loaded now (Ollama loads it on the "
                 "first message)")


async def card_checks(settings: Settings) -> list[Check]:
    """The card of the chat model and of each automation's own model, for the Ollama running
    now (a card speaks only for the version it was probed on), and what roost does about it.
    Of several hosts, the version of the first that says it."""
    version = None
    for host in settings.model.pool:
        wire = ProbeWire(host.url, VERSION_TIMEOUT)
        try:
            version = await wire.version()
            break
        except LLMError:
            continue  # the ollama check above already says why it cannot be asked
        finally:
            await wire.close()
    if version is None:
        return []
    cards = await asyncio.to_thread(all_cards, settings.daemon.state_dir)
    models = dict.fromkeys([settings.model.name,
                            *(a.model for a in settings.automations if a.model)])
    return [check for model in models for check in _card_check(model, version, cards)]


def _card_check(model: str, version: str, cards: Sequence[Card]) -> list[Check]:
    """None of them fails: without a card roost treats the model as any model, and probes it
    quietly the first time it is used."""
    card = card_of(cards, model, version)
    if card is not None:
        does = what_roost_does(card) or [NOTHING_DIFFERENT]
        return [Check("model card", True, card_line(card)),
                *(Check(f"model {model}", True, line) for line in does)]
    fix = f"`roost models --model {model}`"
    older = latest_card(cards, model)
    if older is not None:
        return [Check("model card", True, f"{model}: probed on Ollama {older.ollama_version}; "
                      f"this is {version}", f"run {fix} again")]
    return [Check("model card", True, f"{model}: none yet (roost also probes it quietly on "
                  "first use)", fix)]


