"""The console in a real browser: Debian's Chromium, headless, driven by Selenium. Skipped where
no browser is installed (`.ci/run` installs one). Screenshots at phone and desktop widths go to
$ROOST_TEST_ARTIFACTS (default: test-artifacts/) to be looked at."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from daemon.app.serve import build_app
from daemon.core.config import Settings
from daemon.intake.pairing import PairingBook
from daemon.store.approvals import ApprovalBook
from daemon.store.console_keys import OWNER, ConsoleKeys
from tests.conftest import RecordingChannel, SettingsFactory
from tests.daemon.app.test_app import start
from tests.daemon.console.conftest import DANA, OMAR, Rig, Seeded, seed
from tests.daemon.console.test_console import jar, sign_in_form
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
        # last active, messages, folds and the model, on a phone as on a desktop
        assert re.search(r"\d\d:\d\d 13 1 qwen3:4b$", " ".join(cells[DANA]))
        shot(driver, f"{size}-conversations")
        driver.find_element(By.LINK_TEXT, DANA).click()  # type: ignore[attr-defined]
        boundary = wait.until(lambda d: d.find_element(By.ID, "fold-boundary"))
        assert boundary.is_displayed()
        chart = driver.find_element(By.CSS_SELECTOR, "svg.chart")  # type: ignore
        assert chart.size["width"] <= SIZES[size][0]  # fits the screen
        assert "8192-token window" in chart.get_attribute("aria-label")
        # The axes' numbers and titles are on the screen and large enough to read.
        labels = chart.find_elements(By.CSS_SELECTOR, "text")
        assert {"request number", "tokens", "8,000"} <= {t.text for t in labels}
        for label in labels:
            box = driver.execute_script(  # type: ignore[attr-defined]
                "return arguments[0].getBoundingClientRect().toJSON()", label)
            assert box["left"] >= 0 and box["right"] <= SIZES[size][0], label.text
            assert box["height"] >= 9 if label.text != "tokens" else box["width"] >= 9
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


@dataclass
class Watched:
    """A daemon whose sign-in posts are noted with the headers the browser sent."""

    url: str
    settings: Settings
    presses: list[dict[str, str]] = field(default_factory=list)


@pytest.fixture
async def watched(fake_ollama: FakeOllama, make_settings: SettingsFactory,
                  state_dir: Path) -> AsyncIterator[Watched]:
    seed(state_dir)
    settings = make_settings(model={"host": fake_ollama.url})
    app = build_app(settings, {"telegram": RecordingChannel("telegram")})
    presses: list[dict[str, str]] = []

    @web.middleware
    async def note(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "POST" and request.path == "/console/login":
            presses.append({name: request.headers.get(name, "-")
                            for name in ("Origin", "Sec-Fetch-Site")})
        return await handler(request)  # type: ignore[no-any-return]

    app.middlewares.append(note)
    runner, url = await start(app)
    try:
        yield Watched(url, settings, presses)
    finally:
        await runner.cleanup()


def set_referrer_policy(driver: object, policy: str) -> None:
    """The page's referrer policy, as if its meta said `policy` (a WebDriver script runs
    whatever the page's Content-Security-Policy says; the page itself runs none)."""
    driver.execute_script(  # type: ignore[attr-defined]
        "document.querySelector('meta[name=referrer]').content = arguments[0]", policy)


@pytest.mark.parametrize("policy", ["page's own", "no-referrer", "same-origin",
                                    "strict-origin-when-cross-origin"])
async def test_the_sign_in_button_works_whatever_the_pages_referrer_policy(
        watched: Watched, browser: object, policy: str) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    link = ConsoleKeys(watched.settings.daemon.state_dir).issue_link((OWNER,), 2e9 - 1)

    def walk() -> None:
        driver.get(f"{watched.url}/console/login?t={link}")  # type: ignore[attr-defined]
        if policy != "page's own":
            set_referrer_policy(driver, policy)
        driver.find_element(By.ID, "sign-in").click()  # type: ignore[attr-defined]
        rows = waiting(driver, 20).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, "table.list tbody tr"),
            message=driver.page_source)  # type: ignore[attr-defined]
        assert {r.text.split()[0] for r in rows} == {DANA, OMAR}

    await asyncio.to_thread(walk)
    # The browser said what the policy makes it say (no-referrer: Origin null), and the
    # press counted all the same.
    (press,) = watched.presses
    assert press["Sec-Fetch-Site"] == "same-origin"
    assert press["Origin"] == ("null" if policy == "no-referrer" else watched.url)


ATTACKERS_PAGE = """<!doctype html><meta name="referrer" content="no-referrer">
<form method="post" action="{action}"><input type="hidden" name="t" value="{link}">
<input type="hidden" name="signin_token" value="{token}">
<button id="prize" type="submit">Claim your prize</button></form>"""


async def test_another_sites_page_cannot_sign_the_browser_in_as_someone_else(
        watched: Watched, browser: object) -> None:
    """The attack as it was confirmed in Chromium: a page on another site that sets
    no-referrer posts the attacker's own link, with the form token of its own page."""
    from selenium.webdriver.common.by import By

    keys = ConsoleKeys(watched.settings.daemon.state_dir)
    attackers = keys.issue_link((OMAR,), 2e9 - 1)
    async with jar() as attacker:
        forged = await sign_in_form(attacker, watched.url, attackers)
    page = ATTACKERS_PAGE.format(action=f"{watched.url}/console/login", link=attackers,
                                 token=forged.get("signin_token", ""))
    async def attackers_page(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html")

    elsewhere = web.Application()
    elsewhere.router.add_get("/", attackers_page)
    runner, other = await start(elsewhere)
    driver = browser
    owners = keys.issue_link((OWNER,), 2e9 - 1)

    def walk() -> None:
        wait = waiting(driver, 20)
        driver.get(f"{watched.url}/console/login?t={owners}")  # type: ignore[attr-defined]
        driver.find_element(By.ID, "sign-in").click()  # type: ignore[attr-defined]
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "table.list tbody tr"))
        # localhost is another site than 127.0.0.1 to the browser
        driver.get(other.replace("127.0.0.1", "localhost"))  # type: ignore[attr-defined]
        driver.find_element(By.ID, "prize").click()  # type: ignore[attr-defined]
        wait.until(lambda d: d.current_url.startswith(watched.url))  # roost answered
        driver.get(f"{watched.url}/console/")  # type: ignore[attr-defined]
        rows = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "table.list tbody tr"),
                          message=driver.page_source)  # type: ignore[attr-defined]
        shown = {r.text.split()[0] for r in rows}
        assert shown == {DANA, OMAR}, f"the browser is signed in as {shown}, not as the owner"

    try:
        await asyncio.to_thread(walk)
    finally:
        await runner.cleanup()
    assert watched.presses[-1] == {"Origin": "null", "Sec-Fetch-Site": "cross-site"}
    async with jar() as http:  # refused before the link was looked at: it still works
        form = await sign_in_form(http, watched.url, attackers)
        async with http.post(f"{watched.url}/console/login", data=form,
                             allow_redirects=False) as answer:
            assert answer.status == 303
