"""XLSX with openpyxl (read-only, the values the file last saved): the sheets and their sizes;
a sheet or a range as a Markdown table. Runs in a worker child (`pool.py`)."""

from __future__ import annotations

import zipfile
from typing import Any

from openpyxl import load_workbook
from openpyxl.utils.cell import get_column_letter, range_boundaries
from openpyxl.utils.exceptions import InvalidFileException

from daemon.core.errors import DocumentError
from daemon.parsing.data import SHEET_MAX, as_data
from daemon.parsing.tables import markdown_table
from daemon.parsing.unzip import check_archive

MAX_ROWS = 60
MAX_COLS = 20


def _open(path: str) -> Any:
    check_archive(path, "a spreadsheet")
    try:
        return load_workbook(path, read_only=True, data_only=True)
    except (InvalidFileException, zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise DocumentError("it is not a spreadsheet I can read (damaged, or not .xlsx)") \
            from exc


def info(path: str) -> dict[str, Any]:
    """{"sheets": [{"name", "rows", "cols"}, ...]} (sizes as the file declares them)."""
    book = _open(path)
    try:
        return {"sheets": [{"name": ws.title, "rows": ws.max_row or 0, "cols": ws.max_column or 0}
                           for ws in book.worksheets]}
    finally:
        book.close()


def read(path: str, sheet: str, cells: str) -> dict[str, Any]:
    """{"sheet", "range", "table", "more", "more_columns"}: the range (or the sheet's first
    rows) as Markdown; `more` names the rows below and `more_columns` the columns to the right
    when the sheet goes on past what one call shows."""
    book = _open(path)
    try:
        names = [ws.title for ws in book.worksheets]
        if sheet and sheet not in names:
            # The note shows names as data (`as_data`): that form finds the sheet too.
            listed = [as_data(name, SHEET_MAX) for name in names]
            if sheet not in listed:
                raise DocumentError(f"there is no sheet {sheet!r}; the sheets are {listed}")
            sheet = names[listed.index(sheet)]
        ws = book[sheet] if sheet else book.worksheets[0]
        if cells:
            try:
                min_col, min_row, max_col, max_row = range_boundaries(cells.upper())
            except ValueError as exc:
                raise DocumentError(f"{cells!r} is not a range like A1:D20") from exc
        else:
            min_col, min_row, max_col, max_row = 1, 1, ws.max_column or MAX_COLS, \
                ws.max_row or MAX_ROWS
        min_col, min_row = min_col or 1, min_row or 1
        last_col = max_col or (min_col + MAX_COLS - 1)
        max_col = min(last_col, min_col + MAX_COLS - 1)
        last_row = max_row or (min_row + MAX_ROWS - 1)
        shown_last = min(last_row, min_row + MAX_ROWS - 1)
        rows = [["" if v is None else str(v) for v in row]
                for row in ws.iter_rows(min_row=min_row, max_row=shown_last, min_col=min_col,
                                        max_col=max_col, values_only=True)]
        while rows and not any(rows[-1]):
            rows.pop()
        shown = (f"{get_column_letter(min_col)}{min_row}:"
                 f"{get_column_letter(max_col)}{min_row + max(len(rows), 1) - 1}")
        more = more_columns = None
        if shown_last < last_row:
            more = (f"{get_column_letter(min_col)}{shown_last + 1}:"
                    f"{get_column_letter(max_col)}{last_row}")
        if max_col < last_col:  # the same rows, the columns to the right
            more_columns = (f"{get_column_letter(max_col + 1)}{min_row}:"
                            f"{get_column_letter(last_col)}{shown_last}")
        return {"sheet": ws.title, "range": shown, "table": markdown_table(rows), "more": more,
                "more_columns": more_columns}
    finally:
        book.close()
