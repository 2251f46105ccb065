"""The rolling summary: when and what to fold, the one fold prompt, and the merged result.

A conversation has exactly one summary. When the unsummarized history before the verbatim tail
grows past the threshold (a quarter of the window in tokens, never more than 120,000 characters),
everything before the mark is folded into it: the mark keeps the last 8 messages and walks back to
the nearest user message, so the verbatim tail starts on what the user said.

One model call per fold. The prompt carries the previous summary and asks the model to merge it
with the new messages (excerpts capped so the prompt fits the window). The user's own words are
never generated: each folded user message is copied verbatim, clipped to 300 characters, into
`user_notes`; only when those grow past window/16 tokens does the same call also condense them,
told to keep every fact, name, number and instruction.

Pure functions: the background task in `daemon/folding.py` does the I/O.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from daemon.context.budget import estimate_tokens
from daemon.conversations import Message, SummaryState

FOLD_KEEP = 8
FOLD_MAX_CHARS = 120_000
USER_NOTE_CLIP = 300
SUMMARY_MAX_CHARS = 6_000
EXCERPT_FLOOR_CHARS = 160
NOTES_HEADING = "=== USER NOTES ==="

FOLD_SYSTEM = (
    "You maintain the rolling summary of a conversation between a user and their assistant. "
    "Merge the previous summary and the new messages into ONE updated summary: keep decisions, "
    "facts, names, numbers, open tasks and what the user wants; drop chit-chat. Write plain "
    "text in short lines, no preamble."
)


@dataclass(frozen=True)
class FoldPlan:
    """The messages to fold and the boundary they pin."""

    messages: tuple[Message, ...]
    through_seq: int
    through_id: str


def fold_threshold(window: int) -> int:
    """Tokens of unsummarized history before the tail that trigger a fold."""
    return window // 4


def fold_batch(window: int) -> int:
    """Most messages one fold takes: each keeps an excerpt of at least 160 characters in a fold
    prompt of about half the window."""
    return max(FOLD_KEEP, window * 2 // EXCERPT_FLOOR_CHARS)


def summary_cap_chars(window: int) -> int:
    """Longest summary kept: the smaller of 6,000 characters and window/32 tokens."""
    return min(SUMMARY_MAX_CHARS, window // 32 * 4)


def fold_mark(tail: Sequence[Message], keep: int = FOLD_KEEP) -> int | None:
    """Index in `tail` where the verbatim part starts, or None when there is nothing to fold."""
    if len(tail) <= keep:
        return None
    mark = len(tail) - keep
    while mark > 0 and tail[mark].role != "user":
        mark -= 1
    return mark or None


def plan_fold(
    history: Sequence[Message], summary: SummaryState, window: int, ratio: float,
    *, force: bool = False, keep: int = FOLD_KEEP,
) -> FoldPlan | None:
    """What to fold now, or None. `force` (the /compact command) skips the threshold; `keep`
    is how many of the newest messages stay verbatim (before walking back to a user message).

    One fold takes at most `fold_batch(window)` messages (a backlog is folded over several
    folds), so that every folded message keeps a useful excerpt within the prompt.
    """
    tail = [m for m in history if m.seq > summary.through_seq]
    mark = fold_mark(tail, keep)
    if mark is None:
        return None
    batch = fold_batch(window)
    if mark > batch:
        # Fold the oldest batch only, ending before a user message so the rest starts on one.
        mark = batch
        while mark > 1 and tail[mark].role != "user":
            mark -= 1
    before = tail[:mark]
    chars = sum(len(m.content) for m in before)
    tokens = sum(estimate_tokens(m.content, ratio) for m in before)
    if not force and tokens <= fold_threshold(window) and chars <= FOLD_MAX_CHARS:
        return None
    return FoldPlan(messages=tuple(before), through_seq=before[-1].seq,
                    through_id=before[-1].id)


def merge_user_notes(previous: str, folded: Sequence[Message]) -> str:
    """The previous notes plus each folded user message, verbatim, clipped to 300 characters."""
    lines = [previous.rstrip()] if previous.strip() else []
    for message in folded:
        if message.role != "user" or not message.content.strip():
            continue
        text = " ".join(message.content.split())
        if len(text) > USER_NOTE_CLIP:
            text = text[: USER_NOTE_CLIP - 1] + "…"
        lines.append(f"- {text}")
    return "\n".join(lines)


def notes_need_condensing(notes: str, window: int, ratio: float) -> bool:
    return estimate_tokens(notes, ratio) > window // 16


def excerpt_caps(lengths: Sequence[int], budget_chars: int) -> list[int]:
    """Per-message excerpt caps sharing `budget_chars` fairly: short messages stay whole and
    leave their unused share to the long ones (water filling)."""
    caps = [0] * len(lengths)
    remaining = list(range(len(lengths)))
    left = max(budget_chars, 0)
    while remaining:
        share = left // len(remaining)
        small = [i for i in remaining if lengths[i] <= share]
        if not small:
            for i in remaining:
                caps[i] = share
            break
        for i in small:
            caps[i] = lengths[i]
            left -= lengths[i]
        remaining = [i for i in remaining if i not in small]
    return caps


def fold_messages(
    previous: SummaryState,
    plan: FoldPlan,
    *,
    notes: str,
    condense_notes: bool,
    window: int,
    prompt_budget: int,
    ratio: float,
) -> list[dict[str, str]]:
    """The chat messages of the one fold call; sized to fit `prompt_budget` tokens."""
    cap = summary_cap_chars(window)
    ask = (f"Write the updated summary, at most {cap:,} characters.")
    if condense_notes:
        ask += (
            f" Then write a line {NOTES_HEADING} and below it a shorter version of the user "
            "notes. Keep every fact, name, number and instruction the user gave; drop only "
            "repetition."
        )
    head = f"<previous_summary>\n{previous.summary.strip() or '(none yet)'}\n</previous_summary>"
    if condense_notes:
        head += f"\n\n<user_notes>\n{notes}\n</user_notes>"
    fixed = FOLD_SYSTEM + head + ask
    budget_chars = math.floor((prompt_budget - estimate_tokens(fixed, ratio) - 64) * 4 / ratio)
    lines = [_describe(m) for m in plan.messages]
    caps = excerpt_caps([len(line) for line in lines], int(budget_chars * 0.9))
    body = "\n".join(_clip(line, c) for line, c in zip(lines, caps, strict=True))
    return [
        {"role": "system", "content": FOLD_SYSTEM},
        {"role": "user", "content": f"{head}\n\n<new_messages>\n{body}\n</new_messages>\n\n{ask}"},
    ]


def parse_fold_reply(text: str, window: int, condense_notes: bool) -> tuple[str, str | None]:
    """(summary, condensed notes or None) from the model's answer, capped."""
    summary, _, notes = text.partition(NOTES_HEADING) if condense_notes else (text, "", "")
    summary = summary.strip()
    cap = summary_cap_chars(window)
    if len(summary) > cap:
        summary = summary[: cap - 1].rstrip() + "…"
    condensed = notes.strip() or None
    return summary, condensed


def folded_state(
    previous: SummaryState, plan: FoldPlan, summary: str, notes: str, now: float | None = None,
) -> SummaryState:
    return SummaryState(
        summary=summary,
        user_notes=notes,
        through_seq=plan.through_seq,
        through_id=plan.through_id,
        fold_count=previous.fold_count + 1,
        folded_at=time.time() if now is None else now,
    )


def _describe(message: Message) -> str:
    who = message.tool_name or message.role
    if message.role == "assistant" and message.tool_calls:
        names = ", ".join(str(c.get("function", {}).get("name", "?")) for c in message.tool_calls)
        return f"[#{message.seq} assistant called {names}] {message.content}".rstrip()
    return f"[#{message.seq} {who}] {message.content}"


def _clip(text: str, cap: int) -> str:
    if len(text) <= cap:
        return text
    return text[: cap - 1].rstrip() + "…"
