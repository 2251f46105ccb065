"""`roost models` against the fake Ollama: one model of each kind, the card a user reads, and
the ways it goes wrong (a probe that fails, a model not pulled, no terminal, Ollama down)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from daemon.cli.models import run_models
from daemon.core.config import Settings
from daemon.models import all_cards, load_card, store_cards
from daemon.models.card import CARDS_FILE
from tests.conftest import SettingsFactory
from tests.fakes.ollama import VERSION, FakeModel, FakeOllama, Reply, echo_reply

KINDS = [
    FakeModel("native:4b", capabilities=("completion", "tools", "thinking"),
              tool_style="native", load_duration=3.2, vocab_size=151936),
    FakeModel("text:3b", capabilities=("completion", "tools"), tool_style="text",
              context_length=4096),
    FakeModel("never:1b", capabilities=("completion", "tools"), tool_style="never"),
    FakeModel("inline:7b", capabilities=("completion",), thinking_style="inline"),
    FakeModel("empty:8b", tool_style="native", thinking_style="empty-with-tools"),
    FakeModel("eyes:4b", capabilities=("completion", "vision"), vision_reply="Red and blue."),
    FakeModel("plain:3b", capabilities=("completion",), thinking_style="plain"),
    FakeModel("asked:3b", capabilities=("completion",), thinking_style="inline-when-asked"),
    FakeModel("blind:4b", capabilities=("completion", "vision"),
              vision_reply="I cannot see images, but I am happy to help."),
]


class Terminal(io.StringIO):
    """Someone at a terminal who types `answer`."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
async def kinds() -> AsyncIterator[FakeOllama]:
    async with FakeOllama([dataclass_copy(m) for m in KINDS]) as fake:
        yield fake


def dataclass_copy(model: FakeModel) -> FakeModel:
    return FakeModel(**{k: getattr(model, k) for k in model.__dataclass_fields__})


async def models(settings: Settings, *names: str, stdin: io.StringIO | None = None,
                 **flags: bool) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = await run_models(settings, names, out=out, err=err,
                              stdin=stdin if stdin is not None else io.StringIO(), **flags)
    return status, out.getvalue(), err.getvalue()


def settings_for(make_settings: SettingsFactory, fake: FakeOllama, window: int = 2048
                 ) -> Settings:
    return make_settings(model={"host": fake.url, "window": window})


async def test_every_kind_of_model_gets_the_card_a_user_would_read(
        kinds: FakeOllama, make_settings: SettingsFactory) -> None:
    kinds.report_cached = True
    settings = settings_for(make_settings, kinds)
    status, out, err = await models(settings, as_json=True, yes=True)
    assert status == 0, err
    cards = {c["name"]: c for c in json.loads(out)}
    assert list(cards) == [m.name for m in KINDS]
    assert {n: c["tools"] for n, c in cards.items()} == {
        "native:4b": "native", "text:3b": "text", "never:1b": "none", "inline:7b": "none",
        "empty:8b": "native", "eyes:4b": "none", "plain:3b": "none", "asked:3b": "none",
        "blind:4b": "none"}
    assert {n: c["thinking"] for n, c in cards.items()} == {
        "native:4b": "separate", "text:3b": "none", "never:1b": "none", "inline:7b": "inline",
        "empty:8b": "empty-with-tools", "eyes:4b": "none", "plain:3b": "inline",
        "asked:3b": "inline", "blind:4b": "none"}
    assert {n: c["vision"] for n, c in cards.items()} == {
        "native:4b": None, "text:3b": None, "never:1b": None, "inline:7b": None,
        "empty:8b": None, "eyes:4b": True, "plain:3b": None, "asked:3b": None,
        "blind:4b": False}
    assert not any(c["quick"] or c["already_loaded"] for c in cards.values())
    native = cards["native:4b"]
    assert native["context"] == 32768 and native["num_ctx"] == 2048
    assert cards["text:3b"]["context"] == 4096
    assert native["truncate"] == "refuses"
    assert native["load_s"] == 3.2  # the first request loaded it (/api/ps did not list it)
    assert native["tokens_per_s"] == 100.0  # the fake: 10 ms a token
    assert native["first_token_s"] is not None and native["first_token_s"] < 5
    assert 0 < native["cached_share"] < 1  # the mixed text came from the cache the second time
    assert native["memory"] == native["memory_vram"] == 2_600_000_000
    assert native["ollama_version"] == VERSION and native["probed_at"].endswith("Z")
    # The fake counts bytes/3, not a real tokenizer: roost's estimate is off, and says so.
    assert all(isinstance(c["estimate_error"], float) for c in cards.values())


async def test_the_tool_probe_does_not_think_and_every_request_is_short(
        kinds: FakeOllama, make_settings: SettingsFactory) -> None:
    status, _, err = await models(settings_for(make_settings, kinds), "native:4b")
    assert status == 0, err
    chats = kinds.chat_requests
    assert 4 <= len(chats) <= 6
    assert all(c["options"]["num_predict"] <= 256 for c in chats)
    assert {c["options"]["num_ctx"] for c in chats} == {2048} and kinds.reloads == 0
    (tool_probe,) = [c for c in chats if c.get("tools") and c.get("think") is False]
    assert tool_probe["tools"][0]["function"]["name"] == "get_time"
    (over,) = [c for c in chats if c.get("truncate") is False]
    assert kinds.count_tokens(over["messages"]) > 2 * 2048


async def test_the_table_fits_in_100_columns_and_the_cards_are_kept_privately(
        kinds: FakeOllama, make_settings: SettingsFactory, state_dir: Path) -> None:
    os.umask(0o077)  # what `roost` sets before writing anything (daemon.core.filemodes)
    settings = settings_for(make_settings, kinds)
    status, out, err = await models(settings, "native:4b", "eyes:4b")
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["MODEL", "CTX", "TOOLS", "THINKING", "TRUNC"]
    assert lines[1].split()[:5] == ["native:4b", "32K", "native", "separate", "refuses"]
    assert lines[2].split()[:2] == ["eyes:4b", "32K"] and lines[2].split()[-2] == "yes"
    assert max(len(line) for line in lines) <= 100
    path = state_dir / CARDS_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    card = load_card(state_dir, "native:4b", VERSION)
    assert card is not None and card.tools == "native" and card.thinking == "separate"
    assert load_card(state_dir, "native:4b", "0.13.0") is None  # another Ollama: probe again
    assert [c.name for c in all_cards(state_dir)] == ["eyes:4b", "native:4b"]


async def test_a_model_loaded_before_its_battery_shows_no_load_time(
        kinds: FakeOllama, make_settings: SettingsFactory) -> None:
    kinds.loaded["native:4b"] = 2048  # a chat used it a moment ago
    settings = settings_for(make_settings, kinds)
    status, out, err = await models(settings, "native:4b", "text:3b")
    assert status == 0, err
    lines = out.splitlines()
    load = lines[0].index("LOAD")
    assert lines[1].startswith("native:4b") and lines[1][load:].split()[0] == "warm"
    assert lines[2].startswith("text:3b") and lines[2][load:].split()[0] == "0.0"
    assert "warm: it was loaded already" in out
    status, out, _ = await models(settings, "native:4b", as_json=True)
    (card,) = json.loads(out)
    assert card["load_s"] is None and card["already_loaded"] is True


async def test_json_prints_exactly_what_was_stored(
        kinds: FakeOllama, make_settings: SettingsFactory, state_dir: Path) -> None:
    status, out, _ = await models(settings_for(make_settings, kinds), "text:3b", as_json=True)
    assert status == 0
    stored = json.loads((state_dir / CARDS_FILE).read_text())["cards"]
    assert json.loads(out) == stored


async def test_a_model_that_fails_a_probe_is_one_line_and_exit_1_and_not_stored(
        kinds: FakeOllama, make_settings: SettingsFactory, state_dir: Path) -> None:
    def broken_tools(body: dict[str, Any]) -> Reply:
        if body.get("tools") and body["model"] == "never:1b":
            return Reply(status=500, error="llama runner process has terminated")
        return echo_reply(body)

    kinds.default_reply = broken_tools
    settings = settings_for(make_settings, kinds)
    status, out, err = await models(settings, "never:1b", "text:3b", as_json=True)
    assert status == 1
    assert err.splitlines() == ["never:1b: the tool probe failed: Ollama answered 500: "
                                "llama runner process has terminated"]
    assert [c["name"] for c in json.loads(out)] == ["text:3b"]
    assert [c.name for c in all_cards(state_dir)] == ["text:3b"]


async def test_a_model_not_pulled_is_told_to_pull_it_and_nothing_is_pulled(
        kinds: FakeOllama, make_settings: SettingsFactory) -> None:
    status, out, err = await models(settings_for(make_settings, kinds), "llama3.2:3b")
    assert status == 1 and out == ""
    assert err.splitlines() == ["roost: llama3.2:3b is not pulled; roost models never pulls: "
                                "run `ollama pull llama3.2:3b` first"]
    assert kinds.chat_requests == []
    assert not [r for r in kinds.requests if r.path == "/api/pull"]


async def test_all_models_without_a_terminal_or_yes_is_refused_naming_what_is_loaded(
        kinds: FakeOllama, make_settings: SettingsFactory, state_dir: Path) -> None:
    kinds.loaded["eyes:4b"] = 2048  # something is loaded now
    status, out, err = await models(settings_for(make_settings, kinds))
    assert status == 1 and out == ""
    (line,) = err.splitlines()
    assert "unloads what is loaded now (eyes:4b)" in line
    assert "Pass --yes to go on, or name models with --model." in line
    assert kinds.chat_requests == [] and not (state_dir / CARDS_FILE).exists()


async def test_at_a_terminal_it_asks_and_no_is_no(
        kinds: FakeOllama, make_settings: SettingsFactory) -> None:
    settings = settings_for(make_settings, kinds)
    status, _, err = await models(settings, stdin=Terminal("n\n"))
    assert status == 1 and "Go on? [y/N]" in err and "nothing probed" in err
    assert kinds.chat_requests == []
    status, out, err = await models(settings, stdin=Terminal("y\n"), as_json=True)
    assert status == 0, err
    assert len(json.loads(out)) == len(KINDS)


async def test_ollama_down_is_one_clear_line(
        make_settings: SettingsFactory, state_dir: Path) -> None:
    fake = FakeOllama()
    await fake.start()
    await fake.refuse_connections()
    status, out, err = await models(settings_for(make_settings, fake), "qwen3:4b")
    assert status == 1 and out == ""
    (line,) = err.splitlines()
    assert line.startswith("roost: cannot reach Ollama") and "ollama serve" in line
    assert not (state_dir / CARDS_FILE).exists()


async def test_a_server_older_than_truncate_cuts(
        make_settings: SettingsFactory) -> None:
    async with FakeOllama([FakeModel("old:1b", capabilities=("completion",))]) as fake:
        fake.predate_truncate()
        status, out, err = await models(settings_for(make_settings, fake), "old:1b",
                                        as_json=True)
    assert status == 0, err
    (card,) = json.loads(out)
    assert card["truncate"] == "cuts" and card["ollama_version"] == "0.12.5"
    assert card["cached_share"] is None  # this server does not say what it cached


def test_a_card_stored_before_quick_cards_reads_as_a_full_one(state_dir: Path) -> None:
    stored = {"name": "qwen3:4b", "ollama_version": VERSION, "probed_at": "2025-01-01T00:00:00Z",
              "context": 40960, "num_ctx": 8192, "tools": "native", "thinking": "separate",
              "truncate": "refuses", "estimate_error": 0.05, "load_s": 3.1,
              "first_token_s": 0.2, "tokens_per_s": 80.0, "cached_share": 0.9, "vision": None,
              "memory": 3_000_000_000, "memory_vram": 3_000_000_000}
    path = state_dir / CARDS_FILE
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"format": 1, "cards": [stored]}))
    card = load_card(state_dir, "qwen3:4b", VERSION)
    assert card is not None and card.quick is False and card.already_loaded is False
    assert card.tools == "native" and card.load_s == 3.1
    with pytest.raises(dataclasses.FrozenInstanceError):
        card.quick = True  # type: ignore[misc]
    quick = dataclasses.replace(card, ollama_version="0.13.0", quick=True, cached_share=None)
    store_cards(state_dir, [quick])
    assert load_card(state_dir, "qwen3:4b", "0.13.0") == quick
    assert json.loads(path.read_text())["format"] == 1
    path.write_text(json.dumps({"format": 1, "cards": [stored | {"quick": "yes"}]}))
    assert all_cards(state_dir) == []  # not a card: a flag of another kind


def test_a_cards_file_that_does_not_parse_reads_as_no_cards(state_dir: Path) -> None:
    path = state_dir / CARDS_FILE
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert all_cards(state_dir) == [] and load_card(state_dir, "qwen3:4b", VERSION) is None
    path.write_text(json.dumps({"format": 1, "cards": [{"name": "half a card"}]}))
    assert all_cards(state_dir) == []
