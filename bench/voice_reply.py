"""Voice replies (issue 35): the time to the first visible words with speech on, against speech
off in the same run.

Two copies of roost's real app run in this process (each on 127.0.0.1 with its own state and
loopback fake Bot API, one fake Ollama writing `--tokens`-token answers at `--tps` tokens a
second, replies streamed into drafts): one speaks every reply (`/voice on`, the speech stand-in
of the tests taking `--speak-delay` seconds per voice note, as a backend would), one has no
speech. Rounds alternate between them. Each round posts a message and times it to the first
words the user sees (the first draft, or the reply's message when no draft came) and to the
voice note sent; the next round starts once the voice note is out. Printed: the medians, and the
ratio speech on / speech off of the time to the first visible words (goal: 1.00x, unchanged).

    python bench/voice_reply.py [--rounds 15] [--tps 30] [--tokens 120] [--speak-delay 0.5]
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
from tests.fakes.telegram import FakeTelegram
from tests.fakes.voice_standin import SpeakingStandIn

SECRET = "bench_secret"
USER = 6_000_000
SHOWN = ("sendMessageDraft", "sendMessage")


def update(update_id: int, text: str) -> dict[str, Any]:
    return {"update_id": update_id, "message": {
        "message_id": update_id, "date": int(time.time()), "text": text,
        "chat": {"id": USER, "type": "private", "first_name": "Bench"},
        "from": {"id": USER, "is_bot": False, "first_name": "Bench"}}}


class Side:
    """One roost (speech on or off) with its own fake Bot API and state."""

    def __init__(self, speaks: bool, ollama: FakeOllama, state: str, delay: float) -> None:
        self.speaks = speaks
        self.ollama = ollama
        self.state = state
        self.speech = SpeakingStandIn(Path(state) / "attachments") if speaks else None
        if self.speech is not None:
            self.speech.delay = delay
        self.telegram = FakeTelegram(started=[USER])
        self.first_words: list[float] = []
        self.voice_after: list[float] = []  # the reply's message -> its voice note sent
        self._runner: web.AppRunner | None = None
        self._next = 1
        self.url = ""

    async def start(self) -> None:
        await self.telegram.start()
        base = Settings.defaults(env={"STATE_DIRECTORY": self.state})
        settings = dataclasses.replace(
            base, model=dataclasses.replace(base.model, host=self.ollama.url, think=False),
            platforms={**base.platforms, "telegram": dataclasses.replace(
                base.platforms["telegram"], enabled=True, mode="webhook",
                webhook_url="https://bot.example.org/webhooks/telegram",
                api_base=self.telegram.api_base, file_base=self.telegram.file_base,
                allow=(USER,), token=self.telegram.token, secret=SECRET, streaming="draft")})
        self._runner = web.AppRunner(build_app(settings, tunings={"telegram": TelegramTuning()},
                                               speaking=self.speech), shutdown_timeout=1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}{WEBHOOK_PATH}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await self.telegram.stop()

    async def say(self, http: aiohttp.ClientSession, text: str, timed: bool = True) -> None:
        before = len(self.telegram.calls)
        posted = time.monotonic()
        async with http.post(self.url, data=BytesIO(json.dumps(update(self._next, text))
                                                    .encode()),
                             headers={"Content-Type": "application/json",
                                      SECRET_HEADER: SECRET}) as reply:
            assert reply.status == 200
        self._next += 1
        wanted = "sendVoice" if self.speaks and timed else "sendMessage"
        async with asyncio.timeout(120):
            # The fake's calls are plain state (no event to wait on).
            while not any(c.method == wanted for c in self.telegram.calls[before:]):  # noqa: ASYNC110
                await asyncio.sleep(0.005)
        mine = self.telegram.calls[before:]
        if not timed:
            return
        self.first_words.append(next(c for c in mine if c.method in SHOWN).time - posted)
        if self.speaks:
            message = next(c for c in mine if c.method == "sendMessage")
            voice = next(c for c in mine if c.method == "sendVoice")
            self.voice_after.append(voice.time - message.time)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--tps", type=float, default=30.0)
    parser.add_argument("--tokens", type=int, default=120)
    parser.add_argument("--speak-delay", type=float, default=0.5)
    args = parser.parse_args()
    answer = " ".join(["lorem"] * (args.tokens // 2))
    async with FakeOllama() as ollama:
        ollama.default_reply = lambda body: Reply(content=answer, tokens_per_second=args.tps)
        with tempfile.TemporaryDirectory() as on_dir, tempfile.TemporaryDirectory() as off_dir:
            sides = [Side(True, ollama, on_dir, args.speak_delay),
                     Side(False, ollama, off_dir, args.speak_delay)]
            for side in sides:
                await side.start()
            try:
                async with aiohttp.ClientSession() as http:
                    await sides[0].say(http, "/voice on", timed=False)
                    await sides[1].say(http, "/voice", timed=False)
                    for number in range(args.rounds):
                        for side in sides if number % 2 else reversed(sides):
                            await side.say(http, f"question {number}")
            finally:
                for side in sides:
                    await side.stop()
    on, off = sides
    p50_on, p50_off = statistics.median(on.first_words), statistics.median(off.first_words)
    print(f"{args.rounds} replies each ({args.tokens} tokens at {args.tps:g} tokens/s, "
          f"streamed into drafts; speech taking {args.speak_delay:g} s per voice note)")
    print(f"  first visible words: speech on p50 {p50_on * 1000:.0f} ms, speech off p50 "
          f"{p50_off * 1000:.0f} ms: {p50_on / p50_off:.3f}x (goal 1.00x)")
    print(f"  voice note after the reply's message: p50 "
          f"{statistics.median(on.voice_after) * 1000:.0f} ms (the speech's "
          f"{args.speak_delay * 1000:.0f} ms included)")


if __name__ == "__main__":
    asyncio.run(main())
