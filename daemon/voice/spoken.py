"""A reply's Markdown -> the words a voice note reads aloud. Pure: no I/O.

The spoken text is made from the rendered text, never the Markdown: emphasis, headings and list
markers are not read as symbols, a fenced code block is "a code block", a table "a table", a
long URL "a link" (a link with words says its words). Each block ends as a sentence, so a
heading or a list item gets its pause. A reply longer than `max_seconds` at `words_per_second`
is cut at the last sentence that fits (a first sentence longer than that at a word), and says
that the rest is written: the text message carries the whole answer.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from urllib.parse import urlsplit

from markdown_it import MarkdownIt
from markdown_it.tree import SyntaxTreeNode

REST_IS_WRITTEN = "The rest is in the written reply."
_URL = re.compile(r"\b(?:https?://|www\.)[^\s<>()\[\]]+", re.IGNORECASE)
_SHORT_URL = 30  # characters of a bare host still read out ("example.com")
# Marks Markdown left in the text (unbalanced, escaped or not Markdown at all) that a speech
# engine would read as a word ("asterisk", "hash").
_MARKS = re.compile(r"[*_#|~`<>\\^=]+")
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+")
_ENDS = (".", "!", "?", "…", ":", ";")


@dataclass(frozen=True)
class Spoken:
    text: str  # what is read aloud
    cut: bool  # True when the answer was longer than max_duration allows


def spoken_text(markdown: str, *, max_seconds: float, words_per_second: float = 2.5) -> Spoken:
    """The words to speak for `markdown` within `max_seconds` (see the module docstring)."""
    parser = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
    tree = SyntaxTreeNode(parser.parse(_printable(markdown)))
    sentences = [s for block in _blocks(tree) for s in _SENTENCE_END.split(block) if s]
    budget = max(1, int(max_seconds * words_per_second))
    return _fit(sentences, budget)


def _printable(text: str) -> str:
    """Control characters become spaces and format characters (zero-width) go: a TTS engine
    may choke on or read them. Line breaks stay, Markdown needs them."""
    return "".join(c if c in "\n\t" or unicodedata.category(c)[0] != "C"
                   else "" if unicodedata.category(c) == "Cf" else " " for c in text)


def _blocks(node: SyntaxTreeNode) -> list[str]:
    """One sentence-ended string per block, in reading order."""
    kind = node.type
    if kind in ("fence", "code_block"):
        return ["A code block."]
    if kind == "table":
        return ["A table."]
    if kind in ("paragraph", "heading"):
        inline = node.children[0] if node.children else None
        words = _clean(_inline(inline) if inline is not None else "")
        if not words:
            return []
        return [words if words.endswith(_ENDS) else f"{words}."]
    if kind in ("hr", "html_block"):
        return []
    return [text for child in node.children for text in _blocks(child)]


def _inline(node: SyntaxTreeNode) -> str:
    kind = node.type
    if kind == "text":
        return _URL.sub(lambda m: _url(m.group()), node.content)
    if kind == "code_inline":
        return node.content
    if kind in ("softbreak", "hardbreak"):
        return " "
    if kind == "image":
        alt = "".join(_inline(child) for child in node.children).strip()
        return alt or "an image"
    if kind == "link":
        words = "".join(_inline(child) for child in node.children).strip()
        href = str(node.attrs.get("href", ""))
        # An autolink's text is its address: said as one, not spelled out.
        return _url(href) if not words or words in (href, href.removeprefix("mailto:")) \
            or _URL.fullmatch(words) else words
    return "".join(_inline(child) for child in node.children)


def _url(url: str) -> str:
    """A bare host reads as itself ("example.com"); anything longer is "a link"."""
    if url.startswith("mailto:"):
        return "an email address"
    parts = urlsplit(url if "://" in url else f"http://{url}")
    host = parts.hostname or ""
    if host and parts.path in ("", "/") and not parts.query and len(host) <= _SHORT_URL:
        return host.removeprefix("www.")
    return "a link"


def _clean(text: str) -> str:
    return " ".join(_MARKS.sub(" ", text).split())


def _fit(sentences: list[str], budget: int) -> Spoken:
    """The sentences that fit in `budget` words; a sentence longer than all of it is cut at a
    word, so the note is never empty when the reply is not."""
    total = sum(len(s.split()) for s in sentences)
    if total <= budget:
        return Spoken(" ".join(sentences), cut=False)
    room = max(1, budget - len(REST_IS_WRITTEN.split()))
    kept: list[str] = []
    used = 0
    for sentence in sentences:
        words = len(sentence.split())
        if used + words > room:
            break
        kept.append(sentence)
        used += words
    if not kept:
        head = " ".join(sentences[0].split()[:room]).rstrip(",;:")
        kept = [f"{head}…"]
    return Spoken(" ".join([*kept, REST_IS_WRITTEN]), cut=True)
