"""OpenDocument text (.odt) as the blocks docx_read shows for a DOCX, read with odfdo: headings
as Markdown, paragraphs, list items, tables as Markdown; footnotes, endnotes, comments
(annotations) and tracked changes marked as `word_text` marks them; text boxes after the
paragraph they are anchored in; the page headers and footers of the master pages once each.
Runs in a worker child (`pool.py`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from itertools import islice
from typing import Any

from odfdo import Element, Row

from daemon.parsing import odf
from daemon.parsing.tables import markdown_table
from daemon.parsing.word_text import NOTE, QUOTED_CHARS, joined

CELLS_PER_ROW = 64  # a table row of a text document; past that it is repetition, not text
COUNTED = ("tables", "words", "footnotes", "endnotes", "comments", "inserted", "deleted")
_ROWS = ("table:table-header-rows", "table:table-rows", "table:table-row-group")
_CONTAINERS = ("text:section", "text:table-of-content", "text:index-body",
               "text:alphabetical-index", "text:illustration-index", "text:table-index",
               "text:user-index", "text:bibliography", "text:object-index")
_BREAKS = {"text:tab": "\t", "text:line-break": "\n"}
_SILENT = ("text:note-citation", "office:change-info", "text:tracked-changes",
           "text:soft-page-break", "text:bookmark", "text:bookmark-start", "text:bookmark-end",
           "text:reference-mark", "text:reference-mark-start", "text:reference-mark-end")


def blocks(path: str) -> tuple[list[str], dict[str, Any]]:
    """The blocks, then the facts `word.info` gives of a DOCX."""
    document = odf.open_document(path, "an OpenDocument text")
    body = document.body
    changes = _changes(body)
    reader = _Reader(changes)
    found = reader.blocks(body)
    headers: list[str] = []
    footers: list[str] = []
    for page in document.styles.get_elements("//style:master-page"):
        for part in page.children:
            kind = "header" if part.tag.startswith("style:header") else "footer"
            text = "\n".join(_Reader(changes).blocks(part))
            seen = headers if kind == "header" else footers
            if text and f"[page {kind}: {text}]" not in seen:
                seen.append(f"[page {kind}: {text}]")
    facts: dict[str, Any] = {name: reader.counts[name] for name in COUNTED}
    facts["title"] = ((document.meta.get_title() or "").strip() or None)
    facts["images"] = len(body.get_elements("//draw:image"))
    return headers + found + footers, facts


def _changes(body: Element) -> dict[str, tuple[str, str]]:
    """Each tracked change by id: its label ("inserted by NAME") and, for a deletion, the
    words deleted (kept apart from the text, in text:tracked-changes)."""
    out: dict[str, tuple[str, str]] = {}
    for region in body.get_elements("//text:changed-region"):
        key = region.get_attribute_string("text:id") or region.get_attribute_string("xml:id")
        for change in region.children:
            kind = {"text:insertion": "inserted", "text:deletion": "deleted"}.get(change.tag)
            if kind is None or not key:
                continue
            creator = change.get_elements("office:change-info/dc:creator")
            author = " ".join(creator[0].text_recursive.split()) if creator else ""
            words = " ".join(p.text_recursive for p in change.children
                             if p.tag in ("text:p", "text:h"))
            out[key] = (f"{kind} by {author}" if author else kind, " ".join(words.split()))
    return out


class _Reader:
    """Blocks of one body, header or note, counting what it met."""

    def __init__(self, changes: dict[str, tuple[str, str]]) -> None:
        self.changes = changes
        self.counts: Counter[str] = Counter()
        self._pending: list[str] = []
        self._boxes: list[Element] = []
        self._inserting: list[str] = []  # labels of the insertions open here
        self._comments: dict[str, tuple[str, list[str]]] = {}  # open ranges: note, words
        self._numbers: Counter[str] = Counter()

    def blocks(self, container: Element, bullet: str = "") -> list[str]:
        out: list[str] = []
        for child in container.children:
            tag = child.tag
            if tag == "text:p":
                text = self._paragraph(child)
                title = child.get_attribute_string("text:style-name") == "Title"
                text = ("# " if title else bullet) + text if text else ""
            elif tag == "text:h":
                text = self._paragraph(child)
                level = child.get_attribute_integer("text:outline-level") or 1
                text = "#" * min(level, 6) + " " + text if text else ""
            elif tag == "text:list":
                for item in child.children:  # a nested list is an item's child: "- " too
                    out.extend(self.blocks(item, "- "))
                continue
            elif tag == "table:table":
                text = self._table(child)
            elif tag in _CONTAINERS:
                out.extend(self.blocks(child))
                continue
            else:
                continue
            notes, boxes = self._pending, self._boxes
            self._pending, self._boxes = [], []
            if text or notes:
                out.append("\n".join([text, *notes]) if text else "\n".join(notes))
            for box in boxes:
                out.extend(self.blocks(box))
        return out

    def _paragraph(self, p: Element) -> str:
        pieces: list[tuple[str, str]] = []
        self._inline(p, pieces)
        for key in list(self._comments):  # a range past its paragraph: shown from here
            self._pending.append(_quoting(*self._comments.pop(key)))
        text = joined(pieces).strip()
        if text:
            self.counts["words"] += len("".join(t for label, t in pieces if label == ""
                                                or label.startswith("inserted")).split())
        return text

    def _table(self, table: Element) -> str:
        rows = [[" ".join(part for part in self._cell_parts(cell) if part)
                 for cell in islice(row.traverse(), CELLS_PER_ROW)] for row in _rows(table)]
        if not any(any(row) for row in rows):
            return ""
        self.counts["tables"] += 1
        return markdown_table(rows)

    def _cell_parts(self, container: Element) -> Iterable[str]:
        for child in container.children:
            if child.tag in ("text:p", "text:h"):
                yield self._paragraph(child)
            elif child.tag == "table:table":
                for row in _rows(child):
                    for cell in islice(row.traverse(), CELLS_PER_ROW):
                        yield from self._cell_parts(cell)
            elif child.tag in ("text:list", "text:list-item", "text:list-header",
                               *_CONTAINERS):
                yield from self._cell_parts(child)

    def _inline(self, element: Element, pieces: list[tuple[str, str]]) -> None:
        self._text(element.text or "", pieces)
        for child in element.children:
            tag = child.tag
            if tag == "text:s":
                self._text(" " * (child.get_attribute_integer("text:c") or 1), pieces)
            elif tag in _BREAKS:
                self._text(_BREAKS[tag], pieces)
            elif tag == "text:note":
                self._note(child, pieces)
            elif tag == "office:annotation":
                self._comment(child)
            elif tag == "office:annotation-end":
                found = self._comments.pop(child.get_attribute_string("office:name") or "", None)
                if found is not None:
                    self._pending.append(_quoting(*found))
            elif tag in ("text:change-start", "text:change-end", "text:change"):
                self._change(tag, child.get_attribute_string("text:change-id") or "", pieces)
            elif tag == "draw:text-box":
                self._boxes.append(child)
            elif tag == "text:a":
                self._link(child, pieces)
            elif tag not in _SILENT:
                self._inline(child, pieces)
            self._text(child.tail or "", pieces)

    def _text(self, text: str, pieces: list[tuple[str, str]]) -> None:
        if not text:
            return
        pieces.append((self._inserting[-1] if self._inserting else "", text))
        for _, words in self._comments.values():
            if sum(map(len, words)) <= QUOTED_CHARS:
                words.append(text)

    def _change(self, tag: str, key: str, pieces: list[tuple[str, str]]) -> None:
        label, words = self.changes.get(key, ("", ""))
        if not label:
            return
        if tag == "text:change" and label.startswith("deleted") and words:
            self.counts["deleted"] += 1
            pieces.append((label, words))
        elif tag == "text:change-start" and label.startswith("inserted"):
            self.counts["inserted"] += 1
            self._inserting.append(label)
        elif tag == "text:change-end" and label in self._inserting:
            self._inserting.remove(label)

    def _link(self, link: Element, pieces: list[tuple[str, str]]) -> None:
        inner: list[tuple[str, str]] = []
        self._inline(link, inner)
        pieces.extend(inner)
        url = link.get_attribute_string("xlink:href") or ""
        shown = "".join(text for _, text in inner).strip()
        if url and shown and url != shown and not url.startswith("#"):
            pieces.append((NOTE, f" ({url})"))

    def _note(self, note: Element, pieces: list[tuple[str, str]]) -> None:
        kind = "endnote" if note.get_attribute_string("text:note-class") == "endnote" \
            else "footnote"
        self._numbers[kind] += 1
        number = self._numbers[kind]
        self.counts[f"{kind}s"] += 1
        pieces.append((NOTE, f"[{kind} {number}]"))
        text = " ".join(" ".join(_Reader(self.changes).blocks(body))
                        for body in note.children if body.tag == "text:note-body")
        self._pending.append(f"[{kind} {number}: {text}]")

    def _comment(self, annotation: Element) -> None:
        self.counts["comments"] += 1
        creator = next((c for c in annotation.children if c.tag == "dc:creator"), None)
        author = " ".join(creator.text_recursive.split()) if creator is not None else ""
        text = " ".join(p.text_recursive for p in annotation.children
                        if p.tag in ("text:p", "text:list"))
        head = f"comment by {author}" if author else "comment"
        name = annotation.get_attribute_string("office:name")
        if name:  # a range: quote it once its end is met
            self._comments[name] = (f"{head}\0{' '.join(text.split())}", [])
        else:
            self._pending.append(f"[{head}: {' '.join(text.split())}]")


def _quoting(note: str, words: list[str]) -> str:
    head, text = note.split("\0", 1)
    quoted = " ".join("".join(words).split())
    if len(quoted) > QUOTED_CHARS:
        quoted = quoted[:QUOTED_CHARS - 1] + "…"
    on = f' on "{quoted}"' if quoted else ""
    return f"[{head}{on}: {text}]"


def _rows(table: Element) -> list[Row]:
    """The rows of a table, header rows and row groups included, in order."""
    rows: list[Row] = []
    for child in table.children:
        if isinstance(child, Row):
            rows.append(child)
        elif child.tag in _ROWS:
            rows.extend(_rows(child))
    return rows
