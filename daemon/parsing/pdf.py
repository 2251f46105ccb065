"""PDF with pypdf: the page count, the title, whether there is a text layer and the filled-in
form fields; the text of a page range, each page with its form fields (a value typed into a
form is not in the page's text); the pages that mention some words. Runs in a worker child
(`pool.py`)."""

from __future__ import annotations

import time
from typing import Any

from pypdf import PdfReader
from pypdf.errors import DependencyError, FileNotDecryptedError, PdfReadError
from pypdf.generic import IndirectObject

from daemon.core.errors import DocumentError

PROBE_PAGES = 3  # pages looked at for a text layer: a scan has none on its first pages either
SEARCH_SECONDS = 8.0  # then pdf_search stops and says where to go on, well inside the job's time
SEARCH_HITS = 20
LINE_CHARS = 200
VALUE_CHARS = 300
FIELD_DEPTH = 20  # a field's parents followed at most this far (a hostile file may loop)


def _open(path: str) -> PdfReader:
    try:
        reader = PdfReader(path)
    except (PdfReadError, ValueError) as exc:
        raise DocumentError("it is not a PDF I can read (damaged, or not a PDF at all)") from exc
    if reader.is_encrypted:
        try:
            opened = reader.decrypt("")  # many PDFs are "encrypted" with an empty password
        except (DependencyError, NotImplementedError, FileNotDecryptedError) as exc:
            raise DocumentError("it is encrypted in a way I cannot open") from exc
        if not opened:
            raise DocumentError("it is protected by a password; ask for a copy without one")
    return reader


def _count(reader: PdfReader) -> int:
    """The page count from the page tree's /Count: one object read, not every page walked."""
    root: Any = reader.trailer["/Root"]
    count: Any = root["/Pages"].get("/Count")
    if isinstance(count, IndirectObject):
        count = count.get_object()
    if isinstance(count, int) and count >= 0:
        return int(count)
    return len(reader.pages)


def _page_text(reader: PdfReader, index: int) -> str:
    text = (reader.pages[index].extract_text() or "").strip()
    fields = _page_fields(reader.pages[index])
    if fields:
        text += "\n\nForm fields on this page:\n" + "\n".join(fields)
    return text


def _value(value: Any) -> str:
    """A field's value as text: a checkbox's state name without its slash (Yes, Off), a list
    of choices joined."""
    if value is None:
        return "(empty)"
    if isinstance(value, list):
        return ", ".join(_value(v) for v in value) or "(empty)"
    text = " ".join(str(value).removeprefix("/").split())
    return text[:VALUE_CHARS] + ("…" if len(text) > VALUE_CHARS else "") or "(empty)"


def _page_fields(page: Any) -> list[str]:
    """`name = value` of each form field with a widget on this page; a widget that is a kid
    of its field takes the name (parents' names joined by dots) and value from above."""
    shown: list[str] = []
    try:
        annotations = page.get("/Annots")
        annotations = annotations.get_object() if annotations is not None else []
        for annotation in annotations:
            node = annotation.get_object()
            if node.get("/Subtype") != "/Widget":
                continue
            names: list[str] = []
            value = None
            for _ in range(FIELD_DEPTH):
                if "/T" in node:
                    names.insert(0, str(node["/T"]))
                if value is None and "/V" in node:
                    value = node["/V"]
                if node.get("/Parent") is None:
                    break
                node = node["/Parent"].get_object()
            if names:
                shown.append(f"{'.'.join(names)} = {_value(value)}")
    except (PdfReadError, AttributeError, KeyError, TypeError, ValueError):
        pass  # broken annotations: the page's text still stands
    return list(dict.fromkeys(shown))  # a radio group's widgets name one field


def _form_fields(reader: PdfReader) -> list[str]:
    try:
        fields = reader.get_fields() or {}
    except (PdfReadError, AttributeError, KeyError, TypeError, ValueError):
        return []
    return [f"{name} = {_value(field.get('/V'))}" for name, field in fields.items()
            if field.get("/FT") is not None]


def info(path: str) -> dict[str, Any]:
    """{"pages", "title", "text_layer", "fields": ["name = value", ...]}."""
    reader = _open(path)
    pages = _count(reader)
    title = None
    if reader.metadata is not None and reader.metadata.title:
        title = str(reader.metadata.title).strip() or None
    probe = min(pages, PROBE_PAGES)
    text_layer = any((reader.pages[i].extract_text() or "").strip() for i in range(probe))
    return {"pages": pages, "title": title, "text_layer": text_layer,
            "fields": _form_fields(reader)}


def read(path: str, first: int, last: int, cap: int) -> dict[str, Any]:
    """{"pages", "texts": [[page, text], ...], "next": the page to go on from or None}; the
    text of pages first..last (1-based), stopping before `cap` characters."""
    reader = _open(path)
    pages = len(reader.pages)
    first = max(first, 1)
    last = min(last, pages)
    texts: list[list[Any]] = []
    used = 0
    for number in range(first, last + 1):
        text = _page_text(reader, number - 1)
        if texts and used + len(text) > cap:
            return {"pages": pages, "texts": texts, "next": number}
        if used + len(text) > cap:  # one page longer than the cap: its start, and say so
            texts.append([number, text[:cap] + f"\n[page {number} cut at {cap} characters]"])
            return {"pages": pages, "texts": texts, "next": number + 1 if number < last else None}
        texts.append([number, text])
        used += len(text)
    return {"pages": pages, "texts": texts, "next": None}


def search(path: str, query: str, first: int) -> dict[str, Any]:
    """{"pages", "hits": [[page, line], ...], "searched_to", "next"}: the pages whose text holds
    every word of `query` (any case), each with the line that holds the first word."""
    reader = _open(path)
    pages = len(reader.pages)
    words = [w for w in query.lower().split() if w]
    hits: list[list[Any]] = []
    started = time.monotonic()
    number = max(first, 1)
    while number <= pages:
        text = _page_text(reader, number - 1)
        lowered = text.lower()
        if words and all(w in lowered for w in words):
            hits.append([number, _line_with(text, words[0])])
        number += 1
        if len(hits) >= SEARCH_HITS or time.monotonic() - started > SEARCH_SECONDS:
            break
    return {"pages": pages, "hits": hits, "searched_to": number - 1,
            "next": number if number <= pages else None}


def _line_with(text: str, word: str) -> str:
    for line in text.splitlines():
        if word in line.lower():
            line = " ".join(line.split())
            at = line.lower().find(word)
            start = max(0, at - LINE_CHARS // 2)
            return ("…" if start else "") + line[start:start + LINE_CHARS]
    return ""
