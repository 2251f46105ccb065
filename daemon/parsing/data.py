"""Text a file states about itself (a title, a sheet name, a file name) on its way into a note
the model reads: bounded, on one line, with nothing that could close the note's brackets or
quotes or open a section of its own. Pure; the worker children import it too."""

from __future__ import annotations

import re
import unicodedata

TITLE_MAX = 200
SHEET_MAX = 60  # Excel allows 31; a longer one is someone's doing
# Brackets end a note, quotes end the quoted value, angle and curly brackets open markup.
_MARKUP = str.maketrans({"[": "(", "]": ")", "{": "(", "}": ")", '"': "'", "`": "'",
                         "<": "‹", ">": "›"})


def as_data(text: str, limit: int = TITLE_MAX) -> str:
    """`text` on one line, markup characters replaced, at most `limit` characters ("..."
    marks a cut). Control and format characters (newlines, bidi overrides) become spaces."""
    head = unicodedata.normalize("NFC", text[: limit * 4])  # bounded work on a huge title
    flat = "".join(" " if unicodedata.category(ch)[0] == "C" else ch for ch in head)
    flat = re.sub(r"\s+", " ", flat.translate(_MARKUP)).strip()
    if len(flat) > limit or len(text) > limit * 4:
        return flat[: limit - 3].rstrip() + "..."
    return flat
