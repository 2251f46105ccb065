"""/status shows its times in the daemon's zone (`[daemon] timezone`), whatever the host's own
zone, and names the zone once, on its last line. On WhatsApp it used to mix both: the template's
last-sent time in the daemon's zone beside the conversation's start in the host's."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from daemon.core.conversations import SummaryState
from daemon.core.messages import TEMPLATE_FLAG
from daemon.engine.chat_commands import Commands
from daemon.llm.client import ModelClient
from daemon.store import Store
from tests.conftest import SettingsFactory, standard_parts
from tests.fakes.ollama import FakeOllama

CHAT = "whatsapp:972544401243"


def utc(year: int, month: int, day: int, hour: int, minute: int) -> float:
    return datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp()


@pytest.fixture
def host_in_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's own zone (what time.localtime uses) is UTC, as on the box of the report."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("host_in_utc")
async def test_status_times_are_in_the_daemons_zone_which_its_last_line_names(
        make_settings: SettingsFactory, fake_ollama: FakeOllama) -> None:
    assert os.environ["TZ"] == "UTC"
    settings = make_settings(model={"host": fake_ollama.url},
                             daemon={"timezone": "Europe/Berlin"})
    store = Store.open(settings.daemon.state_dir)
    llm = ModelClient(settings.model)
    try:
        conversation = store.create_conversation(CHAT, utc(2026, 1, 15, 20, 35))
        store.append_message(conversation.id, "user", "hello", created=utc(2026, 1, 15, 20, 35))
        store.save_summary(conversation.id, SummaryState(
            summary="Planning a trip.", through_seq=1, fold_count=1,
            folded_at=utc(2026, 1, 16, 9, 10)))
        store.set_chat_flag(CHAT, TEMPLATE_FLAG, {"count": 2, "last": utc(2026, 1, 16, 7, 0)})
        parts = standard_parts(settings, store, llm)
        commands = Commands(settings=settings, store=store, router=parts.router, llm=llm,
                            prompting=parts.prompting, folder=parts.folder, clock=time.time)
        status = await commands.run("status", CHAT)
    finally:
        await llm.close()
        store.close()
    lines = status.splitlines()
    assert "(last 2026-01-16 08:00)" in status  # the template, 07:00 UTC
    assert "since 2026-01-15 21:35" in status  # the conversation's start, 20:35 UTC
    assert "last 2026-01-16 10:10" in lines[-2]  # the fold, 09:10 UTC
    assert lines[-1] == "Times in Europe/Berlin."
    assert status.count("Europe/Berlin") == 1
