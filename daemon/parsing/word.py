"""Word-processor documents for docx_read: the text as blocks (a paragraph, a heading, a table
as Markdown), in reading order, read by block range. A DOCX is opened with python-docx and its
words walked by `word_text` (footnotes, comments, tracked changes, text boxes); an OpenDocument
text (.odt, told by its content, not its name) is read by `odf_text`. The page headers and
footers come once each, before and after the body, however many sections repeat them. Runs in
a worker child (`pool.py`)."""

from __future__ import annotations

import zipfile
from typing import Any

import docx
from docx.document import Document
from docx.opc.constants import RELATIONSHIP_TYPE as RT
from docx.opc.exceptions import PackageNotFoundError
from docx.opc.part import Part
from docx.oxml.parser import parse_xml

from daemon.core.errors import DocumentError
from daemon.parsing import odf, odf_text
from daemon.parsing.unzip import check_archive
from daemon.parsing.word_text import R_ID, Notes, Reader, Story, W

COUNTED = ("tables", "words", "footnotes", "endnotes", "comments", "inserted", "deleted")


def _blocks(path: str) -> tuple[list[str], dict[str, Any]]:
    """The blocks and what `info` tells of them."""
    if odf.kind(path) is not None:
        return odf_text.blocks(path)
    check_archive(path, "a Word document")
    try:
        document = docx.Document(path)
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise DocumentError("it is not a Word document I can read (damaged, or not .docx)") \
            from exc
    part = document.part
    notes = Notes(footnotes=_notes(part, RT.FOOTNOTES, "footnote"),
                  endnotes=_notes(part, RT.ENDNOTES, "endnote"), comments=_comments(document))
    styles = {style.style_id: style.name or "" for style in document.styles}
    body = Reader(notes, styles, _links(part))
    blocks = body.blocks(document.element.body)
    headers, footers = _margins(document, notes, styles)
    facts: dict[str, Any] = {name: body.counts[name] for name in COUNTED}
    facts["title"] = (document.core_properties.title or "").strip() or None
    # Pictures in the body, inline or floating: no tool shows them, so the note and
    # docx_read say they are there (a document of scanned pages has nothing else).
    facts["images"] = len(document.element.body.xpath(".//pic:pic"))
    return headers + blocks + footers, facts


def _related(part: Part, reltype: str) -> Part | None:
    return next((rel.target_part for rel in part.rels.values()
                 if rel.reltype == reltype and not rel.is_external), None)


def _links(part: Part) -> dict[str, str]:
    """Where the part's hyperlinks go, by relationship id."""
    return {rid: rel.target_ref for rid, rel in part.rels.items() if rel.is_external}


def _notes(part: Part, reltype: str, tag: str) -> dict[str, Story]:
    """The footnotes or endnotes by id (python-docx keeps their parts but does not read them)."""
    found = _related(part, reltype)
    if found is None:
        return {}
    root = parse_xml(found.blob)
    return {note.get(f"{W}id") or "": Story(note, _links(found))
            for note in root.iterchildren(f"{W}{tag}")}


def _comments(document: Document) -> dict[str, tuple[str, str]]:
    if _related(document.part, RT.COMMENTS) is None:  # asking python-docx would add a part
        return {}
    return {str(comment.comment_id): ((comment.author or "").strip(), comment.text)
            for comment in document.comments}


def _margins(document: Document, notes: Notes, styles: dict[str, str],
             ) -> tuple[list[str], list[str]]:
    """The distinct page headers and footers the sections show, each once."""
    even_pages = document.settings.odd_and_even_pages_header_footer
    seen: dict[str, list[str]] = {"header": [], "footer": []}
    for section in document.element.body.iter(f"{W}sectPr"):
        title_page = section.find(f"{W}titlePg")
        first_page = title_page is not None and title_page.get(f"{W}val") not in ("0", "false")
        for ref in section.iterchildren(f"{W}headerReference", f"{W}footerReference"):
            which = ref.get(f"{W}type")
            if (which == "first" and not first_page) or (which == "even" and not even_pages):
                continue  # defined, but no page shows it
            part = document.part.related_parts.get(ref.get(R_ID))
            if part is None:
                continue
            text = "\n".join(Reader(notes, styles, _links(part)).blocks(parse_xml(part.blob)))
            kind = "header" if ref.tag == f"{W}headerReference" else "footer"
            if text and text not in seen[kind]:
                seen[kind].append(text)
    return ([f"[page header: {text}]" for text in seen["header"]],
            [f"[page footer: {text}]" for text in seen["footer"]])



def info(path: str) -> dict[str, Any]:
    """{"blocks", "tables", "title", "words", "images", "footnotes", "endnotes", "comments",
    "inserted", "deleted"} (the last two: tracked changes)."""
    blocks, facts = _blocks(path)
    return {"blocks": len(blocks), **facts}


def read(path: str, first: int, last: int, cap: int) -> dict[str, Any]:
    """{"blocks", "items": [[n, text], ...], "next", "images"}: blocks first..last within
    `cap`."""
    blocks, facts = _blocks(path)
    images = facts["images"]
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
