"""A fold that keeps failing: retried with a growing pause while its conversation is active,
and no more once it is archived (no hourly model call for a conversation nobody writes to)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import pytest

from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.store.event_log import Records
from daemon.turn.background_fold import BackgroundFold
from tests.conftest import SettingsFactory, wait_until
from tests.fakes.ollama import FakeModel, FakeOllama, Reply

CHAT = "telegram:1111111"
T0 = 1_796_112_000.0




@contextlib.asynccontextmanager
async def failing(make_settings: SettingsFactory, retry_after_failure: float
                  ) -> AsyncIterator[tuple[BackgroundFold, Store, FakeOllama]]:
    """A folder whose every fold fails, pausing `retry_after_failure` before the next try."""
    fake = FakeOllama(models=[FakeModel(context_length=32768)])
    await fake.start()
    # An empty summary is never saved: the fold fails the same way every time.
    fake.default_reply = lambda body: Reply(content="")
    settings = make_settings(model={"host": fake.url, "window": 4096, "retry_backoff": 0.01,
                                    "retry_attempts": 1}, daemon={"timezone": "UTC"})
    store = Store.open(settings.daemon.state_dir)
    llm = ModelClient(settings.model)
    folder = BackgroundFold(settings=settings, store=store, llm=llm,
                    records=Records(store.state_dir, settings.daemon.tz),
                    clock=lambda: T0, retry_after_failure=retry_after_failure)
    try:
        yield folder, store, fake
    finally:
        await folder.stop()
        await llm.close()
        store.close()
        await fake.stop()


@pytest.fixture
async def failing_folds(
        make_settings: SettingsFactory) -> AsyncIterator[tuple[BackgroundFold, Store, FakeOllama]]:
    async with failing(make_settings, retry_after_failure=0.05) as made:
        yield made


def long_conversation(store: Store) -> str:
    """A conversation with enough to fold; its id."""
    conversation = store.create_conversation(CHAT, T0)
    for n in range(30):
        store.append_message(conversation.id, "user" if n % 2 == 0 else "assistant",
                             f"Message {n}: " + "words about the garden " * 20, created=T0 + n)
    return conversation.id


async def test_a_failing_fold_stops_retrying_once_its_conversation_is_archived(
    failing_folds: tuple[BackgroundFold, Store, FakeOllama], caplog: pytest.LogCaptureFixture,
) -> None:
    folder, store, fake = failing_folds
    conversation = store.create_conversation(CHAT, T0)
    for n in range(30):
        store.append_message(conversation.id, "user" if n % 2 == 0 else "assistant",
                             f"Message {n}: " + "words about the garden " * 20, created=T0 + n)
    folder.schedule(conversation.id, urgent=True)
    # While the conversation is active, the fold is tried again.
    await wait_until(lambda: len(fake.chat_requests) >= 2)
    store.save_conversation(conversation.archived("idle"))
    caplog.set_level(logging.INFO, logger="roost")
    # Nothing left that could call the model again: no fold running, none waiting to retry.
    await wait_until(lambda: not folder.busy(conversation.id)
                and not folder.retry_pending(conversation.id))
    tried = len(fake.chat_requests)
    await folder.wait(conversation.id)
    assert len(fake.chat_requests) == tried
    assert any("not retried" in r.getMessage() and conversation.id in r.getMessage()
               for r in caplog.records)
    # A conversation still active keeps its retries.
    other = store.create_conversation("telegram:2222222", T0)
    for n in range(30):
        store.append_message(other.id, "user" if n % 2 == 0 else "assistant",
                             f"Message {n}: " + "words about the garden " * 20, created=T0 + n)
    folder.schedule(other.id, urgent=True)
    await wait_until(lambda: len(fake.chat_requests) >= tried + 2)
    assert folder.busy(other.id) or folder.retry_pending(other.id)


async def test_an_owed_fold_that_failed_is_not_tried_again_by_every_turn(
    make_settings: SettingsFactory,
) -> None:
    """A small model that echoes the fold prompt fails every fold; each turn landing the owed
    fold again paid a whole fold call before its reply (minutes a turn on a CPU, SmolLM2 at
    2K). After a failure, the next try waits for the pause, as a background one does."""
    async with failing(make_settings, retry_after_failure=600) as (folder, store, fake):
        cid = long_conversation(store)
        folder.schedule(cid, urgent=True)
        await wait_until(lambda: bool(fake.chat_requests))
        await folder.wait(cid)
        tried = len(fake.chat_requests)
        await folder.land(cid)  # the chat's next turn
        assert len(fake.chat_requests) == tried
        assert folder.owes(cid)  # still owed: tried again after the pause
