"""Markdown -> Telegram HTML / WhatsApp / plain, and splitting at the platform limits.

Golden files: tests/channels/golden/NAME.md is the input; NAME.html, NAME.wa.txt and NAME.txt
are the expected renderings, each read and checked by eye when written. After a deliberate
change in rendering, regenerate them with

    ROOST_REGEN_GOLDEN=1 /tmp/venv/bin/python -m pytest tests/channels/test_formatting.py -k golden

and read the diff before committing it.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path

import pytest

from channels.formatting import (
    TELEGRAM_LIMIT,
    TELEGRAM_RAW_LIMIT,
    WHATSAPP_LIMIT,
    html_visible_length,
    split_telegram,
    split_text,
    to_plain,
    to_telegram_html,
    to_whatsapp,
)

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(path.stem for path in GOLDEN.glob("*.md"))
RENDERERS: dict[str, Callable[[str], str]] = {
    ".html": to_telegram_html,
    ".wa.txt": to_whatsapp,
    ".txt": to_plain,
}
# The tags Telegram's HTML parse mode accepts.
TELEGRAM_TAGS = {
    "b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "span", "tg-spoiler", "a",
    "code", "pre", "blockquote",
}  # fmt: skip


class TelegramHTML(HTMLParser):
    """An independent reading of a Telegram message: its visible text, and whether its tags
    are all known and properly nested."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.pieces: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in TELEGRAM_TAGS:
            self.errors.append(f"unsupported <{tag}>")
        self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.pieces.append(data)


def visible(html: str) -> str:
    """The text Telegram shows for `html`; fails the test unless `html` is balanced."""
    parser = TelegramHTML()
    parser.feed(html)
    parser.close()
    assert not parser.errors, (parser.errors, html[:200])
    assert not parser.stack, (f"unclosed {parser.stack}", html[-200:])
    return "".join(parser.pieces)


def utf16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def squeeze(text: str) -> str:
    """Text without whitespace: a cut may drop whitespace, nothing else."""
    return "".join(text.split())


def check_telegram_parts(markdown: str, parts: list[str], limit: int) -> None:
    """Each part fits, is balanced, and shows the next stretch of the whole message: in
    order, nothing repeated or lost, only whitespace between two parts."""
    whole = visible(to_telegram_html(markdown))
    pos = 0
    for part in parts:
        seen = visible(part)
        assert html_visible_length(part) == utf16(seen)
        assert utf16(seen) <= limit
        assert seen.strip(), "no empty parts"
        found = whole.find(seen, pos)
        assert found >= 0 and not whole[pos:found].strip(), (seen[:80], whole[pos : pos + 80])
        pos = found + len(seen)
    assert not whole[pos:].strip()


# ---- golden renderings ---------------------------------------------------------------------


@pytest.mark.parametrize("suffix", RENDERERS)
@pytest.mark.parametrize("case", CASES)
def test_golden(case: str, suffix: str) -> None:
    source = (GOLDEN / f"{case}.md").read_text(encoding="utf-8")
    expected_path = GOLDEN / f"{case}{suffix}"
    rendered = RENDERERS[suffix](source)
    if os.environ.get("ROOST_REGEN_GOLDEN") == "1":
        expected_path.write_text(rendered + "\n", encoding="utf-8")
        pytest.skip(f"regenerated {expected_path.name}: read it before committing")
    assert rendered == expected_path.read_text(encoding="utf-8").removesuffix("\n")


@pytest.mark.parametrize("case", CASES)
def test_golden_telegram_html_is_valid(case: str) -> None:
    html = to_telegram_html((GOLDEN / f"{case}.md").read_text(encoding="utf-8"))
    visible(html)  # balanced, only Telegram's tags


def test_every_golden_input_has_all_three_outputs() -> None:
    assert CASES
    for case in CASES:
        for suffix in RENDERERS:
            assert (GOLDEN / f"{case}{suffix}").exists(), f"{case}{suffix} missing"


# ---- rendering rules -----------------------------------------------------------------------


def test_text_is_escaped_and_raw_html_never_passes() -> None:
    html = to_telegram_html('<a href="javascript:x">hi</a> <b>x</b> 1 < 2 & 3 > 2')
    assert "<a" not in html and "<b>" not in html
    assert visible(html) == '<a href="javascript:x">hi</a> <b>x</b> 1 < 2 & 3 > 2'


@pytest.mark.parametrize(
    "url", ["javascript:alert(1)", "JAVASCRIPT:alert(1)", "data:text/html,x", "file:///etc", "/x"]
)
def test_unsafe_links_keep_only_their_text(url: str) -> None:
    markdown = f"[click]({url})"
    assert to_telegram_html(markdown) == "click"
    assert to_whatsapp(markdown) == "click"
    assert to_plain(markdown) == "click"


def test_link_href_is_escaped_as_an_attribute() -> None:
    html = to_telegram_html('[x](https://e.org/?a=1&b=<2>"3")')
    assert html.startswith('<a href="https://e.org/?a=1&amp;b=')
    assert '"3"' not in html and "<2>" not in html
    visible(html)


def test_code_block_language_and_content() -> None:
    html = to_telegram_html('```python\nif a < b:\n    print("&")\n```')
    assert html == (
        '<pre><code class="language-python">if a &lt; b:\n    print("&amp;")</code></pre>'
    )
    assert to_whatsapp("```python\nx = 1\n```") == "```x = 1```"


def test_heading_is_bold_line_and_nested_bold_does_not_double() -> None:
    assert to_telegram_html("# A **b** c") == "<b>A b c</b>"
    assert to_whatsapp("# A **b** c") == "*A b c*"


def test_plain_has_no_emphasis_markers() -> None:
    plain = to_plain("# T\n\n**b** *i* ~~s~~ `c` [l](https://x.org)")
    assert plain == "T\n\nb i s c l (https://x.org)"


def test_empty_input() -> None:
    assert to_telegram_html("") == ""
    assert split_telegram("") == []
    assert split_telegram("  \n\n ") == []
    assert split_text("", 100) == []


@pytest.mark.parametrize(
    ("html", "length"),
    [
        ("plain", 5),
        ("<b>bold</b>", 4),
        ("&lt;&gt;&amp;&quot;", 4),
        ("&#128512;", 2),  # 😀 is outside the BMP: two UTF-16 units
        ("😀", 2),
        ("𝄞é", 3),
        ('<a href="https://e.org/&amp;">é</a>', 1),
        ('<pre><code class="language-x">a\nb</code></pre>', 3),
    ],
)
def test_html_visible_length_counts_utf16_units(html: str, length: int) -> None:
    assert html_visible_length(html) == length


# ---- splitting -----------------------------------------------------------------------------


def long_answer(size: int, code_chars: int, seed: int = 7) -> str:
    """A model's long answer: paragraphs, lists, a table, one long paragraph without blank
    lines and one long code block, with characters that need escaping and emoji throughout."""
    rng = random.Random(seed)
    words = "the model said that roost < ollama & telegram > whatsapp 😀 𝄞 naïve 漢字 fine".split()

    def sentence() -> str:
        chosen = [rng.choice(words) for _ in range(rng.randint(6, 16))]
        chosen[0] = f"**{chosen[0]}**"
        chosen[-1] = f"[{chosen[-1]}](https://example.org/{rng.randint(1, 99)}?a=1&b=2)"
        return " ".join(chosen) + "."

    code_lines: list[str] = []
    while sum(len(line) + 1 for line in code_lines) < code_chars:
        n = len(code_lines)
        code_lines.append(f"    value_{n} = compute({n}) if {n} < limit and flag & 1 else None")
    code = "```python\ndef main():\n" + "\n".join(code_lines) + "\n```"
    long_paragraph = "\n".join(sentence() for _ in range(60))  # soft breaks, no blank line
    blocks = ["# Answer", code, long_paragraph]
    while sum(len(block) + 2 for block in blocks) < size:
        pick = rng.randrange(4)
        if pick == 0:
            blocks.append(" ".join(sentence() for _ in range(rng.randint(2, 6))))
        elif pick == 1:
            blocks.append("\n".join(f"- {sentence()}\n  - nested {sentence()}" for _ in range(4)))
        elif pick == 2:
            blocks.append("\n".join(f"{i}. {sentence()}" for i in range(1, 6)))
        else:
            blocks.append("| a | b |\n|---|---|\n| 1 < 2 | x & y |")
    rng.shuffle(blocks)
    return "\n\n".join(blocks)[:size].rsplit("\n", 1)[0]


@pytest.mark.parametrize(("size", "code_chars"), [(20_000, 6_000), (10_000, 3_000)])
def test_long_answer_splits_within_the_limit(size: int, code_chars: int) -> None:
    markdown = long_answer(size, code_chars)
    assert size - 200 < len(markdown) <= size
    parts = split_telegram(markdown)
    check_telegram_parts(markdown, parts, TELEGRAM_LIMIT)
    # Each part but the last is reasonably full: no flood of tiny messages.
    total = html_visible_length(to_telegram_html(markdown))
    assert len(parts) <= total // (TELEGRAM_LIMIT // 2) + 1
    # A code block longer than a message is cut into several, each with its language.
    if code_chars > TELEGRAM_LIMIT:
        with_code = [part for part in parts if 'class="language-python"' in part]
        assert len(with_code) >= 2


def test_code_block_is_closed_and_reopened_with_its_language() -> None:
    code = "\n".join(f"    line_{i} = {i} < {i + 1}" for i in range(40))
    markdown = f"Intro.\n\n```python\n{code}\n```\n\nOutro."
    parts = split_telegram(markdown, limit=200)
    check_telegram_parts(markdown, parts, 200)
    inside = [part for part in parts if "line_" in part]
    assert len(inside) > 2
    for part in inside:
        assert part.count('<pre><code class="language-python">') == 1
        assert part.count("</code></pre>") == 1
        # Cut at line ends, indentation kept: no line of code torn or shifted.
        code_text = visible(part).removeprefix("Intro.\n\n").removesuffix("\n\nOutro.")
        for line in code_text.split("\n"):
            assert line.startswith("    line_") and line.split(" < ")[1].isdigit(), line


def test_split_prefers_paragraphs_then_lines_then_words() -> None:
    paragraph = " ".join(["word"] * 30)  # 149 characters
    parts = split_telegram(f"{paragraph}\n\n{paragraph}\n\n{paragraph}", limit=320)
    assert [visible(part) for part in parts] == [f"{paragraph}\n\n{paragraph}", paragraph]
    lines = "\n".join(["line " * 10] * 10)  # 10 lines of 49 characters, no blank lines
    parts = split_telegram(lines, limit=120)
    assert all(visible(part).endswith("line") for part in parts)
    assert [visible(part).count("\n") for part in parts[:-1]] == [1] * (len(parts) - 1)


def test_quote_and_bold_survive_a_cut() -> None:
    markdown = "> " + " ".join(f"**w{i}** plain{i}" for i in range(200))
    parts = split_telegram(markdown, limit=150)
    check_telegram_parts(markdown, parts, 150)
    assert all(part.startswith("<blockquote>") for part in parts)
    assert all(part.endswith("</blockquote>") for part in parts)


def test_hard_split_of_a_word_longer_than_the_limit() -> None:
    markdown = "x" * 500 + " " + "😀" * 300
    parts = split_telegram(markdown, limit=100)
    check_telegram_parts(markdown, parts, 100)
    assert "".join(visible(part) for part in parts) == markdown.replace(" ", "")


def link_heavy_answer(items: int = 400) -> str:
    """Sources as a model lists them: few visible characters, long URLs behind each."""
    return "\n".join(
        f"- [source](https://example.org/research/archive/{i:04d}/a-rather-long-article-slug"
        f"-about-topic-{i}?utm_source=assistant&ref=list)" for i in range(items))


def test_a_link_heavy_answer_stays_under_the_raw_byte_limit() -> None:
    markdown = link_heavy_answer()
    html_text = to_telegram_html(markdown)
    assert html_visible_length(html_text) < TELEGRAM_LIMIT  # one part by visible length alone
    assert len(html_text.encode()) > TELEGRAM_RAW_LIMIT
    parts = split_telegram(markdown)
    assert len(parts) >= 2
    check_telegram_parts(markdown, parts, TELEGRAM_LIMIT)
    assert all(len(part.encode()) <= TELEGRAM_RAW_LIMIT for part in parts)
    assert sum(part.count("<a href=") for part in parts) == 400  # no link cut or lost


def test_raw_limit_counts_reopened_tags() -> None:
    markdown = "> " + " ".join(f"[w{i}](https://example.org/{i})" for i in range(300))
    parts = split_telegram(markdown, raw_limit=1024)
    check_telegram_parts(markdown, parts, TELEGRAM_LIMIT)
    assert len(parts) > 5
    assert all(len(part.encode()) <= 1024 for part in parts)
    assert all(part.startswith("<blockquote>") and part.endswith("</blockquote>")
               for part in parts)


def test_split_counts_entities_as_one_character() -> None:
    markdown = "&" * 4096  # 4096 visible characters, 20480 characters of HTML
    parts = split_telegram(markdown)
    assert len(parts) == 1
    assert html_visible_length(parts[0]) == TELEGRAM_LIMIT


def test_split_rejects_a_limit_too_small_to_be_useful() -> None:
    with pytest.raises(ValueError, match="limit"):
        split_telegram("text", limit=1)
    with pytest.raises(ValueError, match="limit"):
        split_text("text", limit=0)


def test_random_markdown_splits_hold_their_invariants() -> None:
    """A property test without hypothesis (not a dependency here): seeded random documents
    built from every construct, split at many limits."""
    rng = random.Random(1234)
    pieces = [
        "# Heading & <co>", "**bold** and *it* and ~~no~~", "`a < b`", "[l](https://e.org/?x=1&y=2)",
        "[j](javascript:alert(1))", "> quoted **text** here", "- item\n  - nested item",
        "1. one\n2. two", "```js\nlet a = b < c && d;\nconsole.log(a);\n```", "---",
        "| h1 | h2 |\n|---|---|\n| 😀 | 𝄞 |", "emoji 👨‍👩‍👧 e\u0301 text", "<i>raw</i> & more",
        "long" * 40, "word " * 50,
    ]  # fmt: skip
    for _ in range(150):
        markdown = "\n\n".join(rng.choice(pieces) for _ in range(rng.randint(1, 25)))
        limit = rng.randint(40, 600)
        check_telegram_parts(markdown, split_telegram(markdown, limit), limit)
        for text in (to_whatsapp(markdown), to_plain(markdown)):
            parts = split_text(text, limit)
            assert all(utf16(part) <= limit for part in parts)
            assert squeeze("".join(parts).replace("```", "")) == squeeze(text.replace("```", ""))


def test_split_text_reopens_a_whatsapp_code_block() -> None:
    code = "\n".join(f"step {i}: do the thing" for i in range(30))
    text = to_whatsapp(f"Before.\n\n```\n{code}\n```\n\nAfter.")
    parts = split_text(text, limit=150)
    assert len(parts) > 3
    for part in parts:
        assert utf16(part) <= 150
        assert part.count("```") % 2 == 0  # every part's monospace is closed
    assert squeeze("".join(parts).replace("```", "")) == squeeze(text.replace("```", ""))


def test_split_text_plain_paragraphs_and_limits() -> None:
    text = "\n\n".join(f"Paragraph {i}. " + "words " * 100 for i in range(10))
    parts = split_text(text.strip(), WHATSAPP_LIMIT)
    assert len(parts) == 2
    assert all(part.startswith("Paragraph") for part in parts)
    assert split_text("short", WHATSAPP_LIMIT) == ["short"]
    # A stray ``` is text, not a fence: nothing is added.
    assert split_text("a ``` b " * 3, 10) == ["a ``` b a", "``` b a", "``` b"]
