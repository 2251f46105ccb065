"""Markdown -> Matrix HTML (`org.matrix.custom.html`) and its splitting.

Golden files: tests/channels/golden/NAME.md is the input, NAME.mx.html the expected Matrix
rendering, read and checked by eye when written. Regenerate after a deliberate change with

    ROOST_REGEN_GOLDEN=1 .venv/bin/pytest tests/channels/test_formatting_matrix.py -k golden
"""

from __future__ import annotations

import os
from html.parser import HTMLParser
from pathlib import Path

import pytest

from channels.formatting import matrix_plain, split_matrix, to_matrix_html

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(path.stem for path in GOLDEN.glob("*.md"))
# What the spec recommends clients accept (client-server API, m.room.message msgtypes).
MATRIX_TAGS = {"strong", "em", "del", "code", "pre", "a", "blockquote", "ul", "ol", "li", "p",
               "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "table", "thead", "tbody", "tr",
               "th", "td"}
VOID = {"br", "hr"}


class Balanced(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in MATRIX_TAGS:
            self.errors.append(f"unsupported <{tag}>")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in VOID:
            self.errors.append(f"<{tag}/> is no void element")

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack.pop() != tag:
            self.errors.append(f"</{tag}> closes nothing open")


def problems(html: str) -> list[str]:
    parser = Balanced()
    parser.feed(html)
    parser.close()
    return parser.errors + [f"<{tag}> left open" for tag in parser.stack]


@pytest.mark.parametrize("case", CASES)
def test_golden(case: str) -> None:
    rendered = to_matrix_html((GOLDEN / f"{case}.md").read_text(encoding="utf-8"))
    expected = GOLDEN / f"{case}.mx.html"
    if os.environ.get("ROOST_REGEN_GOLDEN"):
        expected.write_text(rendered + "\n", encoding="utf-8")
    assert rendered + "\n" == expected.read_text(encoding="utf-8")
    assert problems(rendered) == []


def test_one_paragraph_is_sent_bare_and_text_is_escaped() -> None:
    assert to_matrix_html("hi **you** & <script>") == \
        "hi <strong>you</strong> &amp; &lt;script&gt;"


def test_blocks_are_elements_since_a_client_collapses_newlines() -> None:
    html = to_matrix_html("# Title\n\nfirst line\nsecond line\n\n~~gone~~")
    assert html == "<h1>Title</h1>\n<p>first line<br/>\nsecond line</p>\n<p><del>gone</del></p>"


def test_unsafe_links_keep_only_their_text() -> None:
    assert to_matrix_html("[x](javascript:alert(1))") == "x"


def test_a_long_reply_splits_into_balanced_parts_each_with_its_plain_body() -> None:
    markdown = "\n\n".join(f"- item **{n}** " + "word " * 30 for n in range(200))
    parts = split_matrix(markdown, limit=2000)
    assert len(parts) > 1
    for body, html in parts:
        assert problems(html) == []
        assert body == matrix_plain(html)
        assert "<" not in body and body.startswith("•")


def test_a_short_reply_has_the_plain_rendering_as_its_body() -> None:
    ((body, html),) = split_matrix("1. **one**\n2. two")
    assert body == "1. one\n2. two"
    assert html == "<ol>\n<li><strong>one</strong></li>\n<li>two</li>\n</ol>"


def test_nothing_to_send_for_an_empty_reply() -> None:
    assert split_matrix("   ") == []
