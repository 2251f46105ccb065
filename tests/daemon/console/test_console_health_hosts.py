"""The Health page with several Ollama hosts (`[model] hosts`): a row for each host (reachable or
since when down, its version, models, what it has loaded, requests now) and the conversations
pinned to it, each a link to its page by the name roost knows its chat by; an automation by its
name."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import MappingProxyType

import pytest

from daemon.app.serve import AUTOMATIONS, ENGINE, Tuning, build_app
from daemon.core.config import AutomationSettings
from daemon.core.config.sections import HostSettings
from daemon.core.messages import Inbound
from daemon.store import Store
from daemon.store.console_keys import OWNER
from tests.conftest import RecordingChannel, SettingsFactory, wait_until
from tests.daemon.app.test_app import start
from tests.daemon.console.conftest import DANA, OMAR
from tests.daemon.console.test_console_automations import browser_for
from tests.fakes.ollama import VERSION, FakeOllama, Reply

BRIEF = AutomationSettings(name="brief", schedule="0 0 1 1 *", prompt="Anything new?",
                           deliver=("log",))


@pytest.fixture
async def hosts() -> AsyncIterator[tuple[FakeOllama, FakeOllama, FakeOllama]]:
    async with FakeOllama() as a, FakeOllama() as b, FakeOllama() as c:
        yield a, b, c


def rows(page: str) -> dict[str, str]:
    """The hosts table's rows by server."""
    table = page[page.index('id="hosts"'):page.index('id="cards"')]
    found = {}
    for row in re.findall(r"<tr class=\"(?:ok|fail)\">(.*?)</tr>", table, re.S):
        server = re.search(r'data-label="Server">([^<]*)<', row)
        assert server is not None
        found[server.group(1)] = row
    return found


def cell(row: str, label: str) -> str:
    match = re.search(rf'data-label="{label}">(.*?)</td>', row, re.S)
    assert match is not None, label
    return match.group(1)


async def test_health_lists_each_host_and_the_conversations_it_serves(
    hosts: tuple[FakeOllama, FakeOllama, FakeOllama], make_settings: SettingsFactory,
    state_dir: Path,
) -> None:
    a, b, c = hosts
    await c.refuse_connections()  # the evening box is off
    settings = make_settings(model={"hosts": tuple(HostSettings(h.url) for h in hosts),
                                    "retry_attempts": 1})
    settings = dataclasses.replace(settings, automations=(BRIEF,),
                                   identities=MappingProxyType({"Dana": (DANA,)}))
    app = build_app(settings, {"telegram": RecordingChannel("telegram")},
                    tuning=Tuning(health_interval=0.05))
    runner, url = await start(app)
    try:
        engine = app[ENGINE]
        a.script(Reply(content="a slow answer", pause_after_chunks=1))
        assert await engine.submit(Inbound(chat_key=DANA, text="hello", received=time.time()))
        await wait_until(lambda: a.paused == 1)
        # a is busy with Dana's answer: Omar's conversation goes to b, and its reply streams now
        assert await engine.submit(Inbound(chat_key=OMAR, text="hi", received=time.time()))
        await asyncio.wait_for(engine.wait_idle(OMAR), 10)
        async with await browser_for(url, state_dir, OWNER) as http:
            async def page() -> dict[str, str]:
                async with http.get(f"{url}/console/health") as answer:
                    assert answer.status == 200
                    return rows(await answer.text())

            busy = (await page())[a.url]
            assert cell(busy, "Requests now") == "1"  # Dana's answer, paused at a
            a.resume_paused()
            await asyncio.wait_for(engine.wait_idle(DANA), 10)
            await app[AUTOMATIONS].run_now("brief")
            with Store.open(state_dir, read_only=True) as store:
                dana, omar = store.active_conversation(DANA), store.active_conversation(OMAR)
            assert dana is not None and omar is not None
            shown = await page()
        assert list(shown) == [a.url, b.url, c.url]
        first, second, off = shown[a.url], shown[b.url], shown[c.url]
        assert cell(first, "State") == "reachable" and cell(first, "Version") == VERSION
        assert cell(first, "Models") == "qwen3:4b" and cell(first, "Down since") == "-"
        assert cell(first, "Requests now") == "0"
        assert "qwen3:4b" in cell(first, "Loaded")
        assert f'<a href="/console/c/{dana.id}" title="{DANA}">Dana</a>' in first
        assert f'<a href="/console/c/{omar.id}" title="{OMAR}">{OMAR}</a>' in second
        assert dana.id not in second and omar.id not in first
        # The automation went to a host too, by the same rule: it is named, on that host's row.
        [automation] = [row for row in (first, second) if "automation brief" in row]
        assert '<a href="/console/automations" title="automation:brief">' in automation
        assert cell(off, "State").startswith("unreachable")
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", cell(off, "Down since"))
        assert cell(off, "Serves").strip() == "0 conversations"
    finally:
        await runner.cleanup()
