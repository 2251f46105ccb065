"""Word-processor documents and spreadsheets from public test corpora (tests/fixtures/documents),
sent and read as a person's own files are: footnotes, comments, text boxes, tracked changes and
page headers reach the model; a formula shows its saved value, a workbook never calculated
says so; merged ranges are named; OpenDocument text and spreadsheets read like DOCX and XLSX."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from daemon.parsing.pool import Limits, WorkerPool
from daemon.store import Store
from daemon.store.attachments import StoredFile, store_file
from daemon.tools import documents as document_tools
from daemon.tools.builtin import ToolContext
from daemon.tools.registry import Registry, ToolCall
from tests.conftest import SettingsFactory

FIXTURES = Path(__file__).parents[2] / "fixtures" / "documents"
ODT = "application/vnd.oasis.opendocument.text"


@dataclass
class Desk:
    store: Store
    registry: Registry
    ctx: ToolContext
    cid: str

    def send(self, name: str, mime: str | None = None) -> StoredFile:
        stored = store_file((FIXTURES / name).read_bytes(), self.store.state_dir / "attachments",
                            name=name, mime=mime, kind="document")
        self.store.append_message(self.cid, "user", "here", created=time.time(),
                                  attachments=(stored.to_doc(),))
        return stored

    async def call(self, name: str, **arguments: Any) -> str:
        result = await self.registry.run(ToolCall(name, arguments), self.ctx, ["documents"])
        return result.content


@pytest.fixture
def desk(make_settings: SettingsFactory) -> Iterator[Desk]:
    settings = make_settings()
    store = Store.open(settings.daemon.state_dir)
    registry = Registry()
    document_tools.register(registry)
    cid = store.create_conversation("telegram:1111111", time.time()).id
    ctx = ToolContext(store=store, settings=settings, registry=registry, conversation_id=cid,
                      clock=time.time)
    yield Desk(store, registry, ctx, cid)
    store.close()


def _note(stored: StoredFile) -> str:
    return str(stored.to_doc()["note"])


async def test_footnotes_endnotes_and_comments_follow_the_text_they_belong_to(
        desk: Desk) -> None:
    notes = desk.send("footnotes.docx")
    assert "of 1 words in 1 paragraphs, 2 footnotes: docx_read(" in _note(notes)
    read = await desk.call("docx_read", path=notes.ref)
    assert ("Ouch[footnote 1].[footnote 2]\n[footnote 1: A tachyon walks into a bar.]\n"
            "[footnote 2: Fin.]") in read
    ends = await desk.call("docx_read", path=desk.send("endnotes.docx").ref)
    assert "[endnote 1: A tachyon walks into a bar.]\n[endnote 2: Fin.]" in ends
    comments = desk.send("comments.docx")
    assert "2 comments: docx_read(" in _note(comments)
    read = await desk.call("docx_read", path=comments.ref)
    assert ('Ouch.\n[comment by Michael Williamson on "Ouch": A tachyon walks into a bar.]\n'
            "[comment by Michael Williamson: Fin.]") in read


async def test_the_text_of_a_text_box_is_read(desk: Desk) -> None:
    box = desk.send("text-box.docx")
    assert "with no text" not in _note(box)
    assert "of 2 words in 1 paragraphs: docx_read(" in _note(box)
    assert "Datum plane" in await desk.call("docx_read", path=box.ref)


async def test_tracked_changes_are_marked_and_the_note_says_they_are_pending(
        desk: Desk) -> None:
    added = desk.send("track_changes_insertion.docx")
    assert ("tracked changes not yet accepted (1 insertion, 0 deletions; docx_read marks them)"
            in _note(added))
    assert ("This is a text with [inserted by eng-dept: two exciting] insertions."
            in await desk.call("docx_read", path=added.ref))
    cut = desk.send("track_changes_deletion.docx")
    assert "(0 insertions, 1 deletion; docx_read marks them)" in _note(cut)
    assert ("This is a text with a[deleted by eng-dept: n excessively modified] deletion."
            in await desk.call("docx_read", path=cut.ref))


async def test_page_headers_and_footers_come_once_however_many_sections_repeat_them(
        desk: Desk) -> None:
    notice = desk.send("notice-two-sections.docx")
    first = await desk.call("docx_read", path=notice.ref, from_paragraph=1, to_paragraph=2)
    assert "[page header: # Special Notice]" in first
    last = await desk.call("docx_read", path=notice.ref, from_paragraph=99, to_paragraph=101)
    assert last.count("[page footer: ") == 3, last  # three footers, each different
    assert "Page # of #" in last  # a page number printed once means nothing here
    whole = [await desk.call("docx_read", path=notice.ref, from_paragraph=n, to_paragraph=n + 59)
             for n in (1, 61)]
    assert "".join(whole).count("[page header: ") == 1


async def test_a_formula_shows_its_saved_value(desk: Desk) -> None:
    book = desk.send("concatenate.xlsx")
    assert "never calculated" not in _note(book)
    cells = await desk.call("xlsx_read", path=book.ref)
    assert "| Hello, | =CONCATENATE(A1,A2) -> Hello, world! |" in cells
    assert "| =SUM(A4:A5) -> 3 |" in cells


async def test_a_workbook_never_calculated_says_so_rather_than_show_empties(desk: Desk) -> None:
    book = desk.send("concatenate-openpyxl.xlsx")
    assert ("its formulas were never calculated (the program that wrote it left that to a "
            "spreadsheet app), so it holds no results for them") in _note(book)
    cells = await desk.call("xlsx_read", path=book.ref)
    assert "| =SUM(A4:A5) (not calculated) |" in cells
    assert "=CONCATENATE(A1,A2) (not calculated)" in cells


async def test_merged_ranges_are_named(desk: Desk) -> None:
    book = desk.send("merge_range02.xlsx")
    cells = await desk.call("xlsx_read", path=book.ref)
    assert "|  | Foo |  |  |" in cells and "Merged cells: B2:D6" in cells
    elsewhere = await desk.call("xlsx_read", path=book.ref, cells="A8:D9")
    assert "Merged" not in elsewhere


async def test_opendocument_text_is_noted_and_read_by_docx_read(desk: Desk) -> None:
    odt = desk.send("footnote.odt")
    assert _note(odt).startswith(f"[document: footnote.odt, {ODT}, ")
    assert (f'an OpenDocument text of 5 words in 1 paragraphs, 1 footnote: docx_read("{odt.ref}",'
            " 1, 1) reads them by paragraph range") in _note(odt)
    assert ("Some text[footnote 1] with a footnote.\n[footnote 1: Footnote text]"
            in await desk.call("docx_read", path=odt.ref))
    changed = desk.send("trackedChanges.odt")
    assert "(1 insertion, 1 deletion; docx_read marks them)" in _note(changed)
    assert ("Some text with [deleted by Martin Linnemann: deleted] [inserted by Martin "
            "Linnemann: and inserted] text." in await desk.call("docx_read", path=changed.ref))
    paged = await desk.call("docx_read", path=desk.send("headerfooter.odt").ref)
    assert "[page header: Header\t1\tTest]\n\n# Lorem ipsum\n\n[page footer: Footer" in paged


async def test_opendocument_spreadsheets_are_noted_and_read_by_xlsx_read(desk: Desk) -> None:
    ods = desk.send("pythagoras.ods")
    assert (f'an OpenDocument spreadsheet with sheets "Sheet1" (4 rows x 1 columns), "Sheet2" '
            f'(0 rows x 0 columns), "Sheet3" (0 rows x 0 columns): xlsx_read("{ods.ref}", '
            '"Sheet1", "A1:H30")') in _note(ods)
    cells = await desk.call("xlsx_read", path=ods.ref, sheet="Sheet1")
    assert "| =SQRT(A1*A1+A2*A2) -> 5 |\n| =SUM(A1:A2) -> 7 |" in cells
    merged = await desk.call("xlsx_read", path=desk.send("merged_cells.ods").ref)
    assert "| A | B | C |" in merged and "Merged cells: A2:A3" in merged


def test_an_ods_that_declares_a_billion_cells_is_read_within_the_workers_bound() -> None:
    pool = WorkerPool(Limits(memory_mb=400, timeout=20))
    try:
        path = str(FIXTURES / "issue_594_dos.ods")
        info = pool.call("xlsx_info", path)
        assert info["sheets"] == [{"name": "Sheet1", "rows": 1_048_576, "cols": 16_384}]
        got = pool.call("xlsx_read", path, "Sheet1", "")
        assert got["range"] == "A1:T60" and got["more"] == "A61:T1048576"
        assert got["table"].count("X") == 20 * 60
        assert pool.started == 1
    finally:
        pool.close()

