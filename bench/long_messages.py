"""The "long messages" profile of the sawtooth bench: does the cost of a turn stay flat?

    python bench/context_sawtooth.py --profile long [--turns 300] [--seed 7]
    python bench/long_messages.py   (the same, with its defaults)

One conversation of ~290-token user messages (by the fake's tokenizer) and ~150-token answers at
window 8,192, played through the real engine against the fake Ollama. The model never answers a
fold in the `=== USER NOTES ===` format (small models often do not), so the user notes can only
stay bounded if roost bounds them. Each turn waits for its background fold, as a user's pause
would allow.

Every request Ollama receives counts, fold prompts included. A request's *uncached* tokens are its
prompt less the prefix it shares with the request Ollama received just before it (the tool
schemas when they are the same, since templates render them first; then whole shared messages
count their tokens, and the first differing message its shared characters in proportion).
Printed for turns 50-100 and 250-300 (and 0-50): turns answered, mean prompt tokens of the
turns' requests, folds written, mean uncached tokens per turn (the turn's requests and any fold
before it), and the summary's size (summary plus user notes, in the fake's tokens). Then over
the whole run: requests over the budget or cut by Ollama, turns answered by the model, and total
uncached tokens against the new content (user messages plus replies).

Targets: uncached per turn in 250-300 at most 1.2x that in 50-100; summary within its cap; 0
requests over budget or cut; every turn answered; total uncached at most 3x the new content.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script too

from bench.scenario import WORDS, is_fold
from daemon.app.assembly import assemble
from daemon.core.config import Settings
from daemon.core.messages import Inbound
from daemon.llm.client import ModelClient
from daemon.store import Store
from tests.conftest import RecordingChannel
from tests.fakes.ollama import FakeModel, FakeOllama, Reply

WINDOW = 8192
RESPONSE_RESERVE = 1024
BUDGET = WINDOW - RESPONSE_RESERVE
MODEL = "plain:4b"  # completion and tools, no thinking: the profile is about context, not thought
CHAT = "console:local"
START = 1_796_112_000.0
TURN_GAP = 60.0
USER_BYTES = 870  # ~290 tokens: the fake counts bytes / 3
ANSWER_BYTES = 450  # ~150 tokens
SPANS = ((0, 50), (50, 100), (250, 300))  # the two spans, and the start for context

Body = dict[str, Any]


def _words(rng: random.Random, size: int, head: str) -> str:
    words = [head]
    while sum(len(w) + 1 for w in words) < size:
        words.append(rng.choice(WORDS))
    return " ".join(words)[:size]


@dataclass
class LongModel:
    """Answers turns with ~150 tokens and folds with a plain summary, never in the notes
    format."""

    rng: random.Random
    turn: int = 0
    folds: int = 0
    answers: dict[int, str] = field(default_factory=dict)

    def __call__(self, body: Body) -> Reply:
        messages = body.get("messages") or []
        if is_fold(messages):
            self.folds += 1
            # The count in letters: a number none of the folded messages holds is no
            # summary of them, and is not stored (fold_problem).
            count = "".join(chr(ord("a") + int(d)) for d in str(self.folds))
            return Reply(content=f"Fold {count}: the user sends long notes about their "
                                 "garden, servers and travel; keep answering in detail.")
        answer = self.answers.setdefault(
            self.turn, _words(self.rng, ANSWER_BYTES, f"[answer {self.turn}]"))
        return Reply(content=answer)


def shared_tokens(fake: FakeOllama, before: Body, now: Body) -> int:
    """Tokens of the request `now` that repeat the leading part of `before`: the tool schemas
    (templates render them first) when they are the same, then the leading messages."""
    if (before.get("tools") or None) != (now.get("tools") or None):
        return 0
    shared = fake.count_tokens([], now.get("tools"))
    for old, new in zip(before.get("messages") or [], now["messages"], strict=False):
        if old == new:
            shared += fake.count_tokens([new])
            continue
        a, b = str(old.get("content") or ""), str(new.get("content") or "")
        if old.get("role") == new.get("role"):
            same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                        min(len(a), len(b)))
            shared += fake.count_tokens([new]) * same // max(len(b), 1)
        break
    return shared


@dataclass
class TurnRecord:
    prompt: int  # the fake's tokens of the turn's first request
    uncached: int  # over the turn's requests and any fold before them
    folds: int  # folds written before the turn
    summary_tokens: int
    answered: bool
    requests: list[int]  # the fake's tokens of every request, folds included


async def run_long(turns: int, seed: int) -> tuple[list[TurnRecord], dict[str, int]]:
    rng = random.Random(seed)
    model = LongModel(random.Random(seed + 1))
    with tempfile.TemporaryDirectory(prefix="roost-long-") as folder:
        async with FakeOllama([FakeModel(name=MODEL, capabilities=("completion", "tools"),
                                         context_length=32768)]) as fake:
            fake.default_reply = model
            state = Path(folder) / "state"
            base = Settings.defaults(env={"STATE_DIRECTORY": str(state)})
            settings = dataclasses.replace(
                base, daemon=dataclasses.replace(base.daemon, timezone="UTC"),
                model=dataclasses.replace(base.model, host=fake.url, name=MODEL, window=WINDOW,
                                          response_reserve=RESPONSE_RESERVE, retry_attempts=2,
                                          retry_backoff=0.05))
            now = [START]
            store = Store.open(state)
            llm = ModelClient(settings.model)
            channel = RecordingChannel()
            engine = assemble(settings, store, llm, {"console": channel},
                              clock=lambda: now[0]).engine
            await engine.start()
            records: list[TurnRecord] = []
            previous: Body = {}
            new_content = 0
            try:
                for index in range(turns):
                    now[0] += TURN_GAP
                    model.turn = index
                    user = _words(rng, USER_BYTES, f"(turn {index})")
                    first = len(fake.requests)
                    folds_before = model.folds
                    assert await engine.submit(Inbound(chat_key=CHAT, text=user,
                                                       received=now[0]))
                    await asyncio.wait_for(engine.wait_idle(CHAT), 120)
                    conversation = store.active_conversation(CHAT)
                    assert conversation is not None
                    while engine.parts.folder.busy(conversation.id):
                        await engine.parts.folder.wait(conversation.id)
                        await asyncio.sleep(0)
                    bodies = [r.body for r in fake.requests[first:] if r.path == "/api/chat"
                              and r.body is not None and r.body.get("messages")]
                    del fake.requests[first:]
                    uncached, sizes = 0, []
                    for body in bodies:
                        messages = body["messages"]
                        size = fake.count_tokens(messages, body.get("tools"))
                        sizes.append(size)
                        uncached += size - shared_tokens(fake, previous, body)
                        previous = body
                    turn_bodies = [b for b in bodies if not is_fold(b["messages"])]
                    replies = channel.texts("reply")
                    answer = model.answers.get(index, "")
                    answered = bool(replies) and bool(answer) and replies[-1].endswith(answer)
                    new_content += len(user.encode()) // 3 + len(answer.encode()) // 3
                    summary = conversation.summary
                    summary_tokens = fake.count_tokens(
                        [{"content": summary.summary}, {"content": summary.user_notes}]) - 8
                    records.append(TurnRecord(
                        prompt=fake.count_tokens(turn_bodies[0]["messages"],
                                                 turn_bodies[0].get("tools"))
                        if turn_bodies else 0,
                        uncached=uncached, folds=model.folds - folds_before,
                        summary_tokens=summary_tokens, answered=answered, requests=sizes))
            finally:
                await engine.stop(grace=0)
                await llm.close()
                store.close()
            totals = {"cuts": fake.cuts, "overflows": fake.overflows, "new": new_content}
    return records, totals


def report(records: Sequence[TurnRecord], totals: dict[str, int]) -> str:
    def mean(values: Sequence[int]) -> float:
        return sum(values) / len(values) if values else 0.0

    lines = [f"{'turns':<10}{'answered':>10}{'prompt':>10}{'folds':>8}{'uncached/turn':>16}"
             f"{'summary':>10}"]
    per_span = []
    for low, high in SPANS:
        span = records[low:high]
        if not span:
            continue
        per_span.append(mean([r.uncached for r in span]))
        sent = [r.prompt for r in span if r.prompt]  # a refused turn sends nothing
        lines.append(f"{low}-{high:<7}{sum(r.answered for r in span):>10}"
                     f"{mean(sent):>10,.0f}"
                     f"{sum(r.folds for r in span):>8}{per_span[-1]:>16,.0f}"
                     f"{span[-1].summary_tokens:>10,}")
    over = sum(size > BUDGET for r in records for size in r.requests)
    answered = sum(r.answered for r in records)
    uncached = sum(r.uncached for r in records)
    lines.append(f"requests over budget ({BUDGET:,}): {over}; cut by Ollama: {totals['cuts']}; "
                 f"refused: {totals['overflows']}")
    lines.append(f"turns answered by the model: {answered} of {len(records)}")
    lines.append(f"total uncached {uncached:,} tokens vs new content {totals['new']:,} "
                 f"({uncached / max(totals['new'], 1):.2f}x)")
    if len(per_span) == 3:
        lines.append(f"uncached per turn, 250-300 vs 50-100: "
                     f"{per_span[2] / max(per_span[1], 1):.2f}x")
    return "\n".join(lines)


async def main(turns: int, seed: int) -> None:
    started = time.perf_counter()
    records, totals = await run_long(turns, seed)
    print(f"long messages: {turns} turns of ~290-token messages, ~150-token answers, window "
          f"{WINDOW:,}, a model that ignores the notes format (seed {seed})\n")
    print(report(records, totals))
    print(f"\ntime: {time.perf_counter() - started:.1f}s")


if __name__ == "__main__":
    asyncio.run(main(300, 7))
