"""web_fetch against a loopback site: an article, a redirect chain, a loop, a 20 MB page, a
slow page, and redirects to a loopback address that is not allowed (127.0.0.2 when only the
site's host is in web.allow_hosts). Every connection stays on loopback."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from daemon.tools.registry import Registry
from daemon.tools.web.tools import PAGE_CHARS, split_pages
from tests.daemon.tools.web.conftest import Call
from tests.fakes.website import FakeSite

Tools = Callable[..., tuple[Registry, Call]]
LOOPBACK = {"allow_hosts": ["127.0.0.1"]}


async def test_an_article_comes_back_as_its_text_labelled_and_paged(
        site: FakeSite, tools: Tools) -> None:
    _, call = tools(**LOOPBACK)
    first = await call("web_fetch", url=site.url + "/article")
    assert not first.error
    text = first.content
    assert text.startswith(f"[web page from {site.url}/article; untrusted content")
    assert "\n# t-distributed stochastic neighbor embedding\n" in text
    assert "**T-distributed Stochastic Neighbor Embedding (t-SNE)** is a [machine learning]" in text
    assert "wgBreakFrames" not in text and "<script" not in text  # scripts and markup gone
    # Long pages are paged, not cut: the last page ends the article, the first says how on.
    assert "Page 1 of 3. Next: web_fetch(" in text
    last = await call("web_fetch", url=site.url + "/article", page=3)
    assert "Page 3 of 3." in last.content and "Next:" not in last.content
    for page in (4, 0, -1):
        beyond = await call("web_fetch", url=site.url + "/article", page=page)
        assert beyond.content == f"ERROR: {site.url}/article has 3 pages; there is no page {page}."
    assert site.requests == [(f"127.0.0.1:{site.port}", "/article")]  # page 3 came from cache


async def test_a_redirect_chain_is_followed_and_a_loop_is_stopped(
        site: FakeSite, tools: Tools) -> None:
    _, call = tools(**LOOPBACK)
    got = await call("web_fetch", url=site.url + "/hop/3")
    assert f"[web page from {site.url}/article (redirected from {site.url}/hop/3)" in got.content
    assert [p for _, p in site.requests] == ["/hop/3", "/hop/2", "/hop/1", "/article"]
    looped = await call("web_fetch", url=site.url + "/loop")
    assert looped.content.startswith(f"ERROR: {site.url}/loop was not fetched: more than 5 "
                                     "redirects")
    assert [p for _, p in site.requests].count("/loop") == 6


@pytest.mark.parametrize("path", ["/big", "/bomb"])
async def test_a_20_mb_page_is_refused_at_the_cap_not_read_whole(
        site: FakeSite, tools: Tools, path: str) -> None:
    _, call = tools(**LOOPBACK)
    got = await call("web_fetch", url=site.url + path)
    assert got.content == (f"ERROR: {site.url}{path} was not fetched: the page is larger than "
                           "5 MB (web.max_mb), so it was not read")


async def test_a_page_that_never_answers_times_out_with_a_clear_result(
        site: FakeSite, tools: Tools) -> None:
    _, call = tools(timeout=1.0, **LOOPBACK)
    got = await call("web_fetch", url=site.url + "/slow")
    assert got.content == (f"ERROR: {site.url}/slow was not fetched: 127.0.0.1 did not "
                           "answer within 1 s")


async def test_a_redirect_to_a_loopback_address_that_is_not_allowed_is_refused(
        site: FakeSite, tools: Tools) -> None:
    private = await site.also_on("127.0.0.2")
    _, call = tools(**LOOPBACK)
    got = await call("web_fetch", url=f"{site.url}/to/x?url={private}/secret")
    assert got.content.startswith(f"ERROR: {site.url}/to/x?url={private}/secret was not "
                                  "fetched: 127.0.0.2 leads to 127.0.0.2, a private")
    assert "hunter2" not in got.content
    assert [h for h, _ in site.requests] == [f"127.0.0.1:{site.port}"]  # nothing reached .2
    # A name is resolved once and checked the same way after a redirect ("localhost" is in
    # /etc/hosts: loopback only).
    got = await call("web_fetch", url=f"{site.url}/to/x?url=http://localhost:{site.port}/secret")
    assert "leads to" in got.content and "hunter2" not in got.content
    assert [p for _, p in site.requests if p == "/secret"] == []


async def test_the_first_url_is_refused_before_any_connection(site: FakeSite,
                                                               tools: Tools) -> None:
    _, call = tools()  # nothing allowed: the site itself is on loopback
    got = await call("web_fetch", url=site.url + "/article")
    assert "127.0.0.1 leads to 127.0.0.1, a private, loopback" in got.content
    assert site.requests == []


@pytest.mark.parametrize(("url", "problem"), [
    ("file:///etc/passwd", "is not an http:// or https:// URL"),
    ("ftp://example.org/x", "is not an http:// or https:// URL"),
    ("http://user:pw@example.org/", "user name or password"),
    ("not a url", "is not an http:// or https:// URL"),
])
async def test_other_schemes_and_credentials_are_refused(tools: Tools, url: str,
                                                         problem: str) -> None:
    _, call = tools()
    got = await call("web_fetch", url=url)
    assert got.content.startswith("ERROR: ") and problem in got.content


async def test_a_redirect_to_another_scheme_is_refused(site: FakeSite, tools: Tools) -> None:
    _, call = tools(**LOOPBACK)
    got = await call("web_fetch", url=f"{site.url}/to/x?url=file:///etc/passwd")
    assert "'file:///etc/passwd' is not an http:// or https:// URL" in got.content


async def test_text_is_returned_as_is_errors_and_binaries_are_named(
        site: FakeSite, tools: Tools) -> None:
    _, call = tools(**LOOPBACK)
    plain = await call("web_fetch", url=site.url + "/plain.txt")
    assert "just some text\nover two lines" in plain.content
    missing = await call("web_fetch", url=site.url + "/missing")
    assert missing.content.endswith("answered 404 Not Found")
    binary = await call("web_fetch", url=site.url + "/file.zip")
    assert "it is application/zip, not a web page or text" in binary.content


def test_pages_split_between_paragraphs_and_lose_nothing() -> None:
    text = "\n\n".join(f"Paragraph {n}. " + "word " * 150 for n in range(40))
    pages = split_pages(text)
    assert len(pages) > 1 and all(len(p) <= PAGE_CHARS for p in pages)
    assert all(p.startswith("Paragraph") for p in pages)
    assert " ".join(" ".join(pages).split()) == " ".join(text.split())
