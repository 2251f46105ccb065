"""The WhatsApp channel end to end: roost's real app on 127.0.0.1, the fake Graph API, fake Ollama.

Webhooks go through the real routes with real signatures; replies through the real outbox and
roost's Graph client; nothing is patched.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import re
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from io import BytesIO
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from PIL import Image

from channels.telegram.channel import TelegramTuning
from channels.whatsapp.channel import WEBHOOK_PATH, WhatsAppTuning
from channels.whatsapp.intake import UNSUPPORTED
from daemon.app.serve import ENGINE, METRICS, PLATFORMS, STORE, build_app
from daemon.core.conversations import Message
from daemon.core.messages import Outbound
from daemon.store import Store
from daemon.store.console_keys import OWNER, ConsoleKeys
from tests.conftest import FIXTURES, SettingsFactory, wait_until
from tests.daemon.cli.test_doctor import doctor as roost_doctor
from tests.daemon.console.test_console import jar, sign_in
from tests.fakes.graph import (
    API_VERSION,
    PHONE_NUMBER_ID,
    FakeGraph,
    Template,
    sent_now,
    sign,
    text_message,
    webhook,
)
from tests.fakes.ollama import FakeOllama, Reply
from tests.fakes.telegram import FakeTelegram

APP_SECRET = "1222e786b144d0e85b9f365372d93676"  # the fixture's (reset) app secret
VERIFY = "verify-me-please"
USER = "972544401243"  # the signed fixture's sender
KEY = f"whatsapp:{USER}"
# A part whose answer was lost waits 0.3 s for its status echo (the fake sends none unless told).
FAST = WhatsAppTuning(typing_refresh=0.1, media_backoff=0.01, read_delay=0.1, echo_wait=0.3)
# The recorded fixtures were sent in 2023 and 2024: far past Meta's 7-day retry window, after
# which roost drops a message. Their bytes (and signatures) are the point, so they stay as sent.
RECORDED = replace(FAST, max_age=float("inf"))


@pytest.fixture
async def graph() -> AsyncIterator[FakeGraph]:
    async with FakeGraph() as fake:
        yield fake


@dataclass
class Daemon:
    app: web.Application
    runner: web.AppRunner
    url: str

    @property
    def store(self) -> Store:
        return self.app[STORE]

    async def post(self, body: bytes, *, signature: str | None = "sign",
                   secret: str = APP_SECRET, content_type: str = "application/json") -> int:
        headers = {"Content-Type": content_type}
        if signature == "sign":
            headers["X-Hub-Signature-256"] = sign(secret, body)
        elif signature is not None:
            headers["X-Hub-Signature-256"] = signature
        async with aiohttp.ClientSession() as http, http.post(
                self.url + WEBHOOK_PATH, data=body, headers=headers) as reply:
            return reply.status

    async def settle(self, *chat_keys: str) -> None:
        intake = self.app[PLATFORMS]["whatsapp"].intake
        assert intake is not None
        await asyncio.wait_for(intake.intake.idle(), 10)
        for key in chat_keys or (KEY,):
            await asyncio.wait_for(self.app[ENGINE].wait_idle(key), 10)

    def user_messages(self, key: str = KEY) -> list[Message]:
        conversation = self.store.active_conversation(key)
        assert conversation is not None
        return [m for m in self.store.messages(conversation.id) if m.role == "user"]


Start = Callable[..., Awaitable[Daemon]]


@pytest.fixture
async def start(graph: FakeGraph, fake_ollama: FakeOllama,
                make_settings: SettingsFactory) -> AsyncIterator[Start]:
    running: list[web.AppRunner] = []

    async def run(tuning: WhatsAppTuning = FAST, **sections: dict[str, Any]) -> Daemon:
        whatsapp = {"enabled": True, "phone_number_id": PHONE_NUMBER_ID, "api_base": graph.url,
                    "api_version": API_VERSION, "allow": (USER,), "token": graph.token,
                    "app_secret": APP_SECRET, "verify_token": VERIFY}
        settings = make_settings(model={"host": fake_ollama.url, "retry_backoff": 0.05},
                                 whatsapp=whatsapp | sections.pop("whatsapp", {}), **sections)
        app = build_app(settings, tunings={"whatsapp": tuning,
                                 "telegram": TelegramTuning(poll_timeout=1, poll_backoff=0.05)})
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        running.append(runner)
        return Daemon(app, runner, f"http://127.0.0.1:{runner.addresses[0][1]}")

    yield run
    for runner in reversed(running):
        await runner.cleanup()


# ---- the door ------------------------------------------------------------------------------------


async def test_meta_verification_gets_the_raw_challenge_and_anything_else_403(
        start: Start) -> None:
    daemon = await start()
    async with aiohttp.ClientSession() as http:
        ok = {"hub.mode": "subscribe", "hub.verify_token": VERIFY, "hub.challenge": "1158201444"}
        async with http.get(daemon.url + WEBHOOK_PATH, params=ok) as reply:
            assert reply.status == 200 and await reply.text() == "1158201444"
            assert reply.content_type == "text/plain"
        for wrong in ({**ok, "hub.verify_token": "guess"}, {**ok, "hub.mode": "unsubscribe"},
                      {"hub.challenge": "1"}):
            async with http.get(daemon.url + WEBHOOK_PATH, params=wrong) as reply:
                assert reply.status == 403


async def test_the_signed_fixture_is_verified_and_answered(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama) -> None:
    daemon = await start(RECORDED)
    body = (FIXTURES / "whatsapp" / "signed_text_message.body").read_bytes()
    fixture_signature = ("sha256=54edfa1d7259e0eb13c677cc7d73d1b5c86cfa12433d19156e058ab92"
                         "51bc441")
    assert await daemon.post(body, signature=fixture_signature) == 200
    await graph.wait_sent(1)
    await daemon.settle()
    assert graph.texts(USER) == ["echo: Hey there! I am using PyWa."]
    read = graph.calls_of("read")[0].body
    assert read["message_id"] == json.loads(body)["entry"][0]["changes"][0]["value"][
        "messages"][0]["id"]


async def test_bad_signatures_and_bodies_are_refused_and_never_processed(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    body = (FIXTURES / "whatsapp" / "signed_text_message.body").read_bytes()
    reserialised = json.dumps(json.loads(body), ensure_ascii=False).encode()
    assert await daemon.post(body, signature=None) == 401
    assert await daemon.post(body, signature="sha256=" + "0" * 64) == 403
    assert await daemon.post(body, secret="another secret") == 403
    assert await daemon.post(reserialised, signature=sign(APP_SECRET, body)) == 403
    assert await daemon.post(b"{not json") == 400
    assert await daemon.post(b'{"object": "page"}') == 400
    await daemon.settle()  # nothing was taken in: nothing is on its way
    assert fake_ollama.chat_requests == [] and graph.calls == []
    raw = json.loads(webhook(text_message("wamid.na", USER, "Grüße aus Köln 🦜")))
    non_ascii = json.dumps(raw, ensure_ascii=False).encode()  # raw UTF-8, signed as it is
    assert await daemon.post(non_ascii) == 200
    await graph.wait_sent(1)
    await daemon.settle()
    assert graph.texts() == ["echo: Grüße aus Köln 🦜"]



def _errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def test_a_signed_body_nested_10000_deep_is_a_clear_400_without_a_traceback(
        start: Start, graph: FakeGraph, caplog: pytest.LogCaptureFixture) -> None:
    daemon = await start()
    caplog.set_level(logging.WARNING)
    deep = b"[" * 10_000 + b"]" * 10_000  # json itself gives up on this (RecursionError)
    assert await daemon.post(deep) == 400
    # Readable by json, but no webhook nests like this: storing it would recurse later.
    envelope = json.loads(webhook(text_message("wamid.deep", USER, "deep")))
    envelope["entry"][0]["changes"][0]["value"]["messages"][0]["extra"] = json.loads(
        "[" * 500 + "]" * 500)
    assert await daemon.post(json.dumps(envelope).encode()) == 400
    assert _errors(caplog) == []
    assert any("nested" in r.getMessage() for r in caplog.records if r.name == "roost.whatsapp")
    assert await daemon.post(webhook(text_message("wamid.after", USER, "still here"))) == 200
    await graph.wait_sent(1)
    await daemon.settle()
    assert graph.texts() == ["echo: still here"]


async def test_a_signed_body_sent_as_text_plain_gets_415_and_is_not_handled(
        start: Start, graph: FakeGraph) -> None:
    daemon = await start()
    body = webhook(text_message("wamid.plain", USER, "as plain text"))
    assert await daemon.post(body, content_type="text/plain") == 415
    assert await daemon.post(webhook(text_message("wamid.json", USER, "as JSON"))) == 200
    await graph.wait_sent(1)
    await daemon.settle()
    assert graph.texts() == ["echo: as JSON"]  # the text/plain one never reached the model


async def test_a_message_older_than_metas_7_day_retry_window_is_acked_counted_and_unanswered(
        start: Start, graph: FakeGraph, caplog: pytest.LogCaptureFixture) -> None:
    daemon = await start()
    caplog.set_level(logging.INFO, "roost.whatsapp")
    now = time.time()
    month_old = text_message("wamid.old", USER, "from last month",
                             timestamp=str(int(now - 30 * 86400)))
    assert await daemon.post(webhook(month_old)) == 200  # acked: Meta would only retry it
    six_days = text_message("wamid.late", USER, "late but within Meta's retries",
                            timestamp=str(int(now - 6 * 86400)))
    assert await daemon.post(webhook(six_days)) == 200
    await graph.wait_sent(1)
    await daemon.settle()
    assert graph.texts() == ["echo: late but within Meta's retries"]
    assert [m.content for m in daemon.user_messages()] == ["late but within Meta's retries"]
    assert any("wamid.old" in r.getMessage() and "30 days" in r.getMessage()
               for r in caplog.records)
    async with aiohttp.ClientSession() as http, http.get(daemon.url + "/metrics") as reply:
        metrics = await reply.text()
    assert re.search(r'roost_inbound_messages_total\{channel="whatsapp",outcome="stale"\} 1\.0',
                     metrics), metrics


async def test_a_content_length_of_10_gb_without_a_body_gets_413_at_once(start: Start) -> None:
    daemon = await start()
    port = daemon.runner.addresses[0][1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"POST " + WEBHOOK_PATH.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nX-Hub-Signature-256: sha256=00\r\n"
                     b"Content-Length: 10000000000\r\n\r\n")
        await writer.drain()
        # Waiting for the body would end in a 408 once the body deadline passed.
        status = await asyncio.wait_for(reader.readline(), 60)
        assert status.startswith(b"HTTP/1.1 413"), status
    finally:
        writer.close()


async def test_a_full_disk_while_storing_is_one_log_line_and_503_then_taken_once_freed(
        start: Start, graph: FakeGraph, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    daemon = await start()
    caplog.set_level(logging.INFO)
    real_fsync = os.fsync
    full = True

    def fsync(fd: int) -> None:
        if full:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    body = webhook(text_message("wamid.full", USER, "while the disk is full"))
    assert await daemon.post(body) == 503  # as Telegram's route: Meta delivers it again
    full = False
    assert [r for r in caplog.records if r.exc_info] == []
    (line,) = [r for r in caplog.records if r.name == "roost.whatsapp"
               and r.levelno >= logging.ERROR]
    assert "No space left on device" in line.getMessage()
    async with asyncio.timeout(30):
        # Meta retries on its own schedule; here, until the disk check has seen the space.
        while (status := await daemon.post(body)) == 503:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
    assert status == 200
    await graph.wait_sent(1)
    await daemon.settle()
    assert graph.texts() == ["echo: while the disk is full"]


async def test_the_same_wamid_three_times_gets_one_reply(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    body = webhook(text_message("wamid.same", USER, "once please"))
    for _ in range(3):
        assert await daemon.post(body) == 200
    await graph.wait_sent(1)
    await daemon.settle()  # the intake and the chat idle: a second reply would be queued
    assert daemon.store.inbox_pending() == [] and daemon.store.outbox_pending() == []
    assert graph.texts() == ["echo: once please"]
    assert len(fake_ollama.chat_requests) == 1


async def test_a_batch_of_100_messages_is_answered_in_order_per_sender(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama) -> None:
    senders = [f"4915{i:08d}" for i in range(25)]
    daemon = await start(whatsapp={"allow": tuple(senders)})
    messages = [text_message(f"wamid.b{n:03d}", senders[n % 25], f"message {n}")
                for n in range(100)]
    assert await daemon.post(webhook(*messages)) == 200
    await daemon.settle(*(f"whatsapp:{s}" for s in senders))
    for index, sender in enumerate(senders):
        stored = [m.content for m in daemon.user_messages(f"whatsapp:{sender}")]
        assert stored == [f"message {n}" for n in range(index, 100, 25)]
        assert graph.texts(sender), f"{sender} got no answer"
    assert daemon.store.inbox_pending() == []


async def test_a_burst_from_one_sender_is_marked_read_by_its_last_message(
        start: Start, graph: FakeGraph) -> None:
    """Marking a message read marks the earlier ones read too: a burst costs one read receipt
    (or typing indicator) for its last message, not one per message."""
    daemon = await start()
    messages = [text_message(f"wamid.r{n}", USER, f"part {n}") for n in range(5)]
    assert await daemon.post(webhook(*messages)) == 200
    await daemon.settle()
    async with asyncio.timeout(10):  # the last message's receipt, after its delay
        while "wamid.r4" not in [c.body["message_id"] for c in graph.calls_of("read")]:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    marked = [c.body["message_id"] for c in graph.calls_of("read")]
    assert marked and marked[-1] == "wamid.r4"
    assert len(set(marked)) < 5
    assert [m.content for m in daemon.user_messages()] == [f"part {n}" for n in range(5)]


async def test_a_markdown_reply_arrives_in_whatsapp_syntax(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    fake_ollama.script("# Plan\n\n**Bold** and *it* and ~~gone~~, see [the docs](https://x.org)"
                       " and [https://y.org](https://y.org).\n\n- one\n- two\n\n```\ncode\n```")
    assert await daemon.post(webhook(text_message("wamid.md", USER, "plan?"))) == 200
    (call,) = await graph.wait_sent(1)
    await daemon.settle()
    text = call.body["text"]["body"]
    assert "**" not in text and "# " not in text and "](" not in text
    assert "*Plan*" in text and "*Bold*" in text and "_it_" in text and "~gone~" in text
    assert "the docs (https://x.org)" in text and "https://y.org." in text
    assert "- one" in text and "```code```" in text


async def test_a_long_reply_is_split_at_4096_characters(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    fake_ollama.script("\n\n".join(f"Paragraph {i}. " + "word " * 200 for i in range(10)))
    assert await daemon.post(webhook(text_message("wamid.long", USER, "essay"))) == 200
    await graph.wait_sent(3)
    await daemon.settle()
    assert all(len(t) <= 4096 for t in graph.texts())
    assert "".join(graph.texts()).count("Paragraph") == 10


# ---- read receipts and typing --------------------------------------------------------------------


async def test_read_with_the_typing_indicator_while_the_turn_holds_the_model(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama) -> None:
    """The turn starts at once: the message is marked read by its typing indicator, one call,
    refreshed while the model works and not after the reply."""
    daemon = await start(tuning=WhatsAppTuning(typing_refresh=0.1, read_delay=1.0))
    fake_ollama.script(Reply(content="thought about it", delay=0.6))
    assert await daemon.post(webhook(text_message("wamid.t1", USER, "think hard"))) == 200
    (sent,) = await graph.wait_sent(1)
    await daemon.settle()
    # The receipt's own task ends after its delay, finding the message read: none comes later.
    await wait_until(lambda: not [t for t in asyncio.all_tasks()
                                  if t.get_name() == f"roost-read-{KEY}"])
    reads = graph.calls_of("read")
    assert reads[0].body == {"messaging_product": "whatsapp", "status": "read",
                             "message_id": "wamid.t1", "typing_indicator": {"type": "text"}}
    assert all("typing_indicator" in c.body for c in reads)  # no second call to mark it read
    assert len(reads) >= 3  # refreshed while the model worked (0.1 s here, 20 s for real)
    assert all(c.body["message_id"] == "wamid.t1" for c in reads)
    assert graph.calls.index(reads[-1]) < graph.calls.index(sent)  # none after the reply


async def test_a_message_waiting_for_the_model_is_read_but_shows_no_typing(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama) -> None:
    other = "4915112345678"
    daemon = await start(whatsapp={"allow": (USER, other)})
    fake_ollama.script(Reply(content="a long think", delay=1.0))
    assert await daemon.post(webhook(text_message("wamid.first", USER, "think"))) == 200
    await graph.wait_for("read")  # the first chat's turn holds the model (concurrency 1)
    assert await daemon.post(webhook(text_message("wamid.queued", other, "me too"))) == 200
    await graph.wait_sent(2)
    await daemon.settle(KEY, f"whatsapp:{other}")
    # The first turn held the model for at least its 1 s: the queued chat's turn came after.
    (first_turn,) = [r for r in fake_ollama.requests if r.path == "/api/chat"
                     and r.body and "think" in json.dumps(r.body["messages"][-1])]
    model_free = first_turn.time + 1.0
    queued = [c for c in graph.calls_of("read") if c.body["message_id"] == "wamid.queued"]
    assert queued[0].body == {"messaging_product": "whatsapp", "status": "read",
                              "message_id": "wamid.queued"}  # blue ticks while it waits
    assert queued[0].time < model_free
    typing = [c for c in queued if "typing_indicator" in c.body]
    assert typing and all(c.time >= model_free for c in typing)  # once its turn runs


# ---- delivery errors -----------------------------------------------------------------------------


async def test_rate_limits_and_5xx_are_retried_and_delivered_once(
        start: Start, graph: FakeGraph) -> None:
    daemon = await start()
    graph.fail_next("send", 131056)
    graph.fail_next("send", 130429)
    graph.fail_next("send", 131000)
    graph.drop_next("send")
    assert await daemon.post(webhook(text_message("wamid.r", USER, "busy day"))) == 200
    await graph.wait_sent(1, timeout=10)
    await daemon.settle()
    assert graph.texts() == ["echo: busy day"]
    assert len(graph.calls_of("send")) == 5


async def test_a_refused_message_does_not_stop_later_replies(
        start: Start, graph: FakeGraph) -> None:
    daemon = await start()
    graph.fail_next("send", 131026)  # message undeliverable
    assert await daemon.post(webhook(text_message("wamid.x1", USER, "first"))) == 200
    await graph.wait_sent(1)  # the notice that it could not be delivered
    await daemon.settle()
    assert await daemon.post(webhook(text_message("wamid.x2", USER, "second"))) == 200
    await graph.wait_sent(2)
    await daemon.settle()
    texts = graph.texts()
    assert texts[0].startswith("A reply could not be delivered")
    assert texts[1] == "echo: second"


async def test_after_24_hours_the_reply_goes_to_the_fallback_chat(
        start: Start, graph: FakeGraph, fake_telegram: FakeTelegram) -> None:
    daemon = await start(
        whatsapp={"fallback": "telegram:1111111"},
        telegram={"enabled": True, "mode": "polling", "api_base": fake_telegram.api_base,
                  "file_base": fake_telegram.file_base, "token": fake_telegram.token,
                  "allow": (1111111,)})
    graph.fail_next("send", 131047)
    assert await daemon.post(webhook(text_message("wamid.late", USER, "remind me"))) == 200
    (call,) = await fake_telegram.wait_for("sendMessage")
    await daemon.settle(KEY, "telegram:1111111")
    assert call.params["chat_id"] == 1111111
    assert "more than 24 hours" in call.params["text"] and "echo: remind me" in call.params["text"]
    assert graph.sent == []
    assert daemon.store.outbox_pending() == []


async def test_after_24_hours_without_fallback_the_reply_waits_for_the_user(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    graph.fail_next("send", 131047)
    assert await daemon.post(webhook(text_message("wamid.w1", USER, "late question"))) == 200
    await graph.wait_for("send")
    await daemon.settle()
    (held,) = daemon.store.outbox_pending(KEY)
    assert "Re-engagement" in held["held"]
    shown = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "conversations", "show", held["conversation_id"],
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "STATE_DIRECTORY": str(daemon.store.state_dir)})
    out, _ = await asyncio.wait_for(shown.communicate(), 30)
    assert "(not delivered yet: WhatsApp refused it: Re-engagement message" in out.decode()
    assert len(graph.calls_of("send")) == 1  # not retried while the window is closed
    assert await daemon.post(webhook(text_message("wamid.w2", USER, "hello again"))) == 200
    await graph.wait_sent(2)
    await daemon.settle()
    assert graph.texts() == ["echo: late question", "echo: hello again"]
    assert daemon.store.outbox_pending() == []


# ---- statuses, media and everything else ---------------------------------------------------------


async def test_status_webhooks_are_recorded_and_failures_logged(
        start: Start, graph: FakeGraph, caplog: pytest.LogCaptureFixture) -> None:
    daemon = await start()
    caplog.set_level(logging.INFO, "roost.whatsapp")
    assert await daemon.post(webhook(text_message("wamid.s", USER, "status?"))) == 200
    await graph.wait_sent(1)
    await daemon.settle()
    wamid = "wamid.FAKE000001"
    statuses = ({"id": wamid, "status": "delivered", "timestamp": "1", "recipient_id": USER},
                {"id": wamid, "status": "failed", "timestamp": "2", "recipient_id": USER,
                 "errors": [{"code": 131050, "title": "User stopped marketing messages"}]})
    assert await daemon.post(webhook(statuses=statuses)) == 200
    status_doc = json.loads((FIXTURES / "whatsapp" / "status_delivered.json").read_bytes())
    assert await daemon.post(json.dumps(status_doc).encode()) == 200
    log_text = "\n".join(p.read_text() for p in (daemon.store.state_dir / "corpus").glob("*"))
    conversation = daemon.store.active_conversation(KEY)
    assert conversation is not None
    assert f"`{conversation.id}`: WhatsApp delivered {wamid}" in log_text
    assert "WhatsApp delivered wamid.xyzxyz" in log_text
    assert any("131050 User stopped marketing messages" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING)


def jpeg(width: int, height: int) -> bytes:
    out = BytesIO()
    Image.new("RGB", (width, height), "orange").save(out, "JPEG")
    return out.getvalue()


async def test_the_image_fixture_reaches_the_model_as_an_image(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama) -> None:
    fake_ollama.models[0].capabilities += ("vision",)
    daemon = await start(RECORDED, whatsapp={"allow": ("972987654321",)})
    graph.add_media("65463453", jpeg(1600, 1200), "image/jpeg")
    body = (FIXTURES / "whatsapp" / "image_message.json").read_bytes()
    assert await daemon.post(body) == 200
    await graph.wait_sent(1)
    await daemon.settle("whatsapp:972987654321")
    last_user = [m for m in fake_ollama.chat_requests[-1]["messages"] if m["role"] == "user"][-1]
    assert len(last_user.get("images", [])) == 1
    kinds = [c.kind for c in graph.calls]
    assert kinds.index("media") < kinds.index("download") and "read" in kinds


async def test_unknown_senders_types_and_reactions(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama,
        caplog: pytest.LogCaptureFixture) -> None:
    daemon = await start(access={"unknown_senders": "ignore"})
    caplog.set_level(logging.INFO, "roost.whatsapp")
    stranger = text_message("wamid.u1", "15550001111", "let me in")
    assert await daemon.post(webhook(stranger)) == 200
    hologram = {"from": USER, "id": "wamid.u2", "timestamp": sent_now(), "type": "hologram",
                "hologram": {"shape": "cube"}}
    reaction = {"from": USER, "id": "wamid.u3", "timestamp": sent_now(), "type": "reaction",
                "reaction": {"message_id": "wamid.FAKE000001", "emoji": "👍"}}
    location = {"from": USER, "id": "wamid.u4", "timestamp": sent_now(), "type": "location",
                "location": {"latitude": 1.5, "longitude": 2.5, "name": "Home"}}
    assert await daemon.post(webhook(hologram, reaction, location)) == 200
    await graph.wait_sent(2)
    await daemon.settle()
    assert graph.texts() == [UNSUPPORTED, "echo: [Location: Home at 1.5, 2.5]"]
    assert len(fake_ollama.chat_requests) == 1  # the reaction started no turn
    logged = [r.getMessage() for r in caplog.records]
    assert any("unknown WhatsApp user 15550001111" in line for line in logged)
    assert not any("let me in" in line for line in logged)
    assert daemon.store.active_conversation("whatsapp:15550001111") is None


async def test_button_replies_reach_the_model_as_what_was_chosen_or_the_user_is_told(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    ours = {"from": "15550953877", "id": "wamid.FAKE000001"}  # a message roost sent
    pressed = {"from": USER, "id": "wamid.b1", "timestamp": sent_now(), "type": "interactive",
               "context": ours, "interactive": {"type": "button_reply",
                                                "button_reply": {"id": "snooze-10"}}}
    empty = {"from": USER, "id": "wamid.b2", "timestamp": sent_now(), "type": "interactive",
             "context": ours, "interactive": {"type": "button_reply", "button_reply": {}}}
    assert await daemon.post(webhook(pressed, empty)) == 200
    await graph.wait_sent(2)
    await daemon.settle()
    (request,) = fake_ollama.chat_requests  # the empty one started no turn
    last_user = [m for m in request["messages"] if m["role"] == "user"][-1]
    assert '[Pressed the button "snooze-10"]' in last_user["content"]
    assert sorted(graph.texts(), key=lambda t: t != UNSUPPORTED)[0] == UNSUPPORTED
    assert len(graph.texts()) == 2  # the notice and the one reply


async def test_a_stranger_gets_a_pairing_code_and_is_served_once_approved(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama) -> None:
    daemon = await start()  # access.unknown_senders = "pair" by default
    stranger = "15550002222"
    assert await daemon.post(webhook(text_message("wamid.p1", stranger, "hi?"))) == 200
    (notice,) = await graph.wait_sent(1)
    await daemon.settle(f"whatsapp:{stranger}")
    code = re.search(r"roost pairing approve ([A-Z0-9]{8})", notice.body["text"]["body"])
    assert code is not None and notice.body["to"] == stranger
    assert fake_ollama.chat_requests == []
    approve = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "pairing", "approve", code[1],
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "STATE_DIRECTORY": str(daemon.store.state_dir)})
    out, _ = await asyncio.wait_for(approve.communicate(), 30)
    assert approve.returncode == 0, out
    assert await daemon.post(webhook(text_message("wamid.p2", stranger, "now?"))) == 200
    await graph.wait_sent(2)
    await daemon.settle(f"whatsapp:{stranger}")
    assert graph.texts(stranger)[1] == "echo: now?"


async def test_doctor_checks_the_whatsapp_token(
        graph: FakeGraph, fake_ollama: FakeOllama, tmp_path: Path) -> None:
    config = tmp_path / "roost.toml"
    config.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n[model]\nhost = "{fake_ollama.url}"\n'
        f'[whatsapp]\nenabled = true\nphone_number_id = "{PHONE_NUMBER_ID}"\n'
        f'api_base = "{graph.url}"\n')

    async def doctor(token: str) -> str:
        return (await roost_doctor(config, ROOST_WHATSAPP_TOKEN=token,
                                   ROOST_WHATSAPP_APP_SECRET="s",
                                   ROOST_WHATSAPP_VERIFY_TOKEN="v"))[1]

    good = await doctor(graph.token)
    assert "ok   whatsapp: number 15550953877 (roost test)" in good
    bad = await doctor("expired")
    assert "FAIL whatsapp: the Graph API refused: HTTP 401, code 190" in bad
    assert "expired" not in bad


async def console_page(daemon: Daemon, conversation_id: str) -> str:
    """The conversation's page in the owner's console."""
    link = ConsoleKeys(daemon.store.state_dir).issue_link((OWNER,), 2e9 - 1)
    async with jar() as http:
        assert await sign_in(http, daemon.url, link) == 303
        async with http.get(f"{daemon.url}/console/c/{conversation_id}") as page:
            return await page.text()


async def test_the_console_shows_a_held_reply_at_its_place_until_it_goes_out(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    graph.fail_next("send", 131047)
    assert await daemon.post(webhook(text_message("wamid.c1", USER, "late question"))) == 200
    await graph.wait_for("send")
    await daemon.settle()
    (held,) = daemon.store.outbox_pending(KEY)
    page = await console_page(daemon, held["conversation_id"])
    reply = page[page.index("echo: late question"):]
    assert "Not delivered yet: WhatsApp refused it: Re-engagement message" in \
        reply[:reply.index("</article>")]
    assert await daemon.post(webhook(text_message("wamid.c2", USER, "hello again"))) == 200
    await graph.wait_sent(2)
    await daemon.settle()
    assert "Not delivered yet" not in await console_page(daemon, held["conversation_id"])


async def test_the_console_lists_held_reports_and_the_template_sent_for_them(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama) -> None:
    graph.templates.append(Template("report_ready"))
    daemon = await start(whatsapp=TEMPLATE)
    assert await daemon.post(webhook(text_message("wamid.c3", USER, "hello"))) == 200
    await graph.wait_sent(1)
    await daemon.settle()
    await hold_reports(daemon, "the weekly report")
    (conversation,) = daemon.store.list_conversations()
    page = await console_page(daemon, conversation.id)
    upcoming = page[page.index('id="upcoming"'):]
    assert "Waiting to be delivered to this chat" in upcoming
    assert "the weekly report" in upcoming
    assert "A template message asking them to write was sent" in upcoming


async def test_a_held_reply_survives_a_restart_and_goes_out_once(
        start: Start, graph: FakeGraph) -> None:
    first = await start()
    graph.fail_next("send", 131047)
    assert await first.post(webhook(text_message("wamid.h1", USER, "before the restart"))) == 200
    await graph.wait_for("send")
    await first.settle()
    assert first.store.outbox_pending(KEY)[0]["held"]
    await first.runner.cleanup()
    second = await start()
    assert await second.post(webhook(text_message("wamid.h2", USER, "after it"))) == 200
    await graph.wait_sent(2)
    await second.settle()  # the chat idle with its outbox empty: no duplicate can follow
    assert second.store.outbox_pending() == []
    assert graph.texts() == ["echo: before the restart", "echo: after it"]


async def test_a_held_reply_sent_after_a_restart_is_not_counted_as_resent(
        start: Start, graph: FakeGraph) -> None:
    # Meta refused it (131047): nothing was in flight, so it is no duplicate when it goes out.
    first = await start()
    graph.fail_next("send", 131047)
    assert await first.post(webhook(text_message("wamid.r1", USER, "before the restart"))) == 200
    await graph.wait_for("send")
    await first.settle()
    assert first.store.outbox_pending(KEY)[0]["held"]
    await first.runner.cleanup()
    second = await start()
    assert await second.post(webhook(text_message("wamid.r2", USER, "after it"))) == 200
    await graph.wait_sent(2)
    await second.settle()
    exposition = second.app[METRICS].exposition().decode()
    assert 'roost_parts_resent_total{channel="whatsapp"} 0.0' in exposition, exposition


async def test_a_report_after_24_hours_is_held_without_calling_meta(
        start: Start, graph: FakeGraph) -> None:
    daemon = await start()
    assert await daemon.post(webhook(text_message("wamid.o1", USER, "hello"))) == 200
    await graph.wait_sent(1)
    await daemon.settle()
    # The user last wrote 25 hours ago (as this process would know after a restart, too).
    daemon.app[PLATFORMS]["whatsapp"].channel.last_inbound[KEY] = time.time() - 25 * 3600
    engine = daemon.app[ENGINE]
    for n in range(25):  # an hourly report to a user who stopped writing
        report = Outbound(chat_key=KEY, text=f"report {n}", created=time.time() + n)
        assert await engine.deliver(report)
    # The worker idle: every report looked at, held or given up (all of them held is not
    # enough: the newest is held a moment before the oldest beyond 20 are given up).
    await asyncio.wait_for(engine.wait_idle(KEY), 10)
    assert len(graph.calls_of("send")) == 1  # Meta is not even asked
    held = daemon.store.outbox_pending(KEY)
    assert len(held) == 20 and all(d["held"] for d in held)  # bounded: the newest 20
    assert sorted(d["text"] for d in held) == sorted(f"report {n}" for n in range(5, 25))


async def test_a_failed_status_for_the_24_hour_rule_holds_the_reply_until_the_user_writes(
        start: Start, graph: FakeGraph) -> None:
    daemon = await start()
    assert await daemon.post(webhook(text_message("wamid.f1", USER, "late"))) == 200
    await graph.wait_sent(1)
    await daemon.settle()
    failed = {"id": "wamid.FAKE000001", "status": "failed", "timestamp": "2",
              "recipient_id": USER, "errors": [{"code": 131047, "title": "Re-engagement message"}]}
    assert await daemon.post(webhook(statuses=(failed,))) == 200
    assert await daemon.post(webhook(statuses=(failed,))) == 200  # Meta may say it twice
    (held,) = daemon.store.outbox_pending(KEY)
    assert held["held"] and held["text"] == "echo: late"
    assert await daemon.post(webhook(text_message("wamid.f2", USER, "again"))) == 200
    await graph.wait_sent(3)
    await daemon.settle()
    assert graph.texts() == ["echo: late", "echo: late", "echo: again"]
    assert daemon.store.outbox_pending() == []


async def test_replies_meta_refuses_later_for_the_24_hour_rule_wait_bounded_like_the_others(
        start: Start, graph: FakeGraph) -> None:
    daemon = await start()
    assert await daemon.post(webhook(text_message("wamid.b1", USER, "hello"))) == 200
    await graph.wait_sent(1)
    await daemon.settle()
    engine = daemon.app[ENGINE]
    for n in range(25):  # hourly reports Meta takes, and then refuses: the user stopped writing
        assert await engine.deliver(Outbound(chat_key=KEY, text=f"report {n}",
                                             created=time.time() + n))
    sent = await graph.wait_sent(26)
    await asyncio.wait_for(engine.wait_idle(KEY), 10)
    for call in sent[1:]:
        failed = {"id": call.wamid, "status": "failed", "timestamp": "2", "recipient_id": USER,
                  "errors": [{"code": 131047, "title": "Re-engagement message"}]}
        assert await daemon.post(webhook(statuses=(failed,))) == 200
    await asyncio.wait_for(engine.wait_idle(KEY), 10)
    assert await daemon.post(webhook(text_message("wamid.b2", USER, "back"))) == 200
    await graph.wait_sent(26 + 20 + 1)
    await daemon.settle()
    # The newest 20 reach the user when they write again, not months of them at once.
    again = graph.texts()[26:]
    assert sorted(t for t in again if t.startswith("report")) == sorted(
        f"report {n}" for n in range(5, 25))
    assert "echo: back" in again and len(again) == 21


async def test_messages_to_another_number_of_the_same_app_are_not_answered(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    body = json.loads(webhook(text_message("wamid.other", USER, "to the test number")))
    body["entry"][0]["changes"][0]["value"]["metadata"]["phone_number_id"] = "999999999"
    assert await daemon.post(json.dumps(body).encode()) == 200
    await daemon.settle()  # the payload was looked at and dropped
    assert daemon.store.updates_pending("whatsapp") == []
    assert graph.calls == [] and fake_ollama.chat_requests == []


async def test_a_media_download_cut_off_tells_the_user_and_the_text_goes_on(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama) -> None:
    daemon = await start()
    graph.add_media("m-doc", b"%PDF-1.4 plan", "application/pdf")
    graph.drop_next("download", times=10)  # aiohttp itself retries a reused connection once
    document = {"from": USER, "id": "wamid.d1", "timestamp": sent_now(), "type": "document",
                "document": {"id": "m-doc", "mime_type": "application/pdf",
                             "filename": "plan.pdf", "caption": "read this"}}
    assert await daemon.post(webhook(document)) == 200
    await graph.wait_sent(2)
    await daemon.settle()
    assert graph.texts() == ["I could not download that document from WhatsApp; please send "
                             "it again.", "echo: read this"]
    assert daemon.store.quarantined() == []


async def test_after_a_restart_the_stored_time_of_the_users_last_message_still_counts(
        start: Start, graph: FakeGraph) -> None:
    first = await start()
    assert await first.post(webhook(text_message("wamid.r1", USER, "hello"))) == 200
    await graph.wait_sent(1)
    await first.settle()
    assert first.store.chat_flags(KEY)["last_inbound"] > time.time() - 60  # recorded
    first.store.set_chat_flag(KEY, "last_inbound", time.time() - 26 * 3600)
    await first.runner.cleanup()
    second = await start()
    report = Outbound(chat_key=KEY, text="the daily report", created=time.time())
    assert await second.app[ENGINE].deliver(report)
    async with asyncio.timeout(10):
        # The store has no event to wait on: poll it.
        while not second.store.outbox_pending(KEY)[0].get("held"):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    assert len(graph.calls_of("send")) == 1  # only the first reply: the report was not tried


# ---- templates after 24 hours --------------------------------------------------------------------

TEMPLATE = {"template": "report_ready", "template_language": "en_US"}


async def metrics_text(daemon: Daemon) -> str:
    async with aiohttp.ClientSession() as http, http.get(daemon.url + "/metrics") as reply:
        return await reply.text()


async def hold_reports(daemon: Daemon, *texts: str) -> None:
    """Reports for a user who last wrote 25 hours ago: each is held (Meta is not even asked)."""
    daemon.app[PLATFORMS]["whatsapp"].channel.last_inbound[KEY] = time.time() - 25 * 3600
    engine = daemon.app[ENGINE]
    for n, text in enumerate(texts):
        assert await engine.deliver(Outbound(chat_key=KEY, text=text, created=time.time() + n))
    await asyncio.wait_for(engine.wait_idle(KEY), 10)
    assert all(d.get("held") for d in daemon.store.outbox_pending(KEY))


async def test_held_reports_send_the_template_once_and_go_out_when_the_user_answers(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama) -> None:
    graph.templates.append(Template("report_ready"))
    daemon = await start(whatsapp=TEMPLATE)
    await hold_reports(daemon, "report 1", "report 2")
    await hold_reports(daemon, "report 3")  # another batch within the interval: no template
    assert graph.templates_sent(USER) == [{"name": "report_ready",
                                           "language": {"code": "en_US"}}]
    assert graph.sent == [] and len(daemon.store.outbox_pending(KEY)) == 3  # none lost
    assert 'roost_events_total{kind="whatsapp-template"} 1.0' in await metrics_text(daemon)
    assert await daemon.post(webhook(text_message("wamid.t3", USER, "ok, show me"))) == 200
    await graph.wait_sent(4)
    await daemon.settle()
    texts = graph.texts(USER)
    assert sorted(texts[:3]) == ["report 1", "report 2", "report 3"]
    assert texts[3:] == ["echo: ok, show me"]
    assert daemon.store.outbox_pending() == []


async def test_the_templates_one_parameter_is_the_held_reports_first_words(
        start: Start, graph: FakeGraph) -> None:
    graph.templates.append(Template("report_ready", body="Ready: {{1}}. Reply to see it."))
    daemon = await start(whatsapp=TEMPLATE | {"template_parameter": True})
    await hold_reports(daemon, "Weather report:\n\tsunny    all day, 21 degrees, light wind "
                               "from the west, no rain expected before Friday")
    (template,) = graph.templates_sent(USER)
    (parameter,) = template["components"][0]["parameters"]
    assert parameter["text"].startswith("Weather report: sunny all day, 21 degrees")
    assert len(parameter["text"]) <= 60 and "\n" not in parameter["text"]


@pytest.mark.parametrize("problem", ["missing", "parameters"])
async def test_a_refused_template_leaves_the_reports_held_and_is_not_retried_at_once(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama,
        caplog: pytest.LogCaptureFixture, problem: str) -> None:
    if problem == "parameters":  # the template wants a parameter roost was not told to fill
        graph.templates.append(Template("report_ready", body="Ready: {{1}}"))
    daemon = await start(whatsapp=TEMPLATE)
    caplog.set_level(logging.WARNING, "roost.whatsapp")
    await hold_reports(daemon, "report 1")
    await hold_reports(daemon, "report 2")
    (template,) = graph.calls_of("template")
    assert not template.accepted
    code = "132001" if problem == "missing" else "132000"
    assert f"WhatsApp refused the template 'report_ready' for {KEY}" in caplog.text
    assert code in caplog.text
    assert await daemon.post(webhook(text_message("wamid.r3", USER, "here"))) == 200
    await graph.wait_sent(3)
    await daemon.settle()
    assert graph.texts(USER) == ["report 1", "report 2", "echo: here"]


async def test_status_counts_the_templates_a_chat_was_sent(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama) -> None:
    graph.templates.append(Template("report_ready"))
    daemon = await start(whatsapp=TEMPLATE)
    await hold_reports(daemon, "report")
    assert await daemon.post(webhook(text_message("wamid.s2", USER, "/status"))) == 200
    await graph.wait_sent(2)
    await daemon.settle()
    assert "WhatsApp templates sent to reopen this chat: 1" in graph.texts(USER)[-1]


async def test_without_a_template_nothing_but_the_hold_happens(
        start: Start, graph: FakeGraph) -> None:
    daemon = await start()
    await hold_reports(daemon, "report")
    assert graph.calls_of("template") == [] and graph.calls == []


async def test_a_send_whose_answer_was_lost_and_no_status_came_goes_twice_and_is_counted(
        start: Start, graph: FakeGraph) -> None:
    # Meta took the message and the connection dropped before its answer, and no status of it
    # comes within the wait: roost sends it again (at least once), and /metrics says so.
    daemon = await start()
    graph.drop_next("send", done=True)
    assert await daemon.post(webhook(text_message("wamid.l1", USER, "shaky line"))) == 200
    await graph.wait_sent(2)
    await daemon.settle()
    assert graph.texts(USER) == ["echo: shaky line", "echo: shaky line"]
    assert 'roost_parts_resent_total{channel="whatsapp"} 1.0' in await metrics_text(daemon)


async def test_a_send_whose_answer_was_lost_is_recognised_by_its_status_and_not_sent_again(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama) -> None:
    # Meta took the message, the connection dropped before its answer, and Meta's `sent`
    # status (carrying the biz_opaque_callback_data roost sent) comes to the webhook.
    daemon = await start(tuning=replace(FAST, echo_wait=10.0))
    graph.statuses_to(daemon.url + WEBHOOK_PATH, APP_SECRET)
    graph.drop_next("send", done=True)
    text = "a long answer. " * 400  # two parts: the one after the lost answer goes too
    fake_ollama.script(Reply(content=text))
    assert await daemon.post(webhook(text_message("wamid.l2", USER, "shaky line"))) == 200
    await wait_until(lambda: graph.sent != [] and daemon.store.outbox_pending() == [])
    assert " ".join(graph.texts(USER)).split() == text.split()
    assert len(graph.sent) == 2
    assert 'roost_parts_resent_total{channel="whatsapp"} 0.0' in await metrics_text(daemon)


async def test_a_part_in_flight_when_roost_stopped_is_recognised_after_the_restart(
        start: Start, graph: FakeGraph) -> None:
    # The first process's send reached the user and its answer did not reach roost (the
    # connection dropped; a SIGKILL at that moment leaves the same outbox behind); Meta's
    # status waits while roost is down, and comes to the next process.
    graph.statuses_to(None, APP_SECRET)
    first = await start(tuning=replace(FAST, echo_wait=60.0))
    graph.drop_next("send", done=True)
    assert await first.post(webhook(text_message("wamid.k1", USER, "kill me"))) == 200
    await graph.wait_sent(1)
    await wait_until(lambda: first.store.inbox_pending() == [])
    await first.runner.cleanup()
    second = await start(tuning=replace(FAST, echo_wait=10.0))
    graph.statuses_to(second.url + WEBHOOK_PATH)
    await wait_until(lambda: second.store.outbox_pending() == [])
    assert graph.texts(USER) == ["echo: kill me"]


async def test_with_a_fallback_chat_no_template_is_sent(
        start: Start, graph: FakeGraph, fake_telegram: FakeTelegram) -> None:
    graph.templates.append(Template("report_ready"))
    daemon = await start(whatsapp=TEMPLATE | {"fallback": "telegram:1111111"},
                         telegram={"enabled": True, "mode": "polling",
                                    "api_base": fake_telegram.api_base,
                                    "file_base": fake_telegram.file_base,
                                    "token": fake_telegram.token, "allow": (1111111,)})
    daemon.app[PLATFORMS]["whatsapp"].channel.last_inbound[KEY] = time.time() - 25 * 3600
    assert await daemon.app[ENGINE].deliver(Outbound(chat_key=KEY, text="report",
                                                     created=time.time()))
    (call,) = await fake_telegram.wait_for("sendMessage")
    assert "report" in call.params["text"]
    assert graph.calls_of("template") == []  # nothing waits for an answer: none is billed
