"""What the model reads of an MCP tool result, without roost's untrusted-content label."""

from __future__ import annotations


def unlabelled(text: str) -> str:
    """A labelled result without the label's opening and `[end of ...]` lines (roost's
    words before it, such as an error line, stay); other text as it is."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "untrusted content" in line), None)
    if start is None:
        return text
    end = next(i for i in range(len(lines) - 1, start, -1) if lines[i].startswith("[end of "))
    return "\n".join(lines[:start] + lines[start + 1:end])
