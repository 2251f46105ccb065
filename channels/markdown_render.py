"""Markdown from the model -> the text one channel sends: one walk, four dialects.

markdown-it-py parses CommonMark (plus GFM tables and strikethrough) into a syntax tree; a
`Renderer` walks it and asks its dialect how each construct looks: Telegram's HTML subset,
WhatsApp's own markers, plain text for a terminal, or Matrix's HTML (which, unlike the others,
is built of block elements: `MatrixRenderer`). Pure functions of the input: no I/O.

Blocks render to `Line`s first, not straight to a string, because two block decorations work
per line: a list item indents its continuation lines under its marker, and a WhatsApp or
terminal quote prefixes every line with "> ". Lines inside a code block are `verbatim` so an
enclosing list never adds indentation inside the code itself.
"""

from __future__ import annotations

import html
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import urlsplit

from markdown_it import MarkdownIt
from markdown_it.tree import SyntaxTreeNode

# Link schemes that may become tappable. Anything else (javascript:, data:, file:, relative
# paths a phone cannot resolve) loses its link and keeps its text.
SAFE_SCHEMES = frozenset({"http", "https", "tg", "mailto"})
HR = "———"


class _Parser(MarkdownIt):
    """CommonMark with tables and strikethrough; raw HTML stays text.

    markdown-it refuses javascript:/data: destinations by leaving `[text](url)` as literal
    text; we accept every destination here and judge the scheme when rendering, so an unsafe
    link still shows its text rather than raw Markdown.
    """

    def __init__(self) -> None:
        # html=False: tags the model writes are text (escaped for Telegram), never markup.
        super().__init__("commonmark", {"html": False, "linkify": False, "typographer": False})
        self.enable(["table", "strikethrough"])

    def validateLink(self, url: str) -> bool:
        return True


PARSER = _Parser()


@dataclass(frozen=True, slots=True)
class Line:
    text: str
    verbatim: bool = False  # inside a code block: enclosing lists do not indent it


def safe_href(href: str) -> str | None:
    """The link target if its scheme may be sent to a phone, else None."""
    try:
        scheme = urlsplit(href).scheme.lower()
    except ValueError:  # e.g. a malformed IPv6 host
        return None
    return href if scheme in SAFE_SCHEMES else None


def display_width(text: str) -> int:
    """Columns `text` takes in a monospaced font: wide (CJK, emoji) count 2, marks 0."""
    width = 0
    for char in text:
        if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me", "Cf"):
            continue
        width += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return width


def _pad(text: str, width: int, align: str) -> str:
    room = width - display_width(text)
    if align == "right":
        return " " * room + text
    if align == "center":
        return " " * (room // 2) + text + " " * (room - room // 2)
    return text + " " * room


def _code_lines(text: str) -> list[Line]:
    """A code block's lines: an enclosing list may indent the first line (before the opening
    tag or fence, outside the code) but none of the others."""
    first, *rest = text.split("\n")
    return [Line(first), *(Line(line, verbatim=True) for line in rest)]


class Renderer:
    """Walks the syntax tree; subclasses say how each construct looks on their channel."""

    bullet = "• "
    table_width = 40  # wider grids become "column: value" lines, readable on a phone

    def __init__(self) -> None:
        # Marks already open around the current span: `**a **b** c**` or a bold span inside
        # a heading (already bold) must not nest the same marker, which breaks WhatsApp.
        self._open: Counter[str] = Counter()
        self._quote_depth = 0

    def render(self, markdown: str) -> str:
        tree = SyntaxTreeNode(PARSER.parse(markdown))
        lines = self._blocks(tree.children, tight=False)
        return "\n".join(line.text if line.verbatim else line.text.rstrip() for line in lines)

    # ---- dialect hooks -------------------------------------------------------------------

    def text(self, text: str) -> str:
        return text

    def mark(self, kind: str, inner: str) -> str:
        """`kind` is the node type: strong, em or s."""
        return inner

    def code_span(self, code: str) -> str:
        return code

    def link(self, text: str, href: str) -> str:
        # Shown for reading: percent-encoding undone; an address is recognised without mailto:.
        shown = PARSER.normalizeLinkText(href).removeprefix("mailto:")
        if safe_href(href) is None:
            return text
        if not text or text == shown:
            return text or shown
        return f"{text} ({shown})"

    def heading(self, inner: str) -> str:
        return inner

    def code_block(self, code: str, lang: str) -> list[Line]:
        return [Line(line) for line in code.split("\n")]

    def quote(self, lines: list[Line], nested: bool) -> list[Line]:
        return [Line(f"> {line.text}" if line.text else ">", line.verbatim) for line in lines]

    # ---- blocks --------------------------------------------------------------------------

    def _blocks(self, nodes: Sequence[SyntaxTreeNode], tight: bool) -> list[Line]:
        out: list[Line] = []
        for node in nodes:
            lines = self._block(node)
            if not lines:
                continue
            if out and not tight:
                out.append(Line(""))  # one blank line between blocks
            out.extend(lines)
        return out

    def _block(self, node: SyntaxTreeNode) -> list[Line]:
        kind = node.type
        if kind == "paragraph":
            return [Line(line) for line in self._inline_of(node).split("\n")]
        if kind == "heading":
            self._open["strong"] += 1
            try:
                inner = self._inline_of(node)
            finally:
                self._open["strong"] -= 1
            return [Line(self.heading(inner))] if inner.strip() else []
        if kind in ("bullet_list", "ordered_list"):
            return self._list(node)
        if kind == "blockquote":
            self._quote_depth += 1
            try:
                inner_lines = self._blocks(node.children, tight=False)
            finally:
                self._quote_depth -= 1
            return self.quote(inner_lines, nested=self._quote_depth > 0) if inner_lines else []
        if kind in ("fence", "code_block"):
            code = node.content.removesuffix("\n")
            lang = node.info.split()[0] if node.info.strip() else ""
            return self.code_block(code, lang) if code.strip() else []
        if kind == "hr":
            return [Line(HR)]
        if kind == "table":
            return self._table(node)
        if kind == "html_block":  # only if a future parser option lets raw HTML through
            return [Line(self.text(line)) for line in node.content.rstrip("\n").split("\n")]
        return self._blocks(node.children, tight=False)

    def _list(self, node: SyntaxTreeNode) -> list[Line]:
        ordered = node.type == "ordered_list"
        start = int(node.attrs.get("start", 1)) if ordered else 1
        # markdown-it hides the paragraphs of a tight list; a tight list stays one line apart.
        paragraphs = [c for item in node.children for c in item.children if c.type == "paragraph"]
        tight = not paragraphs or paragraphs[0].hidden
        out: list[Line] = []
        for number, item in enumerate(node.children, start):
            marker = f"{number}. " if ordered else self.bullet
            body = self._blocks(item.children, tight=tight) or [Line("")]
            if out and not tight:
                out.append(Line(""))
            out.append(Line(marker + body[0].text, body[0].verbatim))
            pad = " " * len(marker)
            out.extend(
                line if line.verbatim or not line.text else Line(pad + line.text)
                for line in body[1:]
            )
        return out

    def _table(self, node: SyntaxTreeNode) -> list[Line]:
        header: list[SyntaxTreeNode] = []
        rows: list[list[SyntaxTreeNode]] = []
        for section in node.children:
            for row in section.children:
                if section.type == "thead":
                    header = row.children
                else:
                    rows.append(row.children)
        aligns = [str(cell.attrs.get("style", "")).removeprefix("text-align:") for cell in header]
        plain = PlainRenderer()
        grid = [[plain._inline_of(cell) for cell in row] for row in [header, *rows]]
        widths = [max(display_width(row[col]) for row in grid) for col in range(len(header))]
        if sum(widths) + 3 * (len(widths) - 1) <= self.table_width:

            def fmt(row: list[str]) -> str:
                return " | ".join(map(_pad, row, widths, aligns)).rstrip()

            text_lines = [fmt(grid[0]), "-+-".join("-" * w for w in widths)]
            text_lines += [fmt(row) for row in grid[1:]]
            return self.code_block("\n".join(text_lines), "")
        # Too wide for a phone: one "column: value" line per cell, rows a blank line apart.
        self._open["strong"] += 1
        try:
            labels = [self._inline_of(cell) for cell in header]
        finally:
            self._open["strong"] -= 1
        if not rows:  # a header alone still says something
            return [Line(" | ".join(self.mark("strong", label) for label in labels if label))]
        out: list[Line] = []
        for cells in rows:
            if out:
                out.append(Line(""))
            for label, cell in zip(labels, cells, strict=False):
                value = self._inline_of(cell)
                if value:
                    out.append(Line(f"{self.mark('strong', label)}: {value}" if label else value))
        return out

    # ---- inline --------------------------------------------------------------------------

    def _inline_of(self, node: SyntaxTreeNode) -> str:
        """The inline content of a block node (paragraph, heading, table cell)."""
        return self._spans(node.children)

    def _span(self, node: SyntaxTreeNode) -> str:
        kind = node.type
        if kind == "text":
            return self.text(node.content)
        if kind in ("softbreak", "hardbreak"):
            # Chat clients wrap by themselves; a line break the model wrote is deliberate.
            return "\n"
        if kind == "code_inline":
            return self.code_span(node.content)
        if kind in ("strong", "em", "s"):
            if self._open[kind]:
                return self._spans(node.children)
            self._open[kind] += 1
            try:
                inner = self._spans(node.children)
            finally:
                self._open[kind] -= 1
            return self.mark(kind, inner) if inner.strip() else inner
        if kind == "link":
            return self.link(self._spans(node.children), str(node.attrs.get("href", "")))
        if kind == "image":  # a chat cannot inline it: a link to it, titled by its alt text
            return self.link(self._spans(node.children), str(node.attrs.get("src", "")))
        if kind == "html_inline":
            return self.text(node.content)
        if node.children:  # "inline" wrappers and anything a plugin adds
            return self._spans(node.children)
        return self.text(node.content)

    def _spans(self, nodes: Sequence[SyntaxTreeNode]) -> str:
        return "".join(self._span(node) for node in nodes)


class PlainRenderer(Renderer):
    """A terminal: no markup left over from emphasis; code and grids kept as they are."""

    table_width = 80

    def code_block(self, code: str, lang: str) -> list[Line]:
        # Not verbatim: in a terminal, code under a list item reads best indented with it.
        return [Line(line) for line in code.split("\n")]


class WhatsAppRenderer(Renderer):
    """WhatsApp's markers. It has no escaping, so literal *, _ and ~ in text stay as they are."""

    bullet = "- "
    _MARKS: ClassVar[dict[str, str]] = {"strong": "*", "em": "_", "s": "~"}

    def mark(self, kind: str, inner: str) -> str:
        marker = self._MARKS.get(kind, "")
        # WhatsApp only sees a marker that touches text: keep the spaces outside it.
        core = inner.strip()
        lead, trail = inner[: len(inner) - len(inner.lstrip())], inner[len(inner.rstrip()) :]
        return f"{lead}{marker}{core}{marker}{trail}"

    def code_span(self, code: str) -> str:
        return f"`{code}`"

    def heading(self, inner: str) -> str:
        return self.mark("strong", inner)

    def code_block(self, code: str, lang: str) -> list[Line]:
        # Fences hug the code: a fence on its own line shows as an empty monospaced line.
        return _code_lines(f"```{code}```")


class _HtmlInline(Renderer):
    """The inline parts both HTML dialects write alike: escaped text, the emphasis tags of
    `_TAGS`, code spans and links (only safe addresses)."""

    _TAGS: ClassVar[dict[str, str]] = {}

    def text(self, text: str) -> str:
        return html.escape(text, quote=False)

    def mark(self, kind: str, inner: str) -> str:
        tag = self._TAGS.get(kind)
        return f"<{tag}>{inner}</{tag}>" if tag else inner

    def code_span(self, code: str) -> str:
        return f"<code>{html.escape(code, quote=False)}</code>"

    def link(self, text: str, href: str) -> str:
        target = safe_href(href)
        if not text:
            text = self.text(PARSER.normalizeLinkText(href))
        if target is None:
            return text
        return f'<a href="{html.escape(target, quote=True)}">{text}</a>'


class TelegramRenderer(_HtmlInline):
    """Telegram's HTML parse mode: only its tags, and every <, > and & of text escaped."""

    _TAGS: ClassVar[dict[str, str]] = {"strong": "b", "em": "i", "s": "s"}

    def heading(self, inner: str) -> str:
        return f"<b>{inner}</b>"

    def code_block(self, code: str, lang: str) -> list[Line]:
        body = html.escape(code, quote=False)
        if lang:
            lang_attr = html.escape(lang, quote=True)
            return _code_lines(f'<pre><code class="language-{lang_attr}">{body}</code></pre>')
        return _code_lines(f"<pre>{body}</pre>")

    def quote(self, lines: list[Line], nested: bool) -> list[Line]:
        # Telegram cannot nest blockquotes: an inner quote joins the outer one.
        if nested:
            return lines
        first, last = lines[0], lines[-1]
        if len(lines) == 1:
            return [Line(f"<blockquote>{first.text}</blockquote>", first.verbatim)]
        return [
            Line(f"<blockquote>{first.text}", first.verbatim),
            *lines[1:-1],
            Line(f"{last.text}</blockquote>", last.verbatim),
        ]


class MatrixRenderer(_HtmlInline):
    """Matrix's HTML subset (`org.matrix.custom.html`, client-server spec "m.room.message
    msgtypes"): real block elements (p, h1-h6, ul/ol/li, blockquote, pre, table, hr), since a
    Matrix client collapses the newlines of HTML as a browser does. `<br/>` and `<hr/>` are
    written self-closing so the splitter never tries to balance them."""

    _TAGS: ClassVar[dict[str, str]] = {"strong": "strong", "em": "em", "s": "del"}

    def render(self, markdown: str) -> str:
        tree = SyntaxTreeNode(PARSER.parse(markdown))
        blocks = [b for b in (self._html_block(n) for n in tree.children) if b]
        # A reply of one paragraph is sent bare, as Element itself sends one.
        if len(blocks) == 1 and blocks[0].startswith("<p>") and blocks[0].endswith("</p>"):
            return blocks[0][3:-4]
        return "\n".join(blocks)

    def _inline_html(self, node: SyntaxTreeNode) -> str:
        return self._inline_of(node).replace("\n", "<br/>\n")

    def _html_blocks(self, nodes: Sequence[SyntaxTreeNode], tight: bool) -> str:
        out: list[str] = []
        for node in nodes:
            if tight and node.type == "paragraph":
                out.append(self._inline_html(node))
            elif block := self._html_block(node):
                out.append(block)
        return "\n".join(out)

    def _html_block(self, node: SyntaxTreeNode) -> str:
        kind = node.type
        if kind == "paragraph":
            inner = self._inline_html(node)
            return f"<p>{inner}</p>" if inner.strip() else ""
        if kind == "heading":
            inner = self._inline_html(node)
            return f"<{node.tag}>{inner}</{node.tag}>" if inner.strip() else ""
        if kind in ("bullet_list", "ordered_list"):
            paragraphs = [c for i in node.children for c in i.children if c.type == "paragraph"]
            tight = not paragraphs or paragraphs[0].hidden
            items = "\n".join(f"<li>{self._html_blocks(item.children, tight)}</li>"
                              for item in node.children)
            if kind == "bullet_list":
                return f"<ul>\n{items}\n</ul>"
            start = int(node.attrs.get("start", 1))
            opening = f'<ol start="{start}">' if start != 1 else "<ol>"
            return f"{opening}\n{items}\n</ol>"
        if kind == "blockquote":
            inner = self._html_blocks(node.children, tight=False)
            return f"<blockquote>\n{inner}\n</blockquote>" if inner else ""
        if kind in ("fence", "code_block"):
            code = node.content.removesuffix("\n")
            lang = node.info.split()[0] if node.info.strip() else ""
            if not code.strip():
                return ""
            return "\n".join(line.text for line in TelegramRenderer().code_block(code, lang))
        if kind == "hr":
            return "<hr/>"
        if kind == "table":
            return self._html_table(node)
        if kind == "html_block":
            return f"<p>{self.text(node.content.strip())}</p>"
        return self._html_blocks(node.children, tight=False)

    def _html_table(self, node: SyntaxTreeNode) -> str:
        sections: list[str] = []
        for section in node.children:
            cell_tag = "th" if section.type == "thead" else "td"
            rows = "\n".join(
                "<tr>" + "".join(f"<{cell_tag}>{self._inline_html(cell)}</{cell_tag}>"
                                 for cell in row.children) + "</tr>"
                for row in section.children)
            sections.append(f"<{section.type}>\n{rows}\n</{section.type}>")
        return "<table>\n" + "\n".join(sections) + "\n</table>"
