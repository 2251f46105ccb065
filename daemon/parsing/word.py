"""DOCX with python-docx: the body as blocks (a paragraph, a heading, a table as Markdown), in
document order, read by block range. Runs in a worker child (`pool.py`)."""

from __future__ import annotations

import zipfile
from typing import Any

import docx
from docx.opc.exceptions import PackageNotFoundError
from docx.table import Table
from docx.text.paragraph import Paragraph

from daemon.core.errors import DocumentError
from daemon.parsing.tables import markdown_table
from daemon.parsing.unzip import check_archive


def _blocks(path: str) -> tuple[list[str], int, str | None, int, int]:
    """The blocks, the number of tables, the title, the number of words (as written, not
    counting the Markdown around them) and of pictures."""
    check_archive(path, "a Word document")
    try:
        document = docx.Document(path)
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise DocumentError("it is not a Word document I can read (damaged, or not .docx)") \
            from exc
    blocks: list[str] = []
    tables = words = 0
    for item in document.iter_inner_content():
        if isinstance(item, Paragraph):
            text = item.text.strip()
            if not text:
                continue
            words += len(text.split())
            style = (item.style.name if item.style is not None else "") or ""
            if style.startswith("Heading") and style[7:].strip().isdigit():
                text = "#" * min(int(style[7:]), 6) + " " + text
            elif style == "Title":
                text = "# " + text
            elif style.startswith("List"):
                text = "- " + text
            blocks.append(text)
        elif isinstance(item, Table):
            tables += 1
            rows = [[cell.text.strip() for cell in row.cells] for row in item.rows]
            words += sum(len(cell.split()) for row in rows for cell in row)
            blocks.append(markdown_table(rows))
    title = (document.core_properties.title or "").strip() or None
    # Pictures in the body, inline or floating: no tool shows them, so the note and
    # docx_read say they are there (a document of scanned pages has nothing else).
    images = len(document.element.body.xpath(".//pic:pic"))
    return blocks, tables, title, words, images


def info(path: str) -> dict[str, Any]:
    """{"blocks", "tables", "title", "words", "images"}."""
    blocks, tables, title, words, images = _blocks(path)
    return {"blocks": len(blocks), "tables": tables, "title": title, "words": words,
            "images": images}


def read(path: str, first: int, last: int, cap: int) -> dict[str, Any]:
    """{"blocks", "items": [[n, text], ...], "next", "images"}: blocks first..last within
    `cap`."""
    blocks, *_, images = _blocks(path)
    first = max(first, 1)
    last = min(last, len(blocks))
    items: list[list[Any]] = []
    used = 0
    for number in range(first, last + 1):
        text = blocks[number - 1]
        if items and used + len(text) > cap:
            return {"blocks": len(blocks), "items": items, "next": number, "images": images}
        items.append([number, text[:cap]])
        used += len(text)
    return {"blocks": len(blocks), "items": items, "next": None, "images": images}
