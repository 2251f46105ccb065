"""The never-truncate contract in plain sight: a conversation's page draws every request against
the window and the budget with labelled axes, the part from cache shaded, folds and rotations
marked, and says per request what roost estimated, what Ollama counted and what happened."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from html import unescape
from pathlib import Path

import pytest

from daemon.app.serve import build_app
from daemon.console import views
from daemon.core.config import Settings
from daemon.store import Store
from daemon.store.console_keys import ConsoleKeys
from tests.conftest import RecordingChannel, SettingsFactory
from tests.daemon.app.test_app import start
from tests.daemon.console.conftest import DANA, OMAR, T0, Seeded, seed
from tests.daemon.console.test_console import jar, owner_link, sign_in
from tests.fakes.ollama import FakeOllama


async def page_of(url: str, settings: Settings, capsys: pytest.CaptureFixture[str],
                  conversation: str) -> str:
    async with jar() as http:
        assert await sign_in(http, url, owner_link(settings, capsys)) == 303
        async with http.get(f"{url}/console/c/{conversation}") as page:
            assert page.status == 200
            return await page.text()


def words(html: str) -> str:
    """The page's text as a person reads it."""
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html)))


def chart_of(html: str) -> str:
    found = re.search(r'<svg class="chart".*?</svg>', html, re.S)
    assert found, "no chart on the page"
    return found.group(0)


def rows_of(html: str) -> list[str]:
    table = re.search(r'<table class="list requests">.*?</table>', html, re.S)
    assert table, "no request table on the page"
    return [words(row) for row in re.findall(r"<tr[ >].*?</tr>", table.group(0), re.S)][1:]


async def test_the_chart_has_labelled_axes_the_window_the_budget_the_cache_and_the_fold(
        console: tuple[str, Settings, Seeded], capsys: pytest.CaptureFixture[str]) -> None:
    url, settings, seeded = console
    chart = chart_of(await page_of(url, settings, capsys, seeded.dana))
    labels = re.findall(r"<text[^>]*>([^<]+)</text>", chart)
    assert "request number" in labels and "tokens" in labels
    assert [n for n in labels if n in {"1", "2", "3", "4", "5", "6"}] == list("123456")
    assert "0" in labels and "8,000" in labels  # the token axis reaches past the window
    assert 'class="window"' in chart and 'class="budget"' in chart
    assert re.search(r'<path class="cached" d="M', chart)  # 850 of each from cache
    assert len(re.findall(r'class="estimate"', chart)) == 6
    assert len(re.findall(r'class="fold-mark"', chart)) == 1  # before the fourth request
    assert re.search(r'<path class="retried" d="M', chart)  # the fifth was refused once


async def test_each_request_says_the_estimate_the_count_the_cache_and_what_happened(
        console: tuple[str, Settings, Seeded], capsys: pytest.CaptureFixture[str]) -> None:
    url, settings, seeded = console
    html = await page_of(url, settings, capsys, seeded.dana)
    rows = rows_of(html)
    assert len(rows) == 6
    fifth = rows[4]
    assert "#5" in fifth and "1,280 of 7,168" in fifth and "1,300 (+2%)" in fifth
    assert "850" in fifth and "8,192" in fifth
    assert "Refused as too large once, made smaller and sent again." in fifth
    assert all("Sent once, whole." in row for i, row in enumerate(rows) if i != 4)
    text = words(html)
    assert ("roost estimates this conversation at 1.00× its bytes/4 count" in text
            and "estimated at 1,680 tokens and counted at 1,700 (+1%)" in text)
    key = words(html[html.index('<ul class="key">'):])
    assert "the budget: 7,168" in key and "a fold" in key and "refused or cut" in key


@pytest.fixture
async def rotated(fake_ollama: FakeOllama, make_settings: SettingsFactory,
                  state_dir: Path) -> AsyncIterator[tuple[str, Settings, str, str]]:
    """Dana's chat with a conversation the day before, rotated out when it went idle."""
    seeded = seed(state_dir)
    with Store.open(state_dir) as store:
        before = store.create_conversation(DANA, T0 - 86_400)
        store.append_message(before.id, "user", "yesterday's question", created=T0 - 86_400)
        store.save_conversation(before.archived("idle"))
    settings = make_settings(model={"host": fake_ollama.url})
    runner, url = await start(build_app(settings, {"telegram": RecordingChannel("telegram")}))
    try:
        yield url, settings, before.id, seeded.dana
    finally:
        await runner.cleanup()


async def test_a_rotation_is_marked_and_leads_to_the_conversation_on_either_side(
        rotated: tuple[str, Settings, str, str], capsys: pytest.CaptureFixture[str]) -> None:
    url, settings, before, after = rotated
    old = await page_of(url, settings, capsys, before)
    assert "Rotated: it went idle; the next conversation" in words(old)
    assert f'href="/console/c/{after}" rel="next"' in old
    new = await page_of(url, settings, capsys, after)
    assert f'href="/console/c/{before}" rel="prev"' in new
    assert "← rotated in" in words(chart_of(new))


async def test_an_error_is_a_page_in_the_consoles_layout_with_a_way_back(
        console: tuple[str, Settings, Seeded], capsys: pytest.CaptureFixture[str]) -> None:
    url, settings, _ = console
    omars = ConsoleKeys(settings.daemon.state_dir).issue_link((OMAR,), 2e9 - 1)
    async with jar() as http:
        assert await sign_in(http, url, omars) == 303
        for path, status, said in (
                ("/console/c/01NOSUCHCONVERSATION", 404, "No such conversation."),
                ("/console/no/such/page", 404, "There is no such page here."),
                ("/console/health", 404, "The daemon's health is the owner's to see."),
                ("/console/automations/run", 405, "answers a button on a console page")):
            async with http.get(url + path) as page:
                html = await page.text()
                assert page.status == status, path
                assert page.headers["Content-Type"].startswith("text/html")
                assert "Content-Security-Policy" in page.headers
            assert said in words(html), path
            assert 'href="/console/">Back to the console' in html  # a way back
            assert 'action="/console/logout"' in html  # the header of a signed-in page
    async with jar() as http, http.get(f"{url}/console/nothing") as page:
        assert page.status in (401, 404)  # signed out: the sign-in page or the error page
        assert "text/html" in page.headers["Content-Type"]


async def test_a_bug_behind_a_page_is_a_page_too_and_is_logged(
        console: tuple[str, Settings, Seeded], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    url, settings, _ = console

    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("a bug in the conversation list")

    monkeypatch.setattr(views, "conversation_rows", broken)
    async with jar() as http:
        assert await sign_in(http, url, owner_link(settings, capsys)) == 303
        async with http.get(f"{url}/console/") as page:
            html = await page.text()
            assert page.status == 500 and page.headers["Content-Type"].startswith("text/html")
    assert "Something went wrong on roost's side" in words(html)
    assert "RuntimeError" not in html and 'href="/console/">Back to the console' in html
    assert "a bug in the conversation list" in caplog.text  # the traceback is in the log
