"""The web console over a real daemon app: sign-in links, scope, escaping, forms."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from daemon.app.serve import build_app
from daemon.cli.console import console_command
from daemon.console.views import PAGE
from daemon.core.config import Settings
from daemon.core.messages import Inbound
from daemon.store.console_keys import LINK_TTL, ConsoleKeys
from tests.conftest import RecordingChannel, SettingsFactory
from tests.daemon.app.test_app import start
from tests.daemon.console.conftest import DANA, OMAR, T0, Rig, Seeded
from tests.fakes.ollama import FakeOllama


def jar() -> aiohttp.ClientSession:
    # Unsafe: the test server is an address, not a name, and keeps cookies only this way.
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def sign_in_form(http: aiohttp.ClientSession, url: str, link: str) -> dict[str, str]:
    """What the sign-in page's form posts: the link and the page's own form token."""
    async with http.get(f"{url}/console/login", params={"t": link}) as page:
        assert page.status == 200
        text = await page.text()
    assert 'id="sign-in"' in text
    token = re.search(r'name="signin_token" value="([^"]*)"', text)
    return {"t": link, **({"signin_token": token.group(1)} if token else {})}


async def sign_in(http: aiohttp.ClientSession, url: str, link: str,
                  headers: dict[str, str] | None = None) -> int:
    """Open the link's page and press Sign in, as a browser on roost's own page does."""
    form = await sign_in_form(http, url, link)
    async with http.post(f"{url}/console/login", data=form, headers=headers,
                         allow_redirects=False) as answer:
        return answer.status


def owner_link(settings: Settings, capsys: pytest.CaptureFixture[str]) -> str:
    assert console_command(settings, revoke_all=False) == 0
    printed = capsys.readouterr().out
    found = re.search(r"(http://\S+)/console/login\?t=(\S+)", printed)
    assert found, printed
    return found.group(2)


async def test_no_page_answers_without_a_session(console: tuple[str, Settings, Seeded]) -> None:
    url, _, seeded = console
    async with aiohttp.ClientSession() as http:
        for path in ("/console/", f"/console/c/{seeded.dana}",
                     f"/console/c/{seeded.dana}/file/1/0"):
            async with http.get(f"{url}{path}", allow_redirects=False) as reply:
                assert reply.status == 401
                body = await reply.text()
                assert "roost console" in body and "question" not in body
                assert "script-src" not in reply.headers["Content-Security-Policy"]
                assert "default-src 'none'" in reply.headers["Content-Security-Policy"]


async def test_the_owners_link_works_once_and_shows_everyone(
        console: tuple[str, Settings, Seeded], capsys: pytest.CaptureFixture[str]) -> None:
    url, settings, seeded = console
    link = owner_link(settings, capsys)
    async with jar() as http:
        async with http.get(f"{url}/console/login", params={"t": link}):
            pass  # a link preview fetching the address does not use the link up
        assert await sign_in(http, url, link) == 303
        cookie = http.cookie_jar.filter_cookies(aiohttp.client.URL(f"{url}/console/"))
        assert "roost_console" in cookie
        async with http.get(f"{url}/console/") as page:
            text = await page.text()
            assert page.status == 200
        assert DANA in text and OMAR in text and seeded.dana in text
    async with jar() as other:
        assert await sign_in(other, url, link) == 403  # used already
        async with other.get(f"{url}/console/") as page:
            assert page.status == 401


async def test_roost_console_prints_a_link_that_signs_in(
        console: tuple[str, Settings, Seeded], state_dir: Path) -> None:
    url, _, _ = console
    command = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "console", stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "STATE_DIRECTORY": str(state_dir)})
    out, _ = await asyncio.wait_for(command.communicate(), 60)
    assert command.returncode == 0
    found = re.search(r"http://127\.0\.0\.1:8780/console/login\?t=(\S+)", out.decode())
    assert found, out
    async with jar() as http:  # the test server listens elsewhere; the link's token is what counts
        assert await sign_in(http, url, found.group(1)) == 303


async def test_the_session_cookie_is_httponly_and_strict(
        console: tuple[str, Settings, Seeded], capsys: pytest.CaptureFixture[str]) -> None:
    url, settings, _ = console
    link = owner_link(settings, capsys)
    async with jar() as http:
        form = await sign_in_form(http, url, link)
        async with http.post(f"{url}/console/login", data=form,
                             allow_redirects=False) as answer:
            header = answer.cookies["roost_console"].OutputString()
    assert "HttpOnly" in header and "SameSite=Strict" in header and "Path=/console" in header


async def test_an_expired_link_is_refused(console: tuple[str, Settings, Seeded]) -> None:
    url, settings, _ = console
    link = ConsoleKeys(settings.daemon.state_dir).issue_link(("*",), T0 - LINK_TTL - 1)
    async with jar() as http:
        assert await sign_in(http, url, link) == 403


async def test_a_persons_link_shows_their_own_conversations_only(
        console: tuple[str, Settings, Seeded]) -> None:
    url, settings, seeded = console
    link = ConsoleKeys(settings.daemon.state_dir).issue_link((OMAR,), 2e9 - 1)
    async with jar() as http:
        assert await sign_in(http, url, link) == 303
        async with http.get(f"{url}/console/") as page:
            text = await page.text()
        assert OMAR in text and DANA not in text
        async with http.get(f"{url}/console/c/{seeded.omar}") as page:
            assert "Omar's private plans" in await page.text()
        for path in (f"/console/c/{seeded.dana}", f"/console/c/{seeded.dana}/file/1/0"):
            async with http.get(f"{url}{path}") as page:
                assert page.status == 404  # as if it did not exist
                assert "question" not in await page.text()


async def test_a_conversation_shows_every_message_the_fold_and_the_requests(
        console: tuple[str, Settings, Seeded], capsys: pytest.CaptureFixture[str]) -> None:
    url, settings, seeded = console
    async with jar() as http:
        assert await sign_in(http, url, owner_link(settings, capsys)) == 303
        async with http.get(f"{url}/console/c/{seeded.dana}") as page:
            text = await page.text()
        for turn in range(6):  # folded or not, every message as stored
            assert f"question {turn}" in text and f"answer {turn}" in text
        assert text.index("question 1") < text.index('id="fold-boundary"') < text.index(
            "question 2")
        assert "Dana asked about the report." in text and "my cat is Pickle" in text
        assert 'class="bars"' in text and "a 8192-token window" in text
        assert "Peak 1,700 tokens" in text
        events = text[text.index('id="events"'):]
        assert "folded 4 messages into the summary" in events
        assert "overflow-retry" in events and "Omar" not in events
        async with http.get(f"{url}/console/c/{seeded.dana}/file/1/0") as download:
            assert await download.read() == b"%PDF-1.4 not really"
            assert download.headers["Content-Type"] == "application/octet-stream"
            assert download.headers["Content-Disposition"].startswith("attachment;")


async def test_hostile_text_stays_text(console: tuple[str, Settings, Seeded],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    url, settings, seeded = console
    async with jar() as http:
        assert await sign_in(http, url, owner_link(settings, capsys)) == 303
        async with http.get(f"{url}/console/c/{seeded.dana}") as page:
            text = await page.text()
    assert "<script>" not in text and "<img src=x" not in text and 'href="javascript:' not in text
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in text
    assert "&lt;img src=y onerror=alert(1)&gt;.pdf" in text  # a file name too


async def test_a_form_without_its_token_is_refused_and_sign_out_ends_the_session(
        console: tuple[str, Settings, Seeded], capsys: pytest.CaptureFixture[str]) -> None:
    url, settings, _ = console
    async with jar() as http:
        assert await sign_in(http, url, owner_link(settings, capsys)) == 303
        async with http.post(f"{url}/console/logout", data={}) as forged:
            assert forged.status == 403
        async with http.get(f"{url}/console/") as page:
            token = re.search(r'name="csrf" value="([^"]+)"', await page.text())
        assert token
        async with http.post(f"{url}/console/logout", data={"csrf": token.group(1)}) as done:
            assert done.status == 200  # followed to the sign-in page
        async with http.get(f"{url}/console/") as page:
            assert page.status == 401


async def test_revoke_all_signs_every_browser_out(
        console: tuple[str, Settings, Seeded], capsys: pytest.CaptureFixture[str]) -> None:
    url, settings, _ = console
    async with jar() as http:
        assert await sign_in(http, url, owner_link(settings, capsys)) == 303
        assert console_command(settings, revoke_all=True) == 0
        assert "1 sessions" in capsys.readouterr().out
        async with http.get(f"{url}/console/") as page:
            assert page.status == 401


async def test_the_console_can_be_turned_off(fake_ollama: FakeOllama,
                                             make_settings: SettingsFactory) -> None:
    settings = make_settings(model={"host": fake_ollama.url})
    app = build_app(replace(settings, console=replace(settings.console, enabled=False)),
                    {"telegram": RecordingChannel("telegram")})
    runner, url = await start(app)
    try:
        async with aiohttp.ClientSession() as http, http.get(f"{url}/console/") as reply:
            assert reply.status == 404
    finally:
        await runner.cleanup()



async def test_console_in_a_chat_sends_a_link_to_that_persons_own_data(rig: Rig) -> None:
    assert await rig.engine.submit(Inbound(chat_key=OMAR, text="/console", received=T0 + 20))
    await asyncio.wait_for(rig.engine.wait_idle(OMAR), 10)
    (reply,) = rig.channel.texts()
    found = re.search(r"/console/login\?t=(\S+)", reply)
    assert found and "works once" in reply
    async with jar() as http:
        assert await sign_in(http, rig.url, found.group(1)) == 303
        async with http.get(f"{rig.url}/console/") as page:
            text = await page.text()
        assert OMAR in text and DANA not in text


async def test_console_in_a_group_sends_no_link(rig: Rig) -> None:
    group = "telegram:-100123"
    assert await rig.engine.submit(Inbound(chat_key=group, text="/console", received=T0 + 20))
    await asyncio.wait_for(rig.engine.wait_idle(group), 10)
    (reply,) = rig.channel.texts()
    assert "private chat" in reply and "login" not in reply


async def test_the_list_shows_a_page_at_a_time_newest_first(
        rig: Rig, capsys: pytest.CaptureFixture[str]) -> None:
    url, settings = rig.url, rig.settings
    for n in range(PAGE):
        rig.engine.store.create_conversation(f"telegram:{5_000_000 + n}", T0 + 1000 + n)
    async with jar() as http:
        assert await sign_in(http, url, owner_link(settings, capsys)) == 303
        async with http.get(f"{url}/console/") as page:
            first = await page.text()
        async with http.get(f"{url}/console/?page=1") as page:
            second = await page.text()
    assert f"telegram:{5_000_000 + PAGE - 1}" in first and 'id="older"' in first
    assert DANA not in first and DANA in second and OMAR in second
    assert 'id="older"' not in second and "Newer" in second


async def test_an_old_long_tool_result_is_marked_as_the_stub_the_model_sees(
        rig: Rig, capsys: pytest.CaptureFixture[str]) -> None:
    store, cid = rig.engine.store, rig.seeded.dana
    store.append_message(cid, "user", "fetch the page", created=T0 + 500)
    store.append_message(cid, "assistant", "", created=T0 + 501, tool_calls=(
        {"function": {"name": "web_fetch", "arguments": {"url": "https://example.org"}}},))
    page = store.append_message(cid, "tool", "page text " * 400, created=T0 + 502,
                                tool_name="web_fetch")
    for n in range(2):
        store.append_message(cid, "user", f"later question {n}", created=T0 + 510 + n)
    async with jar() as http:
        assert await sign_in(http, rig.url, owner_link(rig.settings, capsys)) == 303
        async with http.get(f"{rig.url}/console/c/{cid}") as answer:
            text = await answer.text()
    article = text[text.index(f'id="m{page.seq}"') - 60:text.index(f'id="m{page.seq}"')]
    assert "stubbed" in article
    assert text.count("one-line stub instead") == 1
    assert "web_fetch" in text and "https://example.org" in text  # the call, opened on demand


async def test_a_broken_sessions_file_means_signing_in_again_not_an_error(
        console: tuple[str, Settings, Seeded], capsys: pytest.CaptureFixture[str]) -> None:
    url, settings, _ = console
    async with jar() as http:
        assert await sign_in(http, url, owner_link(settings, capsys)) == 303
        (settings.daemon.state_dir / "console.json").write_bytes(b'{"sessions": {"trunc')
        async with http.get(f"{url}/console/") as page:
            assert page.status == 401
        assert await sign_in(http, url, owner_link(settings, capsys)) == 303
        async with http.get(f"{url}/console/") as page:
            assert page.status == 200


async def test_odd_numbers_in_addresses_are_not_errors(
        console: tuple[str, Settings, Seeded], capsys: pytest.CaptureFixture[str]) -> None:
    url, settings, seeded = console
    async with jar() as http:
        assert await sign_in(http, url, owner_link(settings, capsys)) == 303
        for page in ("²", "9" * 5000, "-1", "abc"):
            async with http.get(f"{url}/console/", params={"page": page}) as answer:
                assert answer.status == 200  # the first page
        for path in (f"/console/c/{seeded.dana}/file/1/{'9' * 5000}",
                     f"/console/c/{seeded.dana}/file/{'9' * 5000}/0",
                     f"/console/c/{seeded.dana}/file/1/7"):
            async with http.get(f"{url}{path}") as answer:
                assert answer.status == 404


@pytest.mark.parametrize("content", [b'{"sessions": {"x": {}}}', b'{"links": []}', b"[1, 2]"])
async def test_a_sessions_file_of_the_wrong_shape_means_signing_in_again(
        console: tuple[str, Settings, Seeded], capsys: pytest.CaptureFixture[str],
        content: bytes) -> None:
    url, settings, _ = console
    async with jar() as http:
        assert await sign_in(http, url, owner_link(settings, capsys)) == 303
        (settings.daemon.state_dir / "console.json").write_bytes(content)
        async with http.get(f"{url}/console/") as page:
            assert page.status == 401
        assert await sign_in(http, url, owner_link(settings, capsys)) == 303


async def test_a_sign_in_posted_from_another_site_is_refused(
        console: tuple[str, Settings, Seeded], capsys: pytest.CaptureFixture[str]) -> None:
    url, settings, _ = console
    link = owner_link(settings, capsys)
    async with jar() as http:
        async with http.post(f"{url}/console/login", data={"t": link}, allow_redirects=False,
                             headers={"Origin": "https://evil.example"}) as answer:
            assert answer.status == 403
        assert await sign_in(http, url, link) == 303  # the link was not used up


async def test_a_press_on_roosts_own_page_signs_in_whatever_its_referrer_policy(
        console: tuple[str, Settings, Seeded]) -> None:
    url, settings, _ = console
    keys = ConsoleKeys(settings.daemon.state_dir)
    # What browsers send for a form on roost's page: no-referrer makes Origin "null", other
    # policies give the origin; a browser without Fetch Metadata sends no Sec-Fetch-Site.
    for headers in ({}, {"Origin": url}, {"Origin": url, "Sec-Fetch-Site": "same-origin"},
                    {"Origin": "null", "Sec-Fetch-Site": "same-origin"}):
        async with jar() as http:
            assert await sign_in(http, url, keys.issue_link((OMAR,), 2e9 - 1), headers) == 303


@pytest.mark.parametrize("headers", [
    {"Origin": "null"},  # a page that sets no-referrer, in a browser without Fetch Metadata
    {"Origin": "null", "Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "cross-site"},
    {"Origin": "null", "Sec-Fetch-Site": "same-site"},  # a neighbouring host of the same site
    {},  # no header at all: the form token alone must refuse it
])
async def test_another_sites_post_of_its_own_link_does_not_swap_the_session(
        console: tuple[str, Settings, Seeded], capsys: pytest.CaptureFixture[str],
        headers: dict[str, str]) -> None:
    url, settings, _ = console
    attackers = ConsoleKeys(settings.daemon.state_dir).issue_link((OMAR,), 2e9 - 1)
    async with jar() as attacker:  # the attacker reads the form of their own link's page
        forged = await sign_in_form(attacker, url, attackers)
    async with jar() as owner:
        assert await sign_in(owner, url, owner_link(settings, capsys)) == 303
        async with owner.post(f"{url}/console/login", data=forged, headers=headers,
                              allow_redirects=False) as answer:
            assert answer.status == 403
            assert "roost_console" not in answer.cookies
            assert "roost's own page" in await answer.text()
        async with owner.get(f"{url}/console/") as page:
            text = await page.text()
        assert DANA in text and OMAR in text  # still the owner's session, not the attacker's
    async with jar() as attacker:
        assert await sign_in(attacker, url, attackers) == 303  # the link was not used up


async def test_a_sign_in_without_its_form_token_is_refused(
        console: tuple[str, Settings, Seeded]) -> None:
    url, settings, _ = console
    link = ConsoleKeys(settings.daemon.state_dir).issue_link((OMAR,), 2e9 - 1)
    async with jar() as other:
        elsewhere = await sign_in_form(other, url, link)  # the token of another browser
    async with jar() as http:
        await sign_in_form(http, url, link)
        for data in ({"t": link}, {"t": link, "signin_token": ""}, elsewhere):
            async with http.post(f"{url}/console/login", data=data,
                                 allow_redirects=False) as answer:
                assert answer.status == 403
        async with http.get(f"{url}/console/") as page:
            assert page.status == 401
        assert await sign_in(http, url, link) == 303  # the link was not used up


async def test_a_notice_written_into_the_address_is_not_shown(
        console: tuple[str, Settings, Seeded], capsys: pytest.CaptureFixture[str]) -> None:
    url, settings, _ = console
    words = "Your session expired. Call +1 555 0100 to keep your data."
    async with jar() as http:
        assert await sign_in(http, url, owner_link(settings, capsys)) == 303
        for path in ("/console/people", "/console/automations"):
            async with http.get(f"{url}{path}", params={"done": words}) as page:
                text = await page.text()
            assert page.status == 200
            assert "555 0100" not in text and 'id="done"' not in text


async def test_behind_a_proxy_the_console_url_counts_as_roosts_own_page(
        fake_ollama: FakeOllama, make_settings: SettingsFactory) -> None:
    proxied = "https://roost.example.org"
    settings = make_settings(model={"host": fake_ollama.url}, console={"url": proxied})
    runner, url = await start(build_app(settings, {"telegram": RecordingChannel("telegram")}))
    keys = ConsoleKeys(settings.daemon.state_dir)
    try:
        for origin, status in ((proxied, 303), ("https://evil.example", 403)):
            async with aiohttp.ClientSession() as http:
                link = keys.issue_link((OMAR,), 2e9 - 1)
                async with http.get(f"{url}/console/login", params={"t": link}) as page:
                    # Secure (console.url is https): a browser sends it back over the proxy
                    nonce = page.cookies["roost_signin"]
                    assert nonce["secure"]
                    token = re.search(r'name="signin_token" value="([^"]+)"', await page.text())
                assert token
                # A proxy that passes its own Host on (127.0.0.1:port here), and a browser
                # without Fetch Metadata: the Origin decides.
                async with http.post(f"{url}/console/login", allow_redirects=False,
                                     data={"t": link, "signin_token": token.group(1)},
                                     headers={"Origin": origin,
                                              "Cookie": f"roost_signin={nonce.value}"}) as answer:
                    assert answer.status == status
    finally:
        await runner.cleanup()
