"""The Health page's table of model cards in a real browser (Debian's Chromium, headless): a
hostile model name is shown as text and runs nothing; on a phone each model is a card within
the screen's width.
Skipped where no browser is installed, as tests/daemon/console/test_console_browser.py is."""

from __future__ import annotations

import asyncio
from pathlib import Path

from daemon.models.card import Card
from daemon.store.console_keys import OWNER, ConsoleKeys
from tests.daemon.console.test_console_browser import SIZES, browser, pytestmark, shot, waiting
from tests.daemon.models.test_card_surfaces import HOSTILE, card, health_page

# Fixtures, used by name; and the browser tests' mark: skipped without Chromium.
__all__ = ["browser", "health_page", "pytestmark"]


async def test_the_cards_table_on_a_phone_shows_a_hostile_name_as_text(
        health_page: tuple[list[Card], str], state_dir: Path, browser: object) -> None:
    from selenium.webdriver.common.by import By

    cards, url = health_page
    cards += [card(), card(HOSTILE, tools="native", thinking="separate", truncate="refuses")]
    driver = browser
    link = ConsoleKeys(state_dir).issue_link((OWNER,), 2e9 - 1)

    def walk() -> None:
        driver.set_window_size(*SIZES["phone"])  # type: ignore[attr-defined]
        driver.get(f"{url}/console/login?t={link}")  # type: ignore[attr-defined]
        driver.find_element(By.ID, "sign-in").click()  # type: ignore[attr-defined]
        wait = waiting(driver, 20)
        wait.until(lambda d: d.find_element(By.LINK_TEXT, "Health")).click()
        table = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "table.cards"))
        names = [row.find_element(By.TAG_NAME, "td").text
                 for row in table.find_elements(By.CSS_SELECTOR, "tbody tr:first-child")]
        assert names == ["qwen3:4b", HOSTILE]
        assert driver.execute_script("return window.pwned === undefined")  # type: ignore
        assert table.size["width"] <= SIZES["phone"][0]  # a card each, within the screen
        driver.execute_script("arguments[0].scrollIntoView()", table)  # type: ignore
        shot(driver, "phone-health-cards")
        driver.set_window_size(*SIZES["desktop"])  # type: ignore[attr-defined]
        driver.execute_script("arguments[0].scrollIntoView()", table)  # type: ignore
        shot(driver, "desktop-health-cards")

    await asyncio.to_thread(walk)
