"""roost's HTTP server under misuse: idle sockets, slow and malformed requests, strangers,
a second instance, and /metrics as Prometheus reads it."""

from __future__ import annotations

import asyncio
import logging
import re
import resource
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from channels.telegram.channel import SECRET_HEADER, WEBHOOK_PATH
from daemon.app.httpguard import GuardedSite, HttpLimits, bind
from daemon.app.serve import Tuning, build_app, serve
from tests.conftest import SettingsFactory
from tests.daemon.app.test_app import free_port
from tests.fakes.ollama import FakeOllama
from tests.fakes.telegram import FakeTelegram

SECRET = "s3cret_-X"
USER = 1111111
HOOK_URL = "https://bot.example.org/webhooks/telegram"


def _raise_fd_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.skip(f"this test needs {wanted} file descriptors; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def _default_fd_limit() -> None:  # the child: the 1,024 a service gets without LimitNOFILE
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(
        resource.RLIMIT_NOFILE)[1]))


async def test_1200_idle_connections_do_not_stop_healthz(
    fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    _raise_fd_limit(4096)
    port = free_port()
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
                      f'listen = "127.0.0.1:{port}"\n[model]\nhost = "{fake_ollama.url}"\n')
    daemon = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "run", "--config", str(config),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        preexec_fn=_default_fd_limit)
    idle: list[asyncio.StreamWriter] = []
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(200):
                try:
                    async with http.get(f"http://127.0.0.1:{port}/healthz"):
                        break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.1)
        for _ in range(1200):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            idle.append(writer)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http, \
                http.get(f"http://127.0.0.1:{port}/healthz") as reply:
            assert reply.status == 200
            assert (await reply.json())["status"] == "ok"
        assert daemon.returncode is None
    finally:
        for writer in idle:
            writer.close()
        if daemon.returncode is None:
            daemon.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(daemon.communicate(), 30)
    assert daemon.returncode == 0, err.decode()[-2000:]
    assert b"Traceback" not in err and b"accept" not in err.lower()


@pytest.fixture
async def guarded(fake_ollama: FakeOllama,
                  make_settings: SettingsFactory) -> AsyncIterator[tuple[str, int]]:
    """roost's app behind a GuardedSite with short deadlines and a cap of 4 connections."""
    limits = HttpLimits(max_connections=4, header_timeout=0.3, body_timeout=0.3)
    app = build_app(make_settings(model={"host": fake_ollama.url}), tuning=Tuning(http=limits))
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    sock = bind("127.0.0.1", 0)
    site = GuardedSite(runner, sock, limits)
    await site.start()
    try:
        yield "127.0.0.1", sock.getsockname()[1]
    finally:
        await runner.cleanup()


async def test_a_connection_without_a_request_is_closed(guarded: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*guarded)
    try:
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by roost, unanswered
    finally:
        writer.close()


async def test_a_later_request_head_on_a_kept_alive_connection_has_a_deadline_too(
    guarded: tuple[str, int]
) -> None:
    reader, writer = await asyncio.open_connection(*guarded)
    try:
        body = b'{"x": 1}'
        writer.write(b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert first.startswith(b"HTTP/1.1 404")
        await asyncio.wait_for(reader.readexactly(int(re.search(
            rb"Content-Length: (\d+)", first)[1])), 10)  # type: ignore[index]
        second = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert second.startswith(b"HTTP/1.1 200")  # both served on the one connection
        await asyncio.wait_for(reader.readexactly(int(re.search(
            rb"Content-Length: (\d+)", second)[1])), 10)  # type: ignore[index]
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and then nothing more
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed, unanswered
    finally:
        writer.close()


async def test_a_body_that_never_arrives_gets_408(guarded: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*guarded)
    try:
        writer.write(b"POST /webhooks/telegram HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a\"")
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 10)
        assert status.startswith(b"HTTP/1.1 408")
    finally:
        writer.close()


async def test_at_the_cap_the_oldest_idle_connection_makes_room(guarded: tuple[str, int]) -> None:
    host, port = guarded
    idle = [await asyncio.open_connection(host, port) for _ in range(4)]
    try:
        async with aiohttp.ClientSession() as http, \
                http.get(f"http://{host}:{port}/healthz") as reply:
            assert reply.status == 200
        assert await asyncio.wait_for(idle[0][0].read(), 10) == b""  # the oldest was closed
    finally:
        for _, writer in idle:
            writer.close()


async def test_a_malformed_request_is_one_short_log_line(
    guarded: tuple[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for _ in range(3):
        reader, writer = await asyncio.open_connection(*guarded)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert answer.startswith(b"HTTP/1.0 400")
    lines = [r for r in caplog.records if r.name.startswith(("aiohttp.server", "roost"))]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].exc_info is None and "\n" not in lines[0].getMessage()
    assert "malformed request" in lines[0].getMessage()


@pytest.fixture
async def telegram_app(fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
                       make_settings: SettingsFactory) -> AsyncIterator[str]:
    settings = make_settings(
        model={"host": fake_ollama.url},
        telegram={"enabled": True, "mode": "webhook", "webhook_url": HOOK_URL,
                  "api_base": fake_telegram.api_base, "file_base": fake_telegram.file_base,
                  "allow": (USER,), "token": fake_telegram.token, "secret": SECRET})
    app = build_app(settings)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def _update(update_id: int, text: str) -> dict[str, object]:
    return {"update_id": update_id, "message": {
        "message_id": update_id, "date": 1700000000, "text": text,
        "chat": {"id": USER, "type": "private", "first_name": "Test"},
        "from": {"id": USER, "is_bot": False, "first_name": "Test"}}}


def _metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_strangers_are_logged_once_a_minute_and_counted_in_metrics(
    telegram_app: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="roost")
    async with aiohttp.ClientSession() as http:
        for i in range(10):
            async with http.post(telegram_app + WEBHOOK_PATH, json=_update(i + 1, "hi"),
                                 headers={SECRET_HEADER: "guess"}) as reply:
                assert reply.status == 403
        async with http.post(telegram_app + WEBHOOK_PATH, data="x=1",
                             headers={SECRET_HEADER: SECRET,
                                      "Content-Type": "application/x-www-form-urlencoded"}
                             ) as reply:
            assert reply.status == 415
        async with http.get(telegram_app + "/metrics") as reply:
            assert reply.status == 200
            samples = _metrics(await reply.text())
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 2, refused
    assert samples[("roost_webhook_rejections_total", (("cause", "wrong secret"),))] == 10
    assert samples[("roost_webhook_rejections_total", (("cause", "wrong content type"),))] == 1


async def test_metrics_count_a_message_through_its_reply(
    telegram_app: str, fake_telegram: FakeTelegram, fake_ollama: FakeOllama
) -> None:
    fake_ollama.script("an answer")
    async with aiohttp.ClientSession() as http:
        async with http.post(telegram_app + WEBHOOK_PATH, json=_update(7, "hello"),
                             headers={SECRET_HEADER: SECRET}) as reply:
            assert reply.status == 200
        await fake_telegram.wait_for("sendMessage", timeout=20)
        sent = ("roost_outbound_messages_total", (("channel", "telegram"), ("outcome", "sent")))
        for _ in range(200):  # the count follows Telegram's answer to sendMessage
            async with http.get(telegram_app + "/metrics") as reply:
                assert reply.content_type == "text/plain"
                text = await reply.text()
            samples = _metrics(text)
            if sent in samples and samples[("roost_queued_messages", ())] == 0:
                break  # delivered, and the turn is over
            await asyncio.sleep(0.05)
    assert samples[("roost_inbound_messages_total",
                    (("channel", "telegram"), ("outcome", "accepted")))] == 1
    assert samples[sent] >= 1
    assert samples[("roost_turn_seconds_count", ())] >= 1
    assert samples[("roost_prompt_tokens_total", (("kind", "turn"),))] > 0
    assert samples[("roost_eval_tokens_total", (("kind", "turn"),))] > 0
    assert 0 < samples[("roost_uncached_prompt_tokens_total", ())] <= samples[
        ("roost_prompt_tokens_total", (("kind", "turn"),))]
    assert samples[("roost_queued_messages", ())] == 0
    assert samples[("roost_healthy", ())] == 1
    assert str(USER) not in text and "127.0.0.1" not in text



# Heads that announce a body and send none. The body deadline (60 s) is far beyond what any
# wait here allows: only eviction can free these connections within the test.
SLOW_BODIES = HttpLimits(max_connections=32, header_timeout=60, body_timeout=60,
                         bodies_per_address=4, bodies=8)
ATTACK_HEAD = (b"POST " + WEBHOOK_PATH.encode() + b" HTTP/1.1\r\nHost: x\r\n"
               b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n")


@pytest.fixture
async def guarded_telegram(fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
                           make_settings: SettingsFactory) -> AsyncIterator[tuple[str, int]]:
    """roost with its Telegram webhook behind a GuardedSite with SLOW_BODIES."""
    settings = make_settings(
        model={"host": fake_ollama.url},
        telegram={"enabled": True, "mode": "webhook", "webhook_url": HOOK_URL,
                  "api_base": fake_telegram.api_base, "file_base": fake_telegram.file_base,
                  "allow": (USER,), "token": fake_telegram.token, "secret": SECRET})
    app = build_app(settings, tuning=Tuning(http=SLOW_BODIES))
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    sock = bind("127.0.0.1", 0)
    site = GuardedSite(runner, sock, SLOW_BODIES)
    await site.start()
    try:
        yield "127.0.0.1", sock.getsockname()[1]
    finally:
        await runner.cleanup()


async def test_heads_without_bodies_are_bounded_per_address_and_in_all_and_lock_nobody_out(
    guarded_telegram: tuple[str, int], fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
    caplog: pytest.LogCaptureFixture
) -> None:
    host, port = guarded_telegram
    caplog.set_level(logging.INFO)
    # 12 from one address, 4 from each of three more, then 30 from a fifth: more than the
    # connection cap (32), all of loopback (127.0.0.0/8).
    callers = (["127.0.0.1"] * 12 + ["127.0.0.2"] * 4 + ["127.0.0.3"] * 4 + ["127.0.0.4"] * 4
               + ["127.0.0.5"] * 30)
    writers: list[asyncio.StreamWriter] = []
    closed: list[asyncio.Task[bytes]] = []
    try:
        for caller in callers:
            reader, writer = await asyncio.open_connection(host, port, local_addr=(caller, 0))
            writer.write(ATTACK_HEAD)
            await writer.drain()
            writers.append(writer)
            closed.append(asyncio.create_task(reader.read()))
        # At most 8 may wait for their bodies: every other one is closed by roost, unanswered.
        async with asyncio.timeout(30):
            while sum(t.done() for t in closed) < len(callers) - SLOW_BODIES.bodies:
                await asyncio.wait([t for t in closed if not t.done()],
                                   return_when=asyncio.FIRST_COMPLETED)
        assert all(t.result() == b"" for t in closed if t.done())
        fake_ollama.script("still answered")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://{host}:{port}/healthz") as reply:
                assert reply.status == 200
            async with http.post(f"http://{host}:{port}{WEBHOOK_PATH}", json=_update(5, "hi"),
                                 headers={SECRET_HEADER: SECRET}) as reply:
                assert reply.status == 200
        await fake_telegram.wait_for("sendMessage", timeout=20)
    finally:
        for writer in writers:
            writer.close()
        for task in closed:
            task.cancel()
        await asyncio.gather(*closed, return_exceptions=True)
    assert [r for r in caplog.records if r.exc_info] == []
    evictions = [r.getMessage() for r in caplog.records if "waiting for its body" in r.getMessage()]
    assert evictions and len(evictions) <= 2  # once a minute per cause, not per connection




async def test_kept_alive_idle_connections_at_the_cap_make_room_for_another_caller(
    guarded_telegram: tuple[str, int]
) -> None:
    host, port = guarded_telegram
    held: list[asyncio.StreamWriter] = []
    try:
        for _ in range(SLOW_BODIES.max_connections + 8):  # each served, then kept open, silent
            reader, writer = await asyncio.open_connection(host, port,
                                                           local_addr=("127.0.0.2", 0))
            held.append(writer)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            except (asyncio.IncompleteReadError, ConnectionError):
                continue  # refused at the cap
            assert head.startswith(b"HTTP/1.1 200")
            await reader.readexactly(int(re.search(  # type: ignore[index]
                rb"Content-Length: (\d+)", head)[1]))
        async with aiohttp.ClientSession() as http, \
                http.get(f"http://{host}:{port}/healthz") as reply:  # from 127.0.0.1
            assert reply.status == 200
    finally:
        for writer in held:
            writer.close()

async def test_a_connection_closed_before_its_body_was_read_leaves_no_traceback(
    guarded_telegram: tuple[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    host, port = guarded_telegram
    caplog.set_level(logging.INFO)
    connections = [await asyncio.open_connection(host, port) for _ in range(12)]
    try:
        for _, writer in connections:  # all at once: roost reads them in one go
            writer.write(ATTACK_HEAD)
        for _, writer in connections:
            await writer.drain()
        async with asyncio.timeout(30):  # 4 may wait for their bodies, 8 are closed
            await _until_closed([reader for reader, _ in connections], 12 - 4)
        async with aiohttp.ClientSession() as http, \
                http.get(f"http://{host}:{port}/healthz") as reply:
            assert reply.status == 200
    finally:
        for _, writer in connections:
            writer.close()
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []


async def _until_closed(readers: list[asyncio.StreamReader], count: int) -> None:
    reads = [asyncio.create_task(reader.read()) for reader in readers]
    try:
        while sum(t.done() for t in reads) < count:
            await asyncio.wait([t for t in reads if not t.done()],
                               return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in reads:
            task.cancel()
        await asyncio.gather(*reads, return_exceptions=True)


async def test_a_content_length_of_10_gb_without_a_body_gets_413_at_once(
    telegram_app: str
) -> None:
    port = int(telegram_app.rpartition(":")[2])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"POST " + WEBHOOK_PATH.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n")
        await writer.drain()
        # Waiting for the body would end in a 408 once the body deadline passed.
        status = await asyncio.wait_for(reader.readline(), 60)
        assert status.startswith(b"HTTP/1.1 413"), status
    finally:
        writer.close()

async def test_a_second_instance_that_cannot_bind_changes_nothing_at_telegram(
    fake_telegram: FakeTelegram, fake_ollama: FakeOllama, make_settings: SettingsFactory
) -> None:
    taken = bind("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        settings = make_settings(
            daemon={"listen_port": port},
            model={"host": fake_ollama.url},
            telegram={"enabled": True, "mode": "webhook", "webhook_url": HOOK_URL,
                      "api_base": fake_telegram.api_base, "file_base": fake_telegram.file_base,
                      "allow": (USER,), "token": fake_telegram.token, "secret": SECRET})
        assert await serve(settings) == 71
    finally:
        taken.close()
    assert fake_telegram.calls == []


def test_json_body_of_healthz_is_documented() -> None:
    readme = (Path(__file__).resolve().parents[3] / "docs" / "how-it-works.md").read_text("utf-8")
    for key in ("status", "reasons", "version", "model", "channels", "queued", "busy_chats",
                "in_flight", "accepting"):
        assert f"`{key}`" in readme


async def test_metrics_count_a_chat_that_blocked_the_bot(
    telegram_app: str, fake_telegram: FakeTelegram, fake_ollama: FakeOllama
) -> None:
    fake_ollama.script("never seen")
    fake_telegram.fail_next("sendMessage", status=403,
                            description="Forbidden: bot was blocked by the user", times=5)
    blocked = ("roost_events_total", (("kind", "undeliverable"),))
    async with aiohttp.ClientSession() as http:
        async with http.post(telegram_app + WEBHOOK_PATH, json=_update(8, "hello"),
                             headers={SECRET_HEADER: SECRET}) as reply:
            assert reply.status == 200
        for _ in range(200):
            async with http.get(telegram_app + "/metrics") as reply:
                samples = _metrics(await reply.text())
            if blocked in samples:
                break
            await asyncio.sleep(0.05)
    assert samples[blocked] == 1
    assert samples[("roost_outbound_messages_total",
                    (("channel", "telegram"), ("outcome", "undeliverable")))] == 1
