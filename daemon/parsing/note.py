"""What the attachment note of a PDF, DOCX, XLSX, ODT or ODS says beyond name, type and size:
its pages, paragraphs or sheets, and the tools that read it. Called while the file is stored (in a
thread), so the parse runs in the bounded pool: a hostile file gets a note that says it could
not be read, and the message it came with is still answered."""

from __future__ import annotations

from pathlib import Path

from daemon.core.errors import DocumentError
from daemon.core.logs import store_log as log
from daemon.parsing.data import SHEET_MAX, as_data
from daemon.parsing.pool import WorkerPool, shared_pool

PDF = "pdf"
DOCX = "docx"
XLSX = "xlsx"
ODT = "odt"  # read by docx_read
ODS = "ods"  # read by xlsx_read
_MIMES = {"application/pdf": PDF,
          "application/vnd.openxmlformats-officedocument.wordprocessingml.document": DOCX,
          "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": XLSX,
          "application/vnd.oasis.opendocument.text": ODT,
          "application/vnd.oasis.opendocument.spreadsheet": ODS}
_SUFFIXES = {".pdf": PDF, ".docx": DOCX, ".xlsx": XLSX, ".odt": ODT, ".ods": ODS}
_NAMES = {DOCX: "a Word document", ODT: "an OpenDocument text", XLSX: "a spreadsheet",
          ODS: "an OpenDocument spreadsheet"}
ACTIVATE = 'tool_activate("documents") loads them'


def kind_of(name: str, mime: str) -> str | None:
    """"pdf", "docx", "xlsx", "odt", "ods" or None (then the plain note stays)."""
    return _MIMES.get(mime) or _SUFFIXES.get(Path(name).suffix.lower())


def describe(path: Path, ref: str, kind: str, pool: WorkerPool | None = None) -> str:
    """The tail of the note for a stored document of `kind`."""
    pool = pool or shared_pool()
    try:
        if kind == PDF:
            return _pdf(pool.call("pdf_info", str(path)), ref)
        if kind in (DOCX, ODT):  # the jobs tell the two apart by the file's content
            return _docx(pool.call("docx_info", str(path)), ref, _NAMES[kind])
        return _xlsx(pool.call("xlsx_info", str(path)), ref, _NAMES[kind])
    except DocumentError as exc:
        log.info("a stored %s could not be read: %s", kind, exc)
        return f"{'an' if kind in (ODT, ODS) else 'a'} {kind.upper()} I could not read: {exc}"


def _titled(title: object) -> str:
    # A title is the file's own words: bounded and neutralised, quoted as data.
    return f' titled "{as_data(str(title))}"' if title else ""


def _pdf(info: dict[str, object], ref: str) -> str:
    pages = int(str(info["pages"]))
    plural = "" if pages == 1 else "s"
    head = f"a PDF of {pages} page{plural}{_titled(info.get('title'))}"
    if not info.get("text_layer"):
        return (f"{head} with no text layer (a scan or images): pdf_read finds no text in it; "
                "if you can see images, ask the user to send the pages you need as photos")
    return (f'{head}: pdf_info("{ref}"), pdf_read("{ref}", 1, {min(pages, 5)}) and '
            f'pdf_search("{ref}", "words") read it a page range at a time ({ACTIVATE})')


def _docx(info: dict[str, object], ref: str, what: str) -> str:
    blocks = int(str(info["blocks"]))
    images = int(str(info.get("images") or 0))
    pictures = _counted(images, "image")
    if not blocks:  # suggesting docx_read would only lead to an error
        return (f"{what}{_titled(info.get('title'))} with no text"
                f"{f', only {pictures}' if images else ''}: docx_read finds no text in it"
                + ("; if you can see images, ask the user to send the pages you need as photos"
                   if images else ""))
    counts = {key: int(str(info.get(key + "s") or 0))
              for key in ("table", "image", "footnote", "endnote", "comment")}
    extra = "".join(f", {_counted(number, key)}" for key, number in counts.items() if number)
    inserted, deleted = int(str(info.get("inserted") or 0)), int(str(info.get("deleted") or 0))
    if inserted or deleted:  # pending changes: the text is not final, and says so
        extra += (f", tracked changes not yet accepted ({_counted(inserted, 'insertion')}, "
                  f"{_counted(deleted, 'deletion')}; docx_read marks them)")
    return (f"{what}{_titled(info.get('title'))} of {info['words']} words in {blocks} "
            f'paragraphs{extra}: docx_read("{ref}", 1, {min(blocks, 40) or 1}) reads them by '
            f"paragraph range ({ACTIVATE})")


def _counted(number: int, thing: str) -> str:
    return f"{number} {thing}" + ("" if number == 1 else "s")


def _xlsx(info: dict[str, object], ref: str, what: str) -> str:
    sheets = info["sheets"]
    assert isinstance(sheets, list)
    listed = ", ".join(f'"{as_data(s["name"], SHEET_MAX)}" ({s["rows"]} rows x '
                       f'{s["cols"]} columns)' for s in sheets[:10])
    more = f" and {len(sheets) - 10} more" if len(sheets) > 10 else ""
    first = as_data(sheets[0]["name"], SHEET_MAX) if sheets else ""  # sheet.read accepts it
    formulas = ""
    if info.get("uncalculated"):
        formulas = ("; its formulas were never calculated (the program that wrote it left that "
                    "to a spreadsheet app), so it holds no results for them: xlsx_read shows "
                    "each formula marked (not calculated)")
    return (f"{what} with sheets {listed}{more}{formulas}: xlsx_read(\"{ref}\", \"{first}\", "
            f'"A1:H30") shows a range as a table ({ACTIVATE})')
