"""The `<user_facts>` block and the line that announces a change of facts (pure).

The block comes after the system message's shared part (see `daemon.context.prefix`), so every
conversation still shares those bytes and a person's facts cost only their own. It is bounded:
at most `window / FACTS_SHARE` tokens; past that the oldest facts leave the prompt first (they
stay kept, and `memory_search` finds them). A conversation freezes its block when it starts and
makes it again only at a fold (`daemon.turn.prompting`), so every turn sends the same bytes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from daemon.context.budget import Estimator, estimate_tokens

FACTS_SHARE = 32  # the block may take a 32nd of the window
FACTS_HEAD = "Facts the user asked you to keep (oldest first, with the day noted):"
NOTE_MAX_CHARS = 600  # the change line of one turn

_TAG = re.compile("user_facts", re.IGNORECASE)


@dataclass(frozen=True)
class FactsBlock:
    """The block's text ("" when there is nothing to show), how many facts it shows and leaves
    out, and its estimated tokens against its cap."""

    text: str
    shown: int
    left_out: int
    tokens: int
    cap: int


def facts_cap(num_ctx: int) -> int:
    return num_ctx // FACTS_SHARE


def facts_block(facts: Sequence[tuple[str, str]], num_ctx: int, ratio: float = 1.0,
                estimate: Estimator = estimate_tokens) -> FactsBlock:
    """The block for `facts` ((added day, text) pairs, oldest first): the newest that fit in
    `facts_cap(num_ctx)` tokens, shown oldest first, and a line counting the rest."""
    cap = facts_cap(num_ctx)
    if not facts:
        return FactsBlock("", 0, 0, 0, cap)
    # A fact is one line, and cannot close the block early (a hand-edited file included).
    lines = [f"- {added}: {_TAG.sub('user facts', text)}" for added, text in facts]

    def render(start: int) -> str:
        body = [FACTS_HEAD, *lines[start:]]
        if start:
            body.append(f"[{start} older facts not shown; memory_search finds them]")
        return "<user_facts>\n" + "\n".join(body) + "\n</user_facts>"

    # The fewest left out that fit: leaving out more never costs more, so a binary search.
    low, high = 0, len(lines)
    while low < high:
        middle = (low + high) // 2
        if estimate(render(middle), ratio) <= cap:
            high = middle
        else:
            low = middle + 1
    text = render(low)
    tokens = estimate(text, ratio)
    if tokens > cap:  # a window too small for even the count
        return FactsBlock("", 0, len(lines), 0, cap)
    return FactsBlock(text, len(lines) - low, low, tokens, cap)


def with_facts(prefix: str, block: str) -> str:
    """The system message: the shared prefix, then the person's block (if any)."""
    return f"{prefix}\n\n{block}" if block else prefix


def facts_note(added: Sequence[str], removed: Sequence[str]) -> str:
    """The short line a user message carries when the facts changed since the conversation's
    block was made ("" when they did not)."""
    parts = []
    if added:
        parts.append("now kept: " + "; ".join(added))
    if removed:
        parts.append("forgotten (disregard them above): " + "; ".join(removed))
    if not parts:
        return ""
    note = "[Facts changed since this conversation began: " + " | ".join(parts)
    if len(note) > NOTE_MAX_CHARS:
        note = note[:NOTE_MAX_CHARS - 40].rstrip() + " ... (more: memory_search finds them)"
    return note + "]"
