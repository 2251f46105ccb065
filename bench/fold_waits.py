"""How long a chat's turn waits when folds share the model: 20 chats at a 2K window.

Twenty chats write at once, each sending its next message a moment after the reply to the last
one came (a person reading and typing),
against the fake Ollama with `model.concurrency` 1. At a 2,048-token window every few turns of
each chat need a fold, so fold calls and chat turns compete for the one request slot all the
time. The fake takes `ANSWER_S` per chat answer and `FOLD_S` per fold call (a fold writes a
summary, so it is the longer call, as on a GPU).

Printed for the baseline (a turn lands the fold it owes first, whoever else waits) and for
roost (while others are answered the turn goes on without it and the fold goes in the fold
lane, one at a time among the turns' calls: `BackgroundFold.defer_when_busy`): turns, fold
calls, the turns that went on without the fold they owed (their requests left messages out),
the median and the worst wait (message in, reply sent) and their ratio; the bar of issue 48 is
a worst wait within 2x the median. Run: `python -m bench.fold_waits`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.scenario import WORDS
from daemon.app.assembly import assemble
from daemon.context.fold import FOLD_SYSTEM
from daemon.core.config import Settings
from daemon.core.messages import Inbound, Outbound
from daemon.llm.client import ModelClient
from daemon.store import Store
from tests.conftest import RecordingChannel
from tests.fakes.ollama import FakeModel, FakeOllama, Reply

CHATS = 20
WINDOW = 2048
ANSWER_S = 0.05  # seconds the fake takes for one chat answer
FOLD_S = 0.25  # and for one fold call
TOPICS = WORDS[WORDS.index("garden"):]  # the content words, without the stopwords before them
PAUSE_S = (0.2, 2.0)  # a person reads the reply and types the next message meanwhile


def answer(body: dict[str, Any]) -> Reply:
    messages = body.get("messages") or []
    if messages and str(messages[0].get("content", "")).startswith(FOLD_SYSTEM):
        # A summary drawn from what it was given, as a model writes one (roost stores no
        # summary whose words are not found in its messages).
        given = str(messages[-1].get("content", "")).split("<new_messages>")[-1]
        given = given.split("</new_messages>")[0].split()
        words = list(dict.fromkeys(w for w in given if w.isalpha() and len(w) >= 4))
        return Reply(content=f"They spoke of {', '.join(words[:30])}.", delay=FOLD_S)
    # A reply of some length, so that history grows towards the window turn by turn.
    return Reply(content=" ".join(TOPICS[i % len(TOPICS)] for i in range(120)), delay=ANSWER_S)


class TimedChannel(RecordingChannel):
    """Records when each chat's replies were sent."""

    def __init__(self) -> None:
        super().__init__("telegram")
        self.replies: dict[str, asyncio.Queue[float]] = defaultdict(asyncio.Queue)

    async def send(self, outbound: Outbound) -> None:
        await super().send(outbound)
        if outbound.kind == "reply":
            self.replies[outbound.chat_key].put_nowait(time.monotonic())


async def chat(engine: Any, channel: TimedChannel, key: str, rounds: int,
               waits: list[float]) -> None:
    rng = random.Random(key)
    for turn in range(rounds):
        await asyncio.sleep(rng.uniform(*PAUSE_S))
        # Topic words first: a fold sees the head of each message (its excerpts are clipped).
        text = f"message {turn} of {key}: " + " ".join(
            TOPICS[(turn * 7 + i) % len(TOPICS)] for i in range(80))
        sent = time.monotonic()
        assert await engine.submit(Inbound(chat_key=key, text=text, received=time.time()))
        waits.append(await asyncio.wait_for(channel.replies[key].get(), 600) - sent)


async def run(rounds: int, defer: bool) -> tuple[list[float], int, int]:
    fake = FakeOllama(models=[FakeModel(context_length=32768)])
    fake.default_reply = answer
    await fake.start()
    with tempfile.TemporaryDirectory() as state:
        base = Settings.defaults(env={"STATE_DIRECTORY": state})
        settings = dataclasses.replace(base, model=dataclasses.replace(
            base.model, host=fake.url, window=WINDOW, response_reserve=512, think=False))
        store = Store.open(Path(state))
        llm = ModelClient(settings.model)
        channel = TimedChannel()
        engine = assemble(settings, store, llm, {"telegram": channel}).engine
        engine.parts.folder.defer_when_busy = defer
        await engine.start()
        waits: list[float] = []
        try:
            await asyncio.gather(*(chat(engine, channel, f"telegram:{1000 + n}", rounds, waits)
                                   for n in range(CHATS)))
            folds = sum(1 for b in fake.chat_requests if str(
                (b.get("messages") or [{}])[0].get("content", "")).startswith(FOLD_SYSTEM))
            return waits, folds, engine.parts.folder.turns_without_owed_fold
        finally:
            await engine.stop(grace=0)
            await llm.close()
            store.close()
            await fake.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12, help="messages each chat sends")
    rounds = parser.parse_args().rounds
    print(f"{CHATS} chats x {rounds} turns at a {WINDOW}-token window, concurrency 1 "
          f"(answer {ANSWER_S * 1000:.0f} ms, fold {FOLD_S * 1000:.0f} ms at the fake)")
    worst_of = {}
    # The baseline: a turn lands the fold it owes before its request, whoever else waits.
    for label, defer in (("fold first (baseline)", False), ("turns first, fold lane", True)):
        waits, folds, without = asyncio.run(run(rounds, defer))
        median, worst = statistics.median(waits), max(waits)
        worst_of[defer] = worst
        print(f"{label:24} turns {len(waits)}  fold calls {folds}  without the fold they owed "
              f"{without}  median {median:.2f} s  worst {worst:.2f} s  "
              f"worst/median x{worst / median:.2f}")
    print(f"worst wait against the baseline: x{worst_of[True] / worst_of[False]:.2f}")


if __name__ == "__main__":
    main()
