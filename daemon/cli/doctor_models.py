"""`roost doctor`'s checks of the model server: Ollama reachable, its version, the model pulled,
its capabilities and what roost does about each, the loaded runner's num_ctx, and the card of
each configured model with what roost does about it (daemon/models)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from http import HTTPStatus

import httpx
import ollama

from daemon.core.checks import Check
from daemon.core.config import Settings
from daemon.core.errors import LLMError, ModelNotFound
from daemon.core.redact import redact_url
from daemon.llm.client import OLLAMA_ERRORS, ModelClient
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
    host = redact_url(model.host)
    llm = ModelClient(model)
    try:
        try:
            pulled = await llm.pulled_models()
        except LLMError as exc:
            return [_ollama_refused(host, exc)]
        checks = [Check("ollama", True, f"reachable at {host}")]
        try:
            info = await llm.model_info()
            num_ctx = await llm.num_ctx()
        except ModelNotFound:
            listed = ", ".join(sorted(pulled)) or "none"
            checks.append(Check("model", False, f"{model.name} is not pulled on {host}; "
                                f"pulled there: {listed}",
                                f"ollama pull {model.name}, or set model.name to a pulled one"))
            return checks
        except LLMError as exc:
            checks.append(Check("model", False, redact_url(str(exc)), "check `ollama list`"))
            return checks
        length = info.context_length
        capped = f", capped from model.window {model.window}" if num_ctx < model.window else ""
        checks.append(Check("model", True, f"{model.name}: context length {length or 'unknown'}, "
                            f"roost asks for num_ctx {num_ctx}{capped}"))
        for capability, (have, lack, needed) in CAPABILITIES.items():
            present = capability in info.capabilities
            checks.append(Check(f"model {capability}", present or not needed,
                                f"{'yes' if present else 'no'}: {have if present else lack}",
                                "" if present or not needed else
                                "pick a model with tool support (`ollama show MODEL` lists "
                                "its capabilities), e.g. qwen3"))
        checks.append(await _runner_check(model.host, model.name, num_ctx))
        return checks
    finally:
        await llm.close()


def _ollama_refused(host: str, exc: LLMError) -> Check:
    cause = exc.__cause__
    status = cause.status_code if isinstance(cause, ollama.ResponseError) else None
    if status is None:
        return Check("ollama", False, f"not reachable at {host}: {redact_url(str(exc))}",
                     "start it with `ollama serve`, or set model.host in the config")
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
    now (a card speaks only for the version it was probed on), and what roost does about it."""
    wire = ProbeWire(settings.model.host, VERSION_TIMEOUT)
    try:
        version = await wire.version()
    except LLMError:
        return []  # the ollama check above already says why it cannot be asked
    finally:
        await wire.close()
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


