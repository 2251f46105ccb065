"""People and access in the console: pairing, standing grants and facts, each within its scope."""

from __future__ import annotations

import re
import time

import aiohttp

from daemon.intake.pairing import PairingBook
from daemon.store.approvals import ApprovalBook
from daemon.store.console_keys import OWNER, ConsoleKeys
from daemon.store.facts import FactsBook, Person
from tests.daemon.console.conftest import DANA, OMAR, T0, Rig
from tests.daemon.console.test_console import jar, sign_in

TOOL = "github__create_issue"


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


async def signed_in(rig: Rig, scope: str) -> tuple[aiohttp.ClientSession, str]:
    """A browser signed in for `scope`, and its form token."""
    http = jar()
    link = ConsoleKeys(rig.settings.daemon.state_dir).issue_link((scope,), 2e9 - 1)
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
