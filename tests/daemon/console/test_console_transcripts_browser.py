"""A conversation with a photo, a voice note, a document, a wide table and long code, in
Chromium at a phone's and a desktop's width: the picture loads, the voice note can be played,
the document is named, and nothing reaches past the right edge. Screenshots go to
test-artifacts/console/ (see test_console_browser.py)."""

from __future__ import annotations

import asyncio

import pytest

from daemon.store.console_keys import OWNER, ConsoleKeys
from tests.daemon.console.media import DOCUMENT

# The browser fixture and the skip where no Chromium is installed are test_console_browser's.
from tests.daemon.console.test_console_browser import (  # noqa: F401
    SIZES,
    browser,
    pytestmark,
    shot,
    waiting,
)
from tests.daemon.console.test_console_transcripts import Served, served  # noqa: F401

# Every visible element's right edge, with every <details> opened: what sticks out, if any.
PAST_THE_EDGE = """
document.querySelectorAll('details').forEach(d => d.open = true);
const width = document.documentElement.clientWidth;
return [...document.querySelectorAll('body *')].filter(e => {
  const box = e.getBoundingClientRect();
  return box.width > 0 && box.height > 0 && box.right > width + 0.5;
}).map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right));
"""


@pytest.mark.parametrize("size", sorted(SIZES))
async def test_a_picture_a_voice_note_and_a_document_as_the_person_sent_them(
        served: Served, browser: object, size: str) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    driver = browser
    link = ConsoleKeys(served.settings.daemon.state_dir).issue_link((OWNER,), 2e9 - 1)

    def walk() -> None:
        driver.set_window_size(*SIZES[size])  # type: ignore[attr-defined]
        driver.get(f"{served.url}/console/login?t={link}")  # type: ignore[attr-defined]
        driver.find_element(By.ID, "sign-in").click()  # type: ignore[attr-defined]
        wait = waiting(driver, 20)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "table.list tbody tr"))
        shot(driver, f"{size}-conversations-named")
        listed = driver.find_element(By.CSS_SELECTOR, "table.list").text  # type: ignore
        assert "dana" in listed and "Omar Khayyam" in listed
        driver.get(f"{served.url}/console/c/{served.media}")  # type: ignore[attr-defined]
        picture = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "img.thumb"))
        wait.until(lambda d: d.execute_script(
            "const i = arguments[0]; return i.complete && i.naturalWidth > 0", picture),
            message="the picture did not load")
        assert picture.size["width"] <= SIZES[size][0]
        voice = driver.find_element(By.CSS_SELECTOR, "audio[controls]")  # type: ignore
        wait.until(lambda d: d.execute_script(
            "return arguments[0].readyState >= 1 && arguments[0].duration > 0", voice),
            message="the voice note's length did not load")
        names = [a.text for a in driver.find_elements(  # type: ignore[attr-defined]
            By.CSS_SELECTOR, "figcaption a")]
        assert DOCUMENT in names
        bold = driver.find_elements(By.CSS_SELECTOR, "article.assistant strong")  # type: ignore
        assert [b.text for b in bold][:1] == ["Monday"]  # no asterisks shown
        assert driver.find_elements(By.CSS_SELECTOR, "article div.table table")  # type: ignore
        assert driver.execute_script(PAST_THE_EDGE) == []  # type: ignore[attr-defined]
        assert driver.execute_script("return window.pwned === undefined")  # type: ignore
        shot(driver, f"{size}-conversation-media")
        driver.execute_script(  # type: ignore[attr-defined]
            "document.getElementById('messages').scrollIntoView()")
        shot(driver, f"{size}-conversation-media-messages")

    await asyncio.to_thread(walk)
