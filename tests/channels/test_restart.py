"""`roost run` killed with SIGKILL right after it answered a webhook call (Telegram's, then
WhatsApp's) with 200, then started again: the message is still answered, exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from channels.telegram.channel import SECRET_HEADER, WEBHOOK_PATH
from daemon.store import Store
from tests.daemon.app.test_app import free_port
from tests.fakes.graph import PHONE_NUMBER_ID, FakeGraph, sign, text_message, webhook
from tests.fakes.ollama import FakeOllama, Reply, echo_reply
from tests.fakes.telegram import FakeTelegram

SECRET = "restart-secret_1"
USER = 1111111


async def start_daemon(config: Path, env: dict[str, str],
                       url: str) -> asyncio.subprocess.Process:
    daemon = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "run", "--config", str(config), env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    # Up within a minute: its imports alone take seconds on a loaded two-core machine.
    deadline = asyncio.get_running_loop().time() + 60
    async with aiohttp.ClientSession() as http:
        while asyncio.get_running_loop().time() < deadline:
            try:
                async with http.get(f"{url}/healthz") as reply:
                    if reply.status == 200:
                        return daemon
            except aiohttp.ClientConnectionError:
                pass
            if daemon.returncode is not None:
                break
            await asyncio.sleep(0.05)
    daemon.kill()
    _, err = await daemon.communicate()
    raise AssertionError(f"roost did not come up: {err.decode()}")


def telegram_config(tmp_path: Path, fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
                    port: int, extra: str = "") -> tuple[Path, dict[str, str]]:
    """A webhook config for `roost run` against the fakes (`extra`: more [telegram] lines),
    and the environment with its secrets."""
    config = tmp_path / "roost.toml"
    config.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nlisten = "127.0.0.1:{port}"\n'
        f'shutdown_grace = "2s"\n\n'
        f'[model]\nhost = "{fake_ollama.url}"\nretry_backoff = "50ms"\n\n'
        f'[telegram]\nenabled = true\nmode = "webhook"\n'
        f'webhook_url = "https://bot.example.org{WEBHOOK_PATH}"\n'
        f'api_base = "{fake_telegram.api_base}"\nfile_base = "{fake_telegram.file_base}"\n'
        f"allow = [{USER}]\n{extra}")
    env = dict(os.environ, ROOST_TELEGRAM_TOKEN=fake_telegram.token,
               ROOST_TELEGRAM_SECRET=SECRET)
    return config, env


def private_text(update_id: int, message_id: int, text: str) -> dict[str, Any]:
    """A Telegram update: `text` from USER in their private chat."""
    return {"update_id": update_id, "message": {
        "message_id": message_id, "date": int(time.time()), "text": text,
        "chat": {"id": USER, "type": "private", "first_name": "Test"},
        "from": {"id": USER, "is_bot": False, "first_name": "Test"}}}


def post_update(http: aiohttp.ClientSession, url: str, update: dict[str, Any]) -> Any:
    """POST `update` to roost's Telegram webhook at `url`, with the secret header."""
    return http.post(url + WEBHOOK_PATH, data=json.dumps(update),
                     headers={"Content-Type": "application/json", SECRET_HEADER: SECRET})


def nothing_left(state_dir: Path, channel: str) -> bool:
    """No update, message or reply is left for the daemon to act on."""
    with Store.open(state_dir, read_only=True) as store:
        return (store.updates_pending(channel) == [] and store.inbox_pending() == []
                and store.outbox_pending() == [])


async def wait_for_nothing_left(state_dir: Path, channel: str) -> None:
    """Until the running daemon has nothing left to send: a duplicate, were there one, would
    still wait in its intake, inbox or outbox (each is marked done only after the next step
    holds it), so once all three are empty no more can come."""
    async with asyncio.timeout(10):
        # Another process's store: no event to wait on.
        while not await asyncio.to_thread(nothing_left, state_dir, channel):  # noqa: ASYNC110
            await asyncio.sleep(0.05)


async def test_killed_after_the_200_and_restarted_answers_once(
        fake_telegram: FakeTelegram, fake_ollama: FakeOllama, tmp_path: Path) -> None:
    # Slow enough that the first process cannot have answered before it is killed.
    def slow_echo(body: dict[str, Any]) -> Reply:
        return Reply(content=echo_reply(body).content, delay=0.5)

    fake_ollama.default_reply = slow_echo
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config, env = telegram_config(tmp_path, fake_telegram, fake_ollama, port)
    update = private_text(500, 7, "survive the crash")

    first = await start_daemon(config, env, url)
    try:
        async with aiohttp.ClientSession() as http, post_update(http, url, update) as reply:
            status = reply.status
            first.send_signal(signal.SIGKILL)  # at once: processing has only just begun
        await first.wait()
    finally:
        if first.returncode is None:
            first.kill()
            await first.wait()
    assert status == 200
    assert first.returncode == -signal.SIGKILL
    assert fake_telegram.sent_messages == []

    second = await start_daemon(config, env, url)
    try:
        await fake_telegram.wait_for("sendMessage", timeout=10)
        await wait_for_nothing_left(tmp_path / "state", "telegram")
        second.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(second.communicate(), 15)
        assert second.returncode == 0, err.decode()
    finally:
        if second.returncode is None:
            second.kill()
            await second.wait()
    assert [m["text"] for m in fake_telegram.sent_messages] == ["echo: survive the crash"]


async def test_whatsapp_killed_after_the_200_and_restarted_answers_once(
        fake_ollama: FakeOllama, tmp_path: Path) -> None:
    def slow_echo(body: dict[str, Any]) -> Reply:
        return Reply(content=echo_reply(body).content, delay=0.5)

    fake_ollama.default_reply = slow_echo
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with FakeGraph() as graph:
        config = tmp_path / "roost.toml"
        config.write_text(
            f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nlisten = "127.0.0.1:{port}"\n'
            f'shutdown_grace = "2s"\n\n'
            f'[model]\nhost = "{fake_ollama.url}"\nretry_backoff = "50ms"\n\n'
            f'[whatsapp]\nenabled = true\nphone_number_id = "{PHONE_NUMBER_ID}"\n'
            f'api_base = "{graph.url}"\nallow = ["972544401243"]\n')
        env = dict(os.environ, ROOST_WHATSAPP_TOKEN=graph.token,
                   ROOST_WHATSAPP_APP_SECRET="app-secret", ROOST_WHATSAPP_VERIFY_TOKEN="v")
        body = webhook(text_message("wamid.crash", "972544401243", "survive the crash"))
        first = await start_daemon(config, env, url)
        try:
            async with aiohttp.ClientSession() as http, http.post(
                    url + "/webhooks/whatsapp", data=body,
                    headers={"Content-Type": "application/json",
                             "X-Hub-Signature-256": sign("app-secret", body)}) as reply:
                status = reply.status
                first.send_signal(signal.SIGKILL)
            await first.wait()
        finally:
            if first.returncode is None:
                first.kill()
                await first.wait()
        assert status == 200 and first.returncode == -signal.SIGKILL
        assert graph.sent == []

        second = await start_daemon(config, env, url)
        try:
            await graph.wait_sent(1, timeout=10)
            await wait_for_nothing_left(tmp_path / "state", "whatsapp")
            second.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(second.communicate(), 15)
            assert second.returncode == 0, err.decode()
        finally:
            if second.returncode is None:
                second.kill()
                await second.wait()
        assert graph.texts() == ["echo: survive the crash"]
