"""The console's markdown renderer (daemon/console/transcript.py), its paging and its gzip
test: what a page shows of hostile text, links, code and tables."""

from __future__ import annotations

import pytest

from daemon.console.compression import accepts_gzip
from daemon.console.paging import PER_PAGE, Place, transcript_page
from daemon.console.transcript import render, render_inline


@pytest.mark.parametrize("hostile", [
    "<script>window.pwned=1</script>",
    '<img src=x onerror="window.pwned=2">',
    '<a href="javascript:alert(1)">tap</a>',
    "<iframe src=https://evil.example></iframe>",
])
def test_raw_html_stays_text(hostile: str) -> None:
    html = render(f"before {hostile} after")
    assert "<script" not in html and "<img" not in html and "<iframe" not in html
    assert "<a " not in html
    assert "&lt;" in html  # the tag is shown, escaped


@pytest.mark.parametrize("link", [
    "[x](javascript:alert(1))", "[x](JavaScript:alert(1))", "[x]( javascript:alert(1))",
    "[x](data:text/html;base64,PHNjcmlwdD4=)", "[x](vbscript:msgbox)", "[x](/console/people)",
    "<javascript:alert(1)>", "![x](javascript:alert(1))",
])
def test_only_web_and_mail_addresses_become_links_and_no_picture_is_fetched(link: str) -> None:
    html = render(f"see {link}")
    assert "href" not in html and "<img" not in html
    assert "see x" in html or "see javascript:alert(1)" in html  # the words stay


def test_a_picture_in_markdown_is_a_link_never_fetched_by_the_page() -> None:
    html = render("![the cat](https://evil.example/a.png)")
    assert "<img" not in html
    assert '<a href="https://evil.example/a.png" rel="noopener noreferrer">the cat</a>' in html


def test_a_safe_link_opens_without_telling_the_other_site_where_from() -> None:
    html = render("[the report](https://example.org/r?a=1&b=2) or <mailto:dana@example.org>")
    assert ('<a href="https://example.org/r?a=1&amp;b=2" rel="noopener noreferrer">'
            'the report</a>') in html
    assert '<a href="mailto:dana@example.org" rel="noopener noreferrer">' in html


def test_a_refused_link_keeps_its_words_not_its_brackets() -> None:
    html = render("tap [**here**](javascript:alert(1)) now")
    assert html == "<p>tap <strong>here</strong> now</p>\n"


def test_markdown_shows_as_a_chat_showed_it() -> None:
    html = render("**Monday**: buy *milk*\nand ~~bread~~")
    assert html == ("<p><strong>Monday</strong>: buy <em>milk</em><br />\n"
                    "and <s>bread</s></p>\n")


def test_code_keeps_its_html_as_text() -> None:
    html = render("```html\n<script>alert(1)</script>\n```\nand `<b>inline</b>`")
    assert '<pre><code class="language-html">&lt;script&gt;alert(1)&lt;/script&gt;' in html
    assert "<code>&lt;b&gt;inline&lt;/b&gt;</code>" in html


def test_a_table_is_kept_inside_its_reflowing_box() -> None:
    html = render("| Day | Plan |\n|---|---|\n| Mon | <b>gym</b> |")
    assert html.startswith('<div class="table"><table>') and html.endswith("</table>\n</div>")
    assert "<th>Day</th>" in html and "<td>&lt;b&gt;gym&lt;/b&gt;</td>" in html


def test_roosts_own_note_renders_inline() -> None:
    assert render_inline("12:00:05 **fold**: folded `4` messages") == (
        "12:00:05 <strong>fold</strong>: folded <code>4</code> messages")


@pytest.mark.parametrize(("header", "takes"), [
    ("gzip, deflate, br", True), ("deflate", False), ("", False), ("gzip;q=0", False),
    ("br;q=1.0, gzip;q=0.8", True), ("GZIP", True), ("identity", False)])
def test_gzip_only_when_the_client_takes_it(header: str, takes: bool) -> None:
    assert accepts_gzip(header) is takes


def test_pages_count_back_from_the_latest_with_the_fold_and_first_message_in_reach() -> None:
    seqs = list(range(1, 2001))
    latest = transcript_page(seqs, through_seq=1200, number=0)
    assert (latest.start, latest.end, latest.count) == (1900, 2000, 20)
    assert latest.newer is None and latest.older == 1
    assert latest.fold == Place(7, 1201)  # seq 1201 is index 1200: 799 messages after it
    assert latest.first == Place(19, 1)
    fold = transcript_page(seqs, 1200, latest.fold.page)
    assert fold.start <= 1200 < fold.end
    oldest = transcript_page(seqs, 1200, 999)  # past the end: the oldest page
    assert (oldest.number, oldest.start, oldest.end) == (19, 0, 100)
    short = transcript_page(seqs[:5], 0, 0)
    assert (short.count, short.start, short.end, short.fold) == (1, 0, 5, None)
    assert PER_PAGE == 100
