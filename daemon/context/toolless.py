"""What a model without tools is told of files and records: roost's notes, without the calls
it cannot make. Only roost's own framing goes through here, never what a person wrote.

A small model told to "read it with file_read(...)" when it has no tools promises a read it
cannot do, or writes the call as its answer (issue 30: a 135M model did both).
"""

from __future__ import annotations

import re

# A built-in tool's name, or any call with a quoted argument (an MCP tool's `server__tool("`).
_TOOL = re.compile(r"\b(?:file_read|files_list|tool_activate|conversation_read|memory_search|"
                   r"memory_get|image_view|web_fetch|web_search|pdf_\w+|docx_\w+|xlsx_\w+)\b"
                   r"|\b\w+\(\"")
_PARENTHESES = re.compile(r"\s*\([^()]*\)")


def plain_note(note: str) -> str:
    """`note` without the clauses that name a tool: a clause is dropped whole, or kept up to
    its colon when what comes before says what the thing is ("a PDF of 12 pages: pdf_read...")."""
    if not _TOOL.search(note):
        return note
    bracketed = note.startswith("[") and note.endswith("]")
    body = note[1:-1] if bracketed else note
    kept = []
    for clause in body.split("; "):
        clause = _PARENTHESES.sub(lambda m: "" if _TOOL.search(m.group()) else m.group(), clause)
        if _TOOL.search(clause):
            head, colon, _ = clause.partition(": ")
            if colon and not _TOOL.search(head):
                kept.append(head)
            continue
        kept.append(clause)
    text = "; ".join(kept)
    return f"[{text}]" if bracketed else text


def plain_lines(text: str) -> str:
    """`plain_note` of each line (a block of notes, such as the facts block)."""
    return "\n".join(plain_note(line) for line in text.split("\n"))
