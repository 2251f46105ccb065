"""An OpenDocument spreadsheet (.ods) read with odfdo, as the book `sheet.py` reads: sheet
names and sizes, a window of cells (the value the file holds and its formula), the merged
ranges in it. odfdo keeps a run of repeated rows or cells as one element until a window asks
for it, so a sheet that declares a billion empty rows costs no more than its text."""

from __future__ import annotations

from typing import Any

from odfdo import Table
from openpyxl.utils.cell import get_column_letter

from daemon.parsing import odf

MAX_ROW, MAX_COLUMN = 1_048_576, 16_384  # LibreOffice's and Excel's grid
SCANNED = 20_000  # formula cells looked at, enough to tell how the book was written


class OdsBook:
    """The sheets of one .ods."""

    recalculate = False  # ODF has no such flag; a formula without a value tells instead

    def __init__(self, path: str) -> None:
        document = odf.open_document(path, "a spreadsheet")
        self._body = document.body
        self._tables: dict[str, Table] = {}
        for table in document.body.get_tables():
            table.rstrip()  # trailing empty rows and cells: what LibreOffice pads a sheet with
            self._tables.setdefault(table.name or f"Sheet{len(self._tables) + 1}", table)
        self.names = list(self._tables)

    def size(self, name: str) -> tuple[int, int]:
        """(rows, columns) in use, within the grid a spreadsheet app has (a hostile file may
        declare a billion of either)."""
        width, height = self._tables[name].size
        return min(height, MAX_ROW), min(width, MAX_COLUMN)

    def cells(self, name: str, rows: tuple[int, int], cols: tuple[int, int],
              ) -> list[list[tuple[Any, str | None]]]:
        """Rows of (value, formula) over 1-based inclusive bounds."""
        return [[(cell.value, _formula(cell.formula)) for cell in row]
                for row in self._window(name, rows, cols)]

    def merged(self, name: str, rows: tuple[int, int], cols: tuple[int, int]) -> list[str]:
        """The merged ranges that start in the window, like "A1:C1"."""
        found = []
        for r, row in enumerate(self._window(name, rows, cols), start=rows[0]):
            for c, cell in enumerate(row, start=cols[0]):
                across = int(cell.get_attribute_string("table:number-columns-spanned") or 1)
                down = int(cell.get_attribute_string("table:number-rows-spanned") or 1)
                if across > 1 or down > 1:
                    found.append(f"{get_column_letter(c)}{r}:"
                                 f"{get_column_letter(c + across - 1)}{r + down - 1}")
        return found

    def _window(self, name: str, rows: tuple[int, int], cols: tuple[int, int]) -> list[Any]:
        height, width = self.size(name)
        last_row, last_col = min(rows[1], height), min(cols[1], width)
        if rows[0] > last_row or cols[0] > last_col:
            return []
        return list(self._tables[name].get_cells(
            (cols[0] - 1, rows[0] - 1, last_col - 1, last_row - 1)))

    def formula_facts(self) -> tuple[int, int]:
        """(formulas, formulas with a value) among the cells that hold one: LibreOffice always
        stores the value, a program that writes ODS need not. Found by XPath on the cells as
        stored, so a repeated run counts once and costs nothing to expand."""
        seen = valued = 0
        for cell in self._body.get_elements(".//table:table-cell[@table:formula]")[:SCANNED]:
            seen += 1
            valued += cell.get_attribute("office:value-type") is not None
        return seen, valued

    def close(self) -> None:
        """Nothing held open: odfdo read the package whole."""


def _formula(text: str | None) -> str | None:
    """An OpenFormula as a spreadsheet user writes it: "of:=SUM([.A1:.A2])" -> "=SUM(A1:A2)"."""
    if not text:
        return None
    text = text.split(":", 1)[1] if text[:4].lower() in ("of:=", "oooc") else text
    return text.replace("[.", "").replace(":.", ":").replace("[", "").replace("]", "")
