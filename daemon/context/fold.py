"""The rolling summary: when and what to fold, the one fold prompt, and the merged result.

A conversation has exactly one summary. Folds are rare and large: when the unsummarized history
grows past the high-water mark (5/8 of the window in tokens, never more than 120,000 characters),
everything but a low-water tail is folded into the summary: the newest messages worth at most
window/12 tokens, starting on a user message, and always at least the newest exchange. Each fold
so frees a large share of the budget, and the prompt cache is rebuilt once per fold rather than
every few turns.

One model call per fold, never thinking. The prompt carries the previous summary and asks the
model to merge it with the new messages (excerpts capped so the prompt fits half the window). The
user's own words are never generated: each folded user message is copied verbatim, clipped to 300
characters, into `user_notes`, except the conversation's first one, which every request carries
whole (usually the goal; see `daemon.context.replay`). Both have hard caps in tokens: the summary
window/32 (256 at 8,192), the notes window/16 (512; at least 160 at small windows). Notes over
their cap are sent to be condensed by the same call; when the model does not (small models often
ignore the format), notes leave the prompt trivia first: lines with no number, name or instruction,
oldest first, and only then the others. They stay in the store, where `conversation_read` and
`memory_search` find the messages they came from.

The answer is checked before it is stored (small models echo the prompt): roost's own section tags
are removed from it, an answer cut at its limit keeps only its whole sentences, and one that is
empty, mostly a copy of the prompt, repeats a run of roost's own instructions, states a number
none of its messages holds, or shares almost no words with them is not stored (`fold_problem`).
Condensed notes stand for the user's own words, so each line must be drawn from the notes it
condenses (`notes_problem`); else the notes are kept as they were and trimmed.

Pure functions: the background task in `daemon/turn/background_fold.py` does the I/O.
"""

from __future__ import annotations

import itertools
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo

from daemon.context.budget import MULTILINGUAL, Vocabulary, estimate_tokens
from daemon.core.conversations import Message, SummaryState

LOW_WATER_SHARE = 12  # a fold keeps window/12 tokens of the newest messages verbatim
HIGH_WATER_EIGHTHS = 5  # and runs once the unsummarized history passes 5/8 of the window
SUMMARY_CAP_SHARE = 32
NOTES_CAP_SHARE = 16
NOTES_MIN_TOKENS = 160  # at 2,048 a 16th (128) held only two or three notes
FOLD_MAX_CHARS = 120_000
USER_NOTE_CLIP = 300
_DATA_QUOTES = str.maketrans({"[": "(", "]": ")", '"': "'", "<": "‹", ">": "›"})  # a file name
SUMMARY_MAX_CHARS = 6_000
EXCERPT_FLOOR_CHARS = 160
NOTES_HEADING = "=== USER NOTES ==="
# The section tags roost writes around prompt parts; a small model echoes them back.
ROOST_TAGS = re.compile(r"</?\s*(?:previous_summary|new_messages|user_notes|summary|"
                        r"first_message|user_facts|state)\s*>", re.IGNORECASE)
# The message marks of the fold prompt (`_describe`), which a small model copies line by line.
MESSAGE_MARK = re.compile(r"\[#\d+ [^\]\n]{1,120}\] ?")
ECHO_WORDS = 6  # runs of this many words found in the prompt count as echoed
ECHO_SHARE = 0.6  # a summary more than this share echoed is no summary
INSTRUCTION_WORDS = 5  # a run of this many words of roost's fold instructions is an echo
# A summary of 6 content words or more finds at least a fifth of them in what it was given
# (a paraphrase keeps names and nouns; nonsense in Spanish about an English chat keeps none);
# a condensed note of 3 or more, half: it stands for the user's own words.
SUMMARY_WORDS_SHARE = 0.2
SUMMARY_MIN_WORDS = 6
NOTE_WORDS_SHARE = 0.5
NOTE_MIN_WORDS = 3
STEM_CHARS = 4
SMALL_NUMBER = 10  # counts ("two questions", "3 beds") may be the model's own
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_LETTERS = re.compile(r"[^\W\d_]+")
_PUNCTUATION = "\"'`.,;:!?()[]{}<>*-–—…"
_STOPWORDS = frozenset(
    "that this with from have has had they them their there then than were what when which "
    "will would should could your yours about into some also just like more very only over "
    "such been being does done each other these those where while after before because "
    "here said says asked asks wants want user users assistant".split())

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
    """The high-water mark: tokens of unsummarized history that trigger a fold."""
    return window * HIGH_WATER_EIGHTHS // 8


def low_water(window: int) -> int:
    """Tokens of the newest messages a fold keeps verbatim (capped like the history itself, so
    a huge window still folds)."""
    return min(window // LOW_WATER_SHARE, FOLD_MAX_CHARS // 16)


def fold_batch(window: int) -> int:
    """Most messages one fold takes: each keeps an excerpt of at least 160 characters in a fold
    prompt of about half the window."""
    return max(8, window * 2 // EXCERPT_FLOOR_CHARS)


def summary_cap_tokens(window: int) -> int:
    return window // SUMMARY_CAP_SHARE


def notes_cap_tokens(window: int) -> int:
    return max(window // NOTES_CAP_SHARE, NOTES_MIN_TOKENS)


def summary_cap_chars(window: int, ratio: float = 1.0) -> int:
    """Longest summary kept, in characters: window/32 tokens (at most 6,000 characters)."""
    return min(SUMMARY_MAX_CHARS, int(summary_cap_tokens(window) * 4 / ratio))


def fold_mark(tail: Sequence[Message], keep_tokens: int, ratio: float = 1.0,
              vocabulary: Vocabulary = MULTILINGUAL) -> int | None:
    """Index in `tail` where the verbatim part starts, or None when there is nothing to fold.

    The verbatim part is the longest run of newest messages within `keep_tokens` that starts on
    a user message, and never less than the newest user message and what follows it.
    """
    users = [i for i, m in enumerate(tail) if m.role == "user"]
    if not users:
        return None
    mark = users[-1]
    kept = sum(estimate_tokens(m.content, ratio, vocabulary) for m in tail[mark:])
    for start in reversed(users[:-1]):
        kept += sum(estimate_tokens(m.content, ratio, vocabulary) for m in tail[start:mark])
        if kept > keep_tokens:
            break
        mark = start
    return mark or None


def plan_fold(
    history: Sequence[Message], summary: SummaryState, window: int, ratio: float,
    *, force: bool = False, keep_tokens: int | None = None,
    vocabulary: Vocabulary = MULTILINGUAL,
) -> FoldPlan | None:
    """What to fold now, or None. `force` (a crowded request, the /compact command) skips the
    high-water check; `keep_tokens` is the verbatim tail kept (default: the low-water mark;
    0 keeps only the newest exchange).

    One fold takes at most `fold_batch(window)` messages (a backlog is folded over several
    folds), so that every folded message keeps a useful excerpt within the prompt.
    """
    tail = [m for m in history if m.seq > summary.through_seq]
    keep = low_water(window) if keep_tokens is None else keep_tokens
    mark = fold_mark(tail, keep, ratio, vocabulary)
    if mark is None:
        return None
    batch = fold_batch(window)
    if mark > batch:
        # Fold the oldest batch only, ending before a user message so the rest starts on one.
        mark = batch
        while mark > 1 and tail[mark].role != "user":
            mark -= 1
    before = tail[:mark]
    chars = sum(len(m.content) for m in tail)
    tokens = sum(estimate_tokens(m.content, ratio, vocabulary) for m in tail)
    if not force and tokens <= fold_threshold(window) and chars <= FOLD_MAX_CHARS:
        return None
    return FoldPlan(messages=tuple(before), through_seq=before[-1].seq,
                    through_id=before[-1].id)


def merge_user_notes(previous: str, folded: Sequence[Message], first_seq: int | None = None,
                     tz: tzinfo = UTC) -> str:
    """The previous notes plus each folded user message, verbatim, clipped to 300 characters;
    not the conversation's first (`first_seq`), which the request carries whole anyway. A file
    the user sent gets a line with its name, date and reference, so it stays one call away."""
    lines = [previous.rstrip()] if previous.strip() else []
    for message in folded:
        if message.role == "user":
            lines.extend(_file_line(doc, message.created, tz) for doc in message.attachments
                         if doc.get("path"))
        if message.role != "user" or not message.content.strip() or message.seq == first_seq:
            continue
        text = " ".join(message.content.split())
        if len(text) > USER_NOTE_CLIP:
            text = text[: USER_NOTE_CLIP - 1] + "…"
        lines.append(f"- {text}")
    return "\n".join(lines)


def _file_line(doc: Mapping[str, object], created: float, tz: tzinfo) -> str:
    day = datetime.fromtimestamp(created, tz).strftime("%Y-%m-%d")
    name = " ".join(str(doc.get("name") or "").split()).translate(_DATA_QUOTES)[:USER_NOTE_CLIP]
    quoted = f' "{name}"' if name else ""
    return f'- (a file I sent on {day}: {doc.get("kind", "file")}{quoted}, {doc["path"]})'


def notes_need_condensing(notes: str, window: int, ratio: float,
                          vocabulary: Vocabulary = MULTILINGUAL) -> bool:
    return estimate_tokens(notes, ratio, vocabulary) > notes_cap_tokens(window)


# Words that make a note an instruction or a fact about the person, worth more than trivia.
_WEIGHTY = re.compile(
    r"\d|\b(?:always|never|don'?t|do not|must|remember|keep|call me|my|i am|i'm|i live|"
    r"i have|i work|please|make sure|prefer|allergic|birthday|address|phone|email)\b",
    re.IGNORECASE)


def carries_facts(line: str) -> bool:
    """Whether a note holds a number, a name (a capitalised word inside a sentence) or an
    instruction: what the user would miss; the rest is trivia and leaves first."""
    if _WEIGHTY.search(line):
        return True
    words = line.removeprefix("- ").split()
    return any(word[:1].isupper() and word not in ("I", "I'm") and not before.endswith(
        (".", "!", "?", ":")) for before, word in itertools.pairwise(words))


def trim_notes(notes: str, window: int, ratio: float,
               vocabulary: Vocabulary = MULTILINGUAL) -> tuple[str, int]:
    """The notes within their cap, trivia (see `carries_facts`) left out first, oldest first,
    then the rest oldest first; and how many lines left."""
    cap = notes_cap_tokens(window)
    lines = notes.splitlines()
    order = sorted(range(len(lines)), key=lambda i: carries_facts(lines[i]))  # stable: by age
    gone: set[int] = set()
    for index in order:
        if len(lines) - len(gone) <= 1 or estimate_tokens(
                "\n".join(line for i, line in enumerate(lines) if i not in gone), ratio,
                vocabulary) <= cap:
            break
        gone.add(index)
    dropped = len(gone)
    lines = [line for i, line in enumerate(lines) if i not in gone]
    if lines:  # one huge line alone: clip it
        lines[0] = _clip_to_tokens(lines[0], cap, ratio, vocabulary)
    return "\n".join(lines), dropped


def _clip_to_tokens(line: str, cap: int, ratio: float, vocabulary: Vocabulary) -> str:
    """`line` within `cap` tokens: shrunk by the share it overshoots (a dense script costs
    several times four characters a token), so a clipped line is not clipped again."""
    while estimate_tokens(line, ratio, vocabulary) > cap and len(line) > 1:
        cost = estimate_tokens(line, ratio, vocabulary)
        line = _clip(line.removesuffix("…"), max(int(len(line) * cap * 0.95 / cost), 1))
    return line


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
    vocabulary: Vocabulary = MULTILINGUAL,
) -> list[dict[str, str]]:
    """The chat messages of the one fold call; sized to fit `prompt_budget` tokens."""
    cap = summary_cap_chars(window, ratio)
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
    room = prompt_budget - estimate_tokens(fixed, ratio, vocabulary) - 64
    # Notes to condense can fill the budget alone (a digit export at 2K): the messages then
    # go as bare ellipses rather than whole, and the model condenses the notes.
    budget_chars = max(math.floor(room * 4 / ratio), 0)
    lines = [_describe(m) for m in plan.messages]
    # Four characters a token holds for prose; digits and punctuation cost more, so the body
    # is measured and shrunk to the share it overshot by (a few rounds at most).
    for _ in range(4):
        caps = excerpt_caps([len(line) for line in lines], int(budget_chars * 0.9))
        body = "\n".join(_clip(line, c) for line, c in zip(lines, caps, strict=True))
        cost = estimate_tokens(body, ratio, vocabulary)
        if cost <= room * 0.9 or budget_chars == 0:
            break
        budget_chars = math.floor(budget_chars * room * 0.85 / cost)
    return [
        {"role": "system", "content": FOLD_SYSTEM},
        {"role": "user", "content": f"{head}\n\n<new_messages>\n{body}\n</new_messages>\n\n{ask}"},
    ]


def parse_fold_reply(
    text: str, window: int, condense_notes: bool, ratio: float = 1.0
) -> tuple[str, str | None]:
    """(summary, condensed notes or None) from the model's answer, without roost's own tags,
    the summary capped (at a sentence's end when one is near)."""
    summary, _, notes = text.partition(NOTES_HEADING) if condense_notes else (text, "", "")
    summary = _untagged(summary)
    cap = summary_cap_chars(window, ratio)
    if len(summary) > cap:
        cut = whole_sentences(summary[: cap - 1])
        summary = cut if len(cut) > cap // 2 else summary[: cap - 1].rstrip() + "…"
    condensed = _untagged(notes) or None
    return summary, condensed


def whole_sentences(text: str) -> str:
    """`text` up to the end of its last whole sentence or line (an answer cut at its limit)."""
    ends = [m.end() for m in re.finditer(r"[.!?)](?=\s|$)|\n", text)]
    return text[: ends[-1]].strip() if ends else ""


def fold_problem(summary: str, prompt: Sequence[dict[str, str]], previous: str) -> str:
    """Why a fold's summary must not be stored ("" when it may): empty, mostly words copied
    from the prompt (the previous summary aside, which a merge may well repeat), a repeat of
    roost's own instructions, or no summary of what it was given (`unfounded`)."""
    if not summary.strip():
        return "the summary is empty"
    source = " ".join(m["content"] for m in prompt)
    if previous.strip():
        source = source.replace(previous.strip(), " ")
    share = echo_share(summary, source)
    if share > ECHO_SHARE:
        return f"the summary is mostly an echo of the prompt ({share:.0%} copied)"
    given = fold_given(prompt)
    echoed = instruction_echo(summary, fold_instructions(prompt), given)
    if echoed:
        return f'the summary repeats roost\'s instructions ("{echoed}")'
    return unfounded(summary, given, "the summary")


def notes_problem(condensed: str, notes: str, prompt: Sequence[dict[str, str]]) -> str:
    """Why the model's condensed user notes must not replace the notes ("" when they may):
    they go under "in my own words", so every line must be drawn from the user's notes: no
    run of roost's instructions, no number the notes lack, most of a line's words theirs."""
    echoed = instruction_echo(condensed, fold_instructions(prompt), notes)
    if echoed:
        return f'the condensed notes repeat roost\'s instructions ("{echoed}")'
    for line in condensed.splitlines():
        problem = unfounded(line, notes, "a condensed note", NOTE_WORDS_SHARE, NOTE_MIN_WORDS)
        if problem:
            return problem
    return ""


def fold_instructions(prompt: Sequence[dict[str, str]]) -> str:
    """roost's own words in a fold prompt: the system message, the ask after the messages,
    the notes heading (what a small model echoed back as its summary, issue 43)."""
    system = " ".join(m["content"] for m in prompt if m.get("role") == "system")
    user = prompt[-1]["content"] if prompt else ""
    return f"{system}\n{user.rpartition('</new_messages>')[2]}\n{NOTES_HEADING}"


def fold_given(prompt: Sequence[dict[str, str]]) -> str:
    """What a fold was given to summarise: the previous summary, the notes, the messages
    (the user message up to the ask, without roost's tags)."""
    user = prompt[-1]["content"] if prompt else ""
    given, mark, _ = user.rpartition("</new_messages>")
    return ROOST_TAGS.sub(" ", given if mark else user)


def instruction_echo(text: str, instructions: str, given: str) -> str:
    """The first run of INSTRUCTION_WORDS words of `text` that is in roost's `instructions`
    and not in what the fold was `given` ("" when there is none)."""
    words = _words(text)
    theirs = _runs(_words(instructions), INSTRUCTION_WORDS) - _runs(_words(given),
                                                                     INSTRUCTION_WORDS)
    for i in range(len(words) - INSTRUCTION_WORDS + 1):
        if tuple(words[i:i + INSTRUCTION_WORDS]) in theirs:
            return " ".join(words[i:i + INSTRUCTION_WORDS])
    return ""


def unfounded(text: str, given: str, what: str, share: float = SUMMARY_WORDS_SHARE,
              least: int = SUMMARY_MIN_WORDS) -> str:
    """Why `text` is no account of `given` ("" when it may be): it states a number that is
    in none of it (a small model's "12 x 7 = 72"), or, with at least `least` content words,
    fewer than `share` of them are found there (nonsense in another language)."""
    numbers = _numbers(given)
    invented = [n for n in _numbers(text) if n not in numbers and int(n) > SMALL_NUMBER]
    if invented:
        return f"{what} states numbers found in none of its messages ({', '.join(invented)})"
    words = _content_words(text)
    if len(words) < least:
        return ""
    found = _stems(given)
    kept = sum(word[:STEM_CHARS] in found for word in words) / len(words)
    if kept < share:
        return f"{what} shares almost no words with its messages ({kept:.0%})"
    return ""


def _words(text: str) -> list[str]:
    """Lower-case words without the punctuation around them (", at most" is "at most")."""
    return [w for w in (w.strip(_PUNCTUATION) for w in text.lower().split()) if w]


def _runs(words: Sequence[str], size: int) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + size]) for i in range(len(words) - size + 1)}


def _numbers(text: str) -> list[str]:
    """The numbers in `text`, without separators or leading zeros ("3,000" and "3000" are the
    same, so are "02" and "2")."""
    return [str(int(re.sub(r"[.,]", "", n))) for n in _NUMBER.findall(text)
            if len(re.sub(r"[.,]", "", n)) <= 30]


def _content_words(text: str) -> list[str]:
    return [w for w in (m.lower() for m in _LETTERS.findall(text))
            if len(w) >= 4 and w not in _STOPWORDS]


def _stems(text: str) -> set[str]:
    """The first STEM_CHARS letters of each word of `text` (so "wants" finds "want" and
    "wanted", a crude stem that needs no language's rules)."""
    return {w.lower()[:STEM_CHARS] for w in _LETTERS.findall(text)}


def echo_share(text: str, source: str) -> float:
    """The share of `text`'s words that lie in runs of `ECHO_WORDS` words found in `source`."""
    words = text.lower().split()
    if len(words) < ECHO_WORDS:
        return 0.0
    theirs = source.lower().split()
    runs = {tuple(theirs[i:i + ECHO_WORDS]) for i in range(len(theirs) - ECHO_WORDS + 1)}
    copied = [False] * len(words)
    for i in range(len(words) - ECHO_WORDS + 1):
        if tuple(words[i:i + ECHO_WORDS]) in runs:
            copied[i:i + ECHO_WORDS] = [True] * ECHO_WORDS
    return sum(copied) / len(words)


def _untagged(text: str) -> str:
    """`text` without roost's own markup: section tags, message marks, the notes heading."""
    text = MESSAGE_MARK.sub("", ROOST_TAGS.sub("", text)).replace(NOTES_HEADING, "")
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def folded_state(
    previous: SummaryState, plan: FoldPlan, summary: str, notes: str, now: float | None = None,
) -> SummaryState:
    at = time.time() if now is None else now
    # A summary from before `first_folded_at` existed is as old as its last fold, at least.
    first = (previous.first_folded_at or previous.folded_at) if previous.fold_count else None
    return SummaryState(
        summary=summary,
        user_notes=notes,
        through_seq=plan.through_seq,
        through_id=plan.through_id,
        fold_count=previous.fold_count + 1,
        folded_at=at,
        first_folded_at=first if first is not None else at,
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
    # A cap of 0 (notes that fill the fold's budget alone) leaves the ellipsis, never the text.
    return text[: max(cap - 1, 0)].rstrip() + "…"
