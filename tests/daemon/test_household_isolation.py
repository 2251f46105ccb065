"""Every pair of a household, apart (issue 45): Dana the owner (Telegram and WhatsApp), Omar a
member (Telegram), Sam a guest (WhatsApp) and their family group, in one running daemon.

Each person keeps a private fact, talks about something of their own and sends a file. Then,
for every ordered pair (A, B): nothing of A's (fact, words, conversation, file) reaches B's
requests, B's tool results (B's model searches for A's words, reads A's conversation and A's
file by their exact names), B's console session (conversations, facts, "Always" grants), or
`roost memory list --person B`. The group recalls only itself and carries no one's private
fact; the household's facts reach owner, member and group, never the guest."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from daemon.app.serve import ENGINE, build_app
from daemon.core.config import GUEST, MEMBER, OWNER, PersonSettings, Settings
from daemon.core.messages import Inbound
from daemon.engine.workers import Engine
from daemon.store.approvals import ApprovalBook
from daemon.store.attachments import store_file
from daemon.store.console_keys import ConsoleKeys
from daemon.store.facts import HOUSEHOLD, FactsBook
from tests.conftest import RecordingChannel, SettingsFactory
from tests.daemon.app.test_app import start
from tests.daemon.console.test_console import jar, sign_in
from tests.fakes.ollama import FakeOllama, Reply

GROUP = "telegram:-1001234567890"
WIFI = "The wifi password is plum-tree-42"


@dataclass(frozen=True)
class Member:
    name: str
    chat: str  # the chat they use here
    role: str
    fact: str  # their private fact
    word: str  # a word only their conversation holds
    secret: str  # what only their file holds


PEOPLE = (
    Member("dana", "whatsapp:972544401243", OWNER, "My locker code is 4417", "zucchini",
           "dana-file-quokka"),
    Member("omar", "telegram:2222222", MEMBER, "My bike lock is 9032", "marzipan",
           "omar-file-narwhal"),
    Member("sam", "whatsapp:972500000003", GUEST, "My hotel room is 5518", "tamarind",
           "sam-file-axolotl"),
)
DANA_TELEGRAM = "telegram:1111111"


def call(tool: str, **arguments: Any) -> dict[str, Any]:
    return {"function": {"name": tool, "arguments": arguments}}


@dataclass
class Home:
    url: str
    settings: Settings
    engine: Engine
    fake: FakeOllama
    conversations: dict[str, str]  # person -> their conversation id
    files: dict[str, str]  # person -> their file's path as its note names it

    async def say(self, chat: str, text: str, sender: str | None = None,
                  attachments: tuple[dict[str, Any], ...] = ()) -> list[dict[str, Any]]:
        before = len(self.fake.chat_requests)
        assert await self.engine.submit(Inbound(chat_key=chat, text=text, received=time.time(),
                                                sender=sender, attachments=attachments))
        await asyncio.wait_for(self.engine.wait_idle(chat), 20)
        return self.fake.chat_requests[before:]


@pytest.fixture
async def home(fake_ollama: FakeOllama, make_settings: SettingsFactory,
               state_dir: Path) -> AsyncIterator[Home]:
    settings = make_settings(model={"host": fake_ollama.url})
    settings = dataclasses.replace(settings, people=MappingProxyType({
        "dana": PersonSettings(chats=(PEOPLE[0].chat, DANA_TELEGRAM), role=OWNER),
        "omar": PersonSettings(chats=(PEOPLE[1].chat,), role=MEMBER),
        "sam": PersonSettings(chats=(PEOPLE[2].chat,), role=GUEST, daily_messages=100),
    }))
    app = build_app(settings, {k: RecordingChannel(k) for k in ("telegram", "whatsapp")})
    runner, url = await start(app)
    try:
        engine = app[ENGINE]
        house = Home(url, settings, engine, fake_ollama, {}, {})
        await house.say(PEOPLE[1].chat, f"/memory household {WIFI}")
        for person in PEOPLE:
            await house.say(person.chat, f"/remember {person.fact}")
            stored = store_file(f"{person.secret}\n".encode(), state_dir / "attachments",
                                name=f"{person.name}-notes.txt", mime="text/plain")
            await house.say(person.chat, f"Here are my notes about {person.word}",
                            attachments=(stored.to_doc(),))
            conversation = engine.store.active_conversation(person.chat)
            assert conversation is not None
            house.conversations[person.name] = conversation.id
            house.files[person.name] = str(stored.path.relative_to(state_dir))
        await house.say(GROUP, "What shall we cook tonight?", sender="2222222")
        yield house
    finally:
        await runner.cleanup()


def sent_text(requests: list[dict[str, Any]]) -> str:
    return json.dumps([r["messages"] for r in requests], ensure_ascii=False)


async def test_no_pair_of_people_reaches_each_others_data(home: Home) -> None:
    for a, b in itertools.permutations(PEOPLE, 2):
        theirs = (a.fact, a.word, a.secret, home.conversations[a.name], home.files[a.name])
        # B's model goes looking for A's data by every name it could know.
        home.fake.script(
            Reply(tool_calls=[call("memory_search", query=f"{a.word} {a.fact}")]),
            Reply(tool_calls=[call("conversation_read",
                                   conversation_id=home.conversations[a.name])]),
            Reply(tool_calls=[call("file_read", path=home.files[a.name])]),
            Reply(tool_calls=[call("files_list")]),
            Reply(content="done"))
        requests = await home.say(b.chat, f"Tell me about {a.word}")
        assert len(requests) == 5, (a.name, b.name)
        seen = sent_text(requests)
        # The question names A's word; nothing else of A's may come back.
        seen = seen.replace(f"Tell me about {a.word}", "").replace(f"{a.word} {a.fact}", "")
        seen = seen.replace(home.conversations[a.name], "").replace(home.files[a.name], "")
        for item in theirs:
            assert item not in seen, (a.name, "->", b.name, item)
        # B's own data is there: the searches do work.
        assert b.fact in seen and b.word in seen


async def test_the_group_recalls_itself_and_carries_no_ones_private_fact(home: Home) -> None:
    home.fake.script(*[Reply(tool_calls=[call("memory_search", query=p.word)]) for p in PEOPLE],
                     Reply(tool_calls=[call("files_list")]), Reply(content="done"))
    requests = await home.say(GROUP, "what did everyone say?", sender="2222222")
    seen = sent_text(requests)
    for person in PEOPLE:
        seen_here = seen.replace(f'"query": "{person.word}"', "")
        assert person.fact not in seen and person.secret not in seen
        assert f"my notes about {person.word}" not in seen_here.casefold()
    assert WIFI in requests[0]["messages"][0]["content"]
    assert "<user_facts>" not in requests[0]["messages"][0]["content"]


async def test_household_facts_reach_owner_and_member_never_the_guest(home: Home) -> None:
    for person in PEOPLE:
        await home.say(person.chat, "/new")  # a fact kept mid-conversation joins the next one
        system = (await home.say(person.chat, "hello"))[0]["messages"][0]["content"]
        assert (WIFI in system) is (person.role != GUEST), person.name
        assert person.fact in system
        assert all(other.fact not in system for other in PEOPLE if other is not person)


def roost(settings: Settings, tmp: Path, *args: str) -> str:
    people = "".join(f'[people.{name}]\nchats = {json.dumps(list(p.chats))}\nrole = "{p.role}"\n'
                     for name, p in settings.people.items())
    config = tmp / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{settings.daemon.state_dir}"\n{people}')
    done = subprocess.run([sys.executable, "-m", "daemon", *args, "--config", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_each_persons_console_and_cli_show_only_their_own(home: Home,
                                                                tmp_path: Path) -> None:
    keys = ConsoleKeys(home.settings.daemon.state_dir)
    grants = ApprovalBook(home.settings.daemon.state_dir)
    for person in PEOPLE:  # each said "Always" to a tool of their own
        grants.grant(person.chat, f"{person.name}_files__read", time.time())
    for b in PEOPLE:
        listed = roost(home.settings, tmp_path, "memory", "list", "--person", b.name)
        assert b.fact in listed
        http = jar()
        async with http:
            chats = home.settings.people[b.name].chats
            assert await sign_in(http, home.url, keys.issue_link(chats, 2e9 - 1)) == 303
            async with http.get(f"{home.url}/console/") as page:
                own_list = await page.text()
            async with http.get(f"{home.url}/console/people") as page:
                people = await page.text()
            assert f"{b.name}_files__read" in people and b.fact in people
            for a in PEOPLE:
                if a is b:
                    continue
                assert a.fact not in listed
                async with http.get(
                        f"{home.url}/console/c/{home.conversations[a.name]}") as page:
                    assert page.status == 404
                    assert a.word not in await page.text()
                assert home.conversations[a.name] not in own_list
                assert a.word not in own_list
                assert f"{a.name}_files__read" not in people and a.fact not in people
    assert FactsBook.at(home.settings.daemon.state_dir).facts(HOUSEHOLD)[0].text == WIFI
