"""Every page of the console in Chromium at a phone's widths (360 and 390 px) and a desktop's:
nothing reaches past the right edge, not even inside a box that scrolls sideways (every
<details> opened), and what a person reads there is on the screen: each column of a list,
the link to a run's result, a health check's state. Screenshots go to test-artifacts/console/
(see test_console_browser.py): {size}-layout-{page}.png."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from automations.state import AutomationState
from daemon.app.serve import ENGINE, Tuning, build_app
from daemon.models.card import store_cards
from daemon.store.console_keys import OWNER, ConsoleKeys
from tests.conftest import RecordingChannel, SettingsFactory
from tests.daemon.app.test_app import start
from tests.daemon.console.conftest import DANA, PROBE, T0, Rig, seed

# The browser fixture and the skip where no Chromium is installed are test_console_browser's.
from tests.daemon.console.test_console_browser import (  # noqa: F401
    SIZES,
    browser,
    pytestmark,
    shot,
    waiting,
)
from tests.daemon.console.test_console_people import seed_access
from tests.daemon.console.test_console_transcripts_browser import PAST_THE_EDGE
from tests.daemon.models.test_card_surfaces import card
from tests.fakes.ollama import FakeOllama

ZONE = "Europe/Berlin"
# The narrowest phone the console is made for, besides the tests' usual two sizes.
WIDTHS = {**SIZES, "narrow": (360, 780)}
LONG_MODEL = "hf.co/someone/Qwen3-30B-A3B-Instruct-2507-GGUF:Q4_K_M"

# Each list cell with words in it that is not wholly on the screen: hidden, or its text past
# either edge (a cell in a box that scrolls sideways counts: its box is past the edge).
CELLS_CUT = """
const width = document.documentElement.clientWidth;
return [...document.querySelectorAll('table.list td')].filter(td => td.textContent.trim())
  .filter(td => {
    const box = td.getBoundingClientRect();
    const range = document.createRange();
    range.selectNodeContents(td);
    const text = range.getBoundingClientRect();
    return box.width === 0 || box.height === 0 || getComputedStyle(td).visibility !== 'visible'
      || box.right > width + 0.5 || text.right > width + 0.5 || text.left < -0.5;
  }).map(td => (td.dataset.label ?? 'no label') + ': ' + td.textContent.trim().slice(0, 40));
"""
# What the page's list cells say they are on a phone (the name before each value).
LABELS_SHOWN = """
return [...document.querySelectorAll('table.list td')].map(td =>
  getComputedStyle(td, '::before').content).filter(c => c !== 'none');
"""


@dataclass
class Whole:
    """A daemon with something on every page: conversations, people waiting and granted, an
    automation with runs, model cards for the running Ollama."""

    url: str
    link: str  # the owner's sign-in link
    dana: str  # a conversation's id


def seed_runs(state_dir: Path, conversation_id: str) -> None:
    """The probe's runs: one that answered (its conversation to read), one by hand, and an
    outage's missed slots, whose long reason has to wrap on a phone."""
    state = AutomationState(state_dir)
    try:
        common = {"name": "probe", "delivered": [], "message_ids": {}}
        state.start_run({**common, "id": "probe@2025-11-24T07:00", "scheduled": T0,
                         "started": T0 + 1, "ended": T0 + 9.4, "status": "ok", "manual": False,
                         "prompt_tokens": 1234, "error": "", "conversation_id": conversation_id})
        state.start_run({**common, "id": "probe@2025-11-25T07:00", "scheduled": T0 + 86400,
                         "started": T0 + 86400, "ended": T0 + 86400, "status": "missed",
                         "manual": False, "prompt_tokens": None, "slots": 3,
                         "error": "roost was not running: 3 slots not run (Tue 2025-11-25 "
                                  "07:00 to Thu 2025-11-27 07:00)"})
        state.start_run({**common, "id": "probe:by-hand", "scheduled": T0 + 3 * 86400,
                         "started": T0 + 3 * 86400, "ended": T0 + 3 * 86400 + 2.1,
                         "status": "quiet", "manual": True, "prompt_tokens": 987,
                         "error": "", "conversation_id": conversation_id})
    finally:
        state.close()


@pytest.fixture
async def whole(fake_ollama: FakeOllama, make_settings: SettingsFactory,
                state_dir: Path) -> AsyncIterator[Whole]:
    seeded = seed(state_dir)
    settings = replace(make_settings(model={"host": fake_ollama.url},
                                     daemon={"timezone": ZONE}), automations=(PROBE,))
    store_cards(state_dir, [card(settings.model.name), card(LONG_MODEL, vision=True)])
    seed_runs(state_dir, seeded.dana)
    channel = RecordingChannel("telegram")
    app = build_app(settings, {"telegram": channel}, tuning=Tuning(health_interval=0.05))
    runner, url = await start(app)
    try:
        seed_access(Rig(url, settings, seeded, channel, app[ENGINE]))
        yield Whole(url, ConsoleKeys(state_dir).issue_link((OWNER,), 2e9 - 1), seeded.dana)
    finally:
        await runner.cleanup()


def on_screen(driver: Any, element: Any) -> bool:
    """Shown, and wholly within the viewport's width."""
    box = driver.execute_script(
        "const b = arguments[0].getBoundingClientRect(); return [b.left, b.right]", element)
    width = driver.execute_script("return document.documentElement.clientWidth")
    return bool(element.is_displayed()) and box[0] >= 0 and box[1] <= width + 0.5


@pytest.mark.parametrize("size", sorted(WIDTHS))
async def test_every_page_fits_the_screen_with_what_a_person_reads_on_it(
        whole: Whole, browser: object, size: str) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    driver: Any = browser
    phone = WIDTHS[size][0] < 640
    seen: list[str] = []

    def fits(page: str) -> None:
        """Nothing past the right edge, with every <details> opened; a screenshot."""
        seen.append(page)
        assert driver.execute_script(PAST_THE_EDGE) == [], page
        assert driver.execute_script(
            "return document.documentElement.scrollWidth <= "
            "document.documentElement.clientWidth"), page
        assert driver.execute_script(CELLS_CUT) == [], page
        # The whole page in the screenshot: the window as tall as the page, for a moment.
        width, height = WIDTHS[size]
        tall = driver.execute_script("return document.documentElement.scrollHeight "
                                     "+ window.outerHeight - window.innerHeight")
        driver.set_window_size(width, max(height, tall))
        waiting(driver, 5).until(lambda d: d.execute_script(
            "return window.innerHeight >= document.documentElement.scrollHeight"))
        shot(driver, f"{size}-layout-{page}")
        driver.set_window_size(width, height)

    def visit(page: str, path: str, ready: Callable[[Any], Any] | None = None) -> None:
        driver.get(f"{whole.url}/console{path}")
        if ready is not None:
            waiting(driver, 20).until(ready, message=f"{page}: {driver.page_source}")
        body = driver.find_element(By.TAG_NAME, "body").text
        # The zone, said once on every signed-in page.
        assert body.count("Times in ") == 1 and f"Times in {ZONE}." in body, page
        fits(page)

    def cells(row: Any) -> dict[str, Any]:
        return {td.get_attribute("data-label"): td for td in row.find_elements(By.TAG_NAME, "td")}

    def walk() -> None:
        driver.set_window_size(*WIDTHS[size])
        driver.get(f"{whole.url}/console/login?t={whole.link}")
        assert "Times in" not in driver.find_element(By.TAG_NAME, "body").text
        fits("sign-in")
        driver.find_element(By.ID, "sign-in").click()
        waiting(driver, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR, "table.list tr"))

        visit("conversations", "/")
        row = driver.find_element(By.XPATH, f"//tr[td//a[text()='{DANA}']]")
        shown = cells(row)
        assert list(shown) == ["Chat", "Channel", "Status", "Last active", "Messages", "Folds",
                               "Model"]
        assert shown["Model"].text == "qwen3:4b" and shown["Messages"].text == "13"
        for label, cell in shown.items():
            assert on_screen(driver, cell), label
        if phone:  # each value named by its column, the table's header being out of sight
            assert driver.execute_script(LABELS_SHOWN)[:7] == [
                f'"{label}"' for label in shown]
            assert all(th.size["width"] <= 1  # kept for screen readers only
                       for th in driver.find_elements(By.CSS_SELECTOR, "table.list th"))

        visit("conversation", f"/c/{whole.dana}",
              lambda d: d.find_element(By.ID, "fold-boundary"))
        visit("people", "/people")

        visit("automations", "/automations")
        reads = driver.find_elements(By.LINK_TEXT, "read")
        assert len(reads) == 2
        for read in reads:
            assert on_screen(driver, read)
        missed = driver.find_element(By.XPATH, "//td[starts-with(., 'missed: roost was not')]")
        assert on_screen(driver, missed) and "Thu 2025-11-27 07:00)" in missed.text
        # A slot that did not run took no time: no "0.0 s" on its card.
        card = missed.find_element(By.XPATH, "./ancestor::tr")
        assert " s" not in card.find_element(By.CSS_SELECTOR, 'td[data-label="Took"]').text

        def carded(d: Any) -> Any:
            d.refresh()  # the cards are read once the health probe heard Ollama's version
            return d.find_elements(By.CSS_SELECTOR, "table.cards")

        visit("health", "/health", carded)
        checks = driver.find_elements(By.CSS_SELECTOR, "table.checks tbody tr")
        assert checks
        for check in checks:
            now = cells(check)["Now"]
            assert now.text and on_screen(driver, now), now.text
        names = driver.find_elements(By.CSS_SELECTOR, "table.cards td.name")
        assert sorted(n.text for n in names) == sorted(["qwen3:4b", LONG_MODEL])
        for value in driver.find_elements(By.CSS_SELECTOR, "table.cards td"):
            assert on_screen(driver, value), value.text

        visit("missing", "/c/nonexistent")
        assert driver.find_element(By.LINK_TEXT, "Back to the console").is_displayed()

    await asyncio.to_thread(walk)
    assert seen == ["sign-in", "conversations", "conversation", "people", "automations",
                    "health", "missing"]
