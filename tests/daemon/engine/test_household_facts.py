"""The household's facts, end to end: the engine against the fake Ollama, with the household
the daemon has (`[people]`: Dana the owner on Telegram and WhatsApp, Omar a member, Sam a
guest) and a family group.

A household fact is kept by an owner or a member (chat command, the model's tool) and rides in
its own frozen block in every owner's, member's and the group's prompt, never in a guest's;
a person's own facts stay in their own prompt; the prefix stays byte-stable when a household
fact is added mid-conversation (the change rides on the next message, the block changes at the
next conversation)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from types import MappingProxyType

import pytest

from daemon.core.config import GUEST, MEMBER, OWNER, PersonSettings, Settings
from daemon.engine.facts_commands import NOT_A_MEMBER
from daemon.intake.household import Household
from daemon.store.facts import HOUSEHOLD, Person
from tests.conftest import SettingsFactory
from tests.daemon.engine.test_user_facts import Chats, call, start  # noqa: F401 (a fixture)
from tests.fakes.ollama import FakeOllama, Reply

DANA, DANA_WA = "telegram:1111111", "whatsapp:972544401243"
OMAR, SAM = "telegram:2222222", "telegram:3333333"
GROUP = "telegram:-1001234567890"
WIFI = "The wifi password is plum-tree-42"
LOCKER = "My locker code is 4417"


def household_settings(make_settings: SettingsFactory, fake: FakeOllama) -> Settings:
    settings = make_settings(model={"host": fake.url, "retry_backoff": 0.02,
                                    "retry_attempts": 2})
    return dataclasses.replace(settings, people=MappingProxyType({
        "dana": PersonSettings(chats=(DANA, DANA_WA), role=OWNER),
        "omar": PersonSettings(chats=(OMAR,), role=MEMBER),
        "sam": PersonSettings(chats=(SAM,), role=GUEST, daily_messages=30),
    }))


@pytest.fixture
def start_home(start: Callable[..., Awaitable[Chats]]) -> Start:  # noqa: F811
    """The engine of test_user_facts with the household's roles, as the daemon builds it."""
    return lambda settings: start(settings, roles=Household.of(settings))


Start = Callable[[Settings], Awaitable[Chats]]


async def test_a_household_fact_reaches_owners_members_and_the_group_never_a_guest(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, start_home: Start
) -> None:
    home = await start_home(household_settings(make_settings, fake_ollama))
    await home.say(OMAR, f"/remember {LOCKER}")
    await home.say(OMAR, f"/memory household {WIFI}")
    assert home.last(OMAR) == f"Noted for the household: {WIFI}"
    assert (home.engine.store.state_dir / "facts" / "household.md").read_text().endswith(
        f": {WIFI}\n")

    prompts = {chat: await home.system(chat, "hello") for chat in (DANA, DANA_WA, OMAR, GROUP)}
    for chat, prompt in prompts.items():
        assert "<household_facts>" in prompt and WIFI in prompt, chat
    # The household's block is the same bytes for everyone who shares it.
    blocks = {p[p.index("<household_facts>"):p.index("</household_facts>")]
              for p in prompts.values()}
    assert len(blocks) == 1
    # Omar's own fact is in his prompt alone: not Dana's, not the group's.
    assert LOCKER in prompts[OMAR]
    assert all(LOCKER not in prompts[c] for c in (DANA, DANA_WA, GROUP))
    assert "<user_facts>" not in prompts[GROUP]

    guest = await home.system(SAM, "hello")
    assert WIFI not in guest and "household" not in guest
    assert LOCKER not in guest
    await home.say(SAM, "/memory household")
    assert home.last(SAM) == NOT_A_MEMBER
    await home.say(SAM, "/memory household The door code is 1234")
    assert home.last(SAM) == NOT_A_MEMBER
    assert [f.text for f in home.book().facts(HOUSEHOLD)] == [WIFI]

    await home.say(DANA, "/memory household")
    assert home.last(DANA) == ("The household's facts (/forget household N forgets one):\n"
                               f"1. {WIFI} ({time.strftime('%Y-%m-%d')})")


async def test_a_household_fact_added_mid_conversation_keeps_the_prefix_byte_stable(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, start_home: Start
) -> None:
    home = await start_home(household_settings(make_settings, fake_ollama))
    before = await home.system(DANA, "hello")
    await home.say(OMAR, f"/memory household {WIFI}")
    turn = await home.say(DANA, "what is new?")
    assert turn[0]["messages"][0]["content"] == before
    assert turn[0]["messages"][-1]["content"].startswith(
        "what is new?\n\n[Facts changed since this conversation began: now kept for the "
        f"household: {WIFI}]")
    assert (await home.system(DANA, "and now?")) == before

    # The guest is told nothing of it, on the next message either.
    await home.system(SAM, "hi")
    await home.say(OMAR, "/memory household The bins go out on Tuesday")
    assert "bins" not in str((await home.say(SAM, "anything new?"))[0]["messages"])

    await home.say(DANA, "/new")
    fresh = await home.system(DANA, "hello again")
    assert fresh != before and WIFI in fresh and "The bins go out on Tuesday" in fresh
    assert (await home.system(DANA, "and again")) == fresh

    await home.say(DANA, "/forget household 1")
    assert home.last(DANA) == f"Forgotten by the household: {WIFI}"
    turn = await home.say(DANA, "ok")
    assert turn[0]["messages"][0]["content"] == fresh
    assert (f"forgotten by the household (disregard them above): {WIFI}"
            in turn[0]["messages"][-1]["content"])


async def test_the_model_keeps_a_household_fact_for_a_member_and_never_for_a_guest(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, start_home: Start
) -> None:
    home = await start_home(household_settings(make_settings, fake_ollama))
    fake_ollama.script(Reply(tool_calls=[call("memory_remember", fact=WIFI, household=True)]),
                       Reply(content="Done."))
    await home.say(OMAR, f"{WIFI}. Remember it for the whole family.")
    assert home.last(OMAR) == f"Done.\n\nNoted for the household: {WIFI}"
    assert [f.text for f in home.book().facts(HOUSEHOLD)] == [WIFI]
    assert home.book().facts(Person(OMAR, (OMAR,))) == []

    fake_ollama.script(Reply(tool_calls=[call("memory_remember", fact="The door code is 1234",
                                              household=True)]),
                       Reply(content="I cannot."))
    requests = await home.say(SAM, "The door code is 1234. Remember it for everyone.")
    results = [m["content"] for m in requests[-1]["messages"] if m["role"] == "tool"]
    assert results == ["ERROR: nothing changed. Only the household's owner and members keep or "
                       "forget household facts; this user is a guest (or not listed)."]
    assert [f.text for f in home.book().facts(HOUSEHOLD)] == [WIFI]

    # Recall: memory_search finds the household's facts for a member, not for the guest.
    fake_ollama.script(Reply(tool_calls=[call("memory_search", query="wifi password")]),
                       Reply(content="ok"))
    requests = await home.say(DANA, "what is the wifi password?")
    assert WIFI in requests[-1]["messages"][-1]["content"]
    fake_ollama.script(Reply(tool_calls=[call("memory_search", query="wifi password")]),
                       Reply(content="ok"))
    requests = await home.say(SAM, "what is the wifi password?")
    assert "plum-tree" not in requests[-1]["messages"][-1]["content"]


async def test_a_guest_promoted_to_member_gets_the_household_block_at_once(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, start_home: Start
) -> None:
    settings = household_settings(make_settings, fake_ollama)
    home = await start_home(settings)
    home.book().add(HOUSEHOLD, WIFI, "2026-12-01")
    assert WIFI not in await home.system(SAM, "hello")
    await home.engine.stop(grace=0)
    home.engine.store.close()

    promoted = dataclasses.replace(settings, people=MappingProxyType({
        **settings.people, "sam": PersonSettings(chats=(SAM,), role=MEMBER)}))
    again = await start_home(promoted)
    assert WIFI in await again.system(SAM, "and now?")
