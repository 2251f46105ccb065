"""Replies streamed into Telegram drafts (issue 21): how soon, how many calls, and what it costs.

roost's real app (in this process, on 127.0.0.1) against the loopback fake Bot API and the fake
Ollama writing 400-token answers at 30 tokens a second (`--tps`, `--tokens`), first for one
chat (`--replies` replies in a row), then for 10 chats at once (`--rounds` rounds; one model
slot, `model.concurrency = 1`, so they queue for it as they would on one GPU). The same
runs with `telegram.streaming = "off"` are the baseline. Printed:

* time from the model's first token (the fake's clock, when it wrote the first content) to the
  first draft at the fake Bot API: p50 and p99 (goal p50 <= 0.5 s, p99 <= 1.5 s);
* Bot API calls per reply (drafts, "typing…" until the first draft, the final parts), and the
  drafts and final parts against the bound 1 + answer seconds / interval + final parts, the
  answer's seconds counted from its first token to its message;
* drafts that reached the Bot API after the reply's message, and final messages sent twice
  (both goal 0);
* time from the model's last token (the fake wrote the stream's end) to the reply's
  `sendMessage` at the fake Bot API, p50 and p90, with streaming and without (goal: the same
  within a few milliseconds: the reply does not wait behind a draft);
* end-to-end turn time (the update posted -> the last part sent) with streaming over without
  (goal <= 1.05x).

Run: `python bench/streaming.py` (about 6 minutes at the defaults); issue 31's figure:
`python bench/streaming.py --replies 40 --tokens 120 --tps 60 --bot-latency 0.1`.
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
from io import BytesIO
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests` is not installed

from channels.telegram.channel import SECRET_HEADER, WEBHOOK_PATH, TelegramTuning
from daemon.app.serve import build_app
from daemon.core.config import Settings
from tests.fakes.ollama import FakeOllama, Reply
from tests.fakes.telegram import Call, FakeTelegram

SECRET = "bench_secret"
FIRST_USER = 5_000_000
INTERVAL = 0.7


def _replace(base: Settings, fake_ollama: FakeOllama, fake_telegram: FakeTelegram,
             users: list[int], streaming: str) -> Settings:
    return dataclasses.replace(
        base,
        model=dataclasses.replace(base.model, host=fake_ollama.url, think=False),
        platforms={**base.platforms, "telegram": dataclasses.replace(
            base.platforms["telegram"], enabled=True, mode="webhook",
            webhook_url="https://bot.example.org/webhooks/telegram",
            api_base=fake_telegram.api_base, file_base=fake_telegram.file_base,
            allow=tuple(users), token=fake_telegram.token, secret=SECRET,
            streaming=streaming, draft_interval=INTERVAL)},
        access=dataclasses.replace(base.access, rate_limit=1000))


def update(update_id: int, user: int, text: str) -> dict[str, Any]:
    return {"update_id": update_id, "message": {
        "message_id": update_id, "date": int(time.time()), "text": text,
        "chat": {"id": user, "type": "private", "first_name": "Bench"},
        "from": {"id": user, "is_bot": False, "first_name": "Bench"}}}


class Run:
    """One configuration (streaming on or off) against fresh fakes and a fresh state."""

    def __init__(self, streaming: str, tps: float, tokens: int, latency: float = 0.0) -> None:
        self.streaming = streaming
        self.latency = latency
        self.answer = " ".join(["lorem"] * (tokens * 3 // 6))[: tokens * 3]  # tokens of 3 bytes
        self.tps = tps
        self.latencies: list[float] = []
        self.calls_per_reply: list[int] = []
        self.bounds: list[float] = []
        self.typing: list[int] = []  # of the calls, "typing…" before the first draft
        self.turn_times: list[float] = []
        self.after_last: list[float] = []  # the model's last token -> the reply's sendMessage
        self.late_drafts = 0
        self.twice = 0
        self._next_update = 1

    async def go(self, chats: int, rounds: int) -> None:
        users = [FIRST_USER + i for i in range(chats)]
        async with FakeOllama() as ollama, FakeTelegram(started=users) as telegram:
            telegram.latency = self.latency
            ollama.default_reply = lambda body: Reply(content=self.answer,
                                                      tokens_per_second=self.tps)
            with tempfile.TemporaryDirectory() as state:
                settings = _replace(Settings.defaults(env={"STATE_DIRECTORY": state}), ollama,
                                    telegram, users, self.streaming)
                app = build_app(settings, tunings={"telegram": TelegramTuning()})
                runner = web.AppRunner(app, shutdown_timeout=1)
                await runner.setup()
                site = web.TCPSite(runner, "127.0.0.1", 0)
                await site.start()
                url = f"http://127.0.0.1:{runner.addresses[0][1]}{WEBHOOK_PATH}"
                try:
                    async with aiohttp.ClientSession() as http:
                        for _ in range(rounds):
                            await asyncio.gather(*(self._one(http, url, ollama, telegram, u)
                                                   for u in users))
                finally:
                    await runner.cleanup()

    async def _one(self, http: aiohttp.ClientSession, url: str, ollama: FakeOllama,
                   telegram: FakeTelegram, user: int) -> None:
        number = self._next_update
        self._next_update += 1
        text = f"question {number}"
        before = len([c for c in telegram.calls if _chat(c) == user])
        posted = time.monotonic()
        async with http.post(url, data=BytesIO(json.dumps(update(number, user, text)).encode()),
                             headers={"Content-Type": "application/json",
                                      SECRET_HEADER: SECRET}) as reply:
            assert reply.status == 200
        async with asyncio.timeout(900):  # ten chats queue for one model slot
            # The fake's calls are plain state (no event to wait on).
            while not _answered(telegram, user, before):  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        mine = _mine(telegram, user, before)
        finals = [c for c in mine if c.method == "sendMessage"]
        self.turn_times.append(finals[-1].time - posted)
        drafts = [c for c in mine if c.method == "sendMessageDraft"]
        self.late_drafts += sum(d.time > finals[0].time for d in drafts)
        self.twice += len(finals) - len({c.params["text"] for c in finals})
        first = next((t for t, body in ollama.first_content
                      if text in json.dumps(body["messages"][-1])), None)
        if drafts and first is not None:
            self.latencies.append(drafts[0].time - first)
        last = next((t for t, body in reversed(ollama.last_token)
                     if text in json.dumps(body["messages"][-1])), None)
        if last is not None:
            self.after_last.append(finals[0].time - last)
        self.calls_per_reply.append(len(mine))
        self.typing.append(sum(c.method == "sendChatAction" for c in mine))
        # The answer's seconds as written: from its first token to its message (the fake's
        # pacing runs a little slower than nominal on a busy machine).
        seconds = finals[0].time - first if first is not None else len(self.answer) / 3 / self.tps
        self.bounds.append(1 + seconds / INTERVAL + len(finals))


def _answered(telegram: FakeTelegram, user: int, before: int) -> bool:
    return any(c.method == "sendMessage" for c in _mine(telegram, user, before))


def _mine(telegram: FakeTelegram, user: int, before: int) -> list[Call]:
    return [c for c in telegram.calls if _chat(c) == user][before:]


def _chat(call: Call) -> int | None:
    chat = call.params.get("chat_id")
    return chat if isinstance(chat, int) else None


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tps", type=float, default=30.0)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--replies", type=int, default=5, help="replies in a row, one chat")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the 10 chats")
    parser.add_argument("--bot-latency", type=float, default=0.0,
                        help="seconds the fake Bot API takes per call (Telegram is ~0.05-0.2 s "
                             "away); a draft on the wire at the last token shows then")
    args = parser.parse_args()
    for chats, rounds in ((1, args.replies), (10, args.rounds)):
        results = {}
        for streaming in ("draft", "off"):
            run = Run(streaming, args.tps, args.tokens, args.bot_latency)
            await run.go(chats, rounds)
            results[streaming] = run
        on, off = results["draft"], results["off"]
        print(f"{chats} chat{'s' if chats > 1 else ''} at once, {rounds} replies each "
              f"({args.tokens} tokens at {args.tps:g} tokens/s, interval {INTERVAL} s):")
        print(f"  first token -> first draft: p50 {_p(on.latencies, 0.5):.3f} s, "
              f"p99 {_p(on.latencies, 0.99):.3f} s (goal <= 0.5 s, <= 1.5 s; "
              f"{len(on.latencies)} replies)")
        worst = max(c - t - b for c, t, b in zip(on.calls_per_reply, on.typing, on.bounds,
                                                 strict=True))
        print(f"  Bot API calls per reply: median {statistics.median(on.calls_per_reply):.0f}, "
              f"max {max(on.calls_per_reply)}, of which \"typing…\" before the first draft "
              f"{statistics.median(on.typing):.0f}; drafts and final parts against the bound "
              f"1 + answer s / interval + parts = {statistics.median(on.bounds):.1f}: worst "
              f"reply {worst:+.1f}; without streaming "
              f"{statistics.median(off.calls_per_reply):.0f} calls")
        print(f"  drafts after the final message: {on.late_drafts}; final messages sent twice: "
              f"{on.twice + off.twice}")
        print(f"  last token -> reply sent: streaming p50 {_p(on.after_last, 0.5) * 1000:.0f} ms"
              f", p90 {_p(on.after_last, 0.9) * 1000:.0f} ms; off p50 "
              f"{_p(off.after_last, 0.5) * 1000:.0f} ms, p90 {_p(off.after_last, 0.9) * 1000:.0f}"
              f" ms (goal: within a few ms)")
        ratio = statistics.median(on.turn_times) / statistics.median(off.turn_times)
        print(f"  turn time: streaming {statistics.median(on.turn_times):.2f} s, off "
              f"{statistics.median(off.turn_times):.2f} s: {ratio:.3f}x (goal <= 1.05x)")


if __name__ == "__main__":
    asyncio.run(main())
