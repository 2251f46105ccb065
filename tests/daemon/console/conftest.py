"""A daemon app over a state directory holding two people's conversations, for the console's
tests (the fixture `console`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from daemon.app.serve import ENGINE, build_app
from daemon.core.config import AutomationSettings, Settings
from daemon.core.conversations import SummaryState
from daemon.engine.workers import Engine
from daemon.store import Store
from daemon.store.attachments import store_file
from daemon.store.event_log import Records
from tests.conftest import RecordingChannel, SettingsFactory
from tests.daemon.app.test_app import start
from tests.fakes.ollama import FakeOllama

DANA = "telegram:1111111"
OMAR = "telegram:2222222"
T0 = 1_764_000_000.0
HOSTILE = ('<script>window.pwned=1</script> <img src=x onerror="window.pwned=2"> '
           '<a href="javascript:window.pwned=3">tap</a>')


@dataclass
class Seeded:
    dana: str  # conversation ids
    omar: str


def seed(state_dir: Path) -> Seeded:
    """Two people's conversations; Dana's folded once, with a file and recorded requests."""
    with Store.open(state_dir) as store:
        dana = store.create_conversation(DANA, T0)
        omar = store.create_conversation(OMAR, T0)
        pdf = store_file(b"%PDF-1.4 not really", state_dir / "attachments",
                         name="<img src=y onerror=alert(1)>.pdf", mime="application/pdf")
        for turn in range(6):
            store.append_message(dana.id, "user", f"question {turn}", created=T0 + turn * 60,
                                 attachments=(pdf.to_doc(),) if turn == 0 else ())
            store.append_message(dana.id, "assistant", f"answer {turn}",
                                 created=T0 + turn * 60 + 5,
                                 meta={"prompt_eval_count": 900 + 400 * (turn % 3),
                                       "prompt_eval_cached_count": 850, "num_ctx": 8192,
                                       "prompt_tokens": 1000,
                                       # what roost knew: its estimate, the budget, the
                                       # fold before turn 3, a refusal at turn 4
                                       "estimate": 880 + 400 * (turn % 3), "budget": 7168,
                                       "folds": int(turn >= 3), "refused": int(turn == 4),
                                       "cut": 0, "redone": 0})
        store.append_message(dana.id, "user", HOSTILE, created=T0 + 400)
        store.save_summary(dana.id, SummaryState(summary="Dana asked about the report.",
                                                 user_notes="- my cat is Pickle",
                                                 through_seq=4, fold_count=1, folded_at=T0))
        store.append_message(omar.id, "user", "Omar's private plans", created=T0 + 10)
        records = Records(state_dir, ZoneInfo("UTC"))
        records.event(T0 + 300, "fold", dana.id, "folded 4 messages into the summary")
        records.event(T0 + 350, "overflow-retry", dana.id, "Ollama counted 9,100 tokens")
        records.event(T0 + 360, "fold", omar.id, "Omar's fold")
        return Seeded(dana.id, omar.id)


@dataclass
class Rig:
    url: str
    settings: Settings
    seeded: Seeded
    channel: RecordingChannel
    engine: Engine


@pytest.fixture
async def rig(fake_ollama: FakeOllama, make_settings: SettingsFactory,
              state_dir: Path) -> AsyncIterator[Rig]:
    seeded = seed(state_dir)
    settings = make_settings(model={"host": fake_ollama.url})
    channel = RecordingChannel("telegram")
    app = build_app(settings, {"telegram": channel})
    runner, url = await start(app)
    try:
        yield Rig(url, settings, seeded, channel, app[ENGINE])
    finally:
        await runner.cleanup()


@pytest.fixture
def console(rig: Rig) -> tuple[str, Settings, Seeded]:
    return rig.url, rig.settings, rig.seeded


PROBE = AutomationSettings(name="probe", schedule="0 7 * * *", prompt="Say the weather.",
                           deliver=("log",))


@pytest.fixture
async def automation_daemon(fake_ollama: FakeOllama, make_settings: SettingsFactory,
                 state_dir: Path) -> AsyncIterator[tuple[str, Path]]:
    settings = replace(make_settings(model={"host": fake_ollama.url}), automations=(PROBE,))
    runner, url = await start(build_app(settings, {"telegram": RecordingChannel("telegram")}))
    try:
        yield url, state_dir
    finally:
        await runner.cleanup()
