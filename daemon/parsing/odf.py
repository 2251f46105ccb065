"""OpenDocument files (ODF: .odt text, .ods spreadsheets) opened with odfdo, for `odf_text` and
`odf_sheet`. What a file is comes from its content (the `mimetype` member every ODF package
begins with), not its name. Runs in a worker child (`pool.py`)."""

from __future__ import annotations

import zipfile

from odfdo import Document

from daemon.core.errors import DocumentError
from daemon.parsing.unzip import check_archive

TEXT = "application/vnd.oasis.opendocument.text"
SPREADSHEET = "application/vnd.oasis.opendocument.spreadsheet"
_KINDS = {TEXT: "text", SPREADSHEET: "spreadsheet"}


def kind(path: str) -> str | None:
    """"text", "spreadsheet" (also for templates, .ott and .ots) or None when the file is not
    an OpenDocument text or spreadsheet (a DOCX or XLSX then)."""
    try:
        with zipfile.ZipFile(path) as archive:
            declared = archive.read("mimetype")[:100].decode("ascii", "replace").strip()
    except (zipfile.BadZipFile, KeyError, OSError, ValueError):
        return None
    return _KINDS.get(declared.removesuffix("-template"))


def open_document(path: str, what: str) -> Document:
    """The package, once its archive passed the zip-bomb check."""
    check_archive(path, what)
    try:
        return Document(path)
    except (zipfile.BadZipFile, KeyError, ValueError, OSError) as exc:
        raise DocumentError(f"it is not {what} I can read (damaged, or not that kind of file)") \
            from exc
