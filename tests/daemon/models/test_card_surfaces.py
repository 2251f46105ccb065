"""Where a user reads a model's card: `roost doctor`, `/status` and the console's Health page,
each with what roost does for the model; a card speaks only for the Ollama version it was
probed on, and a model without one is said to have none, with how to make it."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from markupsafe import escape

from daemon.app.console_health import Running, card_row, health_view
from daemon.app.health import Health
from daemon.console.web import Console
from daemon.core.config import Settings
from daemon.engine.chat_commands import Commands
from daemon.llm.client import ModelClient
from daemon.models.card import Card, store_cards
from daemon.models.strategy import card_line, card_of, what_roost_does
from daemon.store import Store
from daemon.store.console_keys import OWNER
from tests.conftest import SettingsFactory, standard_parts
from tests.daemon.app.test_app import start
from tests.daemon.cli.test_doctor import doctor, failed
from tests.daemon.console.test_console_automations import browser_for
from tests.fakes.ollama import VERSION, FakeOllama

HOSTILE = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'
CHAT = "console:local"


def card(name: str = "qwen3:4b", version: str = VERSION, **changes: object) -> Card:
    """A card as `roost models` keeps it: a model that writes its tool calls as text, reasons
    inline, whose server cut an over-window prompt, and that roost's estimate counts 12% high."""
    made = Card(name=name, ollama_version=version, probed_at="2025-06-01T08:00:00Z",
                context=32768, num_ctx=8192, tools="text", thinking="inline", truncate="cuts",
                estimate_error=0.12, load_s=3.2, first_token_s=0.41, tokens_per_s=38.4,
                cached_share=0.97, vision=None, memory=5_200_000_000,
                memory_vram=5_200_000_000)
    return dataclasses.replace(made, **changes)  # type: ignore[arg-type]


# ---- the words --------------------------------------------------------------------------


def test_the_card_in_one_line_and_what_roost_does_in_plain_words() -> None:
    assert card_line(card()) == ("qwen3:4b: tools text, thinking inline, over-window prompts "
                                 "cut, estimate +12.0%, 38.4 tokens/s — probed 2025-06-01")
    does = what_roost_does(card())
    assert [line.split(":")[0] for line in does] == [
        "writes its tool calls as JSON text", "reasons inside its answer",
        "the server cut a prompt over the window instead of refusing it",
        "roost's token estimate was +12.0% off the server's count"]
    assert "calibration ratio 0.89" in does[-1]
    assert card_line(card(quick=True)).endswith(
        "— probed 2025-06-01 (quick probe; `roost models` for all)")
    plain = card(tools="native", thinking="separate", truncate="refuses", estimate_error=0.001)
    assert [line.split(":")[0] for line in what_roost_does(plain)] == [
        "thinks apart from its answer"]


def test_a_card_is_found_however_the_model_was_named_on_its_version_only() -> None:
    cards = [card("qwen3:latest"), card("llama3.2:3b", version="0.11.0")]
    assert card_of(cards, "qwen3", VERSION) is cards[0]
    assert card_of(cards, "qwen3:latest", VERSION) is cards[0]
    assert card_of(cards, "llama3.2:3b", VERSION) is None
    assert card_of(cards, "qwen3:8b", VERSION) is None


# ---- roost doctor -----------------------------------------------------------------------


def keep(tmp_path: Path, *cards: Card) -> None:
    """The cards in the config's state directory, private as the daemon makes it (its umask)."""
    (tmp_path / "state").mkdir(mode=0o700)
    store_cards(tmp_path / "state", cards)


def config_with_automation(tmp_path: Path, ollama: str) -> Path:
    config = tmp_path / "roost.toml"
    config.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n[model]\nhost = "{ollama}"\n'
        '[[automations]]\nname = "brief"\nschedule = "0 7 * * *"\nprompt = "The weather."\n'
        'deliver = ["log"]\nmodel = "llama3.2:3b"\n'
        '[[automations]]\nname = "digest"\nschedule = "0 8 * * *"\nprompt = "The news."\n'
        'deliver = ["log"]\nmodel = "gemma3:4b"\n')
    return config


async def test_doctor_shows_each_configured_models_card_for_the_running_ollama(
        tmp_path: Path, fake_ollama: FakeOllama) -> None:
    keep(tmp_path, card(), card("llama3.2:3b", version="0.11.0"))
    status, out = await doctor(config_with_automation(tmp_path, fake_ollama.url))
    assert failed(out) == [], out  # no card is no failure: roost probes quietly on first use
    lines = [line for line in out.splitlines() if " model card: " in line
             or line.startswith("ok   model qwen3:4b:")]
    assert lines == [
        f"ok   model card: {card_line(card())}",
        *(f"ok   model qwen3:4b: {line}" for line in what_roost_does(card())),
        f"ok   model card: llama3.2:3b: probed on Ollama 0.11.0; this is {VERSION} -> fix: "
        "run `roost models --model llama3.2:3b` again",
        "ok   model card: gemma3:4b: none yet (roost also probes it quietly on first use) "
        "-> fix: `roost models --model gemma3:4b`",
    ]
    assert status == 0


async def test_doctor_json_carries_the_cards_as_checks(
        tmp_path: Path, fake_ollama: FakeOllama) -> None:
    keep(tmp_path, card(tools="native", thinking="none", truncate="refuses",
                        estimate_error=None))
    status, out = await doctor(config_with_automation(tmp_path, fake_ollama.url), "--json")
    assert status == 0
    checks = json.loads(out)["checks"]
    cards = [c for c in checks if c["name"] == "model card"]
    assert [c["detail"].split(": ")[0] for c in cards] == ["qwen3:4b", "llama3.2:3b",
                                                          "gemma3:4b"]
    assert all(c["ok"] for c in cards)
    assert cards[2]["fix"] == "`roost models --model gemma3:4b`"
    assert {"name": "model qwen3:4b", "ok": True,
            "detail": "nothing in its card asks roost to treat it differently",
            "fix": ""} in checks


async def test_doctor_with_ollama_down_says_nothing_of_cards_and_fails_once(
        tmp_path: Path) -> None:
    keep(tmp_path, card())
    status, out = await doctor(config_with_automation(tmp_path, "http://127.0.0.1:9"))
    assert status == 1
    [line] = failed(out)
    assert line.startswith("FAIL ollama: not reachable")
    assert "model card" not in out and "check itself failed" not in out


# ---- /status ----------------------------------------------------------------------------


async def status_of(settings: Settings, **wired: object) -> str:
    store = Store.open(settings.daemon.state_dir)
    llm = ModelClient(settings.model)
    try:
        parts = standard_parts(settings, store, llm)
        commands = Commands(settings=settings, store=store, router=parts.router, llm=llm,
                            prompting=parts.prompting, folder=parts.folder, clock=time.time,
                            registry=parts.registry, **wired)  # type: ignore[arg-type]
        return await commands.run("status", CHAT)
    finally:
        await llm.close()
        store.close()


async def test_status_says_the_chat_models_card_in_one_line(
        make_settings: SettingsFactory, fake_ollama: FakeOllama) -> None:
    settings = make_settings(model={"host": fake_ollama.url})
    cards = {"qwen3:4b": card_line(card())}
    status = await status_of(settings, card_line=cards.get)
    assert status.splitlines()[:2] == [f"Model: qwen3:4b at {fake_ollama.url}",
                                       f"Card: {card_line(card())}"]


async def test_status_without_a_card_says_how_one_is_made(
        make_settings: SettingsFactory, fake_ollama: FakeOllama) -> None:
    settings = make_settings(model={"host": fake_ollama.url})
    status = await status_of(settings, card_line=lambda model: None)
    assert status.splitlines()[1] == ("Card: none yet (`roost models` probes it; roost also "
                                      "does it quietly on first use)")
    # Where nothing knows the cards (a caller that did not wire them), no line at all.
    assert "Card:" not in await status_of(settings)


# ---- the console's Health page ----------------------------------------------------------


def running(settings: Settings, cards: list[Card]) -> Running:
    return Running(settings, Health(ollama_reachable=True, model_pulled=True), "ok", ["telegram"],
                   {}, 0, [], [], cards=cards)


@pytest.fixture
async def health_page(make_settings: SettingsFactory,
                      state_dir: Path) -> AsyncIterator[tuple[list[Card], str]]:
    """The console alone, its Health page showing `cards` (the list, filled by the test)."""
    settings = make_settings()
    cards: list[Card] = []
    store = Store.open(state_dir)
    app = web.Application()
    Console(settings, lambda: store,
            health=lambda: health_view(running(settings, cards))).add_routes(app)
    runner, url = await start(app)
    try:
        yield cards, url
    finally:
        await runner.cleanup()
        store.close()


async def page(url: str, state_dir: Path) -> str:
    async with await browser_for(url, state_dir, OWNER) as http, http.get(
            f"{url}/console/health") as answer:
        assert answer.status == 200
        return await answer.text()


async def test_the_health_page_shows_the_cards_table_with_what_roost_does(
        health_page: tuple[list[Card], str], state_dir: Path) -> None:
    cards, url = health_page
    text = await page(url, state_dir)
    assert "No model has a card for this Ollama version yet" in text
    cards += [card(),
              card("llava:7b", tools="none", thinking="none", truncate="refuses",
                   vision=False, memory=None, estimate_error=None, load_s=None,
                   already_loaded=True, quick=True)]
    text = await page(url, state_dir)
    assert "<th>Over-window prompts</th>" in text and "What roost does:" in text
    row = card_row(cards[0])
    for cell in ("qwen3:4b", "text", "inline", "cut", "+12.0%", "38.4", "0.41\u00a0s",
                 "3.2\u00a0s", "5.2\u00a0GB (100% on the GPU)", f"2025-06-01 on Ollama {VERSION}"):
        assert re.search(rf'<td( class="name")? data-label="[^"]+">{re.escape(cell)}', text), cell
    for line in row.does:
        assert f"<li>{escape(line)}</li>" in text
    assert ">did not describe an image</td>" in text
    assert '<td data-label="Over-window prompts">refused</td>' in text
    assert '<td data-label="Load">warm</td>' in text and "(quick probe)</td>" in text


async def test_a_hostile_model_name_on_the_health_page_stays_text(
        health_page: tuple[list[Card], str], state_dir: Path) -> None:
    cards, url = health_page
    cards.append(card(HOSTILE))
    text = await page(url, state_dir)
    assert HOSTILE not in text and "<script>" not in text and "<img" not in text
    assert ('<td class="name" data-label="Model">&lt;script&gt;window.pwned=1&lt;/script&gt;'
            '&lt;img src=x') in text
