"""`/console` by a household's roles (issue 45), through Telegram (the fake Bot API, roost's
real webhook) and the console's own pages: the `[people]` owner's link gives the owner's view,
as `roost console` does (every conversation, everyone on People, Health); a member's and a
guest's give their own chats only; an owner the config demotes or drops, after the restart that
applies it, keeps neither an unused owner's link nor a signed-in owner's session."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from itertools import count
from types import MappingProxyType

import aiohttp
import pytest
from aiohttp import web

from channels.telegram.channel import SECRET_HEADER, WEBHOOK_PATH
from daemon.app.serve import ENGINE, STORE, build_app
from daemon.core.config import PersonSettings, Settings
from daemon.store.approvals import ApprovalBook
from daemon.store.facts import HOUSEHOLD as FACTS_OF_HOUSEHOLD
from daemon.store.facts import FactsBook
from tests.conftest import SettingsFactory, wait_until
from tests.daemon.console.test_console import jar, sign_in
from tests.daemon.console.test_console_people import cards
from tests.fakes.ollama import FakeOllama
from tests.fakes.telegram import FakeTelegram

SECRET = "s3cret_-X"
DANA, OMAR, ZOE = 1111111, 2222222, 3333333  # the owner, a member, a guest
NAMES = {DANA: "dana", OMAR: "omar", ZOE: "zoe"}
LINK = re.compile(r"/console/login\?t=(\S+)")
HOUSEHOLD = {"dana": PersonSettings((f"telegram:{DANA}",), "owner"),
             "omar": PersonSettings((f"telegram:{OMAR}",), "member"),
             "zoe": PersonSettings((f"telegram:{ZOE}",), "guest", 30)}


@dataclass
class Household:
    """A daemon with Telegram on and `[people]` as given; `restart` applies another `[people]`
    to the same state directory, as editing the config and restarting roost does."""

    settings: Settings
    fake: FakeTelegram
    ids: count[int]
    app: web.Application | None = None
    runner: web.AppRunner | None = None
    url: str = ""

    async def start(self, people: Mapping[str, PersonSettings]) -> None:
        settings = dataclasses.replace(self.settings, people=MappingProxyType(dict(people)))
        self.app = build_app(settings)
        self.runner = web.AppRunner(self.app, shutdown_timeout=0.5)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def restart(self, people: Mapping[str, PersonSettings]) -> None:
        await self.stop()
        await self.start(people)

    async def say(self, user: int, text: str) -> None:
        """A private message from `user`, answered before this returns."""
        assert self.app is not None
        self.fake.start_chat(user)  # a user who writes to the bot has started it
        update_id = next(self.ids)
        update = {"update_id": update_id, "message": {
            "message_id": update_id, "date": 1700000000, "text": text,
            "chat": {"id": user, "type": "private", "first_name": f"User {user}"},
            "from": {"id": user, "is_bot": False, "first_name": f"User {user}"}}}
        before = len(self.texts_to(user))
        async with aiohttp.ClientSession() as http, http.post(
                f"{self.url}{WEBHOOK_PATH}", json=update,
                headers={SECRET_HEADER: SECRET}) as reply:
            assert reply.status == 200
        await wait_until(lambda: len(self.texts_to(user)) > before)
        await asyncio.wait_for(self.app[ENGINE].wait_idle(f"telegram:{user}"), 10)

    def texts_to(self, user: int) -> list[str]:
        return [str(m["text"]) for m in self.fake.sent_messages if m["chat_id"] == user]

    async def console_link(self, user: int) -> str:
        """What `/console` sends `user`: the link's token (the reply's words are checked by the
        tests that care)."""
        await self.say(user, "/console")
        found = LINK.search(self.texts_to(user)[-1])
        assert found, self.texts_to(user)[-1]
        return found.group(1)

    def conversation_of(self, user: int) -> str:
        assert self.app is not None
        conversation = self.app[STORE].active_conversation(f"telegram:{user}")
        assert conversation is not None
        return conversation.id


@pytest.fixture
async def household(fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
                    make_settings: SettingsFactory) -> AsyncIterator[Household]:
    """Dana (owner, also on telegram.allow), Omar (member) and Zoe (guest) have each said
    something, so each has a conversation."""
    settings = make_settings(
        model={"host": fake_ollama.url},
        telegram={"enabled": True, "mode": "webhook",
                  "webhook_url": "https://bot.example.org/webhooks/telegram",
                  "api_base": fake_telegram.api_base, "file_base": fake_telegram.file_base,
                  "allow": (DANA,), "token": fake_telegram.token, "secret": SECRET})
    running = Household(settings, fake_telegram, count(1))
    await running.start(HOUSEHOLD)
    try:
        for user, words in ((DANA, "Dana's surprise party plans"),
                            (OMAR, "Omar's private diary"), (ZOE, "Zoe's visit")):
            await running.say(user, words)
        yield running
    finally:
        await running.stop()


async def page(http: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with http.get(url, allow_redirects=False) as answer:
        return answer.status, await answer.text()


async def test_the_owner_on_telegram_gets_the_owners_view(household: Household) -> None:
    link = await household.console_link(DANA)
    assert "owner's console" in household.texts_to(DANA)[-1]
    omar = household.conversation_of(OMAR)
    async with jar() as http:
        assert await sign_in(http, household.url, link) == 303
        status, listed = await page(http, f"{household.url}/console/")
        assert status == 200 and "Everyone's conversations" in listed
        assert all(f"telegram:{user}" in listed for user in (DANA, OMAR, ZOE))
        status, text = await page(http, f"{household.url}/console/c/{omar}")
        assert status == 200 and "private diary" in text
        status, people = await page(http, f"{household.url}/console/people")
        assert status == 200
        assert [card.split()[:2] for card in cards(people)] == [
            ["dana", "owner"], ["Terminal", "owner"], ["omar", "member"], ["zoe", "guest"]]
        # The rest of the terminal's view: the daemon's health, and the same link used twice.
        assert (await page(http, f"{household.url}/console/health"))[0] == 200
    async with jar() as again:
        assert await sign_in(again, household.url, link) == 403


@pytest.mark.parametrize("user", [OMAR, ZOE], ids=["member", "guest"])
async def test_a_member_or_guest_sees_only_their_own(household: Household, user: int) -> None:
    link = await household.console_link(user)
    assert household.texts_to(user)[-1].startswith("Your console")
    others = [u for u in (DANA, OMAR, ZOE) if u != user]
    async with jar() as http:
        assert await sign_in(http, household.url, link) == 303
        status, listed = await page(http, f"{household.url}/console/")
        assert status == 200 and f"telegram:{user}" in listed
        assert not [u for u in others if str(u) in listed]
        # The owner's conversation does not open, as if it did not exist.
        status, text = await page(http, f"{household.url}/console/c/"
                                        f"{household.conversation_of(DANA)}")
        assert status == 404 and "surprise party" not in text
        assert (await page(http, f"{household.url}/console/c/"
                                 f"{household.conversation_of(user)}"))[0] == 200
        status, people = await page(http, f"{household.url}/console/people")
        assert status == 200 and len(cards(people)) == 1 and str(user) in cards(people)[0]
        assert not [word for u in others for word in (NAMES[u], str(u)) if word in people]
        assert (await page(http, f"{household.url}/console/health"))[0] == 404


DEMOTED = {**HOUSEHOLD, "dana": PersonSettings((f"telegram:{DANA}",), "member")}
REMOVED = {name: person for name, person in HOUSEHOLD.items() if name != "dana"}


@pytest.mark.parametrize("people", [DEMOTED, REMOVED], ids=["demoted", "removed"])
async def test_an_owner_no_longer_keeps_the_owners_view(
        household: Household, people: Mapping[str, PersonSettings]) -> None:
    signed_in = await household.console_link(DANA)
    unused = await household.console_link(DANA)
    omar = household.conversation_of(OMAR)
    async with jar() as http:
        assert await sign_in(http, household.url, signed_in) == 303
        assert (await page(http, f"{household.url}/console/c/{omar}"))[0] == 200

        await household.restart(people)  # the config changed: Dana is no longer an owner

        # The session made while she was the owner ends, and stays ended.
        for _ in range(2):
            status, text = await page(http, f"{household.url}/console/c/{omar}")
            assert status == 401 and "diary" not in text
        async with jar() as other:
            assert await sign_in(other, household.url, unused) == 403
            status, text = await page(other, f"{household.url}/console/people")
            assert status == 401 and "omar" not in text
    # She still talks to roost (on telegram.allow when removed): /console now gives her own.
    link = await household.console_link(DANA)
    assert household.texts_to(DANA)[-1].startswith("Your console")
    async with jar() as http:
        assert await sign_in(http, household.url, link) == 303
        status, listed = await page(http, f"{household.url}/console/")
        assert f"telegram:{DANA}" in listed and str(OMAR) not in listed
        assert (await page(http, f"{household.url}/console/c/{omar}"))[0] == 404


async def test_an_owners_session_waits_while_the_household_cannot_be_read(
        household: Household) -> None:
    link = await household.console_link(DANA)
    omar = household.conversation_of(OMAR)
    book = household.settings.daemon.state_dir / "pairing.json"
    async with jar() as http:
        assert await sign_in(http, household.url, link) == 303
        kept = book.read_bytes() if book.exists() else b"{}"
        book.write_text("{not json")  # a broken pairing book: whose role is it?
        assert (await page(http, f"{household.url}/console/c/{omar}"))[0] == 401
        book.write_bytes(kept)  # mended: the same session works again, it was not ended
        status, text = await page(http, f"{household.url}/console/c/{omar}")
        assert status == 200 and "private diary" in text


WIFI = "The wifi password is plum-tree-42"


async def test_household_facts_and_an_owners_grant_on_people(household: Household) -> None:
    assert household.app is not None
    state_dir = household.app[STORE].state_dir
    FactsBook.at(state_dir).add(FACTS_OF_HOUSEHOLD, WIFI, "2026-12-01")
    ApprovalBook(state_dir).grant(f"telegram:{OMAR}", "lights__off", 1_764_000_000.0,
                                  by=f"telegram:{DANA}")
    seen: dict[int, str] = {}
    for user in (DANA, OMAR, ZOE):
        link = await household.console_link(user)
        async with jar() as http:
            assert await sign_in(http, household.url, link) == 303
            seen[user] = (await page(http, f"{household.url}/console/people"))[1]
            if user == ZOE:  # a guest cannot keep one through the form either
                csrf = re.search(r'name="csrf" value="([^"]+)"', seen[user])
                assert csrf
                async with http.post(f"{household.url}/console/people/remember", data={
                        "person": FACTS_OF_HOUSEHOLD.name, "text": "The door code is 1234",
                        "csrf": csrf.group(1)}) as answer:
                    assert answer.status == 404
    # The owner and the member read the household's facts; the guest does not.
    assert "the household" in seen[DANA] and WIFI in seen[DANA]
    assert WIFI in seen[OMAR]
    assert WIFI not in seen[ZOE] and "household" not in seen[ZOE]
    assert [f.text for f in FactsBook.at(state_dir).facts(FACTS_OF_HOUSEHOLD)] == [WIFI]
    # Omar's grant says who gave it, to him and to the owner.
    for user in (DANA, OMAR):
        assert "lights__off" in seen[user] and "given by the owner" in seen[user]
    assert "lights__off" not in seen[ZOE]
