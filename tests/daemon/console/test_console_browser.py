"""The console in a real browser: Debian's Chromium, headless, driven by Selenium. Skipped where
no browser is installed (`.ci/run` installs one). Screenshots at phone and desktop widths go to
$ROOST_TEST_ARTIFACTS (default: test-artifacts/) to be looked at."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from daemon.core.config import Settings
from daemon.intake.pairing import PairingBook
from daemon.store.approvals import ApprovalBook
from daemon.store.console_keys import OWNER, ConsoleKeys
from tests.daemon.console.conftest import DANA, OMAR, Rig, Seeded
from tests.daemon.console.test_console_people import TOOL, seed_access
from tests.fakes.ollama import FakeOllama

webdriver = pytest.importorskip("selenium.webdriver")
pytestmark = pytest.mark.skipif(
    not (shutil.which("chromium") and shutil.which("chromedriver")),
    reason="needs Debian's chromium and chromium-driver")

ARTIFACTS = Path(os.environ.get("ROOST_TEST_ARTIFACTS", "test-artifacts")) / "console"
SIZES = {"phone": (390, 844), "desktop": (1280, 900)}


@pytest.fixture
def browser() -> Iterator[object]:
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = shutil.which("chromium") or ""
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-first-run", "--disable-extensions", "--disable-background-networking"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def waiting(driver: object, seconds: float) -> Any:
    """A WebDriverWait that also looks again at an element the page replaced while it read
    it (each action re-renders the page: the element found a moment before is stale)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.wait import WebDriverWait

    return WebDriverWait(driver, seconds,  # type: ignore[arg-type]
                         ignored_exceptions=(StaleElementReferenceException,))


def shot(driver: object, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))  # type: ignore[attr-defined]


@pytest.mark.parametrize("size", sorted(SIZES))
async def test_sign_in_and_read_a_folded_conversation_with_its_chart(
        console: tuple[str, Settings, Seeded], browser: object, size: str) -> None:
    from selenium.webdriver.common.by import By

    url, settings, _ = console
    driver = browser
    link = ConsoleKeys(settings.daemon.state_dir).issue_link((OWNER,), 2e9 - 1)

    def walk() -> None:
        driver.set_window_size(*SIZES[size])  # type: ignore[attr-defined]
        driver.get(f"{url}/console/login?t={link}")  # type: ignore[attr-defined]
        shot(driver, f"{size}-sign-in")
        driver.find_element(By.ID, "sign-in").click()  # type: ignore[attr-defined]
        wait = waiting(driver, 20)
        rows = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "table.list tbody tr"),
                          message=driver.page_source)  # type: ignore[attr-defined]
        cells = {r.text.split()[0]: r.text.split() for r in rows}
        assert set(cells) == {DANA, OMAR}
        # last active, messages, folds (the model too on a wide screen)
        assert re.search(r"\d\d:\d\d 13 1( qwen3:4b)?$", " ".join(cells[DANA]))
        shot(driver, f"{size}-conversations")
        driver.find_element(By.LINK_TEXT, DANA).click()  # type: ignore[attr-defined]
        boundary = wait.until(lambda d: d.find_element(By.ID, "fold-boundary"))
        assert boundary.is_displayed()
        chart = driver.find_element(By.CSS_SELECTOR, "svg.chart")  # type: ignore
        assert chart.size["width"] <= SIZES[size][0]  # fits the screen
        assert "8192-token window" in chart.get_attribute("aria-label")
        hostile = driver.find_element(By.ID, "m13")  # type: ignore[attr-defined]
        assert "<script>window.pwned=1</script>" in hostile.text  # shown as text
        assert driver.execute_script("return window.pwned === undefined")  # type: ignore
        assert not driver.find_elements(By.CSS_SELECTOR, "article img")  # type: ignore
        shot(driver, f"{size}-conversation")

    await asyncio.to_thread(walk)  # the test server runs on this loop meanwhile


async def test_approve_a_pairing_and_revoke_a_grant_by_tapping(
        rig: Rig, browser: object) -> None:
    from selenium.webdriver.common.by import By

    code = seed_access(rig)
    driver = browser
    link = ConsoleKeys(rig.settings.daemon.state_dir).issue_link((OWNER,), 2e9 - 1)

    def walk() -> None:
        driver.set_window_size(*SIZES["phone"])  # type: ignore[attr-defined]
        driver.get(f"{rig.url}/console/login?t={link}")  # type: ignore[attr-defined]
        driver.find_element(By.ID, "sign-in").click()  # type: ignore[attr-defined]
        wait = waiting(driver, 20)
        wait.until(lambda d: d.find_element(By.LINK_TEXT, "People")).click()
        row = wait.until(lambda d: d.find_element(By.XPATH, f"//div[span[contains(., '{code}')]]"))
        shot(driver, "phone-people")
        row.find_element(By.XPATH, ".//button[text()='Approve']").click()
        done = wait.until(lambda d: d.find_element(By.ID, "done"))
        assert "Approved telegram user 3333333 (Zoe)" in done.text
        grant = driver.find_element(  # type: ignore[attr-defined]
            By.XPATH, f"//div[span[contains(., '{DANA}')]]")
        grant.find_element(By.XPATH, ".//button[text()='Ask again']").click()
        done = wait.until(lambda d: "asks again" in d.find_element(By.ID, "done").text)
        shot(driver, "phone-people-after")

    await asyncio.to_thread(walk)
    state_dir = rig.settings.daemon.state_dir
    assert PairingBook(state_dir).is_approved("telegram", "3333333")
    assert not ApprovalBook(state_dir).allows(DANA, TOOL)


async def test_run_an_automation_by_tapping(automation_daemon: tuple[str, Path],
                                            fake_ollama: FakeOllama, browser: object) -> None:
    from selenium.webdriver.common.by import By

    url, state_dir = automation_daemon
    fake_ollama.script("Sunny, 21 degrees.")
    driver = browser
    link = ConsoleKeys(state_dir).issue_link((OWNER,), 2e9 - 1)

    def walk() -> None:
        driver.set_window_size(*SIZES["desktop"])  # type: ignore[attr-defined]
        driver.get(f"{url}/console/login?t={link}")  # type: ignore[attr-defined]
        driver.find_element(By.ID, "sign-in").click()  # type: ignore[attr-defined]
        wait = waiting(driver, 30)
        wait.until(lambda d: d.find_element(By.LINK_TEXT, "Automations")).click()
        wait.until(lambda d: d.find_element(By.XPATH, "//button[text()='Run now']")).click()
        assert "probe runs now" in wait.until(lambda d: d.find_element(By.ID, "done")).text

        def ran(d: object) -> bool:
            d.refresh()  # type: ignore[attr-defined]
            return "by hand" in d.find_element(By.ID, "a-probe").text  # type: ignore

        wait.until(ran)
        shot(driver, "desktop-automations")

    await asyncio.to_thread(walk)
