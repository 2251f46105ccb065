"""People and access in the console: who may talk, pairing, standing grants and facts, each
within its scope."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import datetime
from html.parser import HTMLParser
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

import aiohttp
import pytest
from aiohttp import web

from daemon.app.serve import build_app
from daemon.core.config import PersonSettings, Settings
from daemon.intake.pairing import PairingBook
from daemon.store.approvals import ApprovalBook
from daemon.store.console_keys import OWNER, ConsoleKeys
from daemon.store.facts import FactsBook, Person
from tests.conftest import SettingsFactory
from tests.daemon.console.conftest import DANA, OMAR, T0, Rig
from tests.daemon.console.test_console import jar, sign_in
from tests.fakes.ollama import FakeOllama
from tests.fakes.telegram import FakeTelegram

TOOL = "github__create_issue"


class Served(Protocol):
    url: str
    settings: Settings


def seed_access(rig: Rig) -> str:
    """A stranger waiting with a code, grants and facts for Dana and Omar; the code."""
    state_dir = rig.settings.daemon.state_dir
    waiting = PairingBook(state_dir).request("telegram", "3333333", "telegram:3333333", "Zoe",
                                             time.time())
    assert waiting is not None
    ApprovalBook(state_dir).grant(DANA, TOOL, T0)
    ApprovalBook(state_dir).grant(OMAR, TOOL, T0)
    facts = FactsBook.at(state_dir)
    facts.add(Person(DANA, (DANA,)), "My cat is called <b>Pickle</b>", "2026-12-01")
    facts.add(Person(OMAR, (OMAR,)), "Omar is allergic to peanuts", "2026-12-01")
    return waiting.code


async def signed_in(rig: Served, *scope: str) -> tuple[aiohttp.ClientSession, str]:
    """A browser signed in for `scope` (the chats of one person, or OWNER), and its form
    token."""
    http = jar()
    link = ConsoleKeys(rig.settings.daemon.state_dir).issue_link(scope, 2e9 - 1)
    assert await sign_in(http, rig.url, link) == 303
    async with http.get(f"{rig.url}/console/people") as page:
        token = re.search(r'name="csrf" value="([^"]+)"', await page.text())
    assert token
    return http, token.group(1)


async def post(http: aiohttp.ClientSession, rig: Rig, action: str, **fields: str) -> str:
    async with http.post(f"{rig.url}/console/people/{action}", data=fields) as answer:
        return f"{answer.status} {await answer.text()}"


async def test_the_owner_approves_one_code_and_refuses_none_twice(rig: Rig) -> None:
    code = seed_access(rig)
    http, csrf = await signed_in(rig, OWNER)
    async with http:
        async with http.get(f"{rig.url}/console/people") as page:
            text = await page.text()
        assert "Zoe" in text and code in text
        answer = await post(http, rig, "approve", code=code, csrf=csrf)
        assert answer.startswith("200") and "Approved telegram user 3333333 (Zoe)" in answer
        again = await post(http, rig, "deny", code=code, csrf=csrf)
        assert f"No code {code} is waiting" in again
    assert PairingBook(rig.settings.daemon.state_dir).is_approved("telegram", "3333333")


async def test_a_person_sees_no_pairing_and_cannot_approve(rig: Rig) -> None:
    code = seed_access(rig)
    http, csrf = await signed_in(rig, OMAR)
    async with http:
        async with http.get(f"{rig.url}/console/people") as page:
            text = await page.text()
        assert code not in text and "Zoe" not in text
        assert (await post(http, rig, "approve", code=code, csrf=csrf)).startswith("403")
    assert not PairingBook(rig.settings.daemon.state_dir).is_approved("telegram", "3333333")


async def test_a_person_revokes_their_own_grant_and_not_anothers(rig: Rig) -> None:
    seed_access(rig)
    http, csrf = await signed_in(rig, OMAR)
    async with http:
        async with http.get(f"{rig.url}/console/people") as page:
            text = await page.text()
        assert OMAR in text and DANA not in text
        assert (await post(http, rig, "revoke", person=DANA, tool=TOOL,
                           csrf=csrf)).startswith("404")
        assert "asks again" in await post(http, rig, "revoke", person=OMAR, tool=TOOL, csrf=csrf)
    book = ApprovalBook(rig.settings.daemon.state_dir)
    assert book.allows(DANA, TOOL) and not book.allows(OMAR, TOOL)


async def test_facts_are_read_added_and_forgotten_within_the_persons_scope(rig: Rig) -> None:
    seed_access(rig)
    facts = FactsBook.at(rig.settings.daemon.state_dir)
    http, csrf = await signed_in(rig, OMAR)
    async with http:
        async with http.get(f"{rig.url}/console/people") as page:
            text = await page.text()
        assert "Omar is allergic to peanuts" in text and "Pickle" not in text
        assert (await post(http, rig, "forget", person=DANA,
                           text="My cat is called <b>Pickle</b>", csrf=csrf)).startswith("404")
        assert "Noted: Omar lives in Porto" in await post(
            http, rig, "remember", person=OMAR, text="Omar lives in Porto", csrf=csrf)
        assert "Forgotten: Omar is allergic to peanuts" in await post(
            http, rig, "forget", person=OMAR, text="Omar is allergic to peanuts", csrf=csrf)
        # A second tap on the same button forgets nothing more (not "fact 1" again).
        assert "Nothing forgotten" in await post(
            http, rig, "forget", person=OMAR, text="Omar is allergic to peanuts", csrf=csrf)
    assert [f.text for f in facts.facts(Person(OMAR, (OMAR,)))] == ["Omar lives in Porto"]
    assert [f.text for f in facts.facts(Person(DANA, (DANA,)))] == [
        "My cat is called <b>Pickle</b>"]


async def test_the_owner_sees_everyones_facts_as_text(rig: Rig) -> None:
    seed_access(rig)
    http, _ = await signed_in(rig, OWNER)
    async with http:
        async with http.get(f"{rig.url}/console/people") as page:
            text = await page.text()
    assert "My cat is called &lt;b&gt;Pickle&lt;/b&gt;" in text
    assert "Omar is allergic to peanuts" in text


async def test_a_people_form_without_its_token_changes_nothing(rig: Rig) -> None:
    code = seed_access(rig)
    http, _ = await signed_in(rig, OWNER)
    async with http:
        assert (await post(http, rig, "approve", code=code)).startswith("403")
    assert not PairingBook(rig.settings.daemon.state_dir).is_approved("telegram", "3333333")


async def test_a_notice_shows_only_to_the_session_whose_form_said_it(rig: Rig) -> None:
    code = seed_access(rig)
    owner, csrf = await signed_in(rig, OWNER)
    omar = jar()  # a link issued now: signed_in's far-future one would end the owner's session
    link = ConsoleKeys(rig.settings.daemon.state_dir).issue_link((OMAR,), time.time())
    assert await sign_in(omar, rig.url, link) == 303
    async with owner, omar:
        async with owner.post(f"{rig.url}/console/people/approve", data={"code": code,
                              "csrf": csrf}, allow_redirects=False) as answer:
            assert answer.status == 303, await answer.text()
            back = answer.headers["Location"]
        assert "Zoe" not in back  # the address names the notice, it does not carry it
        async with owner.get(f"{rig.url}{back}") as page:
            assert "Approved telegram user 3333333 (Zoe)" in await page.text()
        async with omar.get(f"{rig.url}{back}") as page:
            text = await page.text()
        assert page.status == 200 and 'id="done"' not in text and "Zoe" not in text


# ---- who may talk ------------------------------------------------------------------------

ALLOWED = "telegram:5555555"  # on telegram.allow only: never paired, no facts
PAIRED = "telegram:4444444"  # approved by pairing, as "Yusuf"
HOSTILE_NAME = "<script>alert(1)</script>"
SNEAKY = "telegram:6666666"  # approved by pairing, under HOSTILE_NAME
DANA_WA = "whatsapp:972544401243"  # Dana's second chat, linked by [identities] dana
OMAR_TG = "telegram:7777777"  # in [people] as a guest (when the test says so), on no allow list


@dataclass
class Talking:
    url: str
    settings: Settings
    approved: float  # when the two pairings were approved


@pytest.fixture
async def talking(fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
                  make_settings: SettingsFactory, state_dir: Path,
                  request: pytest.FixtureRequest) -> AsyncIterator[Talking]:
    """Telegram on, letting in Dana and ALLOWED by its allow list (or the parameter's) and two
    senders by pairing; WhatsApp off, with Dana on its allow list; `[identities] dana` links
    her two chats; `[people]` as the parameter's third item says (none by default)."""
    allow, strangers, *people = getattr(request, "param", ((1111111, 5555555), "pair"))
    settings = make_settings(
        model={"host": fake_ollama.url}, access={"unknown_senders": strangers},
        telegram={"enabled": True, "mode": "webhook",
                  "webhook_url": "https://bot.example.org/webhooks/telegram",
                  "api_base": fake_telegram.api_base, "file_base": fake_telegram.file_base,
                  "allow": allow, "token": fake_telegram.token, "secret": "s3cret_-X"},
        whatsapp={"allow": ("972544401243",)})
    settings = replace(settings, identities=MappingProxyType({"dana": (DANA, DANA_WA)}),
                       people=MappingProxyType(people[0] if people else {}))
    now = time.time()
    book = PairingBook(state_dir)
    book.admit("telegram", "4444444", "Yusuf", now)
    book.admit("telegram", "6666666", HOSTILE_NAME, now)
    runner = web.AppRunner(build_app(settings), shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield Talking(f"http://127.0.0.1:{runner.addresses[0][1]}", settings, now)
    finally:
        await runner.cleanup()


class Cards(HTMLParser):
    """The text a reader sees in each card of the People page's `<ul class="people">`."""

    def __init__(self) -> None:
        super().__init__()
        self.cards: list[str] = []
        self._depth = 0  # lists open inside the people list; 0: outside it

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "ul" and (self._depth or ("class", "people") in attrs):
            self._depth += 1
        elif tag == "li" and self._depth == 1:
            self.cards.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "ul" and self._depth:
            self._depth -= 1

    def handle_data(self, data: str) -> None:
        if self._depth and self.cards:
            self.cards[-1] += data


def cards(page: str) -> list[str]:
    parser = Cards()
    parser.feed(page)
    return [" ".join(card.split()) for card in parser.cards]


async def people_page(served: Served, *scope: str) -> str:
    http, _ = await signed_in(served, *scope)
    async with http, http.get(f"{served.url}/console/people") as page:
        assert page.status == 200
        return await page.text()


def card_of(found: list[str], chat: str) -> str:
    (card,) = [c for c in found if chat in c]  # every chat on one card only
    return card


async def test_the_owner_sees_everyone_who_may_talk(talking: Talking) -> None:
    page = await people_page(talking, OWNER)
    found = cards(page)
    assert len(found) == 5, found
    day = datetime.fromtimestamp(talking.approved, talking.settings.daemon.tz).strftime(
        "%Y-%m-%d")
    assert card_of(found, ALLOWED) == f"no name member Telegram {ALLOWED}: allow list"
    assert card_of(found, PAIRED) == f"Yusuf member Telegram {PAIRED}: pairing, approved {day}"
    # One person on two platforms: one card with both chats, each saying what lets it in.
    dana = card_of(found, DANA)
    assert dana == card_of(found, DANA_WA)
    assert dana == (f"dana member Telegram {DANA}: allow list WhatsApp {DANA_WA}: allow list "
                    "(WhatsApp is off)")
    assert found[0] == "You owner Terminal (roost chat) console:local: owner"
    assert "<b>Telegram</b>: 2 on the allow list (telegram.allow)" in page
    assert "<b>WhatsApp</b>: off (whatsapp.enabled = false)" in page


@pytest.mark.parametrize("talking", [((), "ignore")], indirect=True)
async def test_an_empty_allow_list_is_said_to_let_nobody_in(talking: Talking) -> None:
    page = await people_page(talking, OWNER)
    assert ("<b>Telegram</b>: the allow list (telegram.allow) is empty, so it lets nobody in: "
            "only those approved by pairing may write; a stranger is ignored "
            "(access.unknown_senders = &#34;ignore&#34;).") in page
    found = cards(page)
    assert ALLOWED not in page and PAIRED in card_of(found, PAIRED)
    assert card_of(found, DANA) == (f"dana member Telegram {DANA}: may not write (on no allow "
                                    f"list, not approved) WhatsApp {DANA_WA}: allow list "
                                    "(WhatsApp is off)")


async def test_a_person_sees_only_themselves_among_who_may_talk(talking: Talking) -> None:
    others = ["Yusuf", "4444444", "5555555", "6666666", "alert", "console:local", "owner",
              "telegram.allow"]
    page = await people_page(talking, DANA, DANA_WA)  # as /console in Dana's chat scopes it
    assert cards(page) == [f"dana member Telegram {DANA}: allow list WhatsApp {DANA_WA}: "
                           "allow list (WhatsApp is off)"]
    assert not [word for word in others if word in page]
    page = await people_page(talking, ALLOWED)
    assert cards(page) == [f"no name member Telegram {ALLOWED}: allow list"]
    assert not [word for word in [*others[:2], *others[3:], "dana", "1111111", "972544401243"]
                if word in page]


async def test_a_hostile_pairing_name_stays_text(talking: Talking) -> None:
    page = await people_page(talking, OWNER)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script" not in page
    assert card_of(cards(page), SNEAKY).startswith(f"{HOSTILE_NAME} member Telegram {SNEAKY}")


@pytest.mark.parametrize("talking", [((1111111, 5555555), "pair", {
    "omar": PersonSettings((OMAR_TG,), "guest", 30)})], indirect=True)
async def test_a_person_in_people_is_let_in_with_the_role_the_config_gives(
        talking: Talking) -> None:
    page = await people_page(talking, OWNER)
    found = cards(page)
    assert card_of(found, OMAR_TG) == f"omar guest Telegram {OMAR_TG}: [people.omar]"
    assert [card.split()[:2] for card in found] == [
        ["You", "owner"], ["omar", "guest"], ["dana", "member"], ["no", "name"],
        ["Yusuf", "member"], ["<script>alert(1)</script>", "member"]]
    assert ("<b>Telegram</b>: 2 on the allow list (telegram.allow), and those listed in [people] "
            "and those approved by pairing") in page


async def test_a_code_approved_here_makes_a_guest(talking: Talking) -> None:
    state_dir = talking.settings.daemon.state_dir
    waiting = PairingBook(state_dir).request("telegram", "3333333", "telegram:3333333", "Zoe",
                                             time.time())
    assert waiting is not None
    http, csrf = await signed_in(talking, OWNER)
    async with http:
        async with http.post(f"{talking.url}/console/people/approve",
                             data={"code": waiting.code, "csrf": csrf}) as answer:
            assert "Approved telegram user 3333333 (Zoe) as a guest" in await answer.text()
        async with http.get(f"{talking.url}/console/people") as page:
            found = cards(await page.text())
    assert card_of(found, "telegram:3333333").startswith("Zoe guest Telegram telegram:3333333: "
                                                         "pairing, approved")
