"""The `<user_facts>` and `<household_facts>` blocks, and the line that announces a change of
facts (pure).

The block comes after the system message's shared part (see `daemon.context.prefix`), so every
conversation still shares those bytes and a person's facts cost only their own. It is bounded:
at most `window / FACTS_SHARE` tokens; past that the oldest facts leave the prompt first (they
stay kept, and `memory_search` finds them). A conversation freezes its block when it starts and
makes it again only at a fold (`daemon.turn.prompting`), so every turn sends the same bytes.
The household's facts (those every owner and member shares) have a block of their own, with
the same cap, before the person's: owners and members share its bytes too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from daemon.context.budget import Estimator, estimate_tokens

FACTS_SHARE = 32  # the block may take a 32nd of the window
FACTS_HEAD = "Facts the user asked you to keep (oldest first, with the day noted):"
HOUSEHOLD_HEAD = ("Facts of the household the user belongs to, kept for all of its members "
                  "(oldest first, with the day noted):")
USER_TAG, HOUSEHOLD_TAG = "user_facts", "household_facts"
NOTE_MAX_CHARS = 600  # the change line of one turn

_TAG = re.compile("(user|household)_facts", re.IGNORECASE)


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
                estimate: Estimator = estimate_tokens, *, household: bool = False) -> FactsBlock:
    """The block for `facts` ((added day, text) pairs, oldest first): the newest that fit in
    `facts_cap(num_ctx)` tokens, shown oldest first, and a line counting the rest. The
    household's block with `household`."""
    tag, head = (HOUSEHOLD_TAG, HOUSEHOLD_HEAD) if household else (USER_TAG, FACTS_HEAD)
    cap = facts_cap(num_ctx)
    if not facts:
        return FactsBlock("", 0, 0, 0, cap)
    # A fact is one line, and cannot close the block early (a hand-edited file included).
    lines = [f"- {added}: {_TAG.sub(_untagged, text)}" for added, text in facts]

    def render(start: int) -> str:
        body = [head, *lines[start:]]
        if start:
            body.append(f"[{start} older facts not shown; memory_search finds them]")
        return f"<{tag}>\n" + "\n".join(body) + f"\n</{tag}>"

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


def _untagged(match: re.Match[str]) -> str:
    return match[0].lower().replace("_", " ")


def with_facts(prefix: str, block: str) -> str:
    """The system message: the shared prefix, then the facts' blocks (if any)."""
    return f"{prefix}\n\n{block}" if block else prefix


def facts_note(added: Sequence[str], removed: Sequence[str],
               household_added: Sequence[str] = (), household_removed: Sequence[str] = ()) -> str:
    """The short line a user message carries when the facts (the person's, the household's)
    changed since the conversation's blocks were made ("" when they did not)."""
    parts = []
    if added:
        parts.append("now kept: " + "; ".join(added))
    if removed:
        parts.append("forgotten (disregard them above): " + "; ".join(removed))
    if household_added:
        parts.append("now kept for the household: " + "; ".join(household_added))
    if household_removed:
        parts.append("forgotten by the household (disregard them above): "
                     + "; ".join(household_removed))
    if not parts:
        return ""
    note = "[Facts changed since this conversation began: " + " | ".join(parts)
    if len(note) > NOTE_MAX_CHARS:
        note = note[:NOTE_MAX_CHARS - 40].rstrip() + " ... (more: memory_search finds them)"
    return note + "]"
