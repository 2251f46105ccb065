"""Rows of cells as a Markdown table (pure)."""

from __future__ import annotations

from collections.abc import Sequence

CELL_CHARS = 80


def _cell(text: str) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= CELL_CHARS else text[:CELL_CHARS - 1] + "…"


def markdown_table(rows: Sequence[Sequence[str]]) -> str:
    """The first row is the header; short rows are padded."""
    if not rows:
        return ""
    width = max(len(r) for r in rows)
    lines = []
    for index, row in enumerate(rows):
        cells = [_cell(c) for c in row] + [""] * (width - len(row))
        lines.append("| " + " | ".join(cells) + " |")
        if index == 0:
            lines.append("|" + "---|" * width)
    return "\n".join(lines)
