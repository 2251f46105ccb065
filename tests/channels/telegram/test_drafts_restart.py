"""`roost run` killed with SIGKILL while a reply streams into a draft, then started again: the
reply is the outbox's, sent once, and nothing of the first attempt is left in the chat (a
draft is no message; a part sent early is deleted)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import aiohttp

from daemon.store import Store
from tests.channels.test_restart import (
    post_update,
    private_text,
    start_daemon,
    telegram_config,
    wait_for_nothing_left,
)
from tests.conftest import wait_until
from tests.daemon.app.test_app import free_port
from tests.fakes.ollama import FakeOllama, Reply
from tests.fakes.telegram import FakeTelegram

SECRET = "restart-secret_1"
USER = 1111111
ANSWER = " ".join(f"word{i}" for i in range(150))  # ~1,000 bytes: seconds at 100 tokens/s


async def test_killed_mid_stream_and_restarted_sends_the_reply_once(
        fake_telegram: FakeTelegram, fake_ollama: FakeOllama, tmp_path: Path) -> None:
    def paced(body: dict[str, Any]) -> Reply:
        return Reply(content=ANSWER, tokens_per_second=100)

    fake_ollama.default_reply = paced
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config, env = telegram_config(tmp_path, fake_telegram, fake_ollama, port,
                                  'streaming = "draft"\ndraft_interval = "200ms"\n')
    update = private_text(500, 7, "stream and crash")

    first = await start_daemon(config, env, url)
    try:
        async with aiohttp.ClientSession() as http, post_update(http, url, update) as reply:
            assert reply.status == 200
        await fake_telegram.wait_for("sendMessageDraft", timeout=10)
        first.send_signal(signal.SIGKILL)  # in the middle of the stream
        await first.wait()
    finally:
        if first.returncode is None:
            first.kill()
            await first.wait()
    assert first.returncode == -signal.SIGKILL
    assert fake_telegram.sent_messages == []  # only drafts so far: they vanish by themselves

    second = await start_daemon(config, env, url)
    try:
        await fake_telegram.wait_for("sendMessage", timeout=20)
        await wait_for_nothing_left(tmp_path / "state", "telegram")
    finally:
        second.send_signal(signal.SIGTERM)
        await second.communicate()
    assert [m["text"] for m in fake_telegram.sent_messages] == [ANSWER]
    finals = fake_telegram.calls_to("sendMessage")
    assert all(d.time <= finals[0].time for d in fake_telegram.calls_to("sendMessageDraft"))


async def test_killed_after_an_early_part_leaves_no_orphan_and_no_duplicate(
        fake_telegram: FakeTelegram, fake_ollama: FakeOllama, tmp_path: Path) -> None:
    """A long answer sends its finished parts while it is written; killed then, the restarted
    roost deletes them (they were recorded) and sends the answer written again, whole."""
    long_answer = "\n\n".join(" ".join(f"w{p}-{i}" for i in range(40)) for p in range(60))
    answers = 0

    def paced(body: dict[str, Any]) -> Reply:
        # The first attempt goes quiet mid-answer, past its first part (4,096 bytes, about
        # 1,400 pieces of 3): still streaming when it is killed, however loaded the machine.
        nonlocal answers
        answers += 1
        return Reply(content=long_answer, tokens_per_second=2000,
                     stall_after_chunks=3000 if answers == 1 else None)

    fake_ollama.default_reply = paced
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config, env = telegram_config(tmp_path, fake_telegram, fake_ollama, port,
                                  'draft_interval = "200ms"\n')
    update = private_text(501, 8, "a long one, then crash")

    first = await start_daemon(config, env, url)
    try:
        async with aiohttp.ClientSession() as http, post_update(http, url, update) as reply:
            assert reply.status == 200
        await fake_telegram.wait_for("sendMessage", timeout=20)  # an early part
        assert fake_ollama.streaming == 1
        # The part's record is written just after Telegram's answer: wait for it.
        await wait_until(lambda: "streamed_parts" in flags(tmp_path / "state"))
        first.send_signal(signal.SIGKILL)
        await first.wait()
    finally:
        if first.returncode is None:
            first.kill()
            await first.wait()
    early = list(fake_telegram.messages.values())
    assert early

    second = await start_daemon(config, env, url)
    try:
        await fake_telegram.wait_for("deleteMessage", timeout=20)
        await wait_until(lambda: len(fake_telegram.messages) >= 3, timeout=30)
        await wait_for_nothing_left(tmp_path / "state", "telegram")
    finally:
        second.send_signal(signal.SIGTERM)
        await second.communicate()
    shown = [m["text"] for m in sorted(fake_telegram.messages.values(),
                                       key=lambda m: m["message_id"])]
    assert len(shown) == len(set(shown))  # no part twice in the chat
    assert " ".join(" ".join(shown).split()) == " ".join(long_answer.split())
    assert all(m["message_id"] not in {e["message_id"] for e in early}
               for m in fake_telegram.messages.values())


def flags(state_dir: Path) -> dict[str, Any]:
    with Store.open(state_dir, read_only=True) as store:
        return store.chat_flags(f"telegram:{USER}")
