"""Spreadsheets for xlsx_read: the sheets and their sizes; a sheet or a range as a Markdown
table. An XLSX is read with openpyxl (read-only, streamed), an OpenDocument spreadsheet (.ods,
told by its content) with odfdo (`odf_sheet`); both are a book of the same shape here.

A formula cell shows its formula and the value the file last saved, "=SUM(B2:B9) -> 1204".
A workbook written by a program (openpyxl, XlsxWriter) holds formulas that no spreadsheet app
ever calculated: no values, or zeros with a flag asking the app to recalculate on opening.
Then the cells say "(not calculated)" and `info` says so, rather than show empties or zeros as
results. Merged ranges are named under the table. Runs in a worker child (`pool.py`)."""

from __future__ import annotations

import zipfile
from typing import Any, Protocol
from xml.etree import ElementTree

from openpyxl import load_workbook
from openpyxl.utils.cell import get_column_letter, range_boundaries
from openpyxl.utils.exceptions import InvalidFileException

from daemon.core.errors import DocumentError
from daemon.parsing import odf
from daemon.parsing.data import SHEET_MAX, as_data
from daemon.parsing.odf_sheet import OdsBook
from daemon.parsing.tables import markdown_table
from daemon.parsing.unzip import check_archive

MAX_ROWS = 60
MAX_COLS = 20
SCANNED_CELLS = 20_000  # looked at for formulas; enough to tell how the book was written
FORMULA_CHARS = 50  # of a formula shown beside its value (a cell is cut at 80)
_MAIN = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"

Cell = tuple[Any, "str | None"]  # the value the file holds, the formula ("=...") if any


class Book(Protocol):
    names: list[str]
    recalculate: bool  # the book asks to be calculated on opening: its values are not results

    def size(self, name: str) -> tuple[int, int]: ...
    def cells(self, name: str, rows: tuple[int, int], cols: tuple[int, int],
              ) -> list[list[Cell]]: ...
    def merged(self, name: str, rows: tuple[int, int], cols: tuple[int, int]) -> list[str]: ...
    def formula_facts(self) -> tuple[int, int]: ...
    def close(self) -> None: ...


class XlsxBook:
    """One XLSX opened twice, read-only: openpyxl gives either the saved values or the
    formulas of a cell, so the two are read side by side."""

    def __init__(self, path: str) -> None:
        check_archive(path, "a spreadsheet")
        try:
            self._values = load_workbook(path, read_only=True, data_only=True)
            self._formulas = load_workbook(path, read_only=True, data_only=False)
        except (InvalidFileException, zipfile.BadZipFile, KeyError, ValueError) as exc:
            raise DocumentError("it is not a spreadsheet I can read (damaged, or not .xlsx)") \
                from exc
        self._path = path
        self.names = [ws.title for ws in self._values.worksheets]
        self.recalculate = _asks_recalculation(path)

    def size(self, name: str) -> tuple[int, int]:
        ws = self._values[name]
        return ws.max_row or 0, ws.max_column or 0

    def cells(self, name: str, rows: tuple[int, int], cols: tuple[int, int],
              ) -> list[list[Cell]]:
        bounds = {"min_row": rows[0], "max_row": rows[1], "min_col": cols[0], "max_col": cols[1]}
        values = self._values[name].iter_rows(values_only=True, **bounds)
        formulas = self._formulas[name].iter_rows(**bounds)
        return [[(value, _formula(cell)) for value, cell in zip(vrow, frow, strict=False)]
                for vrow, frow in zip(values, formulas, strict=False)]

    def merged(self, name: str, rows: tuple[int, int], cols: tuple[int, int]) -> list[str]:
        # The read-only reader skips mergeCells; they follow the rows, so this streams the
        # sheet's part once, dropping each row as it passes. The part's name is openpyxl's.
        member = self._values[name]._worksheet_path
        found = []
        rows_of: Any = None  # sheetData, emptied as its rows pass
        with zipfile.ZipFile(self._path) as archive, archive.open(member) as part:
            for event, element in ElementTree.iterparse(part, events=("start", "end")):
                if event == "start":
                    if element.tag == f"{_MAIN}sheetData":
                        rows_of = element
                elif element.tag == f"{_MAIN}mergeCell" and element.get("ref"):
                    found.append(str(element.get("ref")))
                elif element.tag == f"{_MAIN}row" and rows_of is not None:
                    rows_of.remove(element)
        return [ref for ref in found if _overlaps(ref, rows, cols)]

    def formula_facts(self) -> tuple[int, int]:
        """(formulas, formulas with a saved value) among the first cells of the book."""
        seen = valued = scanned = 0
        for name in self.names:
            for vrow, frow in zip(self._values[name].iter_rows(values_only=True),
                                  self._formulas[name].iter_rows(), strict=False):
                for value, cell in zip(vrow, frow, strict=False):
                    if _formula(cell) is not None:
                        seen += 1
                        valued += value is not None
                scanned += len(vrow)
                if scanned > SCANNED_CELLS:
                    return seen, valued
        return seen, valued

    def close(self) -> None:
        self._values.close()
        self._formulas.close()


def _formula(cell: Any) -> str | None:
    if getattr(cell, "data_type", None) != "f":
        return None
    value = cell.value
    return str(getattr(value, "text", value))  # an array formula keeps its text apart


def _asks_recalculation(path: str) -> bool:
    """Whether the workbook asks to be calculated when opened (fullCalcOnLoad), as programs
    that cannot calculate mark what they write. openpyxl reads the flag as on when absent,
    so it is read here."""
    with zipfile.ZipFile(path) as archive:
        if "xl/workbook.xml" not in archive.namelist():
            return False
        with archive.open("xl/workbook.xml") as part:
            for _, element in ElementTree.iterparse(part):
                if element.tag == f"{_MAIN}calcPr":
                    return element.get("fullCalcOnLoad") in ("1", "true")
    return False


def _overlaps(ref: str, rows: tuple[int, int], cols: tuple[int, int]) -> bool:
    try:
        min_col, min_row, max_col, max_row = range_boundaries(ref)
    except ValueError:
        return False
    return (min_row or 1) <= rows[1] and (max_row or min_row or 1) >= rows[0] \
        and (min_col or 1) <= cols[1] and (max_col or min_col or 1) >= cols[0]


def _open(path: str) -> Book:
    if odf.kind(path) is not None:
        return OdsBook(path)
    return XlsxBook(path)


def _uncalculated(book: Book) -> bool:
    seen, valued = book.formula_facts()
    return bool(seen) and (book.recalculate or not valued)


def info(path: str) -> dict[str, Any]:
    """{"sheets": [{"name", "rows", "cols"}, ...], "formulas", "uncalculated"} (sizes as the
    file declares them; formulas among the first cells)."""
    book = _open(path)
    try:
        sheets = [dict(zip(("rows", "cols"), book.size(name), strict=True), name=name)
                  for name in book.names]
        return {"sheets": sheets, "formulas": book.formula_facts()[0],
                "uncalculated": _uncalculated(book)}
    finally:
        book.close()


def read(path: str, sheet: str, cells: str) -> dict[str, Any]:
    """{"sheet", "range", "table", "more", "more_columns", "merged", "uncalculated"}: the
    range (or the sheet's first rows) as Markdown, the merged ranges in it named under it;
    `more` names the rows below and `more_columns` the columns to the right when the sheet
    goes on past what one call shows."""
    book = _open(path)
    try:
        name = _sheet(book, sheet)
        if cells:
            try:
                min_col, min_row, max_col, max_row = range_boundaries(cells.upper())
            except ValueError as exc:
                raise DocumentError(f"{cells!r} is not a range like A1:D20") from exc
        else:
            rows_in_use, cols_in_use = book.size(name)
            min_col, min_row = 1, 1
            max_col, max_row = cols_in_use or MAX_COLS, rows_in_use or MAX_ROWS
        min_col, min_row = min_col or 1, min_row or 1
        last_col = max_col or (min_col + MAX_COLS - 1)
        max_col = min(last_col, min_col + MAX_COLS - 1)
        last_row = max_row or (min_row + MAX_ROWS - 1)
        shown_last = min(last_row, min_row + MAX_ROWS - 1)
        uncalculated = _uncalculated(book)
        rows = [[_shown(value, formula, uncalculated) for value, formula in row]
                for row in book.cells(name, (min_row, shown_last), (min_col, max_col))]
        while rows and not any(rows[-1]):
            rows.pop()
        shown = (f"{get_column_letter(min_col)}{min_row}:"
                 f"{get_column_letter(max_col)}{min_row + max(len(rows), 1) - 1}")
        merged = book.merged(name, (min_row, shown_last), (min_col, max_col))
        table = markdown_table(rows)
        if merged and table:
            table += "\nMerged cells: " + ", ".join(merged)
        more = more_columns = None
        if shown_last < last_row:
            more = (f"{get_column_letter(min_col)}{shown_last + 1}:"
                    f"{get_column_letter(max_col)}{last_row}")
        if max_col < last_col:  # the same rows, the columns to the right
            more_columns = (f"{get_column_letter(max_col + 1)}{min_row}:"
                            f"{get_column_letter(last_col)}{shown_last}")
        return {"sheet": name, "range": shown, "table": table, "more": more,
                "more_columns": more_columns, "merged": merged, "uncalculated": uncalculated}
    finally:
        book.close()


def _sheet(book: Book, sheet: str) -> str:
    if not sheet:
        if not book.names:
            raise DocumentError("it has no sheets")
        return book.names[0]
    if sheet in book.names:
        return sheet
    # The note shows names as data (`as_data`): that form finds the sheet too.
    listed = [as_data(name, SHEET_MAX) for name in book.names]
    if sheet not in listed:
        raise DocumentError(f"there is no sheet {sheet!r}; the sheets are {listed}")
    return book.names[listed.index(sheet)]


def _shown(value: Any, formula: str | None, uncalculated: bool) -> str:
    if formula is None:
        return "" if value is None else str(value)
    if len(formula) > FORMULA_CHARS:  # so the value after it survives the cell's cut
        formula = formula[:FORMULA_CHARS - 1] + "…"
    if uncalculated:
        return f"{formula} (not calculated)"
    return f"{formula} -> {'' if value is None else value}"
