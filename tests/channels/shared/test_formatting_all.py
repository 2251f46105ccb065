"""The same Markdown for every platform: each dialect against its golden files, and a long
reply cut within each platform's limit with nothing lost.

The golden files are tests/channels/golden/NAME.md and its renderings (regenerated, and read,
as tests/channels/test_formatting.py and test_formatting_matrix.py say)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from channels.formatting import (
    MATRIX_LIMIT,
    MATRIX_RAW_LIMIT,
    TELEGRAM_LIMIT,
    TELEGRAM_RAW_LIMIT,
    WHATSAPP_LIMIT,
    html_visible_length,
    matrix_plain,
    split_matrix,
    split_telegram,
    split_text,
    to_matrix_html,
    to_telegram_html,
    to_whatsapp,
)
from daemon.app.platforms import runtime_of
from daemon.core.platforms import installed
from tests.channels.test_formatting import CASES, GOLDEN, long_answer, utf16, visible
from tests.channels.test_formatting_matrix import problems


@dataclass(frozen=True)
class Dialect:
    """How one platform writes a reply: its rendering, its golden files, its parts."""

    name: str
    suffix: str  # of the golden file beside NAME.md
    render: Callable[[str], str]
    parts: Callable[[str], list[str]]  # the reply as the messages sent, in order
    shown: Callable[[str], str]  # what the person reads of one message (fails if malformed)
    length: Callable[[str], int]  # a message's length as the platform counts it
    limit: int
    raw_limit: int  # bytes of a message as sent, markup included


def _matrix_parts(markdown: str) -> list[str]:
    parts = split_matrix(markdown)
    for body, html in parts:  # the plain body every Matrix message carries says the same
        assert problems(html) == [] and body == matrix_plain(html)
    return [html for _, html in parts]


def _matrix_shown(html: str) -> str:
    """The words of a Matrix message; not its bullets, which a list item cut in two shows
    again at the top of the next part, as any client shows a reopened <li>."""
    assert problems(html) == [], problems(html)
    return matrix_plain(html).replace("\u2022", " ")


def _whatsapp_shown(text: str) -> str:
    return text.replace("```", " ")  # the markers around code are not shown


DIALECTS = [
    Dialect("telegram", ".html", to_telegram_html, split_telegram, visible,
            html_visible_length, TELEGRAM_LIMIT, TELEGRAM_RAW_LIMIT),
    Dialect("whatsapp", ".wa.txt", to_whatsapp,
            lambda markdown: split_text(to_whatsapp(markdown), WHATSAPP_LIMIT),
            _whatsapp_shown, utf16, WHATSAPP_LIMIT, 65536),
    Dialect("matrix", ".mx.html", to_matrix_html, _matrix_parts, _matrix_shown,
            html_visible_length, MATRIX_LIMIT, MATRIX_RAW_LIMIT),
]


def test_each_platform_s_description_names_its_dialect() -> None:
    """The formatting overlay a platform describes is the one its golden files hold."""
    assert {name: runtime_of(p).render for name, p in installed().items()} == {
        d.name: d.render for d in DIALECTS}


@pytest.fixture(params=DIALECTS, ids=[d.name for d in DIALECTS])
def dialect(request: pytest.FixtureRequest) -> Dialect:
    chosen: Dialect = request.param
    return chosen


@pytest.mark.parametrize("case", CASES)
def test_every_golden_input_renders_as_its_golden_file(dialect: Dialect, case: str) -> None:
    rendered = dialect.render((GOLDEN / f"{case}.md").read_text(encoding="utf-8"))
    golden = (GOLDEN / f"{case}{dialect.suffix}").read_text(encoding="utf-8")
    assert rendered == golden.removesuffix("\n")
    dialect.shown(rendered)  # and it is well formed for the platform


@pytest.mark.parametrize(("size", "code_chars"), [(20_000, 6_000), (30_000, 3_000)])
def test_a_long_reply_is_cut_within_the_limit_with_nothing_lost(
        dialect: Dialect, size: int, code_chars: int) -> None:
    markdown = long_answer(size, code_chars)
    parts = dialect.parts(markdown)
    assert len(parts) >= 2
    for part in parts:
        assert 0 < dialect.length(part) <= dialect.limit
        assert len(part.encode("utf-8")) <= dialect.raw_limit
        assert dialect.shown(part).strip()
    # Every word of the whole reply, in order, in the messages; only whitespace at the cuts.
    whole = dialect.shown(dialect.render(markdown)).split()
    assert " ".join(dialect.shown(part) for part in parts).split() == whole
    # No flood of small messages: each but the last is at least half full.
    assert all(dialect.length(part) >= dialect.limit // 2 for part in parts[:-1])
