"""`roost models`: probe the models of this Ollama, print their cards, keep them.

The battery itself is daemon.models.probe; this is the command around it: which models (the
named ones, else every pulled one, after asking, since loading each unloads what is loaded
now), one clear line per model that could not be probed, the table or the JSON, the store.

Which Ollama: `model.host`; of several (`[model] hosts`) the first up by priority and config
order, or the one `--host` names (a host of the pool by its URL, credentials or not, or any
other). Each host's cards are kept apart (daemon/models/card.py): the boxes' hardware differs,
and so do their timings. The command says which host it probed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import TextIO

from daemon.core.config import ModelSettings, Settings
from daemon.core.config.sections import HostSettings
from daemon.core.errors import LLMError, LLMUnavailable
from daemon.core.redact import redact_url
from daemon.llm.client import ModelClient
from daemon.models.card import Card, store_cards
from daemon.models.probe import Battery

NOT_DONE = 1  # a model could not be probed, or nothing was (refused, declined, Ollama down)
COLUMNS = (("MODEL", 20), ("CTX", 5), ("TOOLS", 6), ("THINKING", 16), ("TRUNC", 7),
           ("EST", 5), ("LOAD", 5), ("1ST", 5), ("TOK/S", 5), ("CACHE", 5), ("VIS", 3),
           ("MEM", 5))
LEGEND = ("CTX: the model's context length; EST: roost's token estimate against Ollama's "
          "count;\nLOAD (cold; warm: it was loaded already, no load to time), 1ST (first "
          "token) in seconds;\nCACHE: share of a repeated prefix from cache; MEM: what the "
          "loaded model takes (/api/ps).")


def full_name(name: str) -> str:
    """Ollama's own spelling: a name without a tag means ":latest"."""
    return name if ":" in name else f"{name}:latest"


async def run_models(settings: Settings, names: Sequence[str] = (), *, as_json: bool = False,
                     yes: bool = False, host: str | None = None, out: TextIO = sys.stdout,
                     err: TextIO = sys.stderr, stdin: TextIO = sys.stdin) -> int:
    """Probe `names` (default: every pulled model, after asking) on `host` (default: see the
    module docstring), print and store the cards."""
    several = len(settings.model.pool) > 1
    chosen = _named(settings.model, host) if host is not None else None
    if chosen is None and several:
        chosen = await _first_up(settings.model)
        if chosen is None:
            hosts = ", ".join(redact_url(h.url) for h in settings.model.pool)
            print(f"roost: cannot reach Ollama at any of the hosts ({hosts}): start one with "
                  "`ollama serve`, or name one with --host", file=err)
            return NOT_DONE
    model = settings.model if chosen is None else dataclasses.replace(settings.model,
                                                                       hosts=(chosen,))
    if chosen is not None and not as_json:
        others = (f" (of {len(settings.model.pool)} in model.hosts; --host URL probes another)"
                  if several else "")
        print(f"Ollama at {redact_url(model.host)}{others}", file=out)
    battery = Battery(model)
    try:
        return await _run(battery, dataclasses.replace(settings, model=model), names, as_json,
                          yes, (out, err, stdin))
    except LLMUnavailable as exc:
        host = redact_url(model.host)
        # The ollama client's own words for a refused connection are a paragraph; a gateway's
        # answer (502, 503) is worth showing as it is.
        why = "cannot reach Ollama" if "cannot reach Ollama" in str(exc) else str(exc)
        print(f"roost: {why} at {host}: start it with `ollama serve` or "
              "`systemctl start ollama`", file=err)
        return NOT_DONE
    finally:
        await battery.close()


def _named(model: ModelSettings, url: str) -> HostSettings:
    """The host `--host` names: one of the pool's (by its URL, or as roost shows it, without
    credentials: the pool's own carries them), else that URL."""
    wanted = url.rstrip("/")
    return next((h for h in model.pool if wanted in (h.url.rstrip("/"),
                                                       redact_url(h.url).rstrip("/"))),
                HostSettings(url))


async def _first_up(model: ModelSettings) -> HostSettings | None:
    """The host a probe goes to of several: the first up by priority and config order."""
    llm = ModelClient(model)
    try:
        await llm.pool.check_all()
        host = llm.pool.first_up()
        return model.pool[host.index] if host.up else None
    finally:
        await llm.close()


async def _run(battery: Battery, settings: Settings, names: Sequence[str], as_json: bool,
               yes: bool, streams: tuple[TextIO, TextIO, TextIO]) -> int:
    out, err, stdin = streams
    pulled = await battery.llm.pulled_models()
    chosen, status = await _choose(battery, pulled, names, yes, err, stdin)
    if not chosen:
        return status
    version = await battery.wire.version()
    cards: list[Card] = []
    for number, name in enumerate(chosen, 1):
        if err.isatty():
            print(f"probing {name} ({number} of {len(chosen)})...", file=err)
        try:
            cards.append(await battery.probe(await battery.target(name), version))
        except LLMUnavailable:
            raise
        except LLMError as exc:  # one model's failure is its line; the others go on
            print(f"{name}: {exc}", file=err)
            status = NOT_DONE
    await asyncio.to_thread(store_cards, settings.daemon.state_dir, cards)
    if as_json:
        print(json.dumps([c.to_json() for c in cards], indent=2, ensure_ascii=False), file=out)
    elif cards:
        print(table(cards), file=out)
        print(LEGEND, file=out)
    return status


async def _choose(battery: Battery, pulled: Sequence[str], names: Sequence[str], yes: bool,
                  err: TextIO, stdin: TextIO) -> tuple[list[str], int]:
    """The models to probe, and the exit status so far; no models: nothing to do, say why."""
    if names:
        have = {full_name(p) for p in pulled}
        missing = [n for n in names if full_name(n) not in have]
        for name in missing:
            print(f"roost: {name} is not pulled; roost models never pulls: run "
                  f"`ollama pull {name}` first", file=err)
        return [n for n in dict.fromkeys(names) if n not in missing], NOT_DONE if missing else 0
    if not pulled:
        print("roost: Ollama has no models pulled; pull one first, e.g. "
              "`ollama pull qwen3:4b`", file=err)
        return [], NOT_DONE
    if yes:
        return list(pulled), 0
    loaded = [str(m.get("name") or m.get("model")) for m in await battery.wire.running()]
    now = f"what is loaded now ({', '.join(loaded)})" if loaded else "any model loaded later"
    warning = (f"roost models loads each of the {len(pulled)} pulled models in turn, which "
               f"unloads {now}.")
    if not stdin.isatty():
        print(f"roost: {warning} Pass --yes to go on, or name models with --model.", file=err)
        return [], NOT_DONE
    print(f"{warning} Go on? [y/N] ", end="", file=err, flush=True)
    answer = await asyncio.to_thread(stdin.readline)
    if answer.strip().lower() not in ("y", "yes"):
        print("nothing probed", file=err)
        return [], NOT_DONE
    return list(pulled), 0


def table(cards: Sequence[Card]) -> str:
    """One row per card, under 100 columns."""
    rows = [[title for title, _ in COLUMNS], *(_row(c) for c in cards)]
    return "\n".join(" ".join(cell[:width].ljust(width) for cell, (_, width)
                              in zip(row, COLUMNS, strict=True)).rstrip() for row in rows)


def _row(card: Card) -> list[str]:
    return [card.name, _thousands(card.context), card.tools, card.thinking, card.truncate,
            _signed(card.estimate_error), "warm" if card.already_loaded else _number(card.load_s),
            _number(card.first_token_s), _number(card.tokens_per_s, 0), _share(card.cached_share),
            {True: "yes", False: "no", None: "-"}[card.vision], _bytes(card.memory)]


def _thousands(tokens: int | None) -> str:
    if tokens is None:
        return "?"
    return f"{tokens // 1024}K" if tokens >= 1024 and tokens % 1024 == 0 else str(tokens)


def _signed(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:+.0%}"


def _share(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.0%}"


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _bytes(size: int | None) -> str:
    if size is None:
        return "-"
    for unit, scale in (("G", 1e9), ("M", 1e6)):
        if size >= scale:
            return f"{size / scale:.1f}{unit}"
    return f"{size / 1e3:.0f}K"
