"""Transcripts as the person saw them, over a real daemon app: markdown, pictures, voice notes
and documents, names instead of chat ids, a long conversation in pages, and gzip."""

from __future__ import annotations

import asyncio
import gzip
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType

import aiohttp
import pytest

from daemon.app.serve import build_app
from daemon.core.config import Settings
from daemon.store.console_keys import OWNER, ConsoleKeys
from tests.conftest import RecordingChannel, SettingsFactory
from tests.daemon.app.test_app import start
from tests.daemon.console.conftest import DANA, OMAR, seed
from tests.daemon.console.media import DOCUMENT, OMARS_NAME, seed_long, seed_media
from tests.daemon.console.test_console import sign_in
from tests.fakes.ollama import FakeOllama


@dataclass
class Served:
    url: str
    settings: Settings
    media: str  # Dana's conversation with a photo, a voice note and a document



@pytest.fixture
async def served(fake_ollama: FakeOllama, make_settings: SettingsFactory,
                 state_dir: Path) -> AsyncIterator[Served]:
    seed(state_dir)
    media = seed_media(state_dir)
    settings = replace(make_settings(model={"host": fake_ollama.url}),
                       identities=MappingProxyType({"dana": (DANA,)}))
    runner, url = await start(build_app(settings, {"telegram": RecordingChannel("telegram")}))
    try:
        yield Served(url, settings, media)
    finally:
        await runner.cleanup()


async def owner(http: aiohttp.ClientSession, served: Served) -> None:
    link = ConsoleKeys(served.settings.daemon.state_dir).issue_link((OWNER,), 2e9 - 1)
    assert await sign_in(http, served.url, link) == 303


def signed_jar() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


def raw(signed: aiohttp.ClientSession) -> aiohttp.ClientSession:
    """The signed-in browser's cookies in a client that shows the bytes as they came."""
    return aiohttp.ClientSession(cookie_jar=signed.cookie_jar, auto_decompress=False)


async def test_a_reply_shows_its_markdown_and_the_message_its_picture_voice_and_document(
        served: Served) -> None:
    async with signed_jar() as http:
        await owner(http, served)
        async with http.get(f"{served.url}/console/c/{served.media}") as page:
            text = await page.text()
        assert "<strong>Monday</strong>: buy <em>milk</em>" in text
        assert '<div class="table"><table>' in text and "<th>Morning</th>" in text
        assert "&lt;b&gt;" in text  # HTML in code is text
        assert '<a href="https://shop.example/milk" rel="noopener noreferrer">the shop</a>' in text
        assert "javascript:" not in text  # the hostile link kept its words only
        files = dict(re.findall(r'<(img|audio)[^>]* src="([^"]+)"', text))
        assert set(files) == {"img", "audio"}
        assert f">{DOCUMENT.replace('<', '&lt;').replace('>', '&gt;')}</a>" in text
        answers = {}
        for what, src in [*files.items(), ("doc", files["img"].replace("/1/0", "/4/0"))]:
            async with http.get(f"{served.url}{src}") as reply:
                assert reply.status == 200, what
                answers[what] = (reply.headers["Content-Type"],
                                 reply.headers["Content-Disposition"].split(";")[0],
                                 reply.headers["Content-Security-Policy"])
        assert answers["img"][:2] == ("image/jpeg", "inline")  # re-encoded on the way in
        assert answers["audio"][:2] == ("audio/ogg", "inline")
        assert answers["doc"][:2] == ("application/octet-stream", "attachment")
        assert "media-src 'self'" in answers["audio"][2]
        assert "script-src" not in answers["img"][2]
    async with aiohttp.ClientSession() as stranger:
        async with stranger.get(f"{served.url}{files['img']}") as reply:
            assert reply.status == 401


async def test_a_persons_session_cannot_fetch_anothers_picture(served: Served) -> None:
    link = ConsoleKeys(served.settings.daemon.state_dir).issue_link((OMAR,), 2e9 - 1)
    async with signed_jar() as http:
        assert await sign_in(http, served.url, link) == 303
        async with http.get(f"{served.url}/console/c/{served.media}/file/1/0") as reply:
            assert reply.status == 404


async def test_names_instead_of_chat_ids_with_the_id_in_small_print(served: Served) -> None:
    async with signed_jar() as http:
        await owner(http, served)
        async with http.get(f"{served.url}/console/") as page:
            listed = await page.text()
        async with http.get(f"{served.url}/console/c/{served.media}") as page:
            one = await page.text()
    # Dana by her [identities] name; Omar by the name the pairing book keeps.
    assert re.search(rf'title="{DANA}">dana</a>\s*<small class="key">{DANA}</small>', listed)
    assert re.search(rf'title="{OMAR}">{OMARS_NAME}</a>\s*<small class="key">{OMAR}</small>',
                     listed)
    assert re.search(rf'<h1 title="{DANA}">dana <small class="key">{DANA}</small></h1>', one)
    assert "<title>dana · roost console</title>" in one


async def test_html_and_css_are_gzipped_when_the_browser_takes_it_and_only_then(
        served: Served) -> None:
    paths = ["/console/", f"/console/c/{served.media}", "/console/static/console.css",
             "/console/people"]
    async with signed_jar() as signed, raw(signed) as http:
        await owner(signed, served)
        for path in paths:
            async with http.get(f"{served.url}{path}",
                                headers={"Accept-Encoding": "gzip, deflate, br"}) as reply:
                assert reply.headers.get("Content-Encoding") == "gzip", path
                assert gzip.decompress(await reply.read())  # really gzip
            async with http.get(f"{served.url}{path}",
                                headers={"Accept-Encoding": "identity"}) as reply:
                assert "Content-Encoding" not in reply.headers, path
                assert (await reply.read()).lstrip()[:1] in (b"<", b"/")
        async with http.get(f"{served.url}/console/login",
                            headers={"Accept-Encoding": "gzip"}) as reply:
            assert reply.headers.get("Content-Encoding") == "gzip"  # signed out too


@pytest.fixture
async def long_served(fake_ollama: FakeOllama, make_settings: SettingsFactory,
                      state_dir: Path) -> AsyncIterator[tuple[Served, str]]:
    long = await asyncio.to_thread(seed_long, state_dir)
    settings = make_settings(model={"host": fake_ollama.url})
    runner, url = await start(build_app(settings, {"telegram": RecordingChannel("telegram")}))
    try:
        yield Served(url, settings, ""), long
    finally:
        await runner.cleanup()


async def test_a_2000_message_conversation_opens_on_its_latest_page(
        long_served: tuple[Served, str]) -> None:
    served, long = long_served
    address = f"{served.url}/console/c/{long}"
    async with signed_jar() as signed, raw(signed) as http:
        await owner(signed, served)
        async with http.get(address, headers={"Accept-Encoding": "gzip"}) as reply:
            compressed = await reply.read()
        assert len(compressed) < 200_000, len(compressed)
        first = gzip.decompress(compressed).decode()

        async def follow(href: str) -> str:
            async with http.get(f"{address}{href.replace('&amp;', '&')}",
                                headers={"Accept-Encoding": "gzip"}) as reply:
                body = await reply.read()
                assert len(body) < 200_000
                return gzip.decompress(body).decode()

        # the latest first: messages 1901-2000, in order, and nothing older
        shown = [int(n) for n in re.findall(r'<article [^>]*id="m(\d+)"', first)]
        assert shown == list(range(1901, 2001))
        assert "page 1 of 20, latest first" in first
        fold_link = re.search(r'class="to-fold" href="([^"]+)"', first)
        first_link = re.search(r'class="to-first" href="([^"]+)"', first)
        older_link = re.search(r'href="([^"]+)" rel="next">Older', first)
        assert fold_link and first_link and older_link
        assert fold_link.group(1).endswith("#fold-boundary")
        fold_page = await follow(fold_link.group(1).split("#")[0])
        # the line sits just before message 1201, the first the model still sees whole
        assert re.search(r'id="fold-boundary">[^<]*</p>\s*<article[^>]*id="m1201"', fold_page)
        oldest = await follow(first_link.group(1).split("#")[0])
        assert 'id="m1"' in oldest and 'rel="next"' not in oldest
        assert first_link.group(1).endswith("#m1")
        older = await follow(older_link.group(1))
        assert [int(n) for n in re.findall(r'<article [^>]*id="m(\d+)"', older)] == list(
            range(1801, 1901))
        assert 'rel="prev">Newer' in older
