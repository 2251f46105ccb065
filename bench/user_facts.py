"""What a person's facts cost in the prompt, and whether they keep the prompt cache.

One 20-turn Telegram conversation against the fake Ollama (window 8,192), for a person with 12
facts kept before it began; at turn 10 the user keeps one more (`/remember`). Printed:

* how many times the system message changed between turns (target 0), and the share of each
  request's leading bytes that repeat the previous request's (what Ollama's prompt cache can
  reuse; the minimum over turns 2-20);
* beside it, in the same run, a baseline built from the very same requests: the facts read
  afresh into the system message on every turn (what a prompt without freezing would send):
  its system message changes, and the turn after the new fact reuses only the shared part;
* whether the facts conversation's system message starts with the whole shared part of a
  person without facts (so the block costs only its own bytes in the cache);
* the cost of the `<user_facts>` block in tokens (the fake's tokenizer and roost's estimate)
  against its cap (window / 32), at windows 4,096, 8,192 and 32,768 with 5, 20 and 200 facts,
  and how many facts it shows and leaves out.

Run from the repository root with the test extra installed: `python bench/user_facts.py`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.automation_prefix import rendered, shared_bytes
from daemon.app.assembly import assemble
from daemon.context.facts import facts_block, with_facts
from daemon.core.config import Settings
from daemon.core.messages import Inbound
from daemon.engine.workers import Engine
from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.store.facts import FactsBook, Person
from tests.conftest import RecordingChannel
from tests.fakes.ollama import FakeOllama

ALICE = "telegram:1111111"
BOB = "telegram:2222222"
TURNS = 20
NEW_FACT_AT = 10
FACTS = [
    "My locker code at the gym is 4417", "I prefer metric units", "I live in Graz, Austria",
    "My wife is Anna; her birthday is 14 March", "I am allergic to peanuts",
    "I follow the Artemis launches and the Austrian Bundesliga",
    "I work as a structural engineer, mostly on timber bridges",
    "Call me Max, not Maximilian", "My car is a 2019 Skoda Octavia estate, plate G-417 MX",
    "I take the 07:40 train to Vienna on Tuesdays", "Answer in English even when I write German",
    "Remind me to water the fig tree on Sundays",
]
NEW_FACT = "My dentist is Dr. Huber, phone 0316 424242"


async def say(engine: Engine, fake: FakeOllama, chat: str, text: str) -> list[dict[str, Any]]:
    before = len(fake.chat_requests)
    await engine.submit(Inbound(chat_key=chat, text=text, received=time.time()))
    await asyncio.wait_for(engine.wait_idle(chat), 30)
    return fake.chat_requests[before:]


async def conversation(state: Path) -> tuple[list[dict[str, Any]], str, FakeOllama]:
    """The 20 turns' requests and the system message of a person without facts."""
    async with FakeOllama() as fake:
        settings = Settings.defaults(env={"STATE_DIRECTORY": str(state)})
        settings = dataclasses.replace(settings, model=dataclasses.replace(
            settings.model, host=fake.url, window=8192))
        store = Store.open(state)
        book = FactsBook(store.files)
        for i, fact in enumerate(FACTS):
            book.add(Person(ALICE, (ALICE,)), fact, f"2026-11-{i + 1:02d}")
        llm = ModelClient(settings.model)
        channels = {"telegram": RecordingChannel("telegram")}
        engine = assemble(settings, store, llm, channels).engine
        await engine.start()
        try:
            bodies = []
            for turn in range(1, TURNS + 1):
                if turn == NEW_FACT_AT + 1:
                    await say(engine, fake, ALICE, f"/remember {NEW_FACT}")
                bodies += (await say(engine, fake, ALICE, f"turn {turn}: tell me something "
                                     "useful about bridges, briefly"))[:1]
            bob = (await say(engine, fake, BOB, "hello"))[0]["messages"][0]["content"]
        finally:
            await engine.stop(grace=0)
            await llm.close()
            store.close()
    return bodies, bob, fake


def baseline(bodies: list[dict[str, Any]], shared: str) -> list[dict[str, Any]]:
    """The same requests with the facts read afresh into the system message each turn (and
    no change line, which a fresh read makes needless)."""
    out = []
    for turn, body in enumerate(bodies, start=1):
        facts = [(f"2026-11-{i + 1:02d}", f) for i, f in enumerate(FACTS)]
        if turn > NEW_FACT_AT:
            facts.append((time.strftime("%Y-%m-%d"), NEW_FACT))
        system = with_facts(shared, facts_block(facts, 8192).text)
        messages = [{**body["messages"][0], "content": system}]
        for m in body["messages"][1:]:
            content = str(m.get("content") or "")
            head, cut, tail = content.partition("\n\n[Facts changed since")
            if cut:
                content = head + tail[tail.index("]") + 1:]
            messages.append({**m, "content": content})
        out.append({**body, "messages": messages})
    return out


def report_cache(name: str, bodies: list[dict[str, Any]]) -> None:
    systems = [b["messages"][0]["content"] for b in bodies]
    changes = sum(1 for a, b in itertools.pairwise(systems) if a != b)
    shares = [shared_bytes(rendered(a), rendered(b)) / len(rendered(b))
              for a, b in itertools.pairwise(bodies)]
    worst = min(range(len(shares)), key=shares.__getitem__)
    print(f"  {name:<34} system message changes: {changes:>2}   reused share: min "
          f"{shares[worst]:.3f} (turn {worst + 2}), mean {sum(shares) / len(shares):.3f}")


def report_cost(fake: FakeOllama) -> None:
    print("\ncost of the <user_facts> block against its cap (window / 32), estimated at the "
          "conversation's ratio\n(1.00: a first conversation; 1.33: calibrated to the fake's "
          "tokenizer, a token per 3 bytes):")
    print(f"  {'window':>7} {'facts':>6} {'ratio':>6} {'cap':>5} {'estimate':>9} "
          f"{'fake tokens':>12} {'of cap':>7} {'shown':>6} {'left out':>9}")
    many = [(f"2026-11-{i % 28 + 1:02d}", FACTS[i % len(FACTS)] + f" (note {i})")
            for i in range(200)]
    empty = fake.count_tokens([{"role": "system", "content": ""}])
    for window in (4096, 8192, 32768):
        for count in (5, 20, 200):
            for ratio in (1.0, 4 / 3):
                block = facts_block(many[:count], window, ratio)
                counted = fake.count_tokens([{"role": "system", "content": block.text}]) - empty
                print(f"  {window:>7,} {count:>6} {ratio:>6.2f} {block.cap:>5} "
                      f"{block.tokens:>9} {counted:>12} {counted / block.cap:>7.2f} "
                      f"{block.shown:>6} {block.left_out:>9}")


async def main() -> None:
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        bodies, shared, fake = await conversation(Path(tmp) / "state")
    system = bodies[0]["messages"][0]["content"]
    print(f"{TURNS} turns of one conversation with {len(FACTS)} facts, one more kept at turn "
          f"{NEW_FACT_AT}:")
    report_cache("roost (frozen block + change line)", bodies)
    report_cache("baseline (facts read every turn)", baseline(bodies, shared))
    print(f"  the facts conversation starts with the whole shared part of a person without "
          f"facts: {system.startswith(shared + chr(10) * 2)} ({len(shared.encode()):,} shared "
          f"bytes, then {len(system.encode()) - len(shared.encode()):,} bytes of facts)")
    report_cost(fake)


if __name__ == "__main__":
    asyncio.run(main())
