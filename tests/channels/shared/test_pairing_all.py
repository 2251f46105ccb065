"""Pairing on every platform: a stranger gets a code and no model call; once the owner
approves it (`roost pairing approve`, here its PairingBook), the stranger is answered; an
allowed person is answered at once."""

from __future__ import annotations

import re
import time
from pathlib import Path

from daemon.intake.gate import pairing_notice
from daemon.intake.pairing import PairingBook
from tests.channels.shared.drivers import Driver, wait_seen
from tests.conftest import wait_until
from tests.fakes.ollama import FakeOllama

CODE = re.compile(r"pairing code is ([A-Z0-9]{8})\.")


async def test_a_stranger_gets_a_code_and_is_answered_once_approved(
        driver: Driver, fake_ollama: FakeOllama, state_dir: Path) -> None:
    owner = await driver.person("olive")
    stranger = await driver.person("sam")
    async with driver.roost(allow=[owner]) as daemon:
        await driver.send(stranger, "hello?")
        (notice,) = await wait_seen(driver, stranger, lambda seen: len(seen) >= 1)
        code = CODE.search(notice)
        assert code is not None and notice == pairing_notice(code[1])
        await driver.send(stranger, "anyone there?")  # a code is waiting: no second one
        # Turned away at the door (Matrix's bot syncs it in its own time): before the approval.
        await wait_until(lambda: daemon.arrivals("stranger") == 2)
        await daemon.settle(stranger)
        assert fake_ollama.chat_requests == []

        assert PairingBook(state_dir).approve(code[1], time.time()) is not None
        await driver.send(stranger, "am I in?")
        seen = await wait_seen(driver, stranger, lambda seen: len(seen) >= 2)
        await daemon.settle(stranger)
        assert await driver.seen(stranger) == seen == [notice, "echo: am I in?"]
        # The model was asked once, and what the stranger wrote before is not in it.
        (request,) = fake_ollama.chat_requests
        asked = "\n".join(str(m.get("content")) for m in request["messages"])
        assert "am I in?" in asked and "hello?" not in asked and "anyone there" not in asked


async def test_an_allowed_person_is_answered_at_once(
        driver: Driver, fake_ollama: FakeOllama, state_dir: Path) -> None:
    owner = await driver.person("olive")
    async with driver.roost(allow=[owner]) as daemon:
        await driver.send(owner, "good morning")
        await wait_seen(driver, owner, lambda seen: len(seen) >= 1)
        await daemon.settle(owner)
        assert await driver.seen(owner) == ["echo: good morning"]
        assert len(fake_ollama.chat_requests) == 1
        assert PairingBook(state_dir).pending(time.time()) == []
