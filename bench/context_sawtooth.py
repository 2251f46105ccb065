"""Prompt tokens, overflow and prefix reuse over a 500-turn conversation at an 8,192 window.

    python bench/context_sawtooth.py [--turns 500] [--seed 7] [--out bench/out/context_sawtooth.png]
    python bench/context_sawtooth.py --profile long [--turns 300]   (see bench/long_messages.py)

One scripted conversation (`bench/scenario.py`: short chat, 2-6 KB answers, and turns on which
the model fetches a 10-40 KB web page) is played against the loopback fake Ollama three ways:

1. roost: the real engine (store, model client, turn, tool loop, background fold) over HTTP. The
   bench puts a core capability `web` with a scripted `web_fetch(url)` tool in place of the
   built-in one (`engine.parts.registry.replace(...)`). On a tool turn the scripted model
   answers the first call with a structured `web_fetch` call; the tool loop runs it through the
   registry, saves the call and the page as messages, and calls the model again with the result
   (capped in memory at a sixth of the budget), which the model answers. The in-turn compaction's
   state request and the fold prompts get scripted answers too. Each turn waits for its
   background fold, so the run is deterministic.
2. full replay: every model call sends roost's system message and tool schemas, then the whole
   stored history up to that call verbatim (a tool turn makes two calls: up to the user message,
   and up to the tool result).
3. full replay left to Ollama: the same requests, counted as Ollama evaluates them after its
   silent cut of the oldest messages (the fake's `prompt_eval_count`).

Every request Ollama sees from a turn counts (a tool turn makes two or more): peak and mean
prompt tokens, requests over the budget and requests Ollama cuts are over all of them; the chart
draws each turn's first request. Tokens are the fake's (`FakeOllama.count_tokens`).

Prefix reuse. Both requests are serialised as a chat template lays them out (the tool schemas as
one part ahead of the system message, where templates render them; then role, content and tool
calls of each message in order); the common prefix is found character by character, and whole
shared messages count their tokens while the first differing one counts in proportion to its
shared characters. Two figures:

* against the previous request followed by the reply the model generated for it (the assistant
  message as the fake serialises it: the text, or the tool call). This is what Ollama's prompt
  cache holds after a call, and so what the next request can actually reuse: the reply's tokens
  were evaluated once and need not be again. The reuse target is checked against this figure.
* against the previous request only: the issue's words taken literally. It counts the previous
  reply as new text on every turn although the cache holds it, so it understates what is reused
  by about one reply per request; it is printed for comparison.

Reuse is reported over all requests of the turns without a fold (a turn is "with a fold" when a
fold was written since the previous turn's last request), and separately for the turns' first
requests and the follow-up requests inside turns (after a tool result, the compaction's state
request and the call after it). A breakdown says where each request stops repeating what the
cache holds, with the worst example of each place, and the "append-only ceiling" says what reuse
would be if every request only appended to the previous one and its reply.

Targets for roost: 0 requests over budget, 0 cut by Ollama, at most one summary call per fold,
mean prefix reuse (against the previous request and its reply) on turns without a fold >= 0.9.
A chart of prompt tokens per turn is written with Pillow.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests` is not installed

import aiohttp
from PIL import Image, ImageDraw, ImageFont

from bench import long_messages
from bench.scenario import ScriptedModel, Turn, is_fold, is_state_request, script, web_capability
from daemon.app.assembly import assemble
from daemon.app.metrics import common_prefix
from daemon.context.compact import STATE_REQUEST
from daemon.core.config import Settings
from daemon.core.conversations import Message
from daemon.core.messages import Inbound
from daemon.engine.workers import Engine
from daemon.llm.client import ModelClient
from daemon.store import Store
from tests.conftest import RecordingChannel
from tests.fakes.ollama import FakeModel, FakeOllama, Reply

ROOT = Path(__file__).resolve().parents[1]
WINDOW = 8192
RESPONSE_RESERVE = 1024
BUDGET = WINDOW - RESPONSE_RESERVE
CONTEXT_LENGTH = 32768
MODEL = "qwen3:4b"
CHAT = "console:local"
START = datetime(2025, 3, 3, 8, 0, tzinfo=UTC).timestamp()  # 500 turns end the same day
TURN_GAP = 60.0  # seconds between turns: far from the 3 h idle rotation
REUSE_TARGET = 0.9

ChatMessage = dict[str, Any]
Body = dict[str, Any]  # an /api/chat request body


# ---- measuring requests ------------------------------------------------------------------------


def serialise(message: ChatMessage) -> str:
    """One message as a chat template lays it out: role (and a tool result's tool name),
    content, then any tool calls."""
    role = message.get("role")
    if message.get("tool_name"):
        role = f"{role} {message['tool_name']}"
    text = f"<|{role}|>\n{message.get('content') or ''}"
    if message.get("tool_calls"):
        text += "\n" + json.dumps(message["tool_calls"], separators=(",", ":"), sort_keys=True)
    return text + "<|end|>\n"


def template_parts(fake: FakeOllama, body: Body) -> list[ChatMessage]:
    """A request in the order the chat template renders it: the tool schemas (in the system
    block, as one part that knows its own token count), then the messages."""
    tools = body.get("tools")
    if not tools:
        return list(body["messages"])
    schemas = {"role": "tools", "content": json.dumps(tools, sort_keys=True),
               "tokens": fake.count_tokens([], tools)}
    return [schemas, *body["messages"]]


def generated(reply: Reply) -> ChatMessage:
    """The assistant message the model generated, as the fake serialises it: its text, and its
    tool calls when it made any."""
    message: ChatMessage = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    return message


def part_tokens(fake: FakeOllama) -> Callable[[ChatMessage], int]:
    """The fake's token count of one part of `template_parts`."""
    return lambda part: part["tokens"] if "tokens" in part else fake.count_tokens([part])


@dataclass(frozen=True)
class Break:
    """Where a request stops repeating what came before it."""

    index: int  # first part that differs (== len(parts) when all are shared)
    shared_tokens: float
    total_tokens: int

    @property
    def reuse(self) -> float:
        return self.shared_tokens / self.total_tokens if self.total_tokens else 0.0


def prefix_break(
    before: Sequence[ChatMessage], current: Sequence[ChatMessage],
    tokens: Callable[[ChatMessage], int],
) -> Break:
    """The tokens of `current` that repeat the leading tokens of `before`."""
    shared = 0.0
    total = sum(tokens(m) for m in current)
    for index, message in enumerate(current):
        if index >= len(before):
            return Break(index, shared, total)
        old = before[index]
        if old is message or serialise(old) == serialise(message):
            shared += tokens(message)
            continue
        mine = serialise(message)
        shared += tokens(message) * common_prefix(serialise(old), mine) / len(mine)
        return Break(index, shared, total)
    return Break(len(current), shared, total)


def trailing_new(parts: Sequence[ChatMessage]) -> int:
    """How many parts at the end of a request follow its last assistant message: what is new
    even in a request that only appended to the previous one and its reply."""
    count = 0
    for part in reversed(parts):
        if part.get("role") == "assistant":
            break
        count += 1
    return count


@dataclass(frozen=True)
class Measured:
    """One request's reuse against what came before it."""

    turn: int
    position: int  # 0: the turn's first request
    state: bool  # the in-turn compaction's state request
    fold: bool  # a fold was written since the previous turn
    cached: Break  # against the previous request followed by its generated reply
    literal: Break  # against the previous request only
    ceiling_cached: float  # what `cached` would be had the request only appended
    ceiling_literal: float
    cause: str = ""
    example: str = ""


def measure(
    tokens: Callable[[ChatMessage], int], previous: Sequence[ChatMessage],
    reply: ChatMessage | None, current: Sequence[ChatMessage], *, turn: int, position: int,
    fold: bool, state: bool = False, explain: bool = False,
) -> Measured:
    cached_parts = [*previous, reply] if reply is not None else list(previous)
    cached = prefix_break(cached_parts, current, tokens)
    literal = prefix_break(previous, current, tokens)
    total = cached.total_tokens
    new = trailing_new(current)
    fresh = sum(tokens(p) for p in current[len(current) - new:])
    answer = tokens(current[-new - 1]) if new < len(current) else 0
    cause = example = ""
    if explain:
        cause = classify(cached_parts, current, cached.index, len(previous))
        if cached.index < min(len(cached_parts), len(current)):
            example = (f"turn {turn}, request {position + 1}, part {cached.index}: "
                       + difference(cached_parts[cached.index], current[cached.index]))
    return Measured(turn, position, state, fold, cached, literal,
                    (total - fresh) / total if total else 0.0,
                    (total - fresh - answer) / total if total else 0.0, cause, example)


def _roles(parts: Sequence[ChatMessage]) -> str:
    names = {"user": "user message", "tool": "tool result", "assistant": "assistant message"}
    return " + ".join(names.get(str(p.get("role")), str(p.get("role"))) for p in parts)


LOOP_EXCERPT = "reads it in pages"  # daemon/turn/tool_loop.py: a tool result capped in memory
COMPACTED = "left out of this in-memory copy"  # daemon/context/compact.py
REPLAY_CUT = "cut to fit the context window"  # daemon/context/replay.py: _cut
DECAYED = "of an old tool result left out"  # replay: _decay
STUB = "not repeated here"  # replay: stub_text


def classify(cached: Sequence[ChatMessage], current: Sequence[ChatMessage], at: int,
             previous_len: int) -> str:
    """Why `current` stops repeating `cached` (the previous request and its reply) at `at`."""
    if at >= len(current):
        return "repeated whole"
    if at >= len(cached):
        return f"appended only (the loss is the new {_roles(current[at:])})"
    if at == previous_len:
        return "the previous reply, as sent back, differs from the reply as generated"
    before, now = cached[at], current[at]
    text, old = str(now.get("content") or ""), str(before.get("content") or "")
    both = text + old
    where = " (the previous request's last message)" if at == previous_len - 1 else ""
    if STATE_REQUEST in old:
        return "compaction: the state request gave way to the continuation note"
    if now.get("role") in ("system", "tools") or before.get("role") in ("system", "tools"):
        if before.get("role") != now.get("role"):
            return ("tool schemas sent on one request and not the other (they render ahead "
                    "of the system message)")
        return "system message or tool schemas changed"
    if "earlier messages omitted" in both:
        return "dropped messages: the omitted-note came or went"
    if before.get("role") != now.get("role"):
        return "a different message at the same place" + where
    if COMPACTED in both:
        return f"{now.get('role')} message shrunk by the in-turn compaction" + where
    if now.get("role") == "tool":
        if STUB in text:
            return "tool result became a stub" + where
        if LOOP_EXCERPT in old and LOOP_EXCERPT not in text:
            return ("tool result: the turn's in-memory excerpt, then the stored page replayed"
                    + where)
        if REPLAY_CUT in both:
            return "tool result cut to fit, differently" + where
        if DECAYED in both:
            return "tool result decayed differently" + where
        return "tool result changed" + where
    if "[earlier I called" in both:
        return "tool cycle condensed" + where
    if "[Earlier in this conversation" in both:
        return "summary preamble changed"
    return f"{now.get('role')} message changed" + where


def difference(before: ChatMessage, now: ChatMessage) -> str:
    """Where two parts first differ, with a little text on either side."""
    a, b = serialise(before), serialise(now)
    at = common_prefix(a, b)

    def around(text: str) -> str:
        piece = text[max(0, at - 30): at + 50]
        return json.dumps(piece, ensure_ascii=False)

    role = before.get("role") if before.get("role") == now.get("role") else (
        f"{before.get('role')} -> {now.get('role')}")
    return (f"{role}, {len(a):,} -> {len(b):,} characters serialised, first difference at "
            f"character {at:,}: before {around(a)}, now {around(b)}")


# ---- strategy 1: roost -------------------------------------------------------------------------


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Sent:
    """One request of a turn as Ollama received it, and what the model generated for it."""

    body: Body
    reply: Reply | None  # None: Ollama refused the request (an overflow)
    tokens: int  # the fake's count, tool schemas included


@dataclass
class RoostTurn:
    requests: list[Sent]  # every request of the turn, in order (fold prompts not included)
    folds_before: int  # folds written before the turn's first request
    user_seq: int  # the turn's user message in the store
    tool: bool  # the model fetched a page on this turn
    accounting: dict[str, Any]  # roost's own numbers for the first request (its debug/ snapshot)


@dataclass
class RoostRun:
    turns: list[RoostTurn]
    history: list[Message]
    folds: int
    fold_calls: int
    folder_calls: int
    state_calls: int
    fold_prompt_peak: int
    cuts: int  # all requests, fold prompts included
    overflows: int
    seconds: dict[str, float]  # where the roost run spent its time


def bench_settings(state_dir: Path, host: str) -> Settings:
    base = Settings.defaults(env={"STATE_DIRECTORY": str(state_dir)})
    return dataclasses.replace(
        base,
        daemon=dataclasses.replace(base.daemon, timezone="UTC"),
        model=dataclasses.replace(base.model, host=host, name=MODEL, window=WINDOW,
                                  response_reserve=RESPONSE_RESERVE, retry_attempts=2,
                                  retry_backoff=0.05),
    )


def latest_snapshot(state_dir: Path) -> dict[str, Any]:
    """roost's record of the turn it just ran (estimate, ratio, budget, what fitting did)."""
    newest = max((state_dir / "debug").glob("*.json"), default=None)
    if newest is None:
        return {}
    doc = json.loads(newest.read_text("utf-8"))
    return {k: doc.get(k) for k in ("estimate", "ratio", "budget", "fit", "model_calls")}


async def settle_folds(engine: Engine, conversation_id: str) -> None:
    """Wait for the background fold, and for any follow-up fold it schedules (a backlog is
    folded a batch at a time), so the next turn never races a fold."""
    while True:
        await engine.parts.folder.wait(conversation_id)
        await asyncio.sleep(0)  # a follow-up is scheduled with call_soon
        if not engine.parts.folder.busy(conversation_id):
            return


def pair_replies(fake: FakeOllama, bodies: Sequence[Body],
                 answered: Sequence[tuple[Body, Reply]]) -> list[Sent]:
    """The turn's requests with the replies the model generated; a request Ollama refused got
    none (the scripted model answers in arrival order, refused requests never reach it)."""
    queue = deque(answered)
    sent = []
    for body in bodies:
        reply = None
        if queue and queue[0][0]["messages"] == body["messages"]:
            reply = queue.popleft()[1]
        sent.append(Sent(body, reply, fake.count_tokens(body["messages"], body.get("tools"))))
    return sent


async def run_roost(fake: FakeOllama, turns: Sequence[Turn], state_dir: Path) -> RoostRun:
    settings = bench_settings(state_dir, fake.url)
    clock = Clock(START)
    store = Store.open(state_dir)
    llm = ModelClient(settings.model)
    engine = assemble(settings, store, llm, {"console": RecordingChannel()}, clock=clock).engine
    # The scripted pages stand in for the built-in `web` capability (a real fetch would leave
    # loopback); registering it anew fails since web became built in.
    engine.parts.registry.replace(web_capability(turns))
    model = ScriptedModel(WINDOW)
    fake.default_reply = model
    cuts, overflows = fake.cuts, fake.overflows
    seconds: defaultdict[str, float] = defaultdict(float)
    records: list[RoostTurn] = []
    fold_prompt_peak = 0
    conversation_id = ""
    await engine.start()
    try:
        for turn in turns:
            clock.now += TURN_GAP
            conversation = store.active_conversation(CHAT)
            folds_before = conversation.summary.fold_count if conversation else 0
            first = len(fake.requests)
            model.turn = turn
            model.answered.clear()
            inbound = Inbound(chat_key=CHAT, text=turn.user, received=clock.now)

            started = time.perf_counter()
            assert await engine.submit(inbound)
            await asyncio.wait_for(engine.wait_idle(CHAT), 120)
            seconds["turns"] += time.perf_counter() - started

            started = time.perf_counter()
            conversation = store.active_conversation(CHAT)
            assert conversation is not None
            if conversation_id and conversation.id != conversation_id:
                raise RuntimeError("the conversation rotated; the comparison needs one")
            conversation_id = conversation.id
            await settle_folds(engine, conversation_id)
            seconds["background folds"] += time.perf_counter() - started

            bodies = [r.body for r in fake.requests[first:]
                      if r.path == "/api/chat" and r.body is not None and r.body.get("messages")]
            for body in bodies:
                if is_fold(body["messages"]):
                    fold_prompt_peak = max(fold_prompt_peak, fake.count_tokens(body["messages"]))
            answered = [(b, r) for b, r in model.answered if not is_fold(b["messages"])]
            user_seq = next(m.seq for m in reversed(store.messages(conversation_id))
                            if m.meta.get("inbox_id") == inbound.id)
            records.append(RoostTurn(
                requests=pair_replies(fake, [b for b in bodies if not is_fold(b["messages"])],
                                      answered),
                folds_before=folds_before, user_seq=user_seq, tool=turn.tool is not None,
                accounting=latest_snapshot(state_dir),
            ))
            del fake.requests[first:]  # measured; keep memory flat
        conversation = store.active_conversation(CHAT)
        assert conversation is not None
        return RoostRun(turns=records, history=store.messages(conversation_id),
                        folds=conversation.summary.fold_count, fold_calls=model.fold_calls,
                        folder_calls=engine.parts.folder.calls, state_calls=model.state_calls,
                        fold_prompt_peak=fold_prompt_peak, cuts=fake.cuts - cuts,
                        overflows=fake.overflows - overflows, seconds=seconds)
    finally:
        await engine.stop(grace=0)
        await llm.close()
        store.close()


# ---- strategies 2 and 3: full replay -----------------------------------------------------------


def as_chat(message: Message) -> ChatMessage:
    chat: ChatMessage = {"role": message.role, "content": message.content}
    if message.tool_calls:
        chat["tool_calls"] = [dict(c) for c in message.tool_calls]
    if message.tool_name:
        chat["tool_name"] = message.tool_name
    return chat


def ollama_cut(parts: list[ChatMessage], sizes: list[int], num_ctx: int) -> list[ChatMessage]:
    """What Ollama keeps of a too-long prompt: it drops the oldest messages that are not system
    messages (never the last) until the prompt fits. The fake's rule, to know *which* remain."""
    total = sum(sizes)
    keep = [True] * len(parts)
    for index, part in enumerate(parts[:-1]):
        if total <= num_ctx:
            break
        if part.get("role") not in ("system", "tools"):
            keep[index] = False
            total -= sizes[index]
    return [m for m, k in zip(parts, keep, strict=True) if k]


def call_points(roost: RoostRun) -> list[list[int]]:
    """Per turn, how many stored messages each of its model calls sees in a full replay: up to
    the user message, then up to the end of each tool cycle (the results the model answers)."""
    history = roost.history
    assert [m.seq for m in history] == list(range(1, len(history) + 1)), "seqs have gaps"
    ends = [t.user_seq for t in roost.turns[1:]] + [len(history) + 1]
    points = []
    for turn, end in zip(roost.turns, ends, strict=True):
        mine = [turn.user_seq]
        for seq in range(turn.user_seq + 1, end):
            message = history[seq - 1]
            after = history[seq] if seq < len(history) else None
            if message.role == "tool" and (after is None or after.role != "tool"):
                mine.append(seq)
        points.append(mine)
    return points


@dataclass
class ReplayRun:
    turns: list[int]  # the turn of each request
    positions: list[int]  # 0: the turn's first request
    raw: list[int]  # tokens of the full request as sent
    evaluated: list[int | None]  # prompt_eval_count after Ollama's cut; None when refused
    raw_measured: list[Measured]
    cut_measured: list[Measured]
    cuts: int
    refused: int
    mismatches: int  # cut simulations that disagree with the fake's count (should be 0)


def lift_body_limit(fake: FakeOllama) -> None:
    """Let the fake take request bodies over aiohttp's default 1 MiB, as Ollama does: the full
    replay requests of this conversation grow to several MB. The fake builds its application in
    `start()`, so the limit is raised on the running one (a private aiohttp attribute)."""
    runner = fake._runner
    assert runner is not None, "start the fake first"
    runner.app._client_max_size = 256 * 1024**2


async def run_full_replay(fake: FakeOllama, roost: RoostRun) -> ReplayRun:
    """Send every model call's full history once (not streamed) and record what the fake makes
    of it: roost's system message and tool schemas of that turn, then every stored message up to
    the call verbatim. The reply the model generated for a call is the stored message after it."""
    lift_body_limit(fake)
    fake.default_reply = lambda body: Reply(content="ok")
    fake.requests.clear()  # the roost requests are measured already; keep memory flat
    chats = [as_chat(m) for m in roost.history]
    sizes = [fake.count_tokens([c]) for c in chats]
    tokens = part_tokens(fake)
    cuts, overflows = fake.cuts, fake.overflows
    run = ReplayRun([], [], [], [], [], [], 0, 0, 0)
    previous_full: list[ChatMessage] = []
    previous_cut: list[ChatMessage] = []
    previous_reply: ChatMessage | None = None
    async with aiohttp.ClientSession() as session:
        for index, (record, points) in enumerate(zip(roost.turns, call_points(roost),
                                                     strict=True)):
            sent = record.requests[0].body
            for position, count in enumerate(points):
                body: Body = {"model": MODEL, "messages": [sent["messages"][0], *chats[:count]],
                              "tools": sent.get("tools"), "stream": False,
                              "options": {"num_ctx": WINDOW}}
                run.turns.append(index)
                run.positions.append(position)
                run.raw.append(fake.count_tokens(body["messages"], body["tools"]))
                async with session.post(f"{fake.url}/api/chat", json=body) as response:
                    answer = await response.json()
                fake.requests.clear()
                parts = template_parts(fake, body)
                head = parts[: len(parts) - count]  # tool schemas and the system message
                kept = ollama_cut(parts, [*map(tokens, head), *sizes[:count]], WINDOW)
                if response.status == 200:
                    run.evaluated.append(int(answer["prompt_eval_count"]))
                    run.mismatches += sum(map(tokens, kept)) != run.evaluated[-1]
                else:
                    run.evaluated.append(None)
                if previous_full:
                    run.raw_measured.append(measure(tokens, previous_full, previous_reply, parts,
                                                    turn=index, position=position, fold=False))
                    run.cut_measured.append(measure(tokens, previous_cut, previous_reply, kept,
                                                    turn=index, position=position, fold=False))
                previous_full, previous_cut = parts, kept
                previous_reply = chats[count] if count < len(chats) else None
    run.cuts = fake.cuts - cuts
    run.refused = fake.overflows - overflows
    return run


# ---- analysis ----------------------------------------------------------------------------------


def mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


@dataclass
class Column:
    """One strategy's numbers, as printed and drawn."""

    name: str
    tokens: list[int]  # prompt tokens of each turn's first request (the chart)
    sizes: list[int]  # prompt tokens of every request from a turn
    over_budget: int
    cut: int
    summary_calls: int
    state_calls: int
    measured: list[Measured]  # every request but the very first, against what came before
    notes: list[str] = field(default_factory=list)

    def pick(self, *, folds: bool = False, first: bool | None = None) -> list[Measured]:
        """Requests of turns without a fold (all turns with `folds`), only the turns' first
        requests (`first=True`) or only the follow-ups inside turns (`first=False`)."""
        return [m for m in self.measured if (folds or not m.fold)
                and (first is None or (m.position == 0) == first)]

    def reuse(self, *, literal: bool = False, **pick: Any) -> float:
        return mean([(m.literal if literal else m.cached).reuse for m in self.pick(**pick)])


@dataclass
class RoostAnalysis:
    column: Column
    fold_turns: set[int]


def analyse_roost(fake: FakeOllama, roost: RoostRun) -> RoostAnalysis:
    """roost's column: every request of every turn measured against the previous request (of
    the same turn or the turn before) and the reply the model generated for it."""
    tokens = part_tokens(fake)
    measured: list[Measured] = []
    fold_turns: set[int] = set()
    previous: tuple[list[ChatMessage], ChatMessage] | None = None
    over: list[tuple[int, int, int]] = []
    for index, turn in enumerate(roost.turns):
        fold = index > 0 and turn.folds_before != roost.turns[index - 1].folds_before
        if fold:
            fold_turns.add(index)
        for position, sent in enumerate(turn.requests):
            if sent.tokens > BUDGET:
                over.append((index, position, sent.tokens))
            if sent.reply is None:
                continue  # refused: Ollama evaluated nothing, its cache is unchanged
            parts = template_parts(fake, sent.body)
            if previous is not None:
                measured.append(measure(
                    tokens, previous[0], previous[1], parts, turn=index, position=position,
                    fold=fold, state=is_state_request(sent.body["messages"]), explain=not fold))
            previous = parts, generated(sent.reply)
    sizes = [s.tokens for t in roost.turns for s in t.requests]
    column = Column(
        name="roost", tokens=[t.requests[0].tokens for t in roost.turns], sizes=sizes,
        over_budget=len(over), cut=sum(s > WINDOW for s in sizes) + roost.overflows,
        summary_calls=roost.fold_calls, state_calls=roost.state_calls, measured=measured,
    )
    kept = column.pick()
    follow = column.pick(first=False)
    fresh = [m.cached.total_tokens - m.cached.shared_tokens for m in kept]
    column.notes += [
        f"{roost.folds} folds written with {roost.fold_calls} summary calls (the folder "
        f"counted {roost.folder_calls}); fold prompts peak at {roost.fold_prompt_peak:,} tokens",
        f"{len(sizes)} requests from {len(roost.turns)} turns ({len(roost.turns) - len(fold_turns)}"
        f" without a fold, {len(fold_turns)} with one); {len(follow)} follow-ups inside turns "
        f"without a fold, {sum(m.state for m in follow)} of them state requests; "
        f"{roost.overflows} refused by Ollama, {roost.cuts} cut (fold prompts included)",
        f"on turns without a fold Ollama evaluates {mean(fresh):,.0f} tokens afresh per request "
        f"({sum(fresh) / max(sum(m.cached.total_tokens for m in kept), 1):.1%} of the tokens "
        "sent)",
    ]
    for index, position, size in over:
        accounting = roost.turns[index].accounting
        column.notes.append(
            f"over budget at turn {index}, request {position + 1}: {size:,} tokens with the tool "
            f"schemas; roost estimated the first request at {accounting.get('estimate', 0):,} "
            f"against a budget of {accounting.get('budget', 0):,} after the schemas, at ratio "
            f"{accounting.get('ratio', 0):.4f} (fit: {accounting.get('fit')})")
    return RoostAnalysis(column, fold_turns)


def replay_columns(replay: ReplayRun) -> tuple[Column, Column]:
    firsts = [i for i, p in enumerate(replay.positions) if p == 0]
    full = Column(
        name="full replay", tokens=[replay.raw[i] for i in firsts], sizes=replay.raw,
        over_budget=sum(t > BUDGET for t in replay.raw), cut=sum(t > WINDOW for t in replay.raw),
        summary_calls=0, state_calls=0, measured=replay.raw_measured,
    )
    full.notes.append(f"the fake cut {replay.cuts} of these requests and refused "
                      f"{replay.refused}; reuse is of the requests as sent")
    evaluated = [t if t is not None else 0 for t in replay.evaluated]
    ollama = Column(
        name="full, Ollama cuts", tokens=[evaluated[i] for i in firsts], sizes=evaluated,
        over_budget=sum(t > BUDGET for t in evaluated), cut=replay.cuts, summary_calls=0,
        state_calls=0, measured=replay.cut_measured,
    )
    ollama.notes.append("tokens are the fake's prompt_eval_count after its cut; over budget "
                        "here means less than the response reserve is left for the answer")
    if replay.mismatches:
        ollama.notes.append(f"WARNING: {replay.mismatches} cut simulations disagree with the "
                            "fake's count; the reuse of this column is approximate")
    return full, ollama


# ---- output ------------------------------------------------------------------------------------


def table(columns: Sequence[Column]) -> str:
    def reuse(value: float) -> str:
        return "-" if value != value else f"{value:.3f}"  # NaN: no such requests

    rows: list[tuple[str, list[str]]] = [
        ("requests from turns", [f"{len(c.sizes):,}" for c in columns]),
        ("peak prompt tokens (any request)", [f"{max(c.sizes):,}" for c in columns]),
        ("mean prompt tokens (all requests)", [f"{mean(c.sizes):,.0f}" for c in columns]),
        ("mean prompt tokens (turns' first requests)",
         [f"{mean(c.tokens):,.0f}" for c in columns]),
        (f"requests over budget (>{BUDGET:,})", [f"{c.over_budget:,}" for c in columns]),
        (f"requests Ollama cuts (>{WINDOW:,})", [f"{c.cut:,}" for c in columns]),
        ("summary (fold) model calls", [f"{c.summary_calls:,}" for c in columns]),
        ("state (in-turn compaction) model calls", [f"{c.state_calls:,}" for c in columns]),
        ("prefix reuse vs previous request + its reply", [""] * len(columns)),
        ("  (what Ollama's cache holds; the target)", [""] * len(columns)),
        ("  all requests, turns without a fold", [reuse(c.reuse()) for c in columns]),
        ("  first requests of turns", [reuse(c.reuse(first=True)) for c in columns]),
        ("  follow-up requests inside turns", [reuse(c.reuse(first=False)) for c in columns]),
        ("  all requests, all turns", [reuse(c.reuse(folds=True)) for c in columns]),
        ("prefix reuse vs previous request only", [""] * len(columns)),
        ("  all requests, turns without a fold",
         [reuse(c.reuse(literal=True)) for c in columns]),
        ("  all requests, all turns",
         [reuse(c.reuse(literal=True, folds=True)) for c in columns]),
    ]
    width = max(len(label) for label, _ in rows)
    cells = [max(len(c.name), *(len(values[i]) for _, values in rows))
             for i, c in enumerate(columns)]

    def line(label: str, values: Sequence[str]) -> str:
        return (f"{label:<{width}}" + "".join(f"  {v:>{w}}" for v, w in zip(values, cells,
                                                                           strict=True))).rstrip()

    return "\n".join([line("", [c.name for c in columns]),
                      *(line(label, values) for label, values in rows)])


def _kind(m: Measured) -> str:
    if m.position == 0:
        return "first"
    return "state" if m.state else "follow-up"


def reuse_breakdown(column: Column) -> str:
    """Where roost's requests stop repeating the previous request and its reply, what each
    place costs, and the worst example of each."""
    kept = column.pick()
    groups: dict[tuple[str, str], list[Measured]] = defaultdict(list)
    for m in kept:
        groups[(_kind(m), m.cause)].append(m)
    turns = len({m.turn for m in kept})
    lines = [f"roost prefix reuse against the previous request and its reply, on the {len(kept)} "
             f"requests of the {turns} turns without a fold (the first turn has nothing before "
             "it), by where each request stops repeating it",
             "  requests  mean reuse  cost to the mean  request    where"]
    ordered = sorted(groups.items(), key=lambda item: -sum(1 - m.cached.reuse for m in item[1]))
    for (kind, cause), members in ordered:
        cost = sum(1 - m.cached.reuse for m in members) / len(kept)
        lines.append(f"  {len(members):8d}  {mean([m.cached.reuse for m in members]):10.3f}  "
                     f"{cost:16.3f}  {kind:<9}  {cause}")
        worst = min(members, key=lambda m: m.cached.reuse)
        if worst.example:
            lines.append(f"{'':40}worst: {worst.example}")
    lines.append("  append-only ceiling (every request only appends to the previous request and "
                 f"its reply): {mean([m.ceiling_cached for m in kept]):.3f}; against the previous "
                 f"request only: {mean([m.ceiling_literal for m in kept]):.3f}")
    return "\n".join(lines)


def targets(roost: RoostRun, column: Column) -> list[tuple[str, bool, str]]:
    # Every fold written needs one call, so calls == folds means exactly one call per fold.
    reuse = column.reuse()
    return [
        ("0 requests over budget", column.over_budget == 0, f"{column.over_budget}"),
        ("0 requests cut by Ollama", column.cut == 0 and roost.cuts == 0,
         f"{column.cut} turn requests cut or refused, {roost.cuts} cut in all"),
        ("at most one summary call per fold", roost.fold_calls <= roost.folds,
         f"{roost.fold_calls} calls for {roost.folds} folds"),
        (f"mean prefix reuse on turns without a fold >= {REUSE_TARGET} (against the previous "
         "request and its reply, what Ollama's cache holds)", reuse >= REUSE_TARGET,
         f"{reuse:.3f} (against the previous request only: "
         f"{column.reuse(literal=True):.3f})"),
    ]


COLOURS = {"roost": (31, 119, 180), "full replay": (214, 39, 40),
           "full, Ollama cuts": (255, 127, 14)}
GREY, GREEN = (90, 90, 90), (44, 160, 44)


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    try:
        return ImageFont.truetype("DejaVuSans.ttf", size)
    except OSError:
        return ImageFont.load_default(size)


def _dashed(draw: ImageDraw.ImageDraw, y: float, x0: int, x1: int,
            colour: tuple[int, int, int]) -> None:
    for x in range(x0, x1, 14):
        draw.line([(x, y), (min(x + 8, x1), y)], fill=colour, width=2)


def chart(columns: Sequence[Column], fold_turns: set[int], path: Path) -> None:
    """Prompt tokens of each turn's first request, one line per strategy, on an axis a little
    above the window; a line that leaves the axis is drawn up to there and labelled."""
    width, height = 1500, 860
    left, right, top, bottom = 95, 40, 60, 200
    plot_w, plot_h = width - left - right, height - top - bottom
    y_max = 9_500
    turns = max(len(c.tokens) for c in columns)
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    font, small, title = _font(17), _font(14), _font(21)

    def px(turn: float) -> float:
        return left + plot_w * turn / max(turns - 1, 1)

    def py(tokens: float) -> float:
        return top + plot_h * (1 - min(tokens, y_max) / y_max)

    draw.text((left, 18), f"Prompt tokens of each turn's first request, {turns} turns at num_ctx "
              f"{WINDOW:,} (response reserve {RESPONSE_RESERVE:,})", fill="black", font=title)
    for tick in range(0, y_max + 1, 1000):
        draw.line([(left, py(tick)), (left + plot_w, py(tick))], fill=(232, 232, 232))
        draw.text((left - 10, py(tick)), f"{tick:,}", fill="black", font=small, anchor="rm")
    for tick in range(0, turns, 50 if turns > 200 else 10):
        draw.line([(px(tick), top + plot_h), (px(tick), top + plot_h + 6)], fill="black")
        draw.text((px(tick), top + plot_h + 10), str(tick), fill="black", font=small,
                  anchor="mt")
    for turn in fold_turns:  # roost's folds: short grey ticks along the bottom
        draw.line([(px(turn), top + plot_h - 10), (px(turn), top + plot_h)], fill=(150,) * 3)
    for column in reversed(columns):  # the first column (roost) is drawn on top
        colour = COLOURS.get(column.name, (0, 0, 0))
        leaves = next((i for i, t in enumerate(column.tokens) if t > y_max), None)
        shown = column.tokens if leaves is None else column.tokens[: leaves + 1]
        draw.line([(px(i), py(t)) for i, t in enumerate(shown)], fill=colour, width=2)
        if leaves is not None:
            draw.text((px(leaves) + 8, top + 6), f"{column.name} leaves the chart at turn "
                      f"{leaves} and reaches {max(column.tokens):,} tokens", fill=colour,
                      font=font)
    for level, colour, text in ((WINDOW, GREY, f"num_ctx {WINDOW:,}: Ollama cuts above"),
                                (BUDGET, GREEN, f"budget {BUDGET:,}")):
        _dashed(draw, py(level), left, left + plot_w, colour)
        box = draw.textbbox((left + 8, py(level) - 4), text, font=small, anchor="lb")
        draw.rectangle([box[0] - 3, box[1] - 2, box[2] + 3, box[3] + 2], fill="white",
                       outline=colour)
        draw.text((left + 8, py(level) - 4), text, fill=colour, font=small, anchor="lb")
    draw.rectangle([left, top, left + plot_w, top + plot_h], outline="black")
    draw.text((left + plot_w / 2, top + plot_h + 34), "turn", fill="black", font=font,
              anchor="mt")
    label = Image.new("RGB", (260, 24), "white")
    ImageDraw.Draw(label).text((130, 12), "prompt tokens (fake's count)", fill="black",
                               font=font, anchor="mm")
    image.paste(label.rotate(90, expand=True), (8, top + plot_h // 2 - 130))

    legend_y = top + plot_h + 70
    for row, column in enumerate(columns):
        y = legend_y + row * 26
        draw.line([(left, y + 9), (left + 40, y + 9)], fill=COLOURS.get(column.name, (0, 0, 0)),
                  width=4)
        draw.text((left + 50, y), f"{column.name}: first requests mean {mean(column.tokens):,.0f}, "
                  f"peak {max(column.tokens):,}; all {len(column.sizes):,} requests mean "
                  f"{mean(column.sizes):,.0f}, peak {max(column.sizes):,}", fill="black",
                  font=font)
    y = legend_y + len(columns) * 26
    draw.line([(left + 20, y + 2), (left + 20, y + 14)], fill=(150,) * 3, width=2)
    draw.text((left + 50, y), f"roost wrote a fold before this turn ({len(fold_turns)} folds)",
              fill="black", font=font)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)


async def run(turns: int, seed: int, out: Path) -> None:
    clock = [time.perf_counter()]
    phases: dict[str, float] = {}

    def lap(name: str) -> None:
        clock.append(time.perf_counter())
        phases[name] = clock[-1] - clock[-2]

    conversation = script(turns, seed)
    lap("script")
    with tempfile.TemporaryDirectory(prefix="roost-sawtooth-") as folder:
        model = FakeModel(name=MODEL, context_length=CONTEXT_LENGTH)
        async with FakeOllama(models=[model]) as fake:
            roost = await run_roost(fake, conversation, Path(folder) / "state")
            lap("roost")
            replay = await run_full_replay(fake, roost)
            lap("full replay")
            analysis = analyse_roost(fake, roost)
    full, ollama = replay_columns(replay)
    columns = [analysis.column, full, ollama]
    lap("analysis")
    chart(columns, analysis.fold_turns, out)
    lap("chart")

    kinds = Counter(t.kind for t in conversation)
    print(f"{turns} turns (seed {seed}): {kinds['chat']} short answers, {kinds['long']} long "
          f"(2-6 KB), {kinds['tool']} that fetch a 10-40 KB page through the tool loop; num_ctx "
          f"{WINDOW:,}, budget {BUDGET:,}\n")
    print(table(columns) + "\n")
    print("Prefix reuse is the share of a request's tokens that repeat the leading tokens of "
          "what came before it.\nThe target is checked against the previous request followed "
          "by the reply the model generated for it,\nsince that is what Ollama's prompt cache "
          "holds after a call; against the previous request only, the\nprevious reply counts "
          "as new text although Ollama never evaluates it again.\n")
    for column in columns:
        for note in column.notes:
            print(f"{column.name}: {note}")
    print("\n" + reuse_breakdown(analysis.column) + "\n")
    print("targets for roost:")
    for name, met, value in targets(roost, analysis.column):
        print(f"  [{'met' if met else 'MISSED'}] {name}: {value}")
    inside = ", ".join(f"{k} {v:.1f}s" for k, v in roost.seconds.items())
    spent = ", ".join(f"{k} {v:.1f}s" for k, v in phases.items())
    print(f"\nchart: {out}\ntime: {clock[-1] - clock[0]:.1f}s ({spent}; in roost: {inside})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=("mixed", "long"), default="mixed",
                        help="mixed: the scripted chat with tools; long: ~290-token messages")
    parser.add_argument("--turns", type=int, default=None, help="500 mixed, 300 long")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "context_sawtooth.png")
    args = parser.parse_args()
    if args.profile == "long":
        asyncio.run(long_messages.main(args.turns or 300, args.seed))
    else:
        asyncio.run(run(args.turns or 500, args.seed, args.out))


if __name__ == "__main__":
    main()
