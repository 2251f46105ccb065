"""PDF: the page count, the title, whether there is a text layer and the filled-in form fields;
the text of a page range, each page with its form fields (a value typed into a form is not in
the page's text); the pages that mention some words. Runs in a worker child (`pool.py`).

PDFium (pypdfium2) opens the file and reads the text, rows of a table kept as rows
(`pdf_layout`); it reads a 16-page report in a tenth of the time pypdf takes. pypdf reads what
that leaves: the fields of a form, and why a file PDFium cannot open is unreadable (a password,
damage), in the words the tools have always given. Page texts are kept in the worker for the
next call on the same file: a model searches, then reads the pages it found.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from typing import Any

import pypdfium2 as pdfium  # type: ignore[import-untyped]
import pypdfium2.raw as pdfium_c  # type: ignore[import-untyped]
from pypdf import PdfReader
from pypdf.errors import DependencyError, FileNotDecryptedError, PdfReadError

from daemon.core.errors import DocumentError
from daemon.parsing import pdf_match
from daemon.parsing.pdf_layout import PageText, page_text
from daemon.parsing.pdf_pages import parts, range_note

PROBE_PAGES = 3  # pages looked at for a text layer: a scan has none on its first pages either
SEARCH_SECONDS = 8.0  # then pdf_search stops and says where to go on, well inside the job's time
SEARCH_HITS = 20
LINE_CHARS = 200
VALUE_CHARS = 300
FIELD_DEPTH = 20  # a field's parents followed at most this far (a hostile file may loop)
UNREADABLE_SHARE = 0.1  # of a page's characters not read as letters: then the page says so
CACHE_CHARS = 4_000_000  # page texts kept in a worker, about 10 MB
NOT_A_PDF = "it is not a PDF I can read (damaged, or not a PDF at all)"
NO_LETTERS = ("(no readable text: this page's characters are drawn in a font that does not say "
              "which letters they are, so it reads like a scan)")

_cache: OrderedDict[tuple[Any, ...], str] = OrderedDict()
_cached_chars = 0


class _Document:
    """One PDF open in PDFium, with pypdf beside it only when it has a form."""

    def __init__(self, path: str) -> None:
        self.path = path
        stat = os.stat(path)
        # Attachments are written to a new file and renamed, never changed in place: the inode,
        # size and time name one content, at no cost (a sha256 reads the whole file each call).
        self._key = (os.path.realpath(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
        try:
            self.pdf = pdfium.PdfDocument(path)
        except pdfium.PdfiumError as exc:
            raise _why_unreadable(path) from exc
        self.pages = len(self.pdf)
        self.has_form = pdfium_c.FPDF_GetFormType(self.pdf.raw) != pdfium_c.FORMTYPE_NONE
        self._form: PdfReader | None = None  # opened on the first page with a form field

    def close(self) -> None:
        self.pdf.close()

    def __enter__(self) -> _Document:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def title(self) -> str | None:
        title = str(self.pdf.get_metadata_value("Title") or "").strip()
        return title or None

    def words(self, index: int) -> PageText:
        """The page's own text, without its form fields."""
        return self._page(index)[0]

    def text(self, index: int) -> str:
        """What a reader is shown of page `index` (0-based): its text, a word on what could
        not be read, its form fields. Kept for the next call on the same file."""
        key = (*self._key, index)
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
        words, widgets = self._page(index)
        text = _shown(words)
        fields = _page_fields(self.form().pages[index]) if widgets and index < len(
            self.form().pages) else []
        if fields:
            text += "\n\nForm fields on this page:\n" + "\n".join(fields)
        _remember(key, text)
        return text

    def form(self) -> PdfReader:
        """pypdf's view, for the fields: opened only when there is a form (pypdf's parse
        takes longer than PDFium's whole read of some files)."""
        if self._form is None:
            self._form = _open_pypdf(self.path)
        return self._form

    def fields(self) -> list[str]:
        return _form_fields(self.form()) if self.has_form else []

    def _page(self, index: int) -> tuple[PageText, bool]:
        """The page's text, and whether it has a form field on it."""
        page = self.pdf[index]
        try:
            return page_text(page), self.has_form and _has_widgets(page)
        finally:
            page.close()


def _has_widgets(page: Any) -> bool:
    for i in range(pdfium_c.FPDFPage_GetAnnotCount(page.raw)):
        annotation = pdfium_c.FPDFPage_GetAnnot(page.raw, i)
        try:
            if pdfium_c.FPDFAnnot_GetSubtype(annotation) == pdfium_c.FPDF_ANNOT_WIDGET:
                return True
        finally:
            pdfium_c.FPDFPage_CloseAnnot(annotation)
    return False


def _shown(page: PageText) -> str:
    text = page.text.strip()
    if not page.unreadable:
        return text
    if not text:
        return NO_LETTERS
    visible = sum(1 for c in text if not c.isspace())
    if page.unreadable < UNREADABLE_SHARE * (visible + page.unreadable):
        return text  # a few symbols of a math font: not worth a word
    return (f"{text}\n[{page.unreadable} characters of this page could not be read: their font "
            "does not say which letters they are]")


def _remember(key: tuple[Any, ...], text: str) -> None:
    global _cached_chars
    _cache[key] = text
    _cached_chars += len(text)
    while _cached_chars > CACHE_CHARS and len(_cache) > 1:
        _, dropped = _cache.popitem(last=False)
        _cached_chars -= len(dropped)


def _open_pypdf(path: str) -> PdfReader:
    try:
        reader = PdfReader(path)
    except (PdfReadError, ValueError) as exc:
        raise DocumentError(NOT_A_PDF) from exc
    if reader.is_encrypted:
        try:
            opened = reader.decrypt("")  # many PDFs are "encrypted" with an empty password
        except (DependencyError, NotImplementedError, FileNotDecryptedError) as exc:
            raise DocumentError("it is encrypted in a way I cannot open") from exc
        if not opened:
            raise DocumentError("it is protected by a password; ask for a copy without one")
    return reader


def _why_unreadable(path: str) -> DocumentError:
    """Why PDFium could not open `path`, as pypdf finds it: a password, or the part that is
    broken (a page tree that is no tree raises here, and the child calls that damaged)."""
    reader = _open_pypdf(path)
    len(reader.pages)
    return DocumentError(NOT_A_PDF)


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
    """{"pages", "title", "text_layer", "fields": ["name = value", ...]}. A page whose
    characters have no letters to them (a font without a Unicode map) is no text layer."""
    with _Document(path) as document:
        probe = range(min(document.pages, PROBE_PAGES))
        text_layer = any(document.words(i).text.strip() for i in probe)
        return {"pages": document.pages, "title": document.title(), "text_layer": text_layer,
                "fields": document.fields()}


def read(path: str, first: int, last: int, cap: int, ref: str = "", asked: int = 0,
         part: int = 1) -> dict[str, Any]:
    """{"pages", "texts": [[page, text], ...], "next", "after"}: the text of pages
    first..last (1-based), stopping before `cap` characters; a page longer than `cap` comes
    in parts (`part` of the first page). "after" says which pages these are and, with `ref`
    and `asked` (the last page the model asked for), the call that reads on."""
    with _Document(path) as document:
        pages = document.pages
        first, last = max(first, 1), min(last, pages)
        texts: list[list[Any]] = []
        used = 0
        cut: tuple[int, int, int] | None = None  # page, part shown, parts
        number = first
        while number <= last:
            text = document.text(number - 1)
            if texts and used + len(text) > cap:
                break
            if len(text) > cap:  # longer than one answer: one part of it, and say which
                pieces = parts(text, cap)
                shown = min(max(part if number == first else 1, 1), len(pieces))
                texts.append([number, pieces[shown - 1]])
                cut = (number, shown, len(pieces))
                number += 1
                break
            texts.append([number, text])
            used += len(text)
            number += 1
        next_page = number if number <= last else None
        wanted = min(asked, pages) if asked >= first else pages
        after = range_note(ref, first, texts[-1][0] if texts else first, pages, wanted, cut)
        return {"pages": pages, "texts": texts, "next": next_page, "after": after}


def search(path: str, query: str, first: int) -> dict[str, Any]:
    """{"pages", "hits": [[page, line], ...], "searched_to", "next"}: the pages whose text holds
    every word of `query` (folded: see `pdf_match`), each with the line where it was found, as
    the page has it."""
    words = pdf_match.fold(query).split()
    hits: list[list[Any]] = []
    started = time.monotonic()
    with _Document(path) as document:
        pages = document.pages
        number = max(first, 1)
        while number <= pages:
            text = document.text(number - 1)
            found = pdf_match.find(text, words)
            if found is not None:
                hits.append([number, _line_around(text, *found)])
            number += 1
            if len(hits) >= SEARCH_HITS or time.monotonic() - started > SEARCH_SECONDS:
                break
    return {"pages": pages, "hits": hits, "searched_to": number - 1,
            "next": number if number <= pages else None}


def _line_around(text: str, start: int, end: int) -> str:
    """The line of `text` that holds text[start:end], at most LINE_CHARS around it."""
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line = text[line_start:line_end if line_end >= 0 else len(text)]
    at = start - line_start
    cut = max(0, min(at - LINE_CHARS // 2, len(line) - LINE_CHARS))
    shown = " ".join(line[cut:cut + LINE_CHARS].split())
    return ("…" if cut else "") + shown + ("…" if cut + LINE_CHARS < len(line) else "")
