"""Documents made in the tests with the libraries roost reads them with: PDFs written by pypdf
(text pages, a scan, encrypted, broken), DOCX by python-docx and XLSX by openpyxl."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from io import BytesIO
from xml.sax.saxutils import escape as xml_escape

import docx
from openpyxl import Workbook
from PIL import Image
from pypdf import PdfWriter
from pypdf.generic import (
    ArrayObject,
    ContentStream,
    DictionaryObject,
    FloatObject,
    NameObject,
    TextStringObject,
)

_FONT = DictionaryObject({NameObject("/Type"): NameObject("/Font"),
                          NameObject("/Subtype"): NameObject("/Type1"),
                          NameObject("/BaseFont"): NameObject("/Helvetica")})


def _escape(text: str) -> bytes:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)").encode("latin-1")


def pdf(pages: list[str], *, title: str | None = None, password: str | None = None) -> bytes:
    """A PDF with one page per text (lines split on newlines); an empty text is a blank page,
    as a scan without a text layer reads."""
    writer = PdfWriter()
    for text in pages:
        page = writer.add_blank_page(612, 792)
        if not text:
            continue
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): _FONT})})
        lines = b" ".join(b"(" + _escape(line) + b") Tj T*" for line in text.split("\n"))
        stream = ContentStream(None, None)
        stream.set_data(b"BT /F1 11 Tf 14 TL 72 740 Td " + lines + b" ET")
        page.replace_contents(stream)
    if title:
        writer.add_metadata({"/Title": title})
    if password:
        writer.encrypt(user_password=password, owner_password=password, algorithm="RC4-128")
    out = BytesIO()
    writer.write(out)
    return out.getvalue()


def broken_pdf() -> bytes:
    """The first half of a real PDF: what an interrupted download leaves."""
    whole = pdf(["a page that was cut off"] * 3)
    return whole[: len(whole) // 2]


def word(paragraphs: list[str], *, table: list[list[str]] | None = None,
         heading: str | None = None, title: str | None = None, pictures: int = 0) -> bytes:
    document = docx.Document()
    if title:
        document.core_properties.title = title
    for _ in range(pictures):
        picture = BytesIO()
        Image.new("RGB", (40, 30), "orange").save(picture, "PNG")
        document.add_picture(BytesIO(picture.getvalue()))
    if heading:
        document.add_heading(heading, level=1)
    for text in paragraphs:
        document.add_paragraph(text)
    if table:
        grid = document.add_table(rows=len(table), cols=len(table[0]))
        for r, row in enumerate(table):
            for c, value in enumerate(row):
                grid.cell(r, c).text = value
    out = BytesIO()
    document.save(out)
    return out.getvalue()


def workbook(sheets: dict[str, list[list[object]]], *, rename: str | None = None) -> bytes:
    """`rename` gives the first sheet a name openpyxl would not write (newlines, any length),
    as a hand-made file can."""
    book = Workbook()
    book.remove(book.active)
    for name, rows in sheets.items():
        sheet = book.create_sheet(name)
        for row in rows:
            sheet.append(row)
    out = BytesIO()
    book.save(out)
    if rename is None:
        return out.getvalue()
    first = next(iter(sheets))
    escaped = xml_escape(rename, {'"': "&quot;", "\n": "&#10;"})
    return _rewritten(out.getvalue(), "xl/workbook.xml",
                      lambda xml: xml.replace(f'name="{first}"', f'name="{escaped}"', 1))


def _rewritten(archive: bytes, member: str, change: Callable[[str], str]) -> bytes:
    out = BytesIO()
    with zipfile.ZipFile(BytesIO(archive)) as old, zipfile.ZipFile(out, "w") as new:
        for item in old.infolist():
            data = old.read(item)
            if item.filename == member:
                data = change(data.decode()).encode()
            new.writestr(item, data)
    return out.getvalue()


def word_bomb(paragraphs: int) -> bytes:
    """A DOCX whose document.xml unpacks to `paragraphs` tiny paragraphs (35 bytes each, a few
    bytes packed): a zip bomb that a reader building the whole tree chokes on."""
    source = zipfile.ZipFile(BytesIO(word(["x"])))
    out = BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as bomb:
        for info in source.infolist():
            if info.filename != "word/document.xml":
                bomb.writestr(info, source.read(info.filename))
                continue
            head, tail = source.read(info.filename).split(b"<w:body>")
            chunk = b"<w:p><w:r><w:t>a</w:t></w:r></w:p>" * 10_000
            with bomb.open("word/document.xml", "w") as member:
                member.write(head + b"<w:body>")
                for _ in range(paragraphs // 10_000):
                    member.write(chunk)
                member.write(tail)
    return out.getvalue()


def looping_pdf() -> bytes:
    """A PDF whose page tree lists itself among its kids: a reader that walks it naively
    never comes back."""
    writer = PdfWriter()
    writer.add_blank_page(100, 100)
    pages = writer.root_object["/Pages"]
    pages["/Kids"].append(writer.root_object.raw_get("/Pages"))
    out = BytesIO()
    writer.write(out)
    return out.getvalue()


def form_pdf(text: str, fields: dict[str, str]) -> bytes:
    """A one-page PDF form with text fields filled in (value in /V, no appearance drawn: the
    page's text does not show them, as with many PDFs filled by a script)."""
    writer = PdfWriter(clone_from=BytesIO(pdf([text])))
    added = ArrayObject()
    for i, (name, value) in enumerate(fields.items()):
        top = 620 - 30 * i
        added.append(writer.add_annotation(0, DictionaryObject({
            NameObject("/Type"): NameObject("/Annot"),
            NameObject("/Subtype"): NameObject("/Widget"),
            NameObject("/FT"): NameObject("/Tx"), NameObject("/T"): TextStringObject(name),
            NameObject("/V"): TextStringObject(value),
            NameObject("/Rect"): ArrayObject([FloatObject(v) for v in (72, top - 20, 300, top)]),
        })).indirect_reference)
    writer.root_object[NameObject("/AcroForm")] = DictionaryObject(
        {NameObject("/Fields"): added})
    out = BytesIO()
    writer.write(out)
    return out.getvalue()


def pdf_without_page_tree() -> bytes:
    """A PDF whose catalog points its page tree at a number: readers trip over it at different
    places (pypdf with a different exception class each time)."""
    return pdf(["hello"]).replace(b"/Pages 2 0 R", b"/Pages 7     ")  # offsets stay
