"""Pairing end to end: a stranger gets a code and nothing from the model; the owner approves
it with `roost pairing approve` while the daemon runs; from then on the sender is answered."""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from channels.telegram.channel import SECRET_HEADER, WEBHOOK_PATH
from daemon.app.serve import METRICS, PLATFORMS, STORE, build_app
from daemon.intake.gate import SLOW_DOWN, RateLimit
from daemon.intake.pairing import PairingBook
from tests.conftest import SettingsFactory
from tests.fakes.ollama import FakeOllama
from tests.fakes.telegram import FakeTelegram

SECRET = "s3cret_-X"
OWNER = 1111111
STRANGER = 2222222
HOOK_URL = "https://bot.example.org/webhooks/telegram"
CODE = re.compile(r"pairing code is ([A-Z0-9]{8})\.")

Post = Callable[[int, str], Awaitable[None]]


def _update(update_id: int, user: int, text: str) -> dict[str, Any]:
    return {"update_id": update_id, "message": {
        "message_id": update_id, "date": 1700000000, "text": text,
        "chat": {"id": user, "type": "private", "first_name": f"User {user}"},
        "from": {"id": user, "is_bot": False, "first_name": f"User {user}"}}}


@pytest.fixture
async def daemon(fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
                 make_settings: SettingsFactory, tmp_path: Path,
                 request: pytest.FixtureRequest) -> AsyncIterator[tuple[Post, web.Application]]:
    access = getattr(request, "param", {})
    settings = make_settings(
        model={"host": fake_ollama.url}, access=access,
        telegram={"enabled": True, "mode": "webhook", "webhook_url": HOOK_URL,
                  "api_base": fake_telegram.api_base, "file_base": fake_telegram.file_base,
                  "allow": (OWNER,), "token": fake_telegram.token, "secret": SECRET})
    app = build_app(settings)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}{WEBHOOK_PATH}"
    counter = iter(range(1, 10_000))

    async def post(user: int, text: str) -> None:
        fake_telegram.start_chat(user)  # a user who writes to the bot has started it
        async with aiohttp.ClientSession() as http, http.post(
                url, json=_update(next(counter), user, text),
                headers={SECRET_HEADER: SECRET}) as reply:
            assert reply.status == 200

    try:
        yield post, app
    finally:
        await runner.cleanup()


async def roost(config: Path, *args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", *args, "--config", str(config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode() + err.decode()


def texts_to(fake: FakeTelegram, user: int) -> list[str]:
    return [str(m["text"]) for m in fake.sent_messages if m["chat_id"] == user]


async def test_a_stranger_is_paired_by_the_owner_while_the_daemon_runs(
    daemon: tuple[Post, web.Application], fake_telegram: FakeTelegram,
    fake_ollama: FakeOllama, state_dir: Path, tmp_path: Path
) -> None:
    post, _ = daemon
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{state_dir}"\n')
    for text in ("hello?", "anyone there?", "hello!!"):
        await post(STRANGER, text)
    await fake_telegram.wait_for("sendMessage")
    [notice] = texts_to(fake_telegram, STRANGER)
    code = CODE.search(notice)
    assert code is not None and f"roost pairing approve {code[1]}" in notice
    assert fake_ollama.chat_requests == []

    status, listed = await roost(config, "pairing", "list")
    assert status == 0 and code[1] in listed and f"telegram:{STRANGER}" in listed
    assert (await roost(config, "pairing", "approve", "NOSUCH12"))[0] == 1
    status, said = await roost(config, "pairing", "approve", code[1].lower())
    assert status == 0 and "approved" in said

    fake_ollama.script("now I know you")
    await post(STRANGER, "am I in?")
    await fake_telegram.wait_for("sendMessage", 2, timeout=20)
    assert texts_to(fake_telegram, STRANGER)[1:] == ["now I know you"]
    assert len(fake_ollama.chat_requests) == 1  # the earlier messages never reached it
    status, listed = await roost(config, "pairing", "list")
    assert f"approved  telegram:{STRANGER}" in listed and code[1] not in listed


async def test_strangers_get_at_most_three_codes_and_a_denied_code_is_gone(
    daemon: tuple[Post, web.Application], fake_telegram: FakeTelegram,
    fake_ollama: FakeOllama, state_dir: Path, tmp_path: Path
) -> None:
    post, app = daemon
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{state_dir}"\n')
    for user in range(3000001, 3000006):
        await post(user, "let me in")
    await fake_telegram.wait_for("sendMessage", 3)
    status, listed = await roost(config, "pairing", "list")
    codes = re.findall(r"^([A-Z0-9]{8})  ", listed, re.MULTILINE)
    assert len(codes) == 3
    status, said = await roost(config, "pairing", "deny", codes[0])
    assert status == 0 and "denied" in said
    status, listed = await roost(config, "pairing", "list")
    assert codes[0] not in listed
    assert (await roost(config, "pairing", "approve", codes[0]))[0] == 1
    assert fake_ollama.chat_requests == []
    book = (state_dir / "pairing.json").read_text()
    assert book.count('"code"') == 2  # the book holds only what waits
    intake = app[PLATFORMS]["telegram"].intake
    assert intake is not None
    await asyncio.wait_for(intake.idle(), 10)
    metrics = text_string_to_metric_families(app[METRICS].exposition().decode())
    strangers = [s.value for f in metrics for s in f.samples
                 if s.name == "roost_inbound_messages_total" and s.labels["outcome"] == "stranger"]
    assert strangers == [5]


@pytest.mark.parametrize("daemon", [{"rate_limit": 1}], indirect=True)
async def test_over_the_rate_limit_messages_are_kept_and_the_sender_told_once(
    daemon: tuple[Post, web.Application], fake_telegram: FakeTelegram, fake_ollama: FakeOllama
) -> None:
    post, app = daemon
    fake_ollama.script("first")
    for text in ("one", "two", "three"):
        await post(OWNER, text)
    await fake_telegram.wait_for("sendMessage", 2, timeout=20)
    for _ in range(100):
        if SLOW_DOWN in texts_to(fake_telegram, OWNER) and "first" in texts_to(
                fake_telegram, OWNER):
            break
        await asyncio.sleep(0.05)
    assert sorted(texts_to(fake_telegram, OWNER)) == sorted(["first", SLOW_DOWN])
    pending = app[STORE].updates_pending("telegram")
    assert len(pending) == 2  # kept, to be answered when the minute is over


def test_rate_limit_counts_per_sender_per_minute() -> None:
    limit = RateLimit(per_minute=2)
    assert limit.delay("a", 100.0) == 0 and limit.delay("a", 101.0) == 0
    assert limit.delay("a", 102.0) == pytest.approx(58.0)
    assert limit.delay("b", 102.0) == 0  # each sender has their own
    assert limit.tell("a") and not limit.tell("a")  # one notice per flood
    assert limit.delay("a", 160.5) == 0  # the first one left the window


def test_a_code_expires_after_an_hour(state_dir: Path) -> None:
    book = PairingBook(state_dir)
    made = book.request("telegram", "5", "telegram:5", "Five", now=1000.0)
    assert made is not None and len(made.code) == 8
    assert book.request("telegram", "5", "telegram:5", "Five", now=1001.0) is None
    assert book.approve(made.code, now=1000.0 + 3600) is None
    assert not book.is_approved("telegram", "5")


async def test_revoke_removes_an_approved_sender(tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{state}"\n')
    book = PairingBook(state)
    for user in (STRANGER, 3000001):
        made = book.request("telegram", str(user), f"telegram:{user}", f"User {user}", 1e9)
        assert made is not None and book.approve(made.code, 1e9) is not None
    status, listed = await roost(config, "pairing", "list")
    assert status == 0 and listed.splitlines()[0].split()[:4] == ["CODE", "SENDER", "NAME", "WHEN"]
    status, said = await roost(config, "pairing", "revoke", f"telegram:{STRANGER}")
    assert status == 0 and "revoked" in said, said
    assert not book.is_approved("telegram", str(STRANGER))
    assert book.is_approved("telegram", "3000001")
    status, said = await roost(config, "pairing", "revoke", f"telegram:{STRANGER}")
    assert status == 1 and "not an approved sender" in said
