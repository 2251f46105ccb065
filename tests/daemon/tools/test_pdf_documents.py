"""PDFs people send, read as they would read them (issue 49), on real files from public test
corpora (tests/fixtures/documents/README.md): a table comes out a row at a time, the pages
asked for are the pages given or the answer names the call for the rest, a search finds a word
however its vowel marks and case are written, and a page whose font has no letters to it is
called what it is, no text layer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.core.config import Settings
from daemon.parsing import pdf, pdf_match
from daemon.parsing.pdf_pages import parts
from daemon.store import Store
from daemon.store.attachments import store_file
from daemon.tools import documents as document_tools
from daemon.tools.builtin import ToolContext
from daemon.tools.registry import Registry, ToolCall, ToolResult
from tests import documents
from tests.conftest import SettingsFactory

FIXTURES = Path(__file__).parents[2] / "fixtures" / "documents"
WARN = str(FIXTURES / "ca-warn-report.pdf")
SENATE = str(FIXTURES / "senate-expenditures.pdf")
HABIBI = str(FIXTURES / "habibi.pdf")
NO_MAP = str(FIXTURES / "type3_font_nomapping.pdf")
GLYPHS = Path(NO_MAP).read_bytes()
REF = "attachments/2026-12/report.pdf"


def _page(path: str, number: int) -> str:
    return str(pdf.read(path, number, number, 100_000)["texts"][0][1])


def test_a_table_drawn_a_column_at_a_time_comes_out_a_row_at_a_time() -> None:
    page = _page(WARN, 1)
    rows = page.splitlines()
    # Each notice on one line: its dates beside its company, city and count.
    assert ("06/22/2015 | 03/25/2016 | 07/01/2015 | Maxim Integrated Product | San Jose | 150 | "
            "Closure Permanent") in rows, page[:2000]
    assert ("07/08/2015 | 09/06/2015 | 07/08/2015 | Microsoft Corporation | San Diego | 129 | "
            "Layoff Permanent") in rows
    assert "Notice Date | Effective | Received | Company | City | No. Of | Layoff/Closure" in rows
    # Cells are marked, not padded: under a fifth of the text is spaces (36 % before).
    assert page.count(" ") < 0.2 * len(page)
    assert "  " not in page


def test_the_cells_of_a_turned_page_are_not_glued() -> None:
    page = _page(SENATE, 1)
    assert "37,499.96DISTRICT" not in page and "DIRECTORBAIN" not in page
    assert "BAIN, J MATTHEW | DISTRICT DIRECTOR | 37,499.96" in page.splitlines(), page[:1000]
    assert ("DHAW20190001 | 05/03/2019 | CITIBANK - TRAVEL CBA CARD | 03/04/2019 | 03/06/2019 | "
            "STAFF TRANSPORTATION | 920.68") in page.splitlines()


def test_pages_that_do_not_fit_are_named_with_the_call_that_reads_them() -> None:
    got = pdf.read(WARN, 1, 10, 8_000, REF, 12)
    shown = [number for number, _ in got["texts"]]
    assert shown == list(range(1, len(shown) + 1)) and shown[-1] < 12
    last = shown[-1]
    held = "Page 1" if last == 1 else f"Pages 1-{last}"
    assert got["after"] == (f'{held} of 16. More: pdf_read("{REF}", {last + 1}, 12) reads on '
                            f"(pages {last + 1}-12 did not fit in this answer).")
    rest = pdf.read(WARN, last + 1, 12, 8_000, REF, 12)
    assert rest["texts"][0][0] == last + 1
    everything = pdf.read(WARN, 3, 4, 100_000, REF, 4)
    assert everything["after"] == "Pages 3-4 of 16."


def test_a_page_longer_than_an_answer_comes_in_parts_and_every_part_is_reachable(
        tmp_path: Path) -> None:
    lines = [f"Line {n} of a dense page, item {n * 7}." for n in range(1, 60)]
    path = tmp_path / "dense.pdf"
    path.write_bytes(documents.pdf(["\n".join(lines), "the next page"]))
    whole = _page(str(path), 1)
    first = pdf.read(str(path), 1, 2, 800, REF, 2)
    assert first["after"].startswith("Page 1 of 2. Page 1 is longer than one answer: this is "
                                     "part 1 of ")
    count = len(parts(whole, 800))
    assert count >= 2 and f'More: pdf_read("{REF}", 1, 2, part=2)' in first["after"]
    pieces = [first["texts"][0][1]]
    for part in range(2, count + 1):
        got = pdf.read(str(path), 1, 2, 800, REF, 2, part)
        assert got["texts"] == [[1, parts(whole, 800)[part - 1]]]
        pieces.append(got["texts"][0][1])
    assert "Line 59 of a dense page" in pieces[-1]
    assert " ".join(" ".join(pieces).split()) == " ".join(whole.split())
    assert got["after"].endswith(
        f'part {count} of {count}. More: pdf_read("{REF}", 2, 2) reads on (page 2 did not fit '
        "in this answer).")


def test_a_search_ignores_vowel_marks_and_shows_the_word_as_written() -> None:
    got = pdf.search(HABIBI, "حبيبي", 1)
    assert [number for number, _ in got["hits"]] == [1]
    assert "حَبيبي" in got["hits"][0][1]  # with its fatha, as the page has it
    assert "habibi" in got["hits"][0][1]


def test_folding_matches_case_marks_tatweel_and_compatibility_forms() -> None:
    text = "Die Straße nach حبـــيبي und ﬁnal Ｒｏｏｓｔ"
    for query, written in (("STRASSE", "Straße"), ("حَبيبي", "حبـــيبي"), ("final", "ﬁnal"),
                           ("roost", "Ｒｏｏｓｔ")):
        found = pdf_match.find(text, pdf_match.fold(query).split())
        assert found is not None, query
        assert text[found[0]:found[1]] == written
    assert pdf_match.find(text, pdf_match.fold("strasse kairo").split()) is None


def test_a_search_finds_a_row_of_a_table_by_words_of_two_cells() -> None:
    got = pdf.search(WARN, "symantec mountain view", 1)
    assert [number for number, _ in got["hits"]] == [1, 9, 13]
    assert got["hits"][0][1] == ("06/30/2015 | 08/07/2015 | 07/06/2015 | Symantec Corporation | "
                                 "Mountain View | 60 | Layoff Permanent")


def test_a_page_of_glyph_numbers_is_no_text_layer_and_says_so() -> None:
    assert pdf.info(NO_MAP)["text_layer"] is False
    page = _page(NO_MAP, 1)
    assert "/g" not in page and page == pdf.NO_LETTERS
    assert pdf.search(NO_MAP, "g437", 1)["hits"] == []


# Through the tools, as the model calls them.

PDF_MIME = "application/pdf"


@pytest.fixture
def desk(make_settings: SettingsFactory) -> Iterator[tuple[Store, Settings, Registry, str]]:
    settings = make_settings()
    store = Store.open(settings.daemon.state_dir)
    registry = Registry()
    document_tools.register(registry)
    yield store, settings, registry, store.create_conversation("telegram:1111111",
                                                                 time.time()).id
    store.close()


def _send(desk: tuple[Store, Settings, Registry, str], path: str) -> str:
    store, _, _, cid = desk
    stored = store_file(Path(path).read_bytes(), store.state_dir / "attachments",
                        name=Path(path).name, mime=PDF_MIME, kind="document")
    store.append_message(cid, "user", "here", created=time.time(),
                         attachments=(stored.to_doc(),))
    note = str(stored.to_doc()["note"])
    assert "could not read" not in note, note
    return stored.ref


async def _call(desk: tuple[Store, Settings, Registry, str], name: str,
                **arguments: object) -> ToolResult:
    store, settings, registry, cid = desk
    ctx = ToolContext(store=store, settings=settings, registry=registry, conversation_id=cid,
                      clock=time.time)
    return await registry.run(ToolCall(name, arguments), ctx, ["documents"])


async def test_the_tools_read_and_search_the_table_by_rows(
        desk: tuple[Store, Settings, Registry, str]) -> None:
    ref = _send(desk, WARN)
    read = await _call(desk, "pdf_read", path=ref, from_page=1, to_page=1)
    assert "06/22/2015 | 03/25/2016 | 07/01/2015 | Maxim Integrated Product" in read.content
    found = await _call(desk, "pdf_search", path=ref, query="SYMANTEC")
    assert "page 9: 11/30/2015 | 12/04/2015 | 12/02/2015 | Symantec Corporation" in found.content


async def test_the_tools_find_a_word_whatever_its_marks(
        desk: tuple[Store, Settings, Registry, str]) -> None:
    ref = _send(desk, HABIBI)
    found = await _call(desk, "pdf_search", path=ref, query="حبيبي")
    assert "page 1:" in found.content and "حَبيبي" in found.content, found.content


async def test_the_note_and_pdf_info_call_a_page_of_glyph_numbers_no_text_layer(
        desk: tuple[Store, Settings, Registry, str]) -> None:
    store, _, _, cid = desk
    stored = await asyncio.to_thread(
        store_file, GLYPHS, store.state_dir / "attachments", name="glyphs.pdf", mime=PDF_MIME,
        kind="document")
    assert "with no text layer (a scan or images)" in str(stored.to_doc()["note"])
    store.append_message(cid, "user", "here", created=time.time(),
                         attachments=(stored.to_doc(),))
    info = await _call(desk, "pdf_info", path=stored.ref)
    assert "has no text layer" in info.content, info.content
    read = await _call(desk, "pdf_read", path=stored.ref)
    assert "/g437" not in read.content and "reads like a scan" in read.content


async def test_the_tool_names_the_pages_it_gives_and_reads_a_long_page_in_parts(
        desk: tuple[Store, Settings, Registry, str], tmp_path: Path) -> None:
    ref = _send(desk, WARN)
    read = await _call(desk, "pdf_read", path=ref, from_page=1, to_page=12)
    assert "--- page 1 ---" in read.content and "Pages 1-1" not in read.content
    assert f'of 16. More: pdf_read("{ref}", ' in read.content, read.content
    assert ", 12) reads on (pages " in read.content
    dense = tmp_path / "dense.pdf"
    dense.write_bytes(documents.pdf(["\n".join(f"Row {n}: " + "figures " * 20
                                               for n in range(1, 80))]))
    long_ref = _send(desk, str(dense))
    first = await _call(desk, "pdf_read", path=long_ref, from_page=1, to_page=1)
    assert f'More: pdf_read("{long_ref}", 1, 1, part=2)' in first.content, first.content
    second = await _call(desk, "pdf_read", path=long_ref, from_page=1, to_page=1, part=2)
    assert "this is part 2 of" in second.content and "Row 79:" not in first.content
