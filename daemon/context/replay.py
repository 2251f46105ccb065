"""What the model sees of a conversation: a read-time lens over the stored messages.

The request is the system prefix, then (once history was folded) a summary preamble, then the
verbatim tail. Originals are never touched; everything here builds new chat messages:

* the conversation's first user message (usually the goal) stays in every request: in the tail
  until it is folded, then at the start of the preamble, where a fold does not change its
  bytes: word for word, or, one too long for an eighth of the budget, said to be an excerpt and
  kept as its opening and the lines with its names, numbers and identifiers (`key_lines`), with
  the read call for the rest (none for a model without tools);
* of the folded messages, the newest with images and the newest tool call with its results are
  replayed after the preamble as if still in the tail (and protected while they are the newest);

* tool results of 2,000+ characters older than the last 2 user exchanges become a stub naming the
  `conversation_read` call that returns them (deterministic, so the bytes repeat turn after turn);
* only the newest message with images sends pixels, older images become a one-line note;
* a user message that came after the person's facts changed carries the change as a line
  (`meta["facts_note"]`, see `daemon.context.facts`), since the system message's block is
  frozen until the next fold;
* any older user or assistant message (a pasted text, a long answer) larger than its fair share of
  the budget (a quarter) is replayed as a head-and-tail excerpt naming the `conversation_read`
  call that returns it whole; the excerpt depends only on the budget, so its bytes repeat (tool
  results were capped at a sixth of the budget when the tool ran, and become stubs later);
* then, only while the request is over budget, cheapest loss first: old tool output decays with
  age (a failed result 3x slower), old tool cycles condense to one line, the oldest unprotected
  messages are dropped whole (with a note saying how many), tool output is cut, oldest first;
  then protection gives way: the pinned tool cycles condense to one line (a call's arguments
  are never cut otherwise), the protected messages are shortened, in fixed steps, the newest
  user message after all others (the first user message to its key lines, no shorter than
  after a fold), and last they are dropped, oldest first, all but the newest user message(s)
  and the first user message, which shrinks further and goes only when nothing else is left:
  before its fold lands as after, it is the last message to leave.

So no single message can wedge a conversation. The newest user message is sent whole whenever it
fits the budget on its own; otherwise the model gets its excerpt and the pointer to read the rest
(and, for one larger than the window, the note of the file the turn stored it in). An excerpt
keeps a message's file notes and sent stamp whole.
Protected from dropping (until nothing else is left to give): the conversation's first user
message, the last 6 messages, the newest message with images, the newest tool call with its
results. Only when the prefix and summary alone leave no room for an excerpt of the newest user
message is `DoesNotFit` raised and nothing sent.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, tzinfo

from daemon.context.budget import MESSAGE_OVERHEAD_TOKENS, Estimator, estimate_tokens
from daemon.context.key_lines import key_lines
from daemon.context.toolless import plain_note
from daemon.core.conversations import Message, SummaryState
from daemon.core.errors import DoesNotFit

STUB_MIN_CHARS = 2000
STUB_AFTER_EXCHANGES = 2
PROTECT_LAST = 6
DECAY_FLOOR_CHARS = 240
FAILED_DECAY_SLOWER = 3  # a failed tool result decays as if a third as old
CUT_FLOOR_CHARS = 160
IMAGE_MIN_TOKENS = 256
OLD_MESSAGE_SHARE = 4  # an older message may take a quarter of the budget before it is excerpted
FIRST_MESSAGE_SHARE = 8  # the folded first user message may take an eighth of the budget
SHORTEN_SHARES = (2, 4, 8, 16, 32, 64)  # a protected message's excerpts, as budget shares
FIRST_STEPS = (32, 24, 16, 12, 8, 6, 4, 3, 2, 1)  # the first message's, in 64ths of the budget
# The newest message is cut to the room left in finer steps: it is sent once as the newest.
CURRENT_STEP_CHARS = 16
STAMP_PERIOD = 900.0  # seconds: a user message in a new quarter hour carries the time
EXCERPT_STEP_CHARS = 256  # excerpt sizes are whole steps, so a small ratio change keeps the bytes
PROSE_DENSITY = 4.0  # characters a token of English prose, about

JSONScalar = str | int | float | bool | None
JSONValue = JSONScalar | list["JSONValue"] | dict[str, "JSONValue"]
ChatMessage = dict[str, JSONValue]


@dataclass(frozen=True)
class Request:
    """Chat messages for Ollama, their estimated size per part, and what fitting cost."""

    messages: list[ChatMessage]
    estimate: int
    parts: Mapping[str, int]
    # index in `messages` -> image attachments whose pixels go with that message
    images: Mapping[int, tuple[Mapping[str, JSONValue], ...]] = field(default_factory=dict)
    stubbed: int = 0
    decayed: int = 0
    condensed: int = 0
    omitted: int = 0
    cut: int = 0
    shortened: int = 0  # messages replayed as an excerpt (older ones over their share, or to fit)


@dataclass
class _Entry:
    """One tail message on its way into the request (mutable while fitting)."""

    message: Message
    content: str
    group: int
    age: int  # user messages after this one
    protected: bool = False
    images: tuple[Mapping[str, JSONValue], ...] = ()
    tool_calls: tuple[Mapping[str, JSONValue], ...] = ()
    dropped: bool = False
    condensed_into: str | None = None
    current: bool = False  # one of the newest user messages, the ones this turn answers
    first: bool = False  # the conversation's first user message, the last to leave (issue 43)
    full: str = ""  # the content before any excerpt (file notes and sent stamp included)
    suffix: str = ""  # the end of `full` that an excerpt keeps whole: file notes, sent stamp
    tokens: int = 0  # what it adds to the request as it stands (kept by `_Tally`)
    extra: int = 0  # its tool calls and images, which fitting never changes
    density: float = 0.0  # characters a token of its text, at most 4 (0: not measured yet)


def image_tokens(image: Mapping[str, JSONValue]) -> int:
    """Estimated tokens of an image: width x height / 1,024, at least 256."""
    width, height = image.get("width"), image.get("height")
    if not isinstance(width, int) or not isinstance(height, int):
        return IMAGE_MIN_TOKENS
    return max(IMAGE_MIN_TOKENS, math.ceil(width * height / 1024))


def chat_tokens(message: Mapping[str, JSONValue], ratio: float,
                estimate: Estimator = estimate_tokens) -> int:
    """Estimated tokens of one chat message (its text and tool calls; images are counted
    apart)."""
    tokens = MESSAGE_OVERHEAD_TOKENS + estimate(str(message.get("content") or ""), ratio)
    calls = message.get("tool_calls")
    if calls:
        tokens += estimate(json.dumps(calls, separators=(",", ":")), ratio)
    return tokens


def summary_preamble(reader: str | None, summary: SummaryState, first: str = "",
                     excerpt_of: int | None = None) -> list[ChatMessage]:
    """The user message carrying the rolling summary, and a one-line acknowledgement.
    `reader` is the conversation id `conversation_read` takes, None for a model without
    tools (it cannot read the originals, so nothing promises it can). `first` is the
    conversation's first user message as it is kept (`first_words`); `excerpt_of` its seq
    when that is an excerpt, which the heading then says instead of "word for word"."""
    notes = summary.user_notes.strip() or "(none)"
    how = (f' conversation_read("{reader}") retrieves any of them verbatim.' if reader else "")
    opening = (f"{_first_heading(reader, excerpt_of)}\n<first_message>\n{first}\n"
               "</first_message>\n\n" if first else "")
    text = opening + (
        f"[Earlier in this conversation, {summary.through_seq} messages were folded into the "
        f"summary below.{how}]\n\n<summary>\n{summary.summary.strip()}\n</summary>\n\n"
        f"<user_notes>\nWhat I said in that part, in my own words:\n{notes}\n</user_notes>"
    )
    ack = ("Understood. I have the summary and will read the originals when I need them."
           if reader else "Understood. I have the summary.")
    return [{"role": "user", "content": text}, {"role": "assistant", "content": ack}]


def _first_heading(reader: str | None, excerpt_of: int | None) -> str:
    """What the preamble says of the first message: word for word only when it is whole; an
    excerpt says so, and promises a read only to a model that can make it."""
    if excerpt_of is None:
        return "My first message in this conversation, word for word:"
    how = (f' (conversation_read("{reader}", {excerpt_of}, {excerpt_of}, offset=...) reads '
           "all of it)" if reader else "")
    return ("My first message in this conversation is too long to repeat whole; these are its "
            f"opening and the lines with its names, numbers and identifiers{how}:")


def first_words(message: Message, reader: str | None, tokens: int, ratio: float,
                estimate: Estimator = estimate_tokens) -> tuple[str, bool]:
    """The first user message as the preamble keeps it, and whether that is all of it: whole
    (its file notes too), or its opening and the lines with its names and numbers within
    `tokens` (`key_lines`), in whole steps so that its bytes repeat."""
    text = _with_attachment_notes(message.content, message, reader is not None).strip()
    cost = estimate(text, ratio)
    if cost <= tokens:
        return text, True
    return _key_lines_within(text, tokens, ratio, "my first message", estimate), False


def _key_lines_within(text: str, tokens: int, ratio: float, label: str,
                      estimate: Estimator) -> str:
    """`key_lines` of `text` within `tokens`: the longest pick, in small whole steps, whose
    estimate fits. Its lines can be far denser or sparser than the whole (a prose opening
    beside a digit export), so the size is found by bisection from the most prose could
    take; the output changes only when a whole line enters or leaves, so it repeats."""
    keep = _excerpt_chars(tokens, ratio)
    kept = key_lines(text, keep, label)
    if estimate(kept, ratio) <= tokens:
        return kept
    low, high = 0, keep // CURRENT_STEP_CHARS - 1
    while low < high:
        middle = (low + high + 1) // 2
        if estimate(key_lines(text, middle * CURRENT_STEP_CHARS, label), ratio) <= tokens:
            low = middle
        else:
            high = middle - 1
    return key_lines(text, max(low * CURRENT_STEP_CHARS, CURRENT_STEP_CHARS), label)


def stub_text(conversation_id: str, message: Message) -> str:
    name = message.tool_name or "a tool"
    return (
        f"[result of {name}: {len(message.content):,} characters, not repeated here; "
        f'conversation_read("{conversation_id}", {message.seq}, {message.seq}) returns it]'
    )


def shown_result(conversation_id: str, seq: int, content: str, cap: int) -> str:
    """A long tool result as the turn that ran the tool showed it to the model: head and tail
    within `cap` characters. Replay shows the same bytes later, so the prompt cache matches."""
    return excerpt(content, cap, f'a long result; conversation_read("{conversation_id}", {seq}, '
                                 f"{seq}, offset=...) reads it in pages")


def omitted_note(count: int) -> ChatMessage:
    return {"role": "user", "content": f"[{count} earlier messages omitted to fit the context "
                                       "window]"}


def excerpt(text: str, keep: int, label: str) -> str:
    """Head and tail of `text`, with a short label where the middle was left out: worded as
    data, and never last in a message, where a small model continues the pattern it read
    (after the old `[TRUNCATED — ...]` label one wrote `[SENDED — 9,480 characters too
    long...]` under its answers: issue 30)."""
    if len(text) <= keep:
        return text
    head = keep * 2 // 3
    tail = keep - head
    cut = len(text) - keep
    ending = text[-tail:] if tail else ""
    return f"{text[:head]}\n[… {cut:,} characters left out: {label}]\n{ending}"


def sent_stamp(created: float, tz: tzinfo) -> str:
    """The clock on a user message: when it was sent, in the user's timezone. It rides at the
    end of the message and never changes, so the newest one tells the model the time and the
    prompt cache still matches every earlier byte, the previous reply included. Short, with
    words for the month: a tokenizer makes every digit a token (18 Qwen tokens, was 22)."""
    when = datetime.fromtimestamp(created, tz)
    return f"\n\n[sent {when:%a} {when.day} {when:%b %Y %H:%M}]"


def stamp_due(created: float, previous: float | None) -> bool:
    """Whether a user message carries its stamp: the first one, and one sent in another
    quarter hour than the user's message before it. Only when the time may have moved: each
    stamp costs about 18 tokens, and a small model copies a stamp it sees on every message.
    It depends on the two messages alone, so a message's bytes never change later."""
    return previous is None or created // STAMP_PERIOD != previous // STAMP_PERIOD


def build_request(
    *,
    conversation_id: str,
    prefix: str,
    history: Sequence[Message],
    budget: int,
    ratio: float = 1.0,
    summary: SummaryState | None = None,
    tail_note: str = "",
    opening: str = "",
    tz: tzinfo | None = None,
    estimate: Estimator = estimate_tokens,
    tools: bool = True,
) -> Request:
    """The request for the next model call; see the module docstring for the rules.

    `tz` stamps each user message with the time it was sent; `tail_note` is appended to the
    last message (counters and nudges that hold for this request only). `opening` is what
    this conversation has and others do not (the channel's note): it goes in the first user
    message after the system message, which is replayed unchanged turn after turn, so the
    system message stays the same bytes for every conversation. `estimate` is the
    token estimator (a parameter so that a test can count how often a build estimates).
    Without `tools` (a model that cannot call them) the summary and excerpts name no
    `conversation_read` call.
    """
    reader = conversation_id if tools else None
    summary = summary or SummaryState()
    system: ChatMessage = {"role": "system", "content": prefix}
    first_message = next((m for m in history if m.role == "user"), None)
    first_user = first_message.seq if first_message is not None else None
    preamble = _preamble(reader, summary, first_message, budget // FIRST_MESSAGE_SHARE, ratio,
                         estimate)
    tail = [*_kept_through_folds(history, summary.through_seq),
            *(m for m in history if m.seq > summary.through_seq)]
    # The opening rides on the first user message of the request, the same on every turn
    # until the next fold: the summary preamble, else the conversation's first user message
    # (protected from dropping; before its sent stamp, which stays the last thing in it).
    opening = f"\n\n{opening}" if opening else ""
    if opening and preamble:
        preamble[0] = {**preamble[0], "content": f"{preamble[0]['content']}{opening}"}
    entries, stubbed = _entries(conversation_id, tail, first_user, tz,
                                "" if preamble else opening, tools)
    shortened = _excerpt_old(entries, reader, budget // OLD_MESSAGE_SHARE, ratio,
                             estimate)

    fixed = chat_tokens(system, ratio, estimate)
    fixed += sum(chat_tokens(m, ratio, estimate) for m in preamble)
    fixed += estimate(tail_note, ratio)
    tally = _Tally(entries, fixed, ratio, estimate)

    decayed, condensed, omitted, cut, more = _fit(entries, conversation_id, reader, tally,
                                                  budget)
    shortened += more

    messages, images = _render(entries, preamble, system, tail_note)
    parts = _parts(system, preamble, messages, images, ratio, estimate)
    return Request(messages=messages, estimate=sum(parts.values()), parts=parts, images=images,
                   stubbed=stubbed, decayed=decayed, condensed=condensed, omitted=omitted, cut=cut,
                   shortened=shortened)


def _preamble(reader: str | None, summary: SummaryState, first_message: Message | None,
              tokens: int, ratio: float, estimate: Estimator) -> list[ChatMessage]:
    """The summary preamble once history was folded (none before), carrying the first user
    message as `first_words` keeps it within `tokens` once that message is folded too."""
    if not summary.through_seq:
        return []
    if first_message is None or first_message.seq > summary.through_seq:
        return summary_preamble(reader, summary)
    first, whole = first_words(first_message, reader, tokens, ratio, estimate)
    return summary_preamble(reader, summary, first, None if whole else first_message.seq)


def _parts(system: ChatMessage, preamble: Sequence[ChatMessage], messages: Sequence[ChatMessage],
           images: Mapping[int, Sequence[Mapping[str, JSONValue]]], ratio: float,
           estimate: Estimator) -> dict[str, int]:
    """The request's estimate by part: the prefix, the summary preamble, the tail (with its
    images)."""
    tail_tokens = sum(chat_tokens(m, ratio, estimate) for m in messages[1 + len(preamble):])
    tail_tokens += sum(image_tokens(i) for group in images.values() for i in group)
    parts = {
        "prefix": chat_tokens(system, ratio, estimate),
        "summary": sum(chat_tokens(m, ratio, estimate) for m in preamble),
        "tail": tail_tokens,
    }
    return parts


def _fit(entries: list[_Entry], conversation_id: str, reader: str | None, tally: _Tally,
         budget: int) -> tuple[int, int, int, int, int]:
    """Shrink `entries` to the budget, the cheapest loss first; how many were decayed,
    condensed, omitted, cut and shortened. Raises `DoesNotFit` when nothing more can go."""
    decayed = condensed = omitted = cut = shortened = 0
    if tally.total() > budget:
        decayed = _decay(entries, tally, budget)
    if tally.total() > budget:
        condensed = _condense(entries, conversation_id, tally, budget)
    if tally.total() > budget:
        omitted = _drop(entries, tally, budget)
    if tally.total() > budget:
        cut = _cut(entries, conversation_id, tally, budget)
    # From here the protected set alone is over the budget (a pinned tool call with long
    # arguments, which nothing above cuts, or a ratio that overestimates): shrink it rather than
    # refuse, or the conversation is locked. A pinned cycle's output is already cut to its stub,
    # so condensing it costs less than excerpting what the user wrote.
    if tally.total() > budget:
        condensed += _condense(entries, conversation_id, tally, budget, protected=True)
    if tally.total() > budget:
        shortened = _shorten(entries, reader, tally, budget)
    # The first user message is the last to leave, as after a fold, where the preamble always
    # carries it (issue 43: it went first, before the fold landed): the other protected
    # messages go, then it shrinks further, and only then it goes too.
    if tally.total() > budget:
        omitted += _drop(entries, tally, budget, protected=True, spare_first=True)
    if tally.total() > budget:
        shortened += _step_down([e for e in entries if e.first and not e.dropped], reader, tally,
                                budget, first_to=SHORTEN_SHARES[-1])
    if tally.total() > budget:
        omitted += _drop(entries, tally, budget, protected=True)
    if tally.total() > budget:
        raise DoesNotFit(tally.total(), budget)
    return decayed, condensed, omitted, cut, shortened


class _Tally:
    """The running size of the request while it is fitted.

    Each entry's tokens are estimated once, and again only when its text changes; the total is
    kept as a sum. Re-estimating every entry at each fitting step made a build quadratic in
    the conversation's length.
    """

    def __init__(self, entries: Sequence[_Entry], fixed: int, ratio: float,
                 estimate: Estimator) -> None:
        self.fixed = fixed
        self.ratio = ratio
        self.estimate = estimate
        self.dropped = 0
        self.sum = 0
        for entry in entries:
            if entry.tool_calls:
                calls = json.dumps([dict(c) for c in entry.tool_calls], separators=(",", ":"))
                entry.extra = estimate(calls, ratio)
            entry.extra += sum(image_tokens(i) for i in entry.images)
            self._count(entry)

    def total(self) -> int:
        """What `_render` would produce, in tokens (the omitted note included)."""
        note = chat_tokens(omitted_note(self.dropped), self.ratio, self.estimate) \
            if self.dropped else 0
        return self.fixed + self.sum + note

    def set_content(self, entry: _Entry, content: str) -> None:
        entry.content = content
        self._count(entry)

    def condense(self, entry: _Entry, line: str) -> None:
        entry.condensed_into = line
        self._count(entry)

    def drop(self, entry: _Entry) -> None:
        entry.dropped = True
        self.dropped += 1
        self._count(entry)

    def _count(self, entry: _Entry) -> None:
        self.sum -= entry.tokens
        if entry.dropped:
            entry.tokens = 0
        elif entry.condensed_into is not None:
            entry.tokens = (MESSAGE_OVERHEAD_TOKENS + self.estimate(entry.condensed_into,
                                                                     self.ratio)
                            if entry.condensed_into else 0)
        else:
            entry.tokens = (MESSAGE_OVERHEAD_TOKENS + self.estimate(entry.content, self.ratio)
                            + entry.extra)
        self.sum += entry.tokens


def _groups(entries: Sequence[_Entry]) -> dict[int, list[_Entry]]:
    """The entries of each group (a group is contiguous), in order."""
    groups: dict[int, list[_Entry]] = {}
    for entry in entries:
        groups.setdefault(entry.group, []).append(entry)
    return groups


def _entries(
    conversation_id: str, tail: Sequence[Message], first_user: int | None, tz: tzinfo | None,
    opening: str = "", tools: bool = True,
) -> tuple[list[_Entry], int]:
    recent_start = _recent_start(tail)
    users = [i for i, m in enumerate(tail) if m.role == "user"]
    newest_images = max((i for i, m in enumerate(tail) if _images_of(m)), default=None)
    entries: list[_Entry] = []
    group = -1
    stubbed = 0
    last_user: float | None = None  # when the user's message before this one was sent
    for i, message in enumerate(tail):
        previous = entries[-1] if entries else None
        # A tool result joins the group of the call before it: they are kept or dropped together.
        joins = message.role == "tool" and previous is not None and (
            bool(previous.tool_calls) or previous.message.role == "tool")
        if not joins:
            group += 1
        content = message.content
        if _stubbed(message, i, recent_start):
            content = stub_text(conversation_id, message)
            stubbed += 1
        elif message.role == "tool" and isinstance(message.meta.get("shown_chars"), int):
            content = shown_result(conversation_id, message.seq, content,
                                   message.meta["shown_chars"])
        images = _images_of(message)
        if images and i != newest_images:
            size = ", ".join(f"{img.get('width')}x{img.get('height')}" for img in images)
            content = f"{content}\n[image {size} sent earlier; not shown again]".lstrip()
            images = ()
        text = content.strip()
        content = _with_attachment_notes(content, message, tools)
        facts_note = message.meta.get("facts_note") if message.role == "user" else None
        if isinstance(facts_note, str) and facts_note:
            facts_note = facts_note if tools else plain_note(facts_note)
            # The user's facts changed since the system message's block was made: the line
            # rides on the message it was noticed with, the same bytes on every later turn.
            content = f"{content}\n\n{facts_note}"
        if message.seq == first_user:
            content += opening
        if tz is not None and message.role == "user":
            if stamp_due(message.created, last_user):
                content += sent_stamp(message.created, tz)
            last_user = message.created
        suffix = content[len(text):] if text and content.startswith(text) else ""
        entries.append(_Entry(
            message=message, content=content, group=group,
            age=len(users) - bisect_right(users, i), images=images,
            tool_calls=tuple(message.tool_calls), full=content, suffix=suffix,
            first=message.seq == first_user,
        ))
    _protect(entries, first_user, newest_images)
    for entry in reversed(entries):
        if entry.message.role != "user":
            break
        entry.current = True
    return entries, stubbed


def stubbed_seqs(history: Sequence[Message], summary: SummaryState) -> frozenset[int]:
    """The tool results replayed as a one-line stub instead of their text, whatever the budget
    (what the console marks on the messages they replace)."""
    tail = [*_kept_through_folds(history, summary.through_seq),
            *(m for m in history if m.seq > summary.through_seq)]
    start = _recent_start(tail)
    return frozenset(m.seq for i, m in enumerate(tail) if _stubbed(m, i, start))


def _recent_start(tail: Sequence[Message]) -> int:
    """Where the last STUB_AFTER_EXCHANGES exchanges begin: older tool results become stubs."""
    users = [i for i, m in enumerate(tail) if m.role == "user"]
    return users[-STUB_AFTER_EXCHANGES] if len(users) >= STUB_AFTER_EXCHANGES else 0


def _stubbed(message: Message, index: int, recent_start: int) -> bool:
    return (message.role == "tool" and index < recent_start
            and len(message.content) >= STUB_MIN_CHARS)


def _excerpt_chars(tokens: int, ratio: float, density: float = PROSE_DENSITY) -> int:
    """Characters of an excerpt worth `tokens`, rounded down to whole steps, for a text of
    `density` characters a token (prose 4; digits or a script the vocabulary spells out in
    bytes far fewer: counted at 4, their excerpts were several times their share)."""
    step, floor = _steps(density)
    chars = int(max(tokens, 0) * density / ratio)
    return max(chars // step * step, floor)


def _steps(density: float) -> tuple[int, int]:
    """The excerpt step and the shortest excerpt, in characters, for a text's density."""
    scale = min(density, PROSE_DENSITY) / PROSE_DENSITY
    return (max(CURRENT_STEP_CHARS, int(EXCERPT_STEP_CHARS * scale)),
            max(CURRENT_STEP_CHARS, int(CUT_FLOOR_CHARS * scale)))


def _density(entry: _Entry, estimate: Estimator) -> float:
    """Characters a token of the entry's text (measured once, on the whole of it)."""
    if not entry.density:
        body = entry.full[: len(entry.full) - len(entry.suffix)]
        entry.density = min(PROSE_DENSITY, len(body) / max(estimate(body, 1.0), 1))
    return entry.density


def _read_label(reader: str | None, seq: int, why: str) -> str:
    if reader is None:
        return why
    return (f'{why}; conversation_read("{reader}", {seq}, {seq}, offset=...) reads all of it '
            "in pages")


def _excerpt_old(entries: list[_Entry], reader: str | None, share: int, ratio: float,
                 estimate: Estimator) -> int:
    """Older messages over their fair share of the budget become head-and-tail excerpts."""
    shortened = 0
    for entry in entries:
        if entry.current or entry.message.role == "tool":
            continue
        if estimate(entry.content, ratio) <= share:
            continue
        if entry.first:
            entry.content = _first_excerpt(entry, reader, share, ratio, estimate)
            shortened += 1
            continue
        density = _density(entry, estimate)
        keep = _excerpt_chars(share, ratio, density)
        if len(entry.content) <= keep + _steps(density)[0]:
            continue
        entry.content = _excerpt_entry(entry, keep, _read_label(
            reader, entry.message.seq, "a long earlier message"))
        shortened += 1
    return shortened


def _excerpt_entry(entry: _Entry, keep: int, label: str) -> str:
    """Head and tail of the message's text; its file notes and sent stamp stay whole."""
    body = entry.full[: len(entry.full) - len(entry.suffix)]
    return excerpt(body, keep, label) + entry.suffix


def _first_excerpt(entry: _Entry, reader: str | None, tokens: int, ratio: float,
                   estimate: Estimator) -> str:
    """The conversation's first message within `tokens`, as the summary preamble keeps it
    after the fold: its opening and the lines with its names and numbers (`key_lines`), its
    file notes and sent stamp whole."""
    body = entry.full[: len(entry.full) - len(entry.suffix)]
    room = tokens - estimate(entry.suffix, ratio)
    label = _read_label(reader, entry.message.seq, "my first message")
    return _key_lines_within(body, room, ratio, label, estimate) + entry.suffix


def _shorten(entries: list[_Entry], reader: str | None, tally: _Tally, budget: int) -> int:
    """Last resort: shorten protected messages in fixed steps, older ones first (the first
    user message no shorter than the preamble keeps it after a fold); then the newest user
    message(s), each to the room really left."""
    candidates = [e for e in entries if not e.dropped and e.condensed_into is None]
    shortened = _step_down(candidates, reader, tally, budget, first_to=FIRST_MESSAGE_SHARE)
    for entry in (e for e in candidates if e.current):
        if tally.total() <= budget:
            break
        _fit_current(entry, reader, tally, budget)
        shortened += 1
    return shortened


def _step_down(candidates: Sequence[_Entry], reader: str | None, tally: _Tally, budget: int,
               *, first_to: int) -> int:
    """Older messages of `candidates` as excerpts of budget/2, /4 ... /64, each step for all
    of them, oldest first, until the request fits; the first user message to budget/`first_to`
    at most."""
    shortened = 0
    for share in SHORTEN_SHARES:
        for entry in candidates:
            if tally.total() <= budget:
                return shortened
            if entry.current or (entry.first and share > first_to):
                continue
            if entry.first:
                shortened += _shrink_first(entry, reader, tally, budget, budget // share)
                continue
            density = _density(entry, tally.estimate)
            keep = _excerpt_chars(budget // share, tally.ratio, density)
            if len(entry.content) <= keep + _steps(density)[0]:
                continue
            tally.set_content(entry, _excerpt_entry(entry, keep, _read_label(
                reader, entry.message.seq, "a long message, cut to fit the context window")))
            shortened += 1
    return shortened


def _shrink_first(entry: _Entry, reader: str | None, tally: _Tally, budget: int,
                  floor: int) -> int:
    """The first user message in finer steps than the others (FIRST_STEPS, each a fixed share
    of the budget, so its bytes repeat), down to `floor` tokens, while the request is over:
    a whole halving at once took away lines with room left for them. 1 if it changed."""
    changed = 0
    for sixty_fourths in FIRST_STEPS:
        tokens = budget * sixty_fourths // 64
        if tally.total() <= budget or tokens < floor:
            break
        if tally.estimate(entry.content, tally.ratio) > tokens:
            tally.set_content(entry, _first_excerpt(entry, reader, tokens, tally.ratio,
                                                    tally.estimate))
            changed = 1
    return changed


def _fit_current(entry: _Entry, reader: str | None, tally: _Tally, budget: int) -> None:
    """The newest message's start and end, as long as the room left allows: the longest
    excerpt, in small steps, whose estimate fits (halving wasted up to half the room, and
    digits or other scripts are not 4 characters a token)."""
    label = _read_label(reader, entry.message.seq,
                        "too long to send whole, its start and end")
    low, high = 0, (len(entry.full) - len(entry.suffix)) // CURRENT_STEP_CHARS
    while low < high:
        middle = (low + high + 1) // 2
        tally.set_content(entry, _excerpt_entry(entry, middle * CURRENT_STEP_CHARS, label))
        if tally.total() <= budget:
            low = middle
        else:
            high = middle - 1
    tally.set_content(entry, _excerpt_entry(
        entry, max(low * CURRENT_STEP_CHARS, CUT_FLOOR_CHARS), label))


def _kept_through_folds(history: Sequence[Message], through_seq: int) -> list[Message]:
    """Of the folded messages, the newest with images and the newest tool call with its
    results (Flint's protected set: without one real call in sight, a small model stops making
    structured calls). They depend only on the fold's boundary, so their bytes hold until the
    next fold; fitting treats them like older tail messages, protected while newest."""
    folded = [m for m in history if m.seq <= through_seq]
    kept = {i for i in (max((i for i, m in enumerate(folded) if _images_of(m)), default=None),)
            if i is not None}
    call = max((i for i, m in enumerate(folded) if m.role == "assistant" and m.tool_calls),
               default=None)
    if call is not None:
        end = call + 1
        while end < len(folded) and folded[end].role == "tool":
            end += 1
        kept.update(range(call, end))
    return [folded[i] for i in sorted(kept)]


def _images_of(message: Message) -> tuple[Mapping[str, JSONValue], ...]:
    return tuple(a for a in message.attachments if a.get("kind") == "image")


def _with_attachment_notes(content: str, message: Message, tools: bool) -> str:
    notes = [str(a["note"]) if tools else plain_note(str(a["note"])) for a in message.attachments
             if a.get("kind") != "image" and a.get("note")]
    return "\n".join([content, *notes]).strip() if notes else content


def _protect(entries: list[_Entry], first_user: int | None, newest_images: int | None) -> None:
    for entry in entries[-PROTECT_LAST:]:
        entry.protected = True
    if entries and entries[0].message.seq == first_user:
        entries[0].protected = True
    if newest_images is not None:
        entries[newest_images].protected = True
    last_call = max((e.group for e in entries if e.tool_calls), default=None)
    for entry in entries:
        if last_call is not None and entry.group == last_call:
            entry.protected = True
    # A group is dropped whole, so protecting one member protects all of it.
    kept = {e.group for e in entries if e.protected}
    for entry in entries:
        entry.protected = entry.group in kept


def _decay(entries: list[_Entry], tally: _Tally, budget: int) -> int:
    """Old tool output shrinks with age: older results keep less, oldest first."""
    decayed = 0
    for entry in entries:
        if tally.total() <= budget:
            break
        if entry.message.role != "tool" or entry.protected or entry.age == 0:
            continue
        # What failed is what the model must not try again: it fades 3x slower (Flint).
        age = entry.age // FAILED_DECAY_SLOWER if entry.message.meta.get("error") else entry.age
        keep = max(DECAY_FLOOR_CHARS, STUB_MIN_CHARS >> age)
        if len(entry.content) > keep + 80:
            tally.set_content(entry, excerpt(entry.content, keep,
                                             "an old tool result"))
            decayed += 1
    return decayed


def _condense(entries: list[_Entry], conversation_id: str, tally: _Tally, budget: int, *,
              protected: bool = False) -> int:
    """Old tool cycles (a call and its results) become one line, oldest first; with
    `protected`, the pinned ones too (as the last resort)."""
    condensed = 0
    groups = _groups(entries)
    for group in sorted({e.group for e in entries if e.tool_calls and e.protected == protected
                         and e.condensed_into is None and not e.dropped}):
        if tally.total() <= budget:
            break
        members = groups[group]
        calls = ", ".join(_call_text(c) for m in members for c in m.tool_calls)
        sizes = sum(len(m.message.content) for m in members if m.message.role == "tool")
        first, last = members[0].message.seq, members[-1].message.seq
        text = members[0].content.strip()
        line = (f"{text} " if text else "") + (
            f"[earlier I called {calls}; {sizes:,} characters of results, "
            f'conversation_read("{conversation_id}", {first}, {last}) returns them]')
        tally.condense(members[0], line)
        for member in members[1:]:
            tally.condense(member, "")
        condensed += 1
    return condensed


def _call_text(call: Mapping[str, JSONValue]) -> str:
    function = call.get("function")
    if not isinstance(function, Mapping):
        return "a tool"
    arguments = json.dumps(function.get("arguments", {}), ensure_ascii=False,
                           separators=(",", ":"))
    if len(arguments) > 80:
        arguments = arguments[:77] + "..."
    return f"{function.get('name', 'a tool')}({arguments})"


def _drop(entries: list[_Entry], tally: _Tally, budget: int, *, protected: bool = False,
          spare_first: bool = False) -> int:
    """Drop the oldest unprotected groups whole until the request fits; with `protected`, the
    protected ones (as the last resort), never the newest user messages; with `spare_first`,
    not the conversation's first user message either."""
    dropped = 0
    groups = _groups(entries)
    kept = {e.group for e in entries if e.current or (spare_first and e.first)}
    for group in sorted({e.group for e in entries if e.protected == protected
                         and not e.dropped and e.group not in kept}):
        if tally.total() <= budget:
            break
        for entry in groups[group]:
            tally.drop(entry)
            dropped += 1
    return dropped


def _cut(entries: list[_Entry], conversation_id: str, tally: _Tally, budget: int) -> int:
    """Last resort: cut tool output (protected too), oldest first, in fixed steps.

    The steps depend only on the budget, not on how far over it the request is, so a result cut
    on one turn is cut the same way on the next and the prompt cache keeps matching.
    """
    cut = 0
    for keep in _cut_levels(budget):
        for entry in entries:
            if tally.total() <= budget:
                return cut
            if entry.dropped or entry.condensed_into is not None or entry.message.role != "tool":
                continue
            if keep == 0:
                stub = stub_text(conversation_id, entry.message)
                if len(entry.content) > len(stub):
                    tally.set_content(entry, stub)
                    cut += 1
            elif len(entry.content) > keep + 200:
                label = (f'cut to fit the context window; conversation_read("{conversation_id}", '
                         f"{entry.message.seq}, {entry.message.seq}) returns all of it")
                tally.set_content(entry, excerpt(entry.message.content, keep, label))
                cut += 1
    return cut


def _cut_levels(budget: int) -> list[int]:
    """Characters a cut tool result keeps, step by step: about half, a quarter, a tenth of the
    budget, a floor, and last nothing but the stub that names how to read it."""
    chars = budget * 4
    return [chars // 2, chars // 4, chars // 10, CUT_FLOOR_CHARS, 0]


def _render(
    entries: Sequence[_Entry], preamble: list[ChatMessage], system: ChatMessage, tail_note: str
) -> tuple[list[ChatMessage], dict[int, tuple[Mapping[str, JSONValue], ...]]]:
    messages: list[ChatMessage] = [system, *preamble]
    images: dict[int, tuple[Mapping[str, JSONValue], ...]] = {}
    dropped = sum(1 for e in entries if e.dropped)
    note_placed = False
    for entry in entries:
        if entry.dropped:
            if not note_placed:
                messages.append(omitted_note(dropped))
                note_placed = True
            continue
        if entry.condensed_into is not None:
            if entry.condensed_into:
                messages.append({"role": "assistant", "content": entry.condensed_into})
            continue
        chat: ChatMessage = {"role": entry.message.role, "content": entry.content}
        if entry.tool_calls:
            chat["tool_calls"] = [dict(c) for c in entry.tool_calls]  # type: ignore[misc]
        if entry.message.role == "tool" and entry.message.tool_name:
            chat["tool_name"] = entry.message.tool_name
        if entry.images:
            images[len(messages)] = entry.images
        messages.append(chat)
    if tail_note and len(messages) > 1 + len(preamble):
        last = messages[-1]
        messages[-1] = {**last, "content": f"{last.get('content') or ''}{tail_note}"}
    return messages, images

