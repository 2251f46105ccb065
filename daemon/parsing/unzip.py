"""The first line against a zip bomb in a DOCX or XLSX (both are zip files): what the archive
says it unpacks to, checked before any parser opens it. A file that lies about its sizes
still meets the worker's memory bound."""

from __future__ import annotations

import zipfile

from daemon.core.errors import DocumentError

MAX_UNPACKED = 256 * 1024 * 1024
MAX_MEMBERS = 10_000


def check_archive(path: str, what: str) -> None:
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise DocumentError(f"it is not {what} I can read (damaged, or not that kind of file)") \
            from exc
    unpacked = sum(m.file_size for m in members)
    if len(members) > MAX_MEMBERS or unpacked > MAX_UNPACKED:
        raise DocumentError(f"it unpacks to {unpacked // (1024 * 1024):,} MB in "
                            f"{len(members):,} parts, more than a real document holds (a zip "
                            "bomb?), so I did not open it")
