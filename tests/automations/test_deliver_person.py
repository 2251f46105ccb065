"""`deliver = ["person:NAME"]`: a report reaches the person on the first of their chats that can
take it now, through the real app, the fake Graph API and the fake Bot API; a name the config
does not list is an error at load; the run recalls and uses that person's chats."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from aiohttp import web

from daemon.app.serve import AUTOMATIONS, STORE, build_app
from daemon.core.config import GUEST, MEMBER, PersonSettings, Settings, load_settings
from daemon.core.errors import ConfigError
from daemon.store import Store
from daemon.tools.roles import shares_household
from daemon.tools.scope import person_of, recall_scope
from tests.automations.conftest import DaemonFactory, at, automation, wait_until
from tests.conftest import SettingsFactory
from tests.fakes.graph import API_VERSION, PHONE_NUMBER_ID, FakeGraph, Template
from tests.fakes.ollama import FakeOllama
from tests.fakes.telegram import FakeTelegram

USER = 1111111  # Dana on Telegram (the fake's started user)
WA_USER = "972544401243"  # Dana on WhatsApp
DANA = (f"whatsapp:{WA_USER}", f"telegram:{USER}")  # WhatsApp first, in the config's order
REPORT = "Three parcels arrive today."


def household(make_settings: SettingsFactory, graph: FakeGraph, fake_ollama: FakeOllama,
              telegram: FakeTelegram | None) -> Settings:
    """WhatsApp on the fake (with a template it could reopen a chat with), Telegram on its fake
    when given, Dana in [people] with both chats, and `brief` reporting to her every minute
    (so it runs at start)."""
    platforms: dict[str, dict[str, Any]] = {"whatsapp": {
        "enabled": True, "phone_number_id": PHONE_NUMBER_ID, "api_base": graph.url,
        "api_version": API_VERSION, "allow": (WA_USER,), "token": graph.token,
        "app_secret": "s", "verify_token": "v", "template": "report_ready"}}
    if telegram is not None:
        platforms["telegram"] = {"enabled": True, "mode": "polling",
                                 "api_base": telegram.api_base, "file_base": telegram.file_base,
                                 "allow": (USER,), "token": telegram.token}
    graph.templates.append(Template("report_ready"))
    return dataclasses.replace(
        make_settings(model={"host": fake_ollama.url}, **platforms),
        people=MappingProxyType({"dana": PersonSettings(DANA)}),
        automations=(automation("brief", "every 1m", deliver=("person:dana", "log")),))


def dana_last_wrote_on_whatsapp(settings: Settings, hours_ago: float) -> None:
    """What the WhatsApp channel keeps of when she last wrote there (read after a start)."""
    with Store.open(settings.daemon.state_dir) as store:
        store.set_chat_flag(DANA[0], "last_inbound", time.time() - hours_ago * 3600)


async def one_run(settings: Settings) -> dict[str, Any]:
    """Start roost; the run `brief` makes at start, once its report went out somewhere."""
    app = build_app(settings)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    try:
        state = app[AUTOMATIONS].state
        await wait_until(lambda: len(state.runs("brief")) == 1
                         and bool(state.runs("brief")[0]["message_ids"]), timeout=20)
        (run,) = state.runs("brief")
        return run
    finally:
        await runner.cleanup()


async def test_a_report_to_a_person_goes_to_their_first_chat_only(
        fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
        make_settings: SettingsFactory) -> None:
    async with FakeGraph() as graph:
        settings = household(make_settings, graph, fake_ollama, fake_telegram)
        dana_last_wrote_on_whatsapp(settings, hours_ago=1)  # WhatsApp takes it
        fake_ollama.script(REPORT)
        run = await one_run(settings)
    assert graph.texts(WA_USER) == [REPORT]
    assert fake_telegram.sent_messages == []  # her other chat gets nothing
    assert run["status"] == "ok"
    assert run["message_ids"] == {DANA[0]: [graph.sent[0].wamid]}


async def test_a_whatsapp_chat_past_24_hours_passes_the_report_to_her_telegram(
        fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
        make_settings: SettingsFactory) -> None:
    async with FakeGraph() as graph:
        settings = household(make_settings, graph, fake_ollama, fake_telegram)
        dana_last_wrote_on_whatsapp(settings, hours_ago=25)  # free-form messages refused
        fake_ollama.script(REPORT)
        run = await one_run(settings)
    (sent,) = fake_telegram.sent_messages
    assert sent["chat_id"] == USER
    assert REPORT in str(sent["text"]) and "more than 24 hours" in str(sent["text"])
    # Meta is not asked at all: neither the report nor a template to reopen the chat (nothing
    # waits there for her answer).
    assert graph.calls_of("send") == [] and graph.calls_of("template") == []
    assert run["status"] == "ok" and list(run["message_ids"]) == [DANA[1]]


async def test_when_no_chat_of_hers_takes_it_now_it_waits_as_for_a_whatsapp_target(
        fake_ollama: FakeOllama, make_settings: SettingsFactory) -> None:
    async with FakeGraph() as graph:
        # Telegram is not running: her WhatsApp is all there is, and it is past 24 hours.
        settings = household(make_settings, graph, fake_ollama, telegram=None)
        dana_last_wrote_on_whatsapp(settings, hours_ago=25)
        fake_ollama.script(REPORT)
        app = build_app(settings)
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        try:
            store = app[STORE]
            await wait_until(lambda: any(d.get("held") for d in store.outbox_pending(DANA[0])),
                             timeout=20)
            held = store.outbox_pending(DANA[0])
        finally:
            await runner.cleanup()
    assert [d["text"] for d in held] == [REPORT]
    # She is asked to write (the template), as for any report held for the 24-hour rule.
    assert len(graph.templates_sent(WA_USER)) == 1 and graph.calls_of("send") == []


def config(tmp_path: Path, target: str) -> Path:
    path = tmp_path / "roost.toml"
    path.write_text(
        '[identities]\nomar = ["telegram:2222222"]\n\n'
        '[people.dana]\nchats = ["whatsapp:972544401243", "telegram:1111111"]\n\n'
        '[[automations]]\nname = "brief"\nschedule = "0 7 * * *"\nprompt = "Hi"\n'
        f'deliver = ["log", "{target}"]\n', encoding="utf-8")
    return path


def test_a_person_target_names_someone_the_config_lists(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path / "home"), "TZ": "UTC"}
    for listed in ("person:dana", "person:omar"):  # [people] and [identities] alike
        (brief,) = load_settings(config(tmp_path, listed), env=env).automations
        assert brief.deliver == ("log", listed)
    with pytest.raises(ConfigError) as caught:
        load_settings(config(tmp_path, "person:zoe"), env=env)
    assert caught.value.key == "automations[0].deliver[1]"
    assert "'zoe'" in caught.value.problem and "[people]" in caught.value.problem
    assert "brief" in caught.value.problem


def test_the_run_recalls_and_uses_the_persons_chats(make_settings: SettingsFactory) -> None:
    settings = dataclasses.replace(
        make_settings(), people=MappingProxyType({"dana": PersonSettings(DANA)}),
        automations=(automation("brief", deliver=("person:dana", "log")),))
    with Store.open(settings.daemon.state_dir) as store:
        run = store.create_conversation("automation:brief", time.time())
    assert recall_scope(run, settings.automations, settings.linked).chat_keys == set(DANA)
    person = person_of("automation:brief", settings)
    assert person is not None and person.name == "dana" and set(person.chats) == set(DANA)
    # Her role decides whether the run's prompt carries the household's facts.
    assert shares_household("automation:brief", settings, DanaIs(MEMBER))
    assert not shares_household("automation:brief", settings, DanaIs(GUEST))


@dataclasses.dataclass
class DanaIs:
    """The household's roles, with Dana's chats in `role`."""

    role: str

    def role_of(self, chat_key: str) -> str | None:
        return self.role if chat_key in DANA else None


async def test_a_reminder_to_a_person_reaches_their_first_chat(
        make_daemon: DaemonFactory, tmp_path: Path) -> None:
    daemon = make_daemon(start=at(2026, 12, 1, 9, 0))
    daemon.settings = dataclasses.replace(daemon.settings, people=MappingProxyType(
        {"dana": PersonSettings(("console:local",), "owner")}))
    automations = await daemon.start()
    automations.scheduler.pause()  # fired by hand on the test's clock
    doc = await automations.reminders.add(
        "person:dana", at(2026, 12, 1, 9, 30).timestamp(), "stretch", by="command")
    daemon.clock.set(at(2026, 12, 1, 9, 30) + timedelta(seconds=1))
    await automations.reminders.fire(doc["id"], daemon.engine)  # type: ignore[arg-type]
    await wait_until(lambda: daemon.channel.texts("notice") == ["⏰ Reminder: stretch"])

    # The command takes a person's name too, and refuses a name nobody has.
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
                      '[people.dana]\nchats = ["console:local"]\nrole = "owner"\n')

    def remind(target: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "daemon", "automations", "remind", "in 2h",
                               "water the plants", "--to", target, "--config", str(config)],
                              capture_output=True, text=True, timeout=60)

    added = remind("person:dana")
    assert added.returncode == 0, added.stderr
    assert added.stdout.endswith("to person:dana\n")
    nobody = remind("person:nobody")
    assert nobody.returncode == 2
    assert "'nobody' is in neither [people] nor [identities]" in nobody.stderr
