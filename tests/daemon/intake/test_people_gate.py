"""People with roles at the door, through Telegram (the fake Bot API, roost's real webhook): a
person the config lists in `[people]` is answered without pairing and without being on
telegram.allow, a stranger still gets a code; `roost pairing approve --role`, `roost people
set-role` and `roost people remove`, run as commands while the daemon runs, reach it at once."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from types import MappingProxyType

import aiohttp
import pytest
from aiohttp import web

from channels.telegram.channel import SECRET_HEADER, WEBHOOK_PATH
from daemon.app.serve import ACCESS, ENGINE, build_app
from daemon.core.config import PersonSettings
from daemon.intake.household import Household
from tests.conftest import SettingsFactory, wait_until
from tests.daemon.intake.test_pairing import roost
from tests.fakes.ollama import FakeOllama
from tests.fakes.telegram import FakeTelegram

SECRET = "s3cret_-X"
OWNER = 1111111  # on telegram.allow
OMAR = 2222222  # in [people] only
STRANGER = 3333333
CODE = re.compile(r"pairing code is ([A-Z0-9]{8})\.")
PEOPLE = '[people.omar]\nchats = ["telegram:2222222"]\nrole = "member"\n'


@dataclass
class Running:
    app: web.Application
    url: str
    config: Path  # the same state directory and [people], for the `roost` commands
    fake: FakeTelegram
    ids: count[int]

    @property
    def household(self) -> Household:
        return self.app[ACCESS].household

    async def post(self, user: int, text: str) -> None:
        self.fake.start_chat(user)  # a user who writes to the bot has started it
        update_id = next(self.ids)
        update = {"update_id": update_id, "message": {
            "message_id": update_id, "date": 1700000000, "text": text,
            "chat": {"id": user, "type": "private", "first_name": f"User {user}"},
            "from": {"id": user, "is_bot": False, "first_name": f"User {user}"}}}
        async with aiohttp.ClientSession() as http, http.post(
                self.url, json=update, headers={SECRET_HEADER: SECRET}) as reply:
            assert reply.status == 200

    async def settle(self, user: int) -> None:
        """Until the user's chat has no turn running and nothing left to send."""
        await asyncio.wait_for(self.app[ENGINE].wait_idle(f"telegram:{user}"), 10)

    def texts_to(self, user: int) -> list[str]:
        return [str(m["text"]) for m in self.fake.sent_messages if m["chat_id"] == user]


@pytest.fixture
async def running(fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
                  make_settings: SettingsFactory, state_dir: Path, tmp_path: Path
                  ) -> AsyncIterator[Running]:
    settings = make_settings(
        model={"host": fake_ollama.url},
        telegram={"enabled": True, "mode": "webhook",
                  "webhook_url": "https://bot.example.org/webhooks/telegram",
                  "api_base": fake_telegram.api_base, "file_base": fake_telegram.file_base,
                  "allow": (OWNER,), "token": fake_telegram.token, "secret": SECRET})
    settings = dataclasses.replace(settings, people=MappingProxyType(
        {"omar": PersonSettings((f"telegram:{OMAR}",), "member")}))
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{state_dir}"\n{PEOPLE}')
    app = build_app(settings)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield Running(app, f"http://127.0.0.1:{runner.addresses[0][1]}{WEBHOOK_PATH}", config,
                      fake_telegram, count(1))
    finally:
        await runner.cleanup()


async def paired_code(running: Running, user: int) -> str:
    """The code a stranger is told when they write."""
    await running.post(user, "hello?")
    await wait_until(lambda: len(running.texts_to(user)) == 1)
    code = CODE.search(running.texts_to(user)[0])
    assert code is not None
    return code[1]


async def test_a_person_in_people_is_answered_without_pairing_and_a_stranger_gets_a_code(
        running: Running, fake_ollama: FakeOllama) -> None:
    await running.post(OMAR, "hi, it's Omar")
    await wait_until(lambda: running.texts_to(OMAR) == ["echo: hi, it's Omar"])
    code = await paired_code(running, STRANGER)
    await running.settle(OMAR)
    assert len(fake_ollama.chat_requests) == 1  # Omar's message only
    assert running.household.role_of(f"telegram:{OMAR}") == "member"
    assert running.household.role_of(f"telegram:{STRANGER}") is None
    status, listed = await roost(running.config, "pairing", "list")
    assert status == 0 and code in listed and f"telegram:{OMAR}" not in listed


async def test_a_role_set_by_command_reaches_the_running_daemon(running: Running) -> None:
    code = await paired_code(running, STRANGER)
    status, said = await roost(running.config, "pairing", "approve", code, "--role", "guest")
    assert status == 0 and "as a guest" in said
    assert running.household.role_of(f"telegram:{STRANGER}") == "guest"
    person = running.household.person(f"telegram:{STRANGER}")
    assert person is not None and person.daily_messages == 30

    status, said = await roost(running.config, "people", "set-role", f"telegram:{STRANGER}",
                               "member")
    assert status == 0 and "now a member" in said
    assert running.household.role_of(f"telegram:{STRANGER}") == "member"  # no restart
    person = running.household.person(f"telegram:{STRANGER}")
    assert person is not None and person.daily_messages is None
    await running.post(STRANGER, "am I in?")
    await wait_until(lambda: running.texts_to(STRANGER)[1:] == ["echo: am I in?"])


async def test_a_removed_person_gets_a_pairing_code_again(running: Running) -> None:
    code = await paired_code(running, STRANGER)
    assert (await roost(running.config, "pairing", "approve", code))[0] == 0
    await running.post(STRANGER, "thanks")
    await wait_until(lambda: running.texts_to(STRANGER)[1:] == ["echo: thanks"])

    status, said = await roost(running.config, "people", "remove", f"telegram:{STRANGER}")
    assert status == 0 and "next message gets a pairing code" in said
    await running.post(STRANGER, "still there?")
    await wait_until(lambda: len(running.texts_to(STRANGER)) == 3)
    again = CODE.search(running.texts_to(STRANGER)[2])
    assert again is not None and again[1] != code
    assert running.household.person(f"telegram:{STRANGER}") is None

    # A person the config names is not removed by a command: the config says so.
    status, said = await roost(running.config, "people", "remove", "omar")
    assert status == 2 and "[people.omar]" in said
    await running.post(OMAR, "me too?")
    await wait_until(lambda: running.texts_to(OMAR) == ["echo: me too?"])
