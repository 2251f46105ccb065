"""A roost conversation with the real model, and the figures issue 43 asks of it.

roost's own engine (the one assembly every entry point uses) talks to the Ollama-wire server in
front of SmolLM2-135M (tests/llama/server.py) at a 2,048-token window, as a person would on a
small box: turn one carries facts (a name, a locker code, an account's last digits), the turns
after it are short questions and a paste. Read back:

- the estimate roost fitted each request with (its debug snapshots) against the server's
  `prompt_eval_count` of that request;
- silent cuts roost claimed, answers it took back after showing them, turns it ended as too
  large, requests the server refused;
- whether every chat request carried the turn-one facts.

Shared by tests/llama/test_real_conversation.py and bench/real_model.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from daemon.app.assembly import assemble
from daemon.context.fold import FOLD_SYSTEM
from daemon.core.config import Settings
from daemon.core.messages import Inbound
from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.turn.runner import REDONE_LINE, TOO_LARGE
from tests.conftest import RecordingChannel
from tests.llama.server import ServerThread

CHAT = "telegram:1111111"
MODEL = "smollm2:135m"
FACTS = ("4417", "0091")  # turn one's locker code and account digits
TURN_ONE = ("Hi, I am Dana. My locker code is 4417 and my bank account ends in 0091. "
            "Please keep both in mind.")
# A dense paste (ids, amounts), as a bank export is: the kind of text whose tokens an estimate
# gets wrong, and the one a refused request shrinks first.
PASTE = "Here is my October export, which id has the largest amount?\n" + "\n".join(
    f"TX{n:05d};2026-10-{n % 28 + 1:02d};DE89370400440532013{n:03d};{n * 37 % 1000}.{n % 100:02d}"
    for n in range(24))
MESSAGES = (
    "What is the capital of France?",
    "Name three colours of the rainbow.",
    "Here is my shopping list: milk, eggs, bread, apples, cheese, rice, tea. Which is a drink?",
    "How many legs does a spider have?",
    "Write one sentence about the sea.",
    "What is my locker code?",
    "Tell me a short fact about the moon.",
    "What did I ask you about the rainbow?",
    PASTE,  # after the test's turns: the bench's 26 have it
    "Give me a word that rhymes with cat.",
    "What is two plus two?",
    "Say something kind.",
    "Which ocean is the largest?",
    "What is my name?",
    "List two fruits.",
    "What does a bee make?",
    "Name a musical instrument.",
    "What colour is the sky on a clear day?",
    "How many days are in a week?",
    "What is ice made of?",
    "Name a planet.",
    "What is the opposite of hot?",
    "Thank you for your help.",
    "Which animal says moo?",
    "What are the digits my bank account ends in?",
    "Goodbye for now.",
)


@dataclass
class Figures:
    """What one conversation showed; `errors` are (estimate - count) / count per chat request
    after the first, in order."""

    turns: int = 0
    errors: list[float] = field(default_factory=list)
    claimed_cuts: int = 0
    taken_back: int = 0
    too_large: int = 0
    refused: int = 0
    chat_requests: int = 0
    without_facts: int = 0
    seconds: float = 0.0

    def worst(self) -> float:
        return max((abs(e) for e in self.errors), default=0.0)

    def median(self) -> float:
        return statistics.median(abs(e) for e in self.errors) if self.errors else 0.0


async def converse(server: ServerThread, turns: int, state: Path,
                   window: int = 2048) -> Figures:
    """`turns` turns of the conversation above, through roost's engine, against `server`."""
    base = Settings.defaults(env={"STATE_DIRECTORY": str(state)})
    settings = dataclasses.replace(base, model=dataclasses.replace(
        base.model, host=server.url, name=MODEL, window=window, think=False, timeout=600.0))
    store = Store.open(state)
    llm = ModelClient(settings.model)
    channel = RecordingChannel("telegram")
    engine = assemble(settings, store, llm, {"telegram": channel}).engine
    first = len(server.requests)
    started = time.monotonic()
    await engine.start()
    try:
        for text in (TURN_ONE, *MESSAGES)[:turns]:
            assert await engine.submit(Inbound(chat_key=CHAT, text=text, received=time.time()))
            await asyncio.wait_for(engine.wait_idle(CHAT), 900)
    finally:
        await engine.stop(grace=0)
        await llm.close()
        store.close()
    figures = Figures(turns=turns, seconds=time.monotonic() - started)
    _read_snapshots(state / "debug", figures)
    _read_requests(server, first, figures)
    figures.taken_back = sum(REDONE_LINE in t for t in channel.texts("reply"))
    figures.too_large = sum(TOO_LARGE[:40] in t for t in channel.texts("notice"))
    day = time.strftime("%Y-%m-%d", time.localtime())
    figures.claimed_cuts = sum("silent-cut" in e for e in engine.parts.records.events(day))
    return figures


def _read_snapshots(debug: Path, figures: Figures) -> None:
    """roost's estimate against the server's count, for every chat request it kept."""
    shots = [json.loads(p.read_text()) for p in sorted(debug.glob("*.json"))]
    firsts = [s for s in shots if s.get("call", 1) == 1]
    opening = min(firsts, key=lambda s: s["time"]) if firsts else None
    for shot in shots:
        if shot is opening:  # the conversation's first request: no count to learn from yet
            continue
        count = shot.get("prompt_eval_count")
        if count and shot.get("estimate"):
            figures.errors.append((shot["estimate"] - count) / count)


def _read_requests(server: ServerThread, first: int, figures: Figures) -> None:
    for record in server.requests[first:]:
        if record.path != "/api/chat":
            continue
        messages = record.body.get("messages") or []
        if messages and str(messages[0].get("content", "")).startswith(FOLD_SYSTEM):
            continue
        figures.chat_requests += 1
        figures.refused += record.status != 200
        if not all(fact in json.dumps(messages) for fact in FACTS):
            figures.without_facts += 1
