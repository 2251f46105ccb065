"""The `documents` capability: PDF, DOCX, XLSX, ODT and ODS files the user sent, a range at a time.

A tool opens only a file whose reference is on a message of a conversation in scope
(`builtin.sent_file`, the check `file_read` uses): never a path the model makes up. The parse
runs in the bounded worker pool (`daemon.parsing.pool`), through a thread so the event
loop never waits; a damaged, encrypted or hostile file is an error result that says which.
"""

from __future__ import annotations

import asyncio
from typing import Any

from daemon.core.errors import DocumentError
from daemon.parsing.data import SHEET_MAX, as_data
from daemon.parsing.pool import WorkerPool, shared_pool
from daemon.tools.builtin import ToolContext, sent_file
from daemon.tools.registry import Capability, Registry, Tool
from daemon.tools.untrusted import labelled

READ_CAP_CHARS = 8_000
PAGES_PER_READ = 10
BLOCKS_PER_READ = 60
FIELDS_LISTED = 40  # form fields pdf_info names
# The pool kills a job after its own time; this only bounds the wait for a free worker too.
TOOL_TIMEOUT = 60.0


class Documents:
    """The handlers, over one worker pool."""

    def __init__(self, pool: WorkerPool | None = None) -> None:
        self._pool = pool

    @property
    def pool(self) -> WorkerPool:
        return self._pool or shared_pool()

    async def _open(self, ctx: ToolContext, path: str, job: str, *args: Any) -> Any:
        target = await asyncio.to_thread(sent_file, ctx, path)
        if target is None:
            raise _Refusal(f"ERROR: {path!r} is not a file the user sent; paths look like "
                           "attachments/2026-12/<id>.pdf, as given in the file's note.")
        try:
            return await asyncio.to_thread(self.pool.call, job, str(target), *args)
        except DocumentError as exc:
            raise _Refusal(f"ERROR: {path} could not be read: {exc}") from exc

    async def pdf_info(self, ctx: ToolContext, path: str) -> str:
        try:
            info = await self._open(ctx, path, "pdf_info")
        except _Refusal as exc:
            return str(exc)
        layer = ("has a text layer" if info["text_layer"] else
                 "has no text layer on its first pages (a scan): pdf_read finds no text")
        title = f', titled "{as_data(info["title"])}"' if info["title"] else ""
        text = f"{info['pages']} pages{title}; it {layer}."
        fields = info.get("fields") or []
        if fields:  # values typed into a form are not in the page text
            listed = "\n".join(fields[:FIELDS_LISTED])
            more = (f"\n(and {len(fields) - FIELDS_LISTED} more: pdf_read shows each page's)"
                    if len(fields) > FIELDS_LISTED else "")
            text += f"\nIt is a form with {len(fields)} form fields:\n{listed}{more}"
        return labelled("PDF details", path, text)

    async def pdf_read(self, ctx: ToolContext, path: str, from_page: int = 1,
                       to_page: int = 0, part: int = 1) -> str:
        first = max(from_page, 1)
        last = to_page if to_page >= first else first + 4
        last = min(last, first + PAGES_PER_READ - 1)
        try:
            got = await self._open(ctx, path, "pdf_read", first, last, READ_CAP_CHARS, path,
                                   to_page, part)
        except _Refusal as exc:
            return str(exc)
        pages = got["pages"]
        if first > pages:
            return f"ERROR: {path} has {pages} pages; there is no page {first}."
        body = "\n".join(f"--- page {n} ---\n{text or '(no text on this page)'}"
                         for n, text in got["texts"])
        return labelled("PDF text", path, body, got["after"])

    async def pdf_search(self, ctx: ToolContext, path: str, query: str,
                         from_page: int = 1) -> str:
        try:
            got = await self._open(ctx, path, "pdf_search", query, from_page)
        except _Refusal as exc:
            return str(exc)
        hits = got["hits"]
        where = f"pages {max(from_page, 1)}-{got['searched_to']} of {got['pages']}"
        more = (f' The rest: pdf_search("{path}", "{query}", {got["next"]})'
                if got["next"] else "")
        if not hits:
            return f"No page of {path} ({where}) holds all of {query!r}.{more}"
        body = "\n".join(f"page {n}: {line}" for n, line in hits)
        return labelled("PDF search results", path, body,
                        f"{len(hits)} pages matched in {where}; pdf_read(path, page, page) "
                        f"reads one.{more}")

    async def docx_read(self, ctx: ToolContext, path: str, from_paragraph: int = 1,
                        to_paragraph: int = 0) -> str:
        first = max(from_paragraph, 1)
        last = to_paragraph if to_paragraph >= first else first + BLOCKS_PER_READ - 1
        try:
            got = await self._open(ctx, path, "docx_read", first, last, READ_CAP_CHARS)
        except _Refusal as exc:
            return str(exc)
        if not got["blocks"]:
            images = got.get("images") or 0
            if not images:
                return f"{path} has no text."
            return (f"{path} has no text, only {images} image{'' if images == 1 else 's'}; "
                    "docx_read cannot show them.")
        if first > got["blocks"]:
            return f"ERROR: {path} has {got['blocks']} paragraphs; there is no {first}."
        body = "\n\n".join(text for _, text in got["items"])
        shown = got["items"][-1][0] if got["items"] else first
        after = f"Paragraphs {first}-{shown} of {got['blocks']}."
        if got["next"] or shown < got["blocks"]:
            after += f' More: docx_read("{path}", {got["next"] or shown + 1})'
        return labelled("Word document text", path, body, after)

    async def xlsx_read(self, ctx: ToolContext, path: str, sheet: str = "",
                        cells: str = "") -> str:
        try:
            got = await self._open(ctx, path, "xlsx_read", sheet, cells.strip())
        except _Refusal as exc:
            return str(exc)
        sheet = as_data(got["sheet"], SHEET_MAX)  # follows the label, as roost's words
        after = f'Sheet "{sheet}", cells {got["range"]}.'
        if got["more"]:
            after += f' More rows: xlsx_read("{path}", "{sheet}", "{got["more"]}")'
        if got.get("more_columns"):
            after += (f' More columns: xlsx_read("{path}", "{sheet}", '
                      f'"{got["more_columns"]}")')
        if got.get("uncalculated"):  # in roost's words too, not only in the cells and the note
            after += (" Its formulas were never calculated: the file holds no results for "
                      "them, only the formulas.")
        return labelled("spreadsheet cells", path, got["table"] or "(empty)", after)


class _Refusal(DocumentError):
    """Control flow: the error result to return instead of what was read."""


def _schema(properties: dict[str, dict[str, str]], *required: str) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required)}


_READING = "reading your document…"
_PATH = {"type": "string", "description": "the attachments/... path from the file's note"}


def register(registry: Registry, pool: WorkerPool | None = None) -> Documents:
    """The `documents` capability, loaded on demand."""
    docs = Documents(pool)
    registry.register(Capability(
        name="documents", group="files",
        description="read PDF, Word and Excel files the user sent",
        tools=(
            Tool("pdf_info", "Page count, title and whether a PDF has a text layer.",
                 _schema({"path": _PATH}, "path"), docs.pdf_info, TOOL_TIMEOUT,
                 progress=_READING),
            Tool("pdf_read", f"Text of a PDF's pages from_page..to_page (at most "
                 f"{PAGES_PER_READ} pages a call; a long page in parts: part=2, ...).",
                 _schema({"path": _PATH, "from_page": {"type": "integer"},
                          "to_page": {"type": "integer"}, "part": {"type": "integer"}},
                         "path"), docs.pdf_read, TOOL_TIMEOUT, progress=_READING),
            Tool("pdf_search", "Pages of a PDF holding all the words, with a line of context.",
                 _schema({"path": _PATH, "query": {"type": "string"},
                          "from_page": {"type": "integer"}}, "path", "query"),
                 docs.pdf_search, TOOL_TIMEOUT, progress="searching your document…"),
            Tool("docx_read", "Paragraphs (tables as Markdown; footnotes, comments and tracked "
                 "changes marked) of a Word or OpenDocument text (.docx, .odt) by range.",
                 _schema({"path": _PATH, "from_paragraph": {"type": "integer"},
                          "to_paragraph": {"type": "integer"}}, "path"),
                 docs.docx_read, TOOL_TIMEOUT, progress=_READING),
            Tool("xlsx_read", "A sheet or a range (like A1:F40) of a spreadsheet (.xlsx, .ods) as "
                 "a table; a formula shows =FORMULA -> its saved value.",
                 _schema({"path": _PATH, "sheet": {"type": "string"},
                          "cells": {"type": "string"}}, "path"), docs.xlsx_read, TOOL_TIMEOUT,
                 progress=_READING),
        )))
    return docs
