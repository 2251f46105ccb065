"""What the channel tests send as a user would (a PDF, DOCX or XLSX made with its library) and
a fake model that reads it the way a real one does: it finds the file's path in the
attachment note, loads the documents capability, calls the reading tool, and answers with
the line of the result that holds what was asked."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tests import documents
from tests.fakes.ollama import Reply

PDF = "application/pdf"
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
_PATH = re.compile(r"stored at (attachments/\d{4}-\d{2}/[0-9A-Z]+\.[a-z]+)")


@dataclass(frozen=True)
class Sent:
    """A file as the user sends it, what its note must say, and what reading it must find."""

    name: str
    data: bytes
    mime: str
    note: str
    tool: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    finds: str = ""


def manual_pages() -> list[str]:
    pages = [f"Page {n} of the manual.\nSection {n} covers item {n * 7}." for n in range(1, 1001)]
    pages[733] = "Page 734 of the manual.\nThe launch code is TANGERINE-42."
    return pages


def sent_files() -> list[Sent]:
    return [
        Sent("manual.pdf", documents.pdf(manual_pages()), PDF, "a PDF of 1000 pages",
             "pdf_search", {"query": "launch code"}, "page 734: The launch code is TANGERINE-42."),
        Sent("scan.pdf", documents.pdf(["", ""]), PDF, "with no text layer (a scan or images)"),
        Sent("cut.pdf", documents.broken_pdf(), PDF,
             "a PDF I could not read: it is not a PDF I can read"),
        Sent("locked.pdf", documents.pdf(["x"], password="pw"), PDF,
             "a PDF I could not read: it is protected by a password"),
        Sent("house.docx", documents.word(["The boiler is serviced every March."],
                                          heading="House notes"), DOCX,
             "a Word document of 8 words in 2 paragraphs", "docx_read", {},
             "The boiler is serviced every March."),
        Sent("budget.xlsx", documents.workbook({"Budget": [["Item", "Cost"], ["Rent", 900]]}),
             XLSX, 'a spreadsheet with sheets "Budget" (2 rows x 2 columns)', "xlsx_read",
             {"sheet": "Budget"}, "| Rent | 900 |"),
    ]


class Reader:
    """The fake model's `default_reply` for one sent file."""

    def __init__(self, sent: Sent) -> None:
        self.sent = sent
        self.path = ""
        self.results: list[str] = []

    def __call__(self, body: dict[str, Any]) -> Reply:
        messages = body.get("messages") or []
        last = messages[-1]
        if last["role"] == "user":
            found = _PATH.search(str(last.get("content")))
            if found is None or self.sent.tool is None:
                return Reply(content="noted")
            self.path = found.group(1)
            return Reply(tool_calls=[_call("tool_activate", name="documents")])
        self.results.append(str(last.get("content")))
        if str(last.get("content")).startswith("Loaded documents"):
            assert self.sent.tool is not None
            return Reply(tool_calls=[_call(self.sent.tool, path=self.path,
                                           **self.sent.arguments)])
        lines = [line for line in str(last.get("content")).splitlines()
                 if self.sent.finds and self.sent.finds in line]
        return Reply(content="From the file: " + (lines[0] if lines else "nothing found"))


def _call(tool: str, /, **arguments: Any) -> dict[str, Any]:
    return {"function": {"name": tool, "arguments": arguments}}


def last_user_content(body: dict[str, Any]) -> str:
    users = [m for m in body["messages"] if m["role"] == "user"]
    return str(users[-1]["content"])
