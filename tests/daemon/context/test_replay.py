"""Replay: what the model sees of a conversation, and how it is fitted to the budget."""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from daemon.context.budget import estimate_tokens, vocabulary_of
from daemon.context.replay import DoesNotFit, Request, build_request, image_tokens
from daemon.core.conversations import Message, Role, SummaryState

CID = "01JCONVERSATION0000000000A"
PREFIX = "You are roost. <channel>\nplain text\n</channel>\n\n<local_model>\nsmall\n</local_model>"
TAIL_NOTE = "\n\n[now: Wed 2026-03-04 09:15 CET]"
OMITTED = re.compile(r"^\[(\d+) earlier messages omitted to fit the context window\]$")
TAG = re.compile(r"^<(\d+)>")
READ_RANGE = re.compile(r'conversation_read\("' + CID + r'", (\d+), (\d+)\)')


def message(seq: int, role: Role, content: str, **extra: Any) -> Message:
    return Message(id=f"MSG{seq:06d}", seq=seq, role=role, content=content,
                   created=1_772_000_000.0 + seq, **extra)


def image(width: int = 640, height: int = 480, name: str = "photo.jpg") -> dict[str, Any]:
    return {"kind": "image", "path": f"attachments/{name}", "width": width, "height": height}


def call(name: str = "x", **arguments: Any) -> dict[str, Any]:
    return {"function": {"name": name, "arguments": arguments}}


@dataclass
class Script:
    """A conversation built message by message; every content starts with `<seq>` so a rendered
    message can be traced back to its original."""

    messages: list[Message] = field(default_factory=list)
    call_of: dict[int, int] = field(default_factory=dict)  # tool result seq -> its call's seq

    @property
    def next_seq(self) -> int:
        return len(self.messages) + 1

    def add(self, role: Role, body: str, **extra: Any) -> Message:
        seq = self.next_seq
        m = message(seq, role, f"<{seq}> {body}", **extra)
        self.messages.append(m)
        return m

    def user(self, body: str = "a question", **extra: Any) -> Message:
        return self.add("user", body, **extra)

    def assistant(self, body: str = "an answer") -> Message:
        return self.add("assistant", body)

    def tool_cycle(self, *sizes: int, name: str = "x", body: str = "Let me check.") -> Message:
        """An assistant message calling `name` once per result, then the results."""
        calling = self.add("assistant", body, tool_calls=tuple(
            call(name, query=f"q{self.next_seq}-{i}") for i in range(len(sizes))))
        for size in sizes:
            result = self.add("tool", filler(size - len(f"<{self.next_seq}> ")),
                              tool_name=name)
            self.call_of[result.seq] = calling.seq
        return calling

    def exchange(self, question: str = "a question", answer: str = "an answer") -> None:
        self.user(question)
        self.assistant(answer)


# Three-letter words and a space: four characters a token, so sizes read as before.
_WORDS = random.Random(1).choices(
    ("alf", "bra", "cha", "del", "ech", "fox", "gol", "hot"), k=30_000)
_TEXT = " ".join(_WORDS)  # about 120,000 characters of words


def filler(chars: int, seed: int = 0) -> str:
    """`chars` characters of words; different seeds start at different places."""
    start = (seed * 7_919) % 50_000
    return _TEXT[start:start + max(chars, 0)]


def build(
    history: Sequence[Message], budget: int = 100_000, *, summary: SummaryState | None = None,
    ratio: float = 1.0, tail_note: str = TAIL_NOTE,
) -> Request:
    return build_request(conversation_id=CID, prefix=PREFIX, history=history, budget=budget,
                         ratio=ratio, summary=summary, tail_note=tail_note)


def my_estimate(request: Request, ratio: float) -> int:
    """The request's size recomputed from what is actually sent: per message 4 tokens of
    overhead, the text and the tool calls as compact JSON (by the estimate), and each image's
    pixels (w*h/1024, at least 256)."""
    total = 0
    for index, chat in enumerate(request.messages):
        total += 4 + estimate_tokens(str(chat.get("content") or ""), ratio)
        if chat.get("tool_calls"):
            calls = json.dumps(chat["tool_calls"], separators=(",", ":"))
            total += estimate_tokens(calls, ratio)
        for img in request.images.get(index, ()):
            width, height = img["width"], img["height"]
            assert isinstance(width, int) and isinstance(height, int)
            total += max(256, math.ceil(width * height / 1024))
    return total


def tail_of(request: Request) -> list[dict[str, Any]]:
    """The rendered messages after the system message and any summary preamble."""
    start = 3 if request.parts["summary"] else 1
    return request.messages[start:]


def strip_note(chat: Mapping[str, Any], is_last: bool) -> str:
    content = str(chat.get("content") or "")
    if is_last:
        assert content.endswith(TAIL_NOTE), "the volatile tail rides on the last message"
        content = content[: -len(TAIL_NOTE)]
    else:
        assert TAIL_NOTE not in content
    return content


@dataclass
class Traced:
    """Which original messages a request shows whole, condensed, or omitted."""

    shown: dict[int, dict[str, Any]]  # seq -> rendered chat message
    condensed: set[int]
    omitted_note: int | None


def trace(request: Request, script: Script) -> Traced:
    originals = {m.seq: m for m in script.messages}
    tail = tail_of(request)
    shown: dict[int, dict[str, Any]] = {}
    condensed: set[int] = set()
    omitted_note: int | None = None
    for i, chat in enumerate(tail):
        content = strip_note(chat, i == len(tail) - 1)
        role = chat["role"]
        note = OMITTED.match(content)
        if note and role == "user":
            assert omitted_note is None, "one omission note at most"
            omitted_note = int(note.group(1))
            continue
        if role == "tool" and content.startswith("[result of"):
            (first, last), = READ_RANGE.findall(content)
            assert first == last
            seq = int(first)
        else:
            tag = TAG.match(content)
            assert tag, f"untraceable message: {content[:80]!r}"
            seq = int(tag.group(1))
        original = originals[seq]
        assert role == original.role
        if role == "assistant" and "[earlier I called" in content and not chat.get("tool_calls"):
            # A condensed tool cycle: the assistant's own words are kept, then one line.
            assert content.startswith(original.content.strip())
            (first, last), = READ_RANGE.findall(content[len(original.content.strip()):])
            condensed.update(range(int(first), int(last) + 1))
            continue
        assert seq not in shown, "a message is shown once"
        shown[seq] = {**chat, "content": content}
    return Traced(shown, condensed, omitted_note)


def check_invariants(request: Request, script: Script, budget: int, ratio: float,
                     summary: SummaryState | None = None) -> Traced:
    """What must hold of every request (see the issue's replay rules)."""
    history = script.messages
    through = summary.through_seq if summary else 0
    kept = kept_through_folds(script, summary)
    tail_seqs = [m.seq for m in history if m.seq > through or m.seq in kept]

    assert request.estimate <= budget
    assert my_estimate(request, ratio) == request.estimate
    assert request.messages[0] == {"role": "system", "content": PREFIX}
    traced = trace(request, script)

    # The tail after the preamble (and what it keeps of the folded part) starts on a user
    # message.
    assert next(c for c in tail_of(request) if seq_of(c) not in kept)["role"] == "user"
    # Order is preserved.
    order = list(traced.shown)
    assert order == sorted(order)

    originals = {m.seq: m for m in history}
    first_user = next(m.seq for m in history if m.role == "user")
    for seq, chat in traced.shown.items():
        original = originals[seq]
        if original.role in ("user", "assistant"):
            # Never rewritten; an older image only adds a one-line note. Only a message over its
            # share of the budget (or shortened as a last resort) is an excerpt, and then it
            # names the call that reads it whole.
            content = chat["content"]
            if "characters left out:" in content and content != original.content:
                assert request.shortened >= 1
                assert f'conversation_read("{CID}", {seq}, {seq}, offset=...)' in content
                if seq == first_user:
                    assert_key_lines_of(content, original.content)
                else:
                    assert content.startswith(original.content[:100])
                assert len(content) < len(original.content)
            elif original.attachments and content != original.content:
                assert content.startswith(original.content + "\n")
                note = content[len(original.content) + 1:]
                assert note.startswith("[image ") and "\n" not in note
            else:
                assert content == original.content
            if original.tool_calls:
                assert chat["tool_calls"] == [dict(c) for c in original.tool_calls]
        else:
            # A tool result never appears without its own call right before it (or before its
            # sibling results).
            call_seq = script.call_of[seq]
            assert call_seq in traced.shown and traced.shown[call_seq].get("tool_calls")
            between = [s for s in order if call_seq < s < seq]
            assert all(originals[s].role == "tool" and script.call_of.get(s) == call_seq
                       for s in between)

    # Everything in the tail is shown, condensed or counted as omitted.
    missing = [s for s in tail_seqs if s not in traced.shown and s not in traced.condensed]
    assert request.omitted == len(missing)
    assert traced.omitted_note == (len(missing) or None)

    # Protected messages are shown in full (tool output may be cut, but the message is there).
    protected = protected_seqs(script, summary)
    assert protected <= set(traced.shown)

    # Cheapest loss first: nothing is dropped while an unprotected tool cycle could still be
    # condensed, and protected tool output is cut only once nothing unprotected is left.
    if request.omitted:
        assert all(seq in protected for seq in traced.shown if originals[seq].tool_calls)
    if request.cut:
        assert set(traced.shown) <= protected
    return traced


def assert_key_lines_of(excerpt: str, original: str) -> None:
    """An excerpt of the first message: its opening, then a label, then lines (or "…" where
    some were left out) each found in the original, in the original's order."""
    lines = excerpt.split("\n")
    assert original.startswith(lines[0].removesuffix("…"))
    assert lines[1].startswith("[… ") and "characters left out: my first message" in lines[1]
    at = len(lines[0])
    flat = " ".join(original.split())
    for line in lines[2:]:
        if line == "…":
            continue
        line = line.strip()  # a message's own last space rides after the excerpt
        found = flat.find(line, at)
        assert found >= 0, f"not a line of the original, or out of order: {line[:60]!r}"
        at = found + len(line)


def kept_through_folds(script: Script, summary: SummaryState | None) -> set[int]:
    """What replay keeps of the folded part: the newest message with images, the newest tool
    call and its results."""
    through = summary.through_seq if summary else 0
    folded = [m for m in script.messages if m.seq <= through]
    kept = {m.seq for m in folded if m.attachments}
    kept = {max(kept)} if kept else set()
    calls = [m.seq for m in folded if m.tool_calls]
    if calls:
        kept.add(calls[-1])
        kept.update(s for s, c in script.call_of.items() if c == calls[-1])
    return kept


def seq_of(chat: Mapping[str, Any]) -> int | None:
    """The original a rendered message came from (None for roost's own notes)."""
    content = str(chat.get("content") or "")
    stub = READ_RANGE.search(content) if content.startswith("[result of") else None
    tag = TAG.match(content)
    return int(stub.group(1)) if stub else int(tag.group(1)) if tag else None


def protected_seqs(script: Script, summary: SummaryState | None = None) -> set[int]:
    """The issue's protected messages: the conversation's first user message, the last 6, the
    newest message with images, the newest tool call with its results (a call and its results
    count as one, since a result never goes without its call)."""
    through = summary.through_seq if summary else 0
    kept = kept_through_folds(script, summary)
    tail = [m for m in script.messages if m.seq > through or m.seq in kept]
    protected = {m.seq for m in tail[-6:]}
    first_user = next(m.seq for m in script.messages if m.role == "user")
    if first_user > through:
        protected.add(first_user)
    images = [m.seq for m in tail if m.attachments]
    if images:
        protected.add(images[-1])
    calls = [m.seq for m in tail if m.tool_calls]
    if calls:
        protected.add(calls[-1])
    for seq in list(protected):
        call_seq = script.call_of.get(seq, seq)
        protected.add(call_seq)
        protected.update(s for s, c in script.call_of.items() if c == call_seq)
    return protected


def protected_floor(script: Script, summary: SummaryState | None, ratio: float) -> int:
    """A generous lower bound of what the protected part needs once every tool result in it is
    cut to a short excerpt: the fixed part, protected text, tool calls and images in full."""
    fixed = build(script.messages, 10**9, summary=summary, ratio=ratio).parts
    need = fixed["prefix"] + fixed["summary"] + estimate_tokens(TAIL_NOTE, ratio)
    protected = protected_seqs(script, summary)
    for m in script.messages:
        if m.seq not in protected:
            continue
        if m.role == "tool":
            need += 4 + estimate_tokens("x" * 400, ratio)  # the excerpt and its label
            continue
        need += 4 + estimate_tokens(m.content, ratio)
        if m.tool_calls:
            calls = json.dumps([dict(c) for c in m.tool_calls], separators=(",", ":"))
            need += estimate_tokens(calls, ratio)
        need += sum(max(256, math.ceil(a["width"] * a["height"] / 1024))
                    for a in m.attachments)
    return need


# --- the preamble ---------------------------------------------------------------------------


def chat_script(exchanges: int, size: int = 60) -> Script:
    script = Script()
    for i in range(exchanges):
        script.exchange(f"question {i} " + filler(size, i), f"answer {i} " + filler(size, -i))
    return script


def test_without_a_summary_the_request_is_system_then_the_tail() -> None:
    script = chat_script(3)
    request = build(script.messages)
    assert request.messages[0] == {"role": "system", "content": PREFIX}
    rendered = [(c["role"], c["content"]) for c in request.messages[1:]]
    expected = [(m.role, m.content) for m in script.messages]
    expected[-1] = (expected[-1][0], expected[-1][1] + TAIL_NOTE)
    assert rendered == expected
    assert request.parts["summary"] == 0


def test_summary_preamble_then_acknowledgement_then_the_tail_after_the_fold() -> None:
    script = chat_script(10)  # seqs 1..20
    summary = SummaryState(summary="The user is planning a trip to Lisbon in May.",
                           user_notes="- my passport number ends in 4471",
                           through_seq=12, through_id="MSG000012", fold_count=1)
    request = build(script.messages, summary=summary)
    system, preamble, ack, *tail = request.messages
    assert system["role"] == "system"
    assert preamble["role"] == "user"
    text = str(preamble["content"])
    assert "12 earlier" in text or "12 messages" in text
    assert f'conversation_read("{CID}")' in text
    assert "The user is planning a trip to Lisbon in May." in text
    assert "- my passport number ends in 4471" in text
    assert ack["role"] == "assistant"
    assert "\n" not in str(ack["content"]).strip()
    assert [c["content"] for c in tail[:-1]] == [m.content for m in script.messages[12:-1]]
    assert tail[0]["role"] == "user"
    assert tail[-1]["content"] == script.messages[-1].content + TAIL_NOTE
    assert request.parts["summary"] > 0


def test_the_system_message_is_the_same_across_a_fold() -> None:
    script = chat_script(10)
    before = build(script.messages)
    after = build(script.messages, summary=SummaryState(summary="s", through_seq=12,
                                                        through_id="MSG000012"))
    assert after.messages[0] == before.messages[0]


# --- stubs ----------------------------------------------------------------------------------


def test_large_old_tool_results_become_stubs_naming_the_read_call() -> None:
    script = Script()
    script.user("look this up")
    script.tool_cycle(40_000, 2_000, 1_999)  # seqs 2 (call), 3, 4, 5
    script.assistant("found it")
    script.exchange()  # exchange 2
    script.exchange()  # exchange 3
    request = build(script.messages)
    traced = trace(request, script)
    big, edge, small = traced.shown[3], traced.shown[4], traced.shown[5]
    assert big["content"].startswith("[result of x:")
    assert f'conversation_read("{CID}", 3, 3)' in big["content"]
    assert "\n" not in big["content"] and len(big["content"]) < 200
    assert f'conversation_read("{CID}", 4, 4)' in edge["content"]  # 2,000 is "or more"
    assert small["content"] == script.messages[4].content  # 1,999 stays whole
    assert request.stubbed == 2


def test_results_within_the_last_two_exchanges_stay_whole_when_they_fit() -> None:
    script = Script()
    script.exchange()
    script.user("the exchange before last")
    script.tool_cycle(5_000)  # seqs 4, 5
    script.assistant()
    script.user("the last exchange")
    script.tool_cycle(9_000)  # seqs 8, 9
    request = build(script.messages)
    traced = check_invariants(request, script, 100_000, 1.0)
    assert traced.shown[5]["content"] == script.messages[4].content
    assert traced.shown[9]["content"] == script.messages[8].content
    assert request.stubbed == 0


def test_stub_bytes_repeat_across_calls_and_turns() -> None:
    script = Script()
    script.user("fetch it")
    script.tool_cycle(12_000)  # result seq 3
    script.assistant()
    script.exchange()
    script.exchange()
    first = trace(build(script.messages), script).shown[3]["content"]
    assert first.startswith("[result of")
    for _ in range(5):
        script.exchange("more", "sure")
        again = build(script.messages)
        assert trace(again, script).shown[3]["content"] == first
        assert build(script.messages).messages == again.messages


# --- images ---------------------------------------------------------------------------------


def test_only_the_newest_image_message_sends_pixels() -> None:
    older, newer = image(640, 480, "a.jpg"), image(800, 600, "b.jpg")
    script = Script()
    script.user("look at this", attachments=(older,))
    script.assistant()
    script.user("and this", attachments=(newer,))
    script.assistant()
    script.user("which one is nicer?")
    request = build(script.messages)
    assert list(request.images) == [3]  # system, user1, assistant1, user2 <- index 3
    assert request.images[3] == (newer,)
    assert request.messages[3]["content"] == script.messages[2].content
    old = str(request.messages[1]["content"])
    assert old.startswith(script.messages[0].content)
    note = old[len(script.messages[0].content):]
    assert "640x480" in note and note.strip() and "\n" not in note.strip()
    # The pixels count: 800*600/1024 -> 469 tokens.
    assert my_estimate(request, 1.0) == request.estimate
    pixels_left_out = Request(messages=request.messages, estimate=0, parts={})
    assert request.estimate - my_estimate(pixels_left_out, 1.0) == 469


def test_image_index_accounts_for_the_preamble_and_omissions() -> None:
    script = chat_script(12, size=400)
    photo = image(512, 512)
    script.user("what is in the picture?", attachments=(photo,))
    script.assistant("a cat")
    summary = SummaryState(summary="s", through_seq=4, through_id="MSG000004")
    request = build(script.messages, 1_600, summary=summary)
    check_invariants(request, script, 1_600, 1.0, summary)
    assert request.omitted > 0
    ((index, images),) = request.images.items()
    assert images == (photo,)
    assert str(request.messages[index]["content"]).startswith(f"<{len(script.messages) - 1}>")


# --- fitting --------------------------------------------------------------------------------


def test_a_case_that_fits_after_decay_drops_nothing() -> None:
    script = Script()
    for i in range(3):
        script.user(f"check source {i}")
        script.tool_cycle(1_900)  # under the stub size: sent whole unless over budget
        script.assistant(f"source {i} says yes")
    for _ in range(3):
        script.exchange()
    full = build(script.messages)
    assert full.decayed == full.omitted == full.condensed == 0
    budget = full.estimate - 500
    request = build(script.messages, budget)
    traced = check_invariants(request, script, budget, 1.0)
    assert request.decayed >= 1
    assert request.omitted == request.condensed == request.cut == 0
    assert set(traced.shown) == {m.seq for m in script.messages}


def test_drops_take_the_oldest_and_only_as_many_as_needed() -> None:
    script = chat_script(30, size=392)  # every message: 4 + ceil(~400/4) tokens
    budget = 3_000
    request = build(script.messages, budget)
    traced = check_invariants(request, script, budget, 1.0)
    assert request.decayed == request.condensed == request.cut == 0
    n = request.omitted
    assert n > 0
    # The first user message stays, then the note, then the newest messages in one run.
    tail = tail_of(request)
    assert tail[0]["content"] == script.messages[0].content
    assert tail[1]["content"] == f"[{n} earlier messages omitted to fit the context window]"
    assert sorted(traced.shown) == [1, *range(2 + n, len(script.messages) + 1)]
    # Keeping one more would not have fitted.
    newest_dropped = script.messages[n]  # seq n + 1
    assert request.estimate + 4 + estimate_tokens(newest_dropped.content) > budget


def test_old_tool_cycles_condense_before_anything_is_dropped() -> None:
    script = Script()
    for i in range(4):
        script.user(f"look up {i}")
        # Short results: too small to decay, so only condensing or dropping can help.
        script.tool_cycle(300, 300, 300, 300, 300, body=f"Checking {i}.")
        script.assistant(f"result {i}")
    for _ in range(3):
        script.exchange()
    script.user("last question")
    full = build(script.messages)
    budget = full.estimate - 600
    request = build(script.messages, budget)
    traced = check_invariants(request, script, budget, 1.0)
    assert request.condensed >= 1
    assert request.omitted == 0
    for m in script.messages:
        if m.role == "user":
            assert traced.shown[m.seq]["content"] == m.content


def test_tool_output_is_cut_last_and_user_text_survives() -> None:
    script = chat_script(8, size=100)
    script.user("read the whole log please")
    script.tool_cycle(40_000, name="read_log")
    budget = 2_500
    request = build(script.messages, budget)
    traced = check_invariants(request, script, budget, 1.0)
    assert request.cut >= 1
    result_seq = len(script.messages)
    content = traced.shown[result_seq]["content"]
    assert f'conversation_read("{CID}", {result_seq}, {result_seq})' in content
    assert len(content) < 40_000
    # Unprotected history went first: only protected messages remain.
    assert request.omitted == len(script.messages) - len(traced.shown)
    assert set(traced.shown) == {1, *range(result_seq - 5, result_seq + 1)}


def test_protected_messages_survive_a_tight_budget() -> None:
    photo = image(512, 512)
    script = Script()
    script.user("My name is Dana and I keep bees.")  # the conversation's first user message
    script.exchange()
    script.user("here is the hive", attachments=(photo,))
    script.assistant("nice hive")
    script.user("check the weather")
    script.tool_cycle(300, 300, name="weather")  # the newest tool call, old by now
    script.assistant("sunny")
    for i in range(12):
        script.exchange(f"chat {i} " + filler(300, i), "ok " + filler(300, i))
    budget = 2_200
    request = build(script.messages, budget)
    traced = check_invariants(request, script, budget, 1.0)
    assert request.omitted > 0
    assert traced.shown[1]["content"] == "<1> My name is Dana and I keep bees."
    assert 4 in traced.shown and list(request.images.values()) == [(photo,)]
    assert {7, 8, 9} <= set(traced.shown)  # the newest tool call with its results


def test_a_newest_message_larger_than_the_budget_goes_as_an_excerpt_with_a_pointer() -> None:
    script = chat_script(3)
    script.user("please translate: " + filler(8_000))  # ~2,000 tokens
    request = build(script.messages, 1_500)
    check_invariants(request, script, 1_500, 1.0)
    last = request.messages[-1]["content"]
    assert isinstance(last, str) and last.startswith(script.messages[-1].content[:40])
    seq = script.messages[-1].seq
    assert f'conversation_read("{CID}", {seq}, {seq}, offset=...)' in last


def test_a_newest_message_that_fits_alone_is_sent_whole_and_old_pastes_give_way() -> None:
    script = Script()
    script.user("first paste: " + filler(16_000, 1))  # ~4,000 tokens each
    script.assistant("got it")
    script.user("second paste: " + filler(16_000, 2))
    request = build(script.messages, 7_000)
    check_invariants(request, script, 7_000, 1.0)
    assert request.messages[-1]["content"] == script.messages[-1].content + TAIL_NOTE
    first = tail_of(request)[0]["content"]
    assert isinstance(first, str) and "characters left out:" in first


def test_a_model_without_tools_is_promised_no_conversation_read() -> None:
    script = Script()
    script.user("hello")
    script.assistant("hi")
    script.user("first paste: " + filler(16_000, 1))
    script.assistant("got it")
    script.user("second paste: " + filler(16_000, 2))
    summary = SummaryState(summary="A greeting.", through_seq=2,
                           through_id=script.messages[1].id)
    with_tools = build(script.messages, 7_000, summary=summary)
    without = build_request(conversation_id=CID, prefix=PREFIX, history=script.messages,
                            budget=7_000, summary=summary, tools=False)
    shown = json.dumps(without.messages)
    assert "A greeting." in shown and "characters left out:" in shown
    assert "conversation_read" not in shown
    assert "conversation_read" in json.dumps(with_tools.messages)


def test_does_not_fit_only_when_the_prefix_alone_is_too_large() -> None:
    script = chat_script(1)
    with pytest.raises(DoesNotFit) as raised:
        build(script.messages, estimate_tokens(PREFIX) // 2)
    assert raised.value.needed > raised.value.budget


def test_does_not_fit_only_when_the_protected_non_tool_text_is_too_large() -> None:
    script = Script()
    script.user("summarize this paper and check the 8 links in it:\n" + filler(25_500))
    script.tool_cycle(*[20_000] * 8, name="web_fetch")
    budget = 7_168  # window 8,192 less the reply reserve
    question, calling = script.messages[:2]
    calls = json.dumps([dict(c) for c in calling.tool_calls], separators=(",", ":"))
    non_tool = (4 + estimate_tokens(PREFIX) + 4 + estimate_tokens(question.content)
                + 4 + estimate_tokens(calling.content) + estimate_tokens(calls)
                + estimate_tokens(TAIL_NOTE))
    assert non_tool <= budget - 500  # the user's text and the calls fit with room to spare
    request = build(script.messages, budget)
    check_invariants(request, script, budget, 1.0)


def test_a_pinned_tool_call_with_long_arguments_and_an_error_result_gives_way() -> None:
    # The newest tool call is pinned; its arguments (5,000 characters the model wrote) were
    # never cut, so at a high ratio the protected set alone was over the budget, turn after
    # turn: "context window is too small" until /new.
    script = Script()
    script.exchange("hello", "hi " + filler(300))
    script.user("save this note for me")
    calling = script.add("assistant", "", tool_calls=(call("file_write", text=filler(5_000)),))
    script.add("tool", "Error: " + filler(12_000, 3), tool_name="file_write",
               meta={"error": True, "shown_chars": 4_000})
    script.assistant("Sorry, saving failed: " + filler(400, 4))
    for i in range(3):
        script.exchange(f"question {i} " + filler(200, i), "answer " + filler(500, i))
    script.user("and now?")
    budget = 5_353
    for ratio in (2.0, 3.0, 4.0):
        request = build(script.messages, budget, ratio=ratio)
        assert request.estimate <= budget
        assert my_estimate(request, ratio) == request.estimate
        assert request.messages[-1]["content"] == script.messages[-1].content + TAIL_NOTE
    # At the cap the call alone is about the whole budget: it became one line (naming how to
    # read it back), or went with the oldest protected messages.
    assert request.condensed >= 1
    assert not any(m.get("tool_calls") for m in request.messages)
    shown = json.dumps(request.messages)
    assert request.omitted or (
        f'conversation_read("{CID}", {calling.seq}, {calling.seq + 1})' in shown)


def test_a_protected_set_larger_than_the_budget_is_dropped_but_the_first_and_newest_kept(
) -> None:
    script = Script()
    script.user("the first question " + filler(1_500))
    for i in range(3):
        script.exchange(filler(1_500, i), filler(1_500, i + 10))
    script.user("the newest question")
    # At ratio 4 even each protected message's smallest excerpt adds up past this budget.
    budget = estimate_tokens(PREFIX, 4.0) + 900
    request = build(script.messages, budget, ratio=4.0)
    assert request.estimate <= budget
    assert request.messages[-1]["content"] == script.messages[-1].content + TAIL_NOTE
    assert request.omitted > 0
    # The conversation's first message is the last to go (issue 43): its excerpt, then the note.
    first, note = (str(m["content"]) for m in tail_of(request)[:2])
    assert first.startswith("<1> the first") and OMITTED.match(note)


def test_large_unprotected_history_does_not_raise() -> None:
    script = chat_script(40, size=1_000)  # ~10,000 tokens, mostly droppable
    request = build(script.messages, 2_500)
    check_invariants(request, script, 2_500, 1.0)
    assert request.omitted > 0


def test_the_request_is_deterministic() -> None:
    script = Script()
    script.user("start", attachments=(image(),))
    for i in range(6):
        script.user(f"q{i}")
        script.tool_cycle(3_000 + i, 900)
        script.assistant(f"a{i} " + filler(400, i))
    one = build(script.messages, 3_000, ratio=1.3)
    two = build(list(script.messages), 3_000, ratio=1.3)
    assert json.dumps(one.messages) == json.dumps(two.messages)
    assert one == two


def test_one_more_exchange_keeps_the_earlier_bytes() -> None:
    script = Script()
    script.user("hi")
    script.assistant("hello")
    script.user("fetch the page")
    script.tool_cycle(8_000)
    script.assistant("here it is")
    for i in range(3):
        script.exchange(f"q{i}", f"a{i}")
    previous = build(script.messages, 7_000)
    assert previous.decayed == previous.omitted == previous.cut == 0
    for i in range(10):
        script.exchange(f"more {i}", f"sure {i}")
        current = build(script.messages, 7_000)
        assert current.decayed == current.omitted == current.cut == 0
        shared = len(previous.messages) - 1
        assert current.messages[:shared] == previous.messages[:shared]
        # The message that carried the clock before is its plain self now.
        last = previous.messages[-1]
        assert current.messages[shared] == {**last,
                                            "content": str(last["content"])[: -len(TAIL_NOTE)]}
        previous = current


# --- the budget is never exceeded -----------------------------------------------------------


def random_script(rng: random.Random) -> Script:
    script = Script()
    for _ in range(rng.randint(3, 22)):
        attachments = (image(rng.choice([256, 640, 1024]), rng.choice([256, 480, 768])),) \
            if rng.random() < 0.1 else ()
        script.user(filler(rng.randint(5, 300), rng.randint(0, 99)), attachments=attachments)
        while rng.random() < 0.4:
            sizes = [rng.choice([60, 800, 1_900, 2_000, 5_000, 12_000, 40_000])
                     for _ in range(rng.randint(1, 3))]
            script.tool_cycle(*sizes, name=rng.choice(["x", "web_fetch", "memory_search"]),
                              body=rng.choice(["", "Let me look.", filler(120)]))
        script.assistant(filler(rng.randint(5, 500), rng.randint(0, 99)))
    if rng.random() < 0.3:
        script.user("one more thing")
    return script


def scenarios() -> Iterator[tuple[int, Script, int, float, SummaryState | None]]:
    for seed in range(100):
        rng = random.Random(seed)
        script = random_script(rng)
        budget = rng.choice([1_800, 2_500, 4_000, 7_168, 15_000])
        ratio = rng.choice([0.6, 1.0, 1.3, 2.2])
        summary = None
        users = [m.seq for m in script.messages if m.role == "user"][1:]
        if users and rng.random() < 0.4:
            through = rng.choice(users) - 1
            summary = SummaryState(summary=filler(600, seed), user_notes="- " + filler(200),
                                   through_seq=through, through_id=f"MSG{through:06d}")
        yield seed, script, budget, ratio, summary


def test_random_histories_never_exceed_the_budget_and_keep_the_rules() -> None:
    fitted = {"stubbed": 0, "decayed": 0, "condensed": 0, "omitted": 0, "cut": 0}
    ran = 0
    for seed, script, budget, ratio, summary in scenarios():
        if protected_floor(script, summary, ratio) > budget:
            continue  # the protected part alone may not fit: tested on its own below
        ran += 1
        try:
            request = build(script.messages, budget, summary=summary, ratio=ratio)
        except DoesNotFit as exc:  # pragma: no cover - a failure explains itself
            pytest.fail(f"seed {seed}: protected text fits, yet {exc}")
        try:
            check_invariants(request, script, budget, ratio, summary)
        except AssertionError as exc:  # pragma: no cover
            raise AssertionError(f"seed {seed}: {exc}") from exc
        again = build(script.messages, budget, summary=summary, ratio=ratio)
        assert again.messages == request.messages, f"seed {seed}: not deterministic"
        for key in fitted:
            fitted[key] += getattr(request, key)
    # The scenarios exercise every fitting step, so the checks above were not vacuous.
    print(f"{ran} scenarios, fitting steps taken: {fitted}")
    assert ran >= 90
    assert all(fitted.values()), fitted


def test_an_image_costs_its_pixels_over_1024_and_at_least_256_tokens() -> None:
    assert image_tokens({"width": 1024, "height": 768}) == 768
    assert image_tokens({"width": 1025, "height": 1024}) == 1025  # rounded up
    assert image_tokens({"width": 10, "height": 10}) == 256
    assert image_tokens({}) == 256  # unknown size: the floor


def test_an_old_long_message_is_excerpted_the_same_way_on_every_turn() -> None:
    script = Script()
    script.user("here is the article: " + filler(20_000, 3))  # ~5,000 tokens
    script.assistant("read it")
    requests = []
    for turn in range(3):
        script.exchange(f"question {turn}", f"answer {turn}")
        requests.append(build(script.messages, 7_000))
    firsts = [tail_of(r)[0]["content"] for r in requests]
    assert len(set(firsts)) == 1  # the same bytes: Ollama's cache keeps matching
    assert "characters left out:" in firsts[0] and all(r.shortened == 1 for r in requests)
    check_invariants(requests[-1], script, 7_000, 1.0)


def test_a_build_estimates_each_message_a_bounded_number_of_times() -> None:
    """Fitting keeps a running total: a long conversation that needs every fitting step costs
    a few estimates per message, not one per message per step (a quadratic build)."""
    for rounds in (20, 100):
        script = Script()
        for i in range(rounds):
            script.user(f"question {i} " + filler(300, i))
            script.tool_cycle(5_000, 3_000)
            script.assistant(f"answer {i} " + filler(1_500, -i))
        script.user("a paste: " + filler(40_000))
        calls = 0

        def counting(text: str, ratio: float) -> int:
            nonlocal calls
            calls += 1
            return estimate_tokens(text, ratio)

        request = build_request(conversation_id=CID, prefix=PREFIX, history=script.messages,
                                budget=2_500, tail_note=TAIL_NOTE, estimate=counting)
        assert request.condensed and request.omitted and request.cut and request.shortened
        assert request.messages == build(script.messages, 2_500).messages
        # About 7 per message here; rescanning at each step made it 180 at 20 rounds, 580 at 100.
        assert calls <= 10 * len(script.messages), (rounds, calls)


# --- the opening (the channel's note) ---------------------------------------------------------

BERLIN = ZoneInfo("Europe/Berlin")
NOTE = "<channel>\nThe user reads you in Telegram.\n</channel>"


def build_opened(history: Sequence[Message], budget: int = 100_000,
                 summary: SummaryState | None = None) -> Request:
    return build_request(conversation_id=CID, prefix=PREFIX, history=history, budget=budget,
                         summary=summary, opening=NOTE, tz=BERLIN, tail_note=TAIL_NOTE)


def test_the_opening_rides_on_the_first_user_message_the_same_on_every_turn() -> None:
    script = Script()
    script.exchange("hi")
    first = build_opened(script.messages[:1]).messages
    for _ in range(4):
        script.exchange()
    later = build_opened(script.messages).messages
    assert first[0] == later[0] == {"role": "system", "content": PREFIX}
    # The previous turn's last message carried the tail note; without it, the bytes repeat.
    assert str(first[1]["content"]).removesuffix(TAIL_NOTE) == later[1]["content"]
    assert NOTE in str(later[1]["content"])
    assert str(later[1]["content"]).startswith("<1> hi\n\n" + NOTE + "\n\n[sent ")
    assert sum(NOTE in str(m["content"]) for m in later) == 1


def test_after_a_fold_the_opening_rides_on_the_summary() -> None:
    script = Script()
    for _ in range(6):
        script.exchange()
    summary = SummaryState(summary="what happened", through_seq=6, through_id="MSG000006")
    messages = build_opened(script.messages, summary=summary).messages
    assert str(messages[1]["content"]).endswith(NOTE)
    assert sum(NOTE in str(m["content"]) for m in messages) == 1


def test_the_opening_is_kept_whole_and_counted_when_the_first_message_is_excerpted() -> None:
    script = Script()
    script.user(filler(40_000))
    script.assistant()
    for _ in range(4):
        script.exchange()
    request = build_opened(script.messages, budget=4_000)
    assert request.shortened and NOTE in str(request.messages[1]["content"])
    assert request.estimate <= 4_000


# --- what the user said first ---------------------------------------------------------------


def test_the_first_user_message_stays_word_for_word_in_every_request_after_folds() -> None:
    first = "My name is Dana, my cat is Pickle, I live in Lisbon."
    script = Script()
    script.add("user", first)
    script.assistant("Nice to meet you, Dana.")
    for i in range(20):
        script.exchange(f"Tell me a short joke, number {i}.", "A joke.")
    for through in (12, 30):
        summary = SummaryState(summary="Jokes were told.", user_notes="- Tell me a joke.",
                               through_seq=through, through_id=f"MSG{through:06d}",
                               fold_count=through // 12)
        request = build(script.messages, summary=summary)
        sent = "\n".join(str(m["content"]) for m in request.messages)
        assert f"<1> {first}" in sent
    # Before the preamble's changing part, so that a fold keeps the prompt cache up to there.
    assert str(request.messages[1]["content"]).index(first) < str(
        request.messages[1]["content"]).index("<summary>")


def bank_export_message() -> str:
    """Issue 43's first message: a locker code, then a bank export of 60 rows, then a question
    (2,300 characters, mostly digits)."""
    shops = ("Grocery store", "Rent", "Pharmacy", "Train ticket", "Coffee")
    rows = [f"2026-02-{i % 28 + 1:02d};TX-{48213 + i * 37};{shops[i % 5]};-{(i * 53) % 900}.{i:02d}"
            for i in range(60)]
    return ("My locker code is 7316. Below is my bank export for February, keep it handy.\n"
            + "\n".join(rows) + "\nPlease tell me later which line is the biggest expense.")


def folded_bank_export(tools: bool = True, ratio: float = 1.0) -> Request:
    script = Script()
    script.add("user", bank_export_message())
    script.assistant("Noted your locker code and the export.")
    script.exchange("What is a good name for a cat?", "Try Miso, Pip or Nori.")
    script.exchange("What was the first transaction id in my export?")
    summary = SummaryState(summary="A locker code and a bank export; cat names.",
                           user_notes="- What is a good name for a cat?", through_seq=4,
                           through_id="MSG000004", fold_count=1)
    return build_request(conversation_id=CID, prefix=PREFIX, history=script.messages,
                         budget=1_536, ratio=ratio, summary=summary, tail_note=TAIL_NOTE,
                         tools=tools)


@pytest.mark.parametrize("ratio", [1.0, 2.0])
def test_a_first_message_too_long_to_carry_whole_is_called_an_excerpt_and_keeps_its_ids(
        ratio: float) -> None:
    # Issue 43: "word for word:" then its first 50 characters; the code survived, the export's
    # first id, asked about later, was in no request after the fold.
    preamble = str(folded_bank_export(ratio=ratio).messages[1]["content"])
    heading, kept = preamble.split("<first_message>\n")[0], preamble.split(
        "<first_message>\n")[1].split("\n</first_message>")[0]
    assert "word for word" not in heading and "too long to repeat whole" in heading
    assert f'conversation_read("{CID}", 1, 1, offset=...)' in heading
    assert "my locker code is 7316" in kept.lower() and "TX-48213" in kept
    assert estimate_tokens(kept, ratio) <= 1_536 // 8
    # Every kept line is the user's own, in their order; the same bytes on every request.
    assert_key_lines_of(kept.removeprefix("<1> "), bank_export_message())
    assert folded_bank_export(ratio=ratio).messages[1]["content"] == preamble


def test_a_model_without_tools_is_told_the_first_message_is_an_excerpt_but_promised_no_read(
) -> None:
    preamble = str(folded_bank_export(tools=False).messages[1]["content"])
    assert "too long to repeat whole" in preamble and "word for word" not in preamble
    assert "conversation_read" not in preamble and "TX-48213" in preamble


def test_before_the_fold_lands_the_first_message_is_the_last_to_leave() -> None:
    # Issue 43: at 2,048 tokens, requests 3 and 4 replayed "[1 earlier messages omitted]"
    # where the first message was, before the fold landed.
    script = Script()
    script.add("user", bank_export_message())
    script.assistant("Noted your locker code and the export. I will keep them handy.")
    script.exchange("What is a good name for a cat? I like short names.",
                    "Try Miso, Pip or Nori: all short and friendly.")
    script.user("What was the first transaction id in my export?")
    prefix = "You are roost. " + "Be helpful and brief. " * 50
    # A ratio of 3 (the calibration's misfire) leaves little room: the protected set is over.
    request = build_request(conversation_id=CID, prefix=prefix, history=script.messages,
                            budget=1_200, ratio=3.0)
    assert request.estimate <= 1_200
    first = str(request.messages[1]["content"])
    assert first.startswith("<1> My locker code is 7316.")
    assert_key_lines_of(first.removeprefix("<1> "), bank_export_message())


def test_the_first_message_goes_only_once_every_other_older_message_is_gone() -> None:
    script = Script()
    script.add("user", bank_export_message())
    for i in range(3):
        script.exchange(f"question {i} " + filler(400, i), f"answer {i} " + filler(400, -i))
    script.user("the newest question")
    for budget in range(estimate_tokens(PREFIX, 1.0) + 40, 1_600, 20):
        try:
            request = build(script.messages, budget)
        except DoesNotFit:
            continue
        shown = {seq_of(m) for m in request.messages[1:]}
        if 1 not in shown:  # then only the newest message is left
            assert shown - {None} == {script.messages[-1].seq}, budget
        elif request.omitted:  # and while it is there, it is first, the note after it
            assert OMITTED.match(str(request.messages[2]["content"])), budget


def test_a_long_first_message_is_kept_as_its_start_and_end_within_an_eighth_of_the_budget(
) -> None:
    script = Script()
    paste = "Keep this: my locker code is 4921. " + filler(20_000) + " Signed, Dana."
    script.add("user", paste)
    script.assistant("Read it.")
    for _ in range(8):
        script.exchange()
    summary = SummaryState(summary="s", through_seq=10, through_id="MSG000010")
    request = build(script.messages, budget=8_000, summary=summary)
    preamble = str(request.messages[1]["content"])
    assert "my locker code is 4921" in preamble and "Signed, Dana." in preamble
    assert estimate_tokens(preamble, 1.0) < 8_000 // 8 + 200


# --- what a fold never takes away -----------------------------------------------------------


def test_after_a_fold_the_newest_image_and_tool_call_with_its_result_stay_verbatim() -> None:
    script = Script()
    script.user("what is on this label?", attachments=(image(800, 600),))
    script.assistant("It says 'basil'.")
    script.user("look up how to grow it")
    calling = script.tool_cycle(900, name="web_search")
    script.assistant("Water it daily.")
    for _ in range(10):
        script.exchange()
    through = len(script.messages) - 6
    summary = SummaryState(summary="Basil.", through_seq=through,
                           through_id=f"MSG{through:06d}", fold_count=1)
    request = build(script.messages, summary=summary)
    sent = [m for m in request.messages]
    photo = next(i for i, m in enumerate(sent) if m["content"] == script.messages[0].content)
    assert request.images[photo][0]["width"] == 800
    call_at = next(i for i, m in enumerate(sent) if m.get("tool_calls"))
    assert sent[call_at]["content"] == calling.content
    assert sent[call_at]["tool_calls"] == [dict(c) for c in calling.tool_calls]
    result = script.messages[calling.seq]
    assert sent[call_at + 1] == {"role": "tool", "content": result.content,
                                 "tool_name": "web_search"}
    # Right after the summary, in their order, before the verbatim tail.
    assert 2 < photo < call_at < len(sent) - 6


def test_a_newer_tool_call_in_the_tail_keeps_the_folded_one_unprotected() -> None:
    script = Script()
    script.user("first")
    script.tool_cycle(900, name="old_tool")
    script.assistant("done")
    for _ in range(6):
        script.exchange("a question " + filler(800), "an answer " + filler(800))
    script.user("again")
    script.tool_cycle(300, name="new_tool")
    script.assistant("done again")
    script.exchange()
    summary = SummaryState(summary="s", through_seq=4, through_id="MSG000004", fold_count=1)
    roomy = build(script.messages, summary=summary)
    assert any("old_tool" in json.dumps(m.get("tool_calls")) for m in roomy.messages)
    tight = build(script.messages, budget=roomy.estimate - 200, summary=summary)
    names = [c["function"]["name"] for m in tight.messages for c in m.get("tool_calls") or ()]
    assert "new_tool" in names and "old_tool" not in names


def test_a_failed_tool_result_decays_three_times_slower_than_a_successful_one() -> None:
    script = Script()
    script.user("check both")
    calling = script.add("assistant", "Checking.", tool_calls=(call("b"), call("a")))
    # The failed one first: decay goes oldest first, so at the same age it would go first.
    failed = script.add("tool", "ERROR: " + filler(1_500, 4), tool_name="b",
                        meta={"error": True})
    ok = script.add("tool", filler(1_500, 3), tool_name="a")
    script.call_of.update({ok.seq: calling.seq, failed.seq: calling.seq})
    script.assistant("One of them failed.")
    script.exchange()
    script.user("and this one")
    script.tool_cycle(100)  # the newest call, which is protected
    script.assistant("done")
    roomy = build(script.messages)
    tight = build(script.messages, budget=roomy.estimate - 150)
    contents = {seq_of(m): str(m["content"]) for m in tight.messages}
    assert tight.decayed >= 1 and "characters left out:" in contents[ok.seq]
    assert contents[failed.seq] == failed.content


def test_the_time_is_stamped_when_it_may_have_moved_and_never_changes_later() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    start = 1_764_700_200.0  # a quarter hour's first second
    said = [Message(id=f"M{seq}", seq=seq, role=role, content=text, created=start + at)
            for seq, role, text, at in ((1, "user", "hi", 0), (2, "assistant", "hello", 5),
                                        (3, "user", "and?", 120),  # the same quarter hour
                                        (4, "assistant", "yes", 125),
                                        (5, "user", "later", 3_600))]
    first = build_request(conversation_id="c", prefix="P", history=said[:4], budget=4_000,
                          tz=berlin)
    then = build_request(conversation_id="c", prefix="P", history=said, budget=4_000, tz=berlin)
    contents = [str(m["content"]) for m in then.messages[1:]]
    assert contents[0] == "hi\n\n[sent Tue 2 Dec 2025 19:30]"
    assert contents[2] == "and?"  # two minutes later: the stamp above still holds
    assert contents[4] == "later\n\n[sent Tue 2 Dec 2025 20:30]"
    # What was sent before is sent again byte for byte: the prompt cache keeps matching.
    assert [m["content"] for m in first.messages] == [m["content"] for m in then.messages[:5]]


# --- text a token a character or more ----------------------------------------------------------


@pytest.mark.parametrize("kind", ["chinese, small vocabulary", "digits"])
def test_dense_pastes_are_excerpted_to_their_share_not_four_characters_a_token(
    kind: str,
) -> None:
    # SmolLM2 spells Chinese out at 1.75 tokens a character, any tokenizer a digit a token:
    # an excerpt sized at 4 characters a token was several times its share, and the two
    # protected pastes alone did not fit (DoesNotFit: the turn was refused).
    vocabulary = vocabulary_of(49_152)
    paste = ("人工智能正在改变我们的生活方式。" * 200 if kind.startswith("chinese")
             else "2026-12-01 14:01,36019,4793.11\n" * 100)
    script = Script()
    script.user(paste)
    script.assistant("Read it.")
    script.user(paste)
    script.assistant("Read that one too.")
    script.user("thanks")
    request = build_request(conversation_id=CID, prefix=PREFIX, history=script.messages,
                            budget=700, tail_note=TAIL_NOTE, estimate=vocabulary.estimate)
    assert request.estimate <= 700
    pastes = [m["content"] for m in request.messages if paste[:10] in str(m["content"])]
    assert len(pastes) == 2 and all("characters left out:" in p for p in pastes)
