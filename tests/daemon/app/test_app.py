"""The daemon process: /healthz, start-up and shutdown order, graceful stop mid-turn."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from channels.telegram.channel import SECRET_HEADER as TG_SECRET_HEADER
from channels.telegram.channel import WEBHOOK_PATH as TG_WEBHOOK_PATH
from daemon.app.assembly import DaemonParts, assemble
from daemon.app.serve import AUTOMATIONS, ENGINE, Tuning, build_app
from daemon.core.config import AutomationSettings
from daemon.core.messages import Inbound
from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.store.search_index import SearchIndex
from daemon.tools.registry import Capability, Tool
from tests.conftest import RecordingChannel, SettingsFactory
from tests.fakes.ollama import FakeOllama, Reply
from tests.fakes.telegram import FakeTelegram

TG_SECRET = "s3cret_-X"

CHAT = "telegram:1111111"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def start(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def test_healthz_answers_from_cached_state_without_hosts_or_chat_ids(
    fake_ollama: FakeOllama, make_settings: SettingsFactory
) -> None:
    channel = RecordingChannel("telegram")
    app = build_app(make_settings(model={"host": fake_ollama.url}), {"telegram": channel},
                    tuning=Tuning(health_interval=0.05))
    runner, url = await start(app)
    try:
        async with aiohttp.ClientSession() as http, http.get(f"{url}/healthz") as reply:
            assert reply.status == 200
            text = await reply.text()
            body = json.loads(text)
        assert body["status"] == "ok" and body["reasons"] == []
        assert body["model"] == {"name": "qwen3:4b", "reachable": True, "pulled": True}
        assert body["channels"] == ["telegram"]
        assert body["queued"] == 0
        assert body["version"]
        assert "127.0.0.1" not in text and str(fake_ollama.port) not in text
        await fake_ollama.refuse_connections()
        async with aiohttp.ClientSession() as http:
            for _ in range(200):  # the background probe notices within a few intervals
                async with http.get(f"{url}/healthz") as reply:
                    body = await reply.json()
                if body["status"] != "ok":
                    break
                await asyncio.sleep(0.05)
        assert body["status"] == "degraded" and body["reasons"] == ["ollama unreachable"]
        assert body["model"]["reachable"] is False
    finally:
        await runner.cleanup()


async def test_healthz_hits_do_not_call_ollama(
    fake_ollama: FakeOllama, make_settings: SettingsFactory
) -> None:
    app = build_app(make_settings(model={"host": fake_ollama.url}))
    runner, url = await start(app)
    try:
        before = len(fake_ollama.requests)
        async with aiohttp.ClientSession() as http:
            for _ in range(20):
                async with http.get(f"{url}/healthz") as reply:
                    assert reply.status == 200
        assert len(fake_ollama.requests) == before
    finally:
        await runner.cleanup()


async def test_parts_start_in_order_and_stop_in_reverse(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, state_dir: Path
) -> None:
    events: list[str] = []
    app = build_app(make_settings(model={"host": fake_ollama.url}))

    async def probe(app: web.Application) -> object:
        events.append(f"probe up, engine accepting={app[ENGINE].accepting}")
        yield
        events.append(f"probe down, engine accepting={app[ENGINE].accepting}")

    app.cleanup_ctx.append(probe)
    runner, _ = await start(app)
    await runner.cleanup()
    assert events == ["probe up, engine accepting=True", "probe down, engine accepting=True"]
    # After the engine stops, the store is closed: the state directory's lock is free again.
    assert not app[ENGINE].accepting
    Store.open(state_dir).close()


async def test_graceful_stop_lets_a_turn_in_flight_finish(
    fake_ollama: FakeOllama, make_settings: SettingsFactory
) -> None:
    channel = RecordingChannel("telegram")
    fake_ollama.script(Reply(content="finished before exit", delay=0.4))
    app = build_app(make_settings(model={"host": fake_ollama.url},
                                  daemon={"shutdown_grace": 5.0}), {"telegram": channel})
    runner, _ = await start(app)
    engine = app[ENGINE]
    assert await engine.submit(Inbound(chat_key=CHAT, text="quick one", received=time.time()))
    await fake_ollama.wait_for_chats(1)
    await runner.cleanup()
    assert channel.texts("reply") == ["finished before exit"]
    assert not await engine.submit(Inbound(chat_key=CHAT, text="late", received=time.time()))


async def test_a_turn_past_the_grace_is_persisted_and_answered_after_restart(
    fake_ollama: FakeOllama, make_settings: SettingsFactory
) -> None:
    channel = RecordingChannel("telegram")
    # A model that does not answer within the test: the stop ending at all is the turn cut off.
    fake_ollama.script(Reply(content="never delivered", delay=3600))
    settings = make_settings(model={"host": fake_ollama.url}, daemon={"shutdown_grace": 0.2})
    app = build_app(settings, {"telegram": channel})
    runner, _ = await start(app)
    assert await app[ENGINE].submit(Inbound(chat_key=CHAT, text="slow", received=time.time()))
    await fake_ollama.wait_for_chats(1)
    await asyncio.wait_for(runner.cleanup(), 30)
    assert channel.sent == []
    restarted = build_app(settings, {"telegram": channel})
    runner, _ = await start(restarted)
    await asyncio.wait_for(restarted[ENGINE].wait_idle(CHAT), 10)
    await runner.cleanup()
    assert channel.texts("reply") == ["echo: slow"]


async def start_roost_run(
    fake_ollama: FakeOllama, tmp_path: Path,
) -> tuple[asyncio.subprocess.Process, dict[str, Any]] | None:
    """`roost run` on a free port, and its first /healthz; None when the port was taken by
    another test's server between choosing it and roost's bind (roost then exits)."""
    port = free_port()
    config = tmp_path / "roost.toml"
    config.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nlisten = "127.0.0.1:{port}"\n\n'
        f'[model]\nhost = "{fake_ollama.url}"\n'
    )
    daemon = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "run", "--config", str(config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    # Up within a minute: its imports alone take seconds on a loaded two-core machine.
    deadline = asyncio.get_running_loop().time() + 60
    async with aiohttp.ClientSession() as http:
        while asyncio.get_running_loop().time() < deadline and daemon.returncode is None:
            try:
                async with http.get(f"http://127.0.0.1:{port}/healthz") as reply:
                    if reply.content_type == "application/json":
                        return daemon, await reply.json()
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.1)
    if daemon.returncode is None:
        daemon.kill()
    await daemon.wait()
    return None


async def test_roost_run_serves_health_and_exits_0_on_sigterm(
    fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    for _ in range(3):  # a port another test took meanwhile: another one
        started = await start_roost_run(fake_ollama, tmp_path)
        if started is not None:
            break
    assert started is not None, "roost run did not come up"
    daemon, body = started
    try:
        assert body["model"]["reachable"] is True
        daemon.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(daemon.communicate(), 15)
        assert daemon.returncode == 0, err.decode()
        assert b"stopped" in err
    finally:
        if daemon.returncode is None:
            daemon.kill()
            await daemon.wait()


async def test_while_draining_healthz_says_stopping_and_new_work_is_refused(
    fake_ollama: FakeOllama, make_settings: SettingsFactory
) -> None:
    channel = RecordingChannel("telegram")
    fake_ollama.script(Reply(content="the last answer", delay=0.5))
    app = build_app(make_settings(model={"host": fake_ollama.url}), {"telegram": channel})
    runner, url = await start(app)
    engine = app[ENGINE]
    try:
        assert await engine.submit(Inbound(chat_key=CHAT, text="one", received=time.time()))
        await fake_ollama.wait_for_chats(1)
        draining = asyncio.create_task(engine.drain(5.0))
        async with asyncio.timeout(5):
            while engine.accepting:  # noqa: ASYNC110 (a flag, no event to wait on)
                await asyncio.sleep(0.01)
        async with aiohttp.ClientSession() as http, http.get(f"{url}/healthz") as reply:
            assert reply.status == 503
            assert (await reply.json())["accepting"] is False
        assert not await engine.submit(Inbound(chat_key=CHAT, text="two", received=time.time()))
        await draining
        assert channel.texts("reply") == ["the last answer"]
    finally:
        await runner.cleanup()


async def _run_roost(config: Path, env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "run", "--config", str(config), env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)


async def test_the_whole_stop_keeps_within_the_shutdown_budget_and_loses_nothing(
    fake_ollama: FakeOllama, fake_telegram: FakeTelegram, tmp_path: Path
) -> None:
    # A model that never answers holds a turn for the whole drain; everything after it (the
    # cancel, aiohttp's wait, closing the parts) must come out of the same budget.
    budget = 3.0
    port = free_port()
    config = tmp_path / "roost.toml"
    config.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nlisten = "127.0.0.1:{port}"\n'
        f'shutdown_grace = "{budget:.0f}s"\n'
        f'[model]\nhost = "{fake_ollama.url}"\n'
        f'[telegram]\nenabled = true\nwebhook_url = "https://bot.example.org/webhooks/telegram"\n'
        f'api_base = "{fake_telegram.api_base}"\nfile_base = "{fake_telegram.file_base}"\n'
        f'allow = [1111111]\n')
    env = {**os.environ, "ROOST_TELEGRAM_TOKEN": fake_telegram.token,
           "ROOST_TELEGRAM_SECRET": TG_SECRET}
    update = {"update_id": 1, "message": {
        "message_id": 1, "date": 1700000000, "text": "are you there",
        "chat": {"id": 1111111, "type": "private", "first_name": "Test"},
        "from": {"id": 1111111, "is_bot": False, "first_name": "Test"}}}
    fake_ollama.hang = True
    daemon = await _run_roost(config, env)
    try:
        await fake_telegram.wait_for("setWebhook", timeout=30)
        async with aiohttp.ClientSession() as http, http.post(
                f"http://127.0.0.1:{port}{TG_WEBHOOK_PATH}", json=update,
                headers={TG_SECRET_HEADER: TG_SECRET}) as reply:
            assert reply.status == 200
        await fake_ollama.wait_for_chats(1, timeout=30)
        started = time.monotonic()
        daemon.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(daemon.communicate(), 60)
        took = time.monotonic() - started
    finally:
        if daemon.returncode is None:
            daemon.kill()
            await daemon.wait()
    assert daemon.returncode == 0, err.decode()[-3000:]
    print(f"stopped in {took:.2f}s with a {budget:.0f}s shutdown budget")
    # Generous for a loaded machine, and still below two drains (what it took before).
    assert took < budget + 1.5, f"stopping took {took:.2f}s with a {budget:.0f}s budget"
    assert fake_telegram.calls_to("sendMessage") == []
    fake_ollama.hang = False  # the next start answers what the stop interrupted
    daemon = await _run_roost(config, env)
    try:
        sent = await fake_telegram.wait_for("sendMessage", timeout=30)
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(daemon.communicate(), 60)
    assert daemon.returncode == 0, err.decode()[-3000:]
    assert [c.params["text"] for c in sent] == ["echo: are you there"]


async def test_a_run_that_does_not_let_go_when_cancelled_cannot_hold_the_stop(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # An extra tool whose clean-up hangs (a connection that never closes): cancelling the run
    # does not end it. The stop leaves it after its share of the budget instead of waiting.
    started, release = asyncio.Event(), asyncio.Event()

    async def hold(context: object) -> str:
        try:
            started.set()
            await asyncio.Event().wait()
        finally:
            await release.wait()
        return "never"

    settings = make_settings(model={"host": fake_ollama.url}, daemon={"shutdown_grace": 2.0})
    settings = dataclasses.replace(settings, automations=(AutomationSettings(
        name="brief", schedule="0 0 1 1 *", prompt="Anything new?", deliver=("log",)),))
    app = build_app(settings)
    runner, _ = await start(app)
    app[ENGINE].parts.registry.register(Capability(
        name="stuck", description="a tool that does not let go", core=True, tools=(
            Tool("hold", "Hold on.", {"type": "object", "properties": {}}, hold),)))
    fake_ollama.script(Reply(tool_calls=[{"function": {"name": "hold", "arguments": {}}}]))
    run = asyncio.create_task(app[AUTOMATIONS].run_now("brief"))
    try:
        await asyncio.wait_for(started.wait(), 10)
        async with asyncio.timeout(15):  # before, the stop waited for the tool forever
            await runner.cleanup()
        assert any("did not stop within" in r.getMessage() for r in caplog.records
                   if r.levelno == logging.WARNING)
    finally:
        release.set()
        await asyncio.gather(run, return_exceptions=True)


class StuckIndex(SearchIndex):
    """An index whose first full build takes longer than any stop may wait (a huge store)."""

    release = threading.Event()

    def sync(self, store: Store, conversation_ids: Iterable[str] | None = None) -> int:
        self.release.wait(30)
        return 0


async def test_a_long_index_build_cannot_hold_the_engines_stop(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(model={"host": fake_ollama.url})
    store = Store.open(settings.daemon.state_dir)
    llm = ModelClient(settings.model)
    index = StuckIndex.open(settings.daemon.state_dir / "memory.sqlite3")
    engine = assemble(settings, store, llm, {}, extra=DaemonParts(index=index)).engine
    await engine.start()
    try:
        async with asyncio.timeout(10):  # before, the stop waited for the build to end
            await engine.stop(0.1, unwind=0.2)
        assert any("did not stop within" in r.getMessage() for r in caplog.records
                   if r.levelno == logging.WARNING)
    finally:
        StuckIndex.release.set()
        await llm.close()
        store.close()
