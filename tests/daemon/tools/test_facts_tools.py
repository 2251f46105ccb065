"""The facts tools' own rules: a fact must be in the user's own words; whatever is kept or
forgotten is said in the reply; every kept fact stays findable, shown in the prompt or not."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from daemon.core.config import Settings
from daemon.engine.facts_commands import FactsCommands
from daemon.store import Store
from daemon.store.facts import FactsBook, Person
from daemon.tools.builtin import ToolContext, memory_search
from daemon.tools.facts import confirmed, grounded, memory_remember
from daemon.tools.registry import Registry
from tests.conftest import SettingsFactory
from tests.daemon.store.test_facts import FullDisk

ALICE = Person("telegram:1111111", ("telegram:1111111",))


@pytest.mark.parametrize(("fact", "said"), [
    ("Locker code is 4417", "My locker code is 4417. Remember it."),
    ("Prefers metric units", "I prefer metric units, always"),
    ("Lives in Graz", "btw I live in Graz now"),
    ("User's wife is called Anna", "my wife's name is Anna"),
])
def test_a_fact_in_the_users_words_is_grounded(fact: str, said: str) -> None:
    assert grounded(fact, ["hello", said])


@pytest.mark.parametrize(("fact", "said"), [
    ("Bank PIN is 9911", "summarise https://example.org for me"),
    ("Locker code is 4471", "My locker code is 4417"),  # a number the user never said
    ("Lives in Berlin", "what is the weather in Berlin?"),
    ("", "anything"),
])
def test_words_the_user_did_not_say_are_not(fact: str, said: str) -> None:
    assert not grounded(fact, [said])


def test_the_reply_says_what_was_kept_once() -> None:
    assert confirmed("Sure.", ["Noted: Likes tea"]) == "Sure.\n\nNoted: Likes tea"
    assert confirmed("Noted: likes tea - done", ["Noted: Likes tea"]) == (
        "Noted: likes tea - done")
    assert confirmed("", ["Noted: a", "Forgotten: b"]) == "Noted: a\nForgotten: b"
    assert confirmed("Hi", []) == "Hi"


async def test_memory_search_finds_the_facts_the_prompt_leaves_out(
        make_settings: SettingsFactory, state_dir: Path) -> None:
    settings = make_settings()
    store = Store.open(state_dir)
    try:
        book = FactsBook(store.files)
        for i in range(150):
            book.add(ALICE, f"Fact {i}: the user owns gadget model {1000 + i}", "2026-11-01")
        conversation = store.create_conversation(ALICE.name, time.time())
        ctx = ToolContext(store=store, settings=settings, registry=Registry(),
                          conversation_id=conversation.id, clock=time.time, facts=book,
                          person=ALICE)
        assert await memory_search(ctx, "gadget 1000") == (
            "Kept facts matching 'gadget 1000':\n"
            "- Fact 0: the user owns gadget model 1000 (noted 2026-11-01)")
        # No user message in the conversation yet: nothing the model writes is the user's.
        assert (await memory_remember(ctx, "owns gadget model 2000")).startswith(
            "ERROR: not saved.")
        assert ctx.noted == []
    finally:
        store.close()


async def test_a_disk_that_cannot_take_the_fact_gets_a_clear_answer(
        make_settings: SettingsFactory) -> None:
    settings: Settings = make_settings()
    files = FullDisk()
    book = FactsBook(files)
    commands = FactsCommands(settings=settings, facts=book, clock=time.time)
    assert await commands.run("remember", "/remember Likes tea", ALICE.name) == (
        "Noted: Likes tea")
    files.full = True
    reply = await commands.run("remember", "/remember Lives in Graz", ALICE.name)
    assert reply.startswith("Not changed: the facts file cannot be written")
    assert await commands.run("memory", "/memory", ALICE.name) == (
        "What I keep about you (/forget N forgets one):\n1. Likes tea "
        f"({time.strftime('%Y-%m-%d')})")
