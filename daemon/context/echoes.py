"""roost's own framing copied into a model's reply, taken off before the reply is stored.

A small model continues the patterns it sees: after user messages ending in a
`[sent Wed 2 Dec 2026 17:48]` stamp, a 135M model ended its answers with
`[Sender] - Wed 2026-12-02 at 30:52 UTC by Dana`, and after a truncation label with
`[SENDED — 9,480 characters too long...]`. Stored, a copy is replayed and copied again.
"""

from __future__ import annotations

import re

# A line that is one of roost's labels, or a stamp-like line: a bracket opening on a label word.
LABEL_MAX = 200  # characters: a longer line is the model's own words
_COPIED = re.compile(
    r"\[\s*(?:sent|sender|sended|truncated|image \d|facts changed|file:|document:|voice:"
    r"|… [\d,]+ characters left out)[^\n]*", re.IGNORECASE)


def without_framing(reply: str) -> str:
    """`reply` without the lines at its end that copy roost's framing: a short line opening
    on one of its labels. The whole reply when nothing else would be left."""
    lines = reply.rstrip().split("\n")
    end = len(lines)
    while end > 0 and (not lines[end - 1].strip() or _copied(lines[end - 1])):
        end -= 1
    kept = "\n".join(lines[:end]).rstrip()
    return kept if kept else reply


def _copied(line: str) -> bool:
    return len(line) <= LABEL_MAX and _COPIED.match(line.strip()) is not None
