"""The web console on a year of data: time to first byte of its pages against /healthz in the
same run, and the webhook ack rate with a console page reloaded in a loop beside it.

    python bench/console_pages.py                # a year: 3,000 conversations, 100,000 messages
    python bench/console_pages.py --scale 0.1    # a tenth of it

* The year is bench/webhook_load.py's (built through the Store's own methods), plus one chat's
  conversation of 2,000 messages with a fold, and every reply's recorded request counts.
* **pages**: `--requests` sequential GETs each of /healthz, the conversation list and the
  2,000-message conversation, signed in with a link as `roost console` makes one; time to first
  byte (until the response's headers) p50 / p99, and the ratio to /healthz. Goal: <= 200 ms.
* **acks**: the webhook burst of bench/webhook_load.py posted to roost alone, then again with
  a browser reloading the 2,000-message conversation as fast as it answers; the ratio of the
  two ack rates (goal: within 10%).

roost runs in a child process, as in bench/webhook_load.py; the fakes and the clients share this
process.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.webhook_load import (
    STARTED,
    TELEGRAM,
    WARM_FIRST,
    AckFigures,
    Fakes,
    build_year,
    daemon,
    no_fsync,
    percentile,
    post_all,
    roost_spec,
)
from daemon.core.conversations import SummaryState
from daemon.core.filemodes import make_private
from daemon.store import Store
from daemon.store.console_keys import OWNER, ConsoleKeys
from tests.fakes.ollama import FakeOllama
from tests.fakes.telegram import FakeTelegram

BIG_CHAT = "telegram:2000001"
GOAL_MS = 200.0


def build_big(state_dir: Path, messages: int) -> str:
    """One chat's long conversation: replies carry their request counts, half of it folded."""
    now = time.time() - 7 * 86400
    with no_fsync(), Store.open(state_dir) as store:
        conversation = store.create_conversation(BIG_CHAT, now)
        for m in range(messages):
            if m % 2 == 0:
                store.append_message(conversation.id, "user", f"question {m}: " + "words " * 30,
                                     created=now + m * 30)
            else:
                store.append_message(conversation.id, "assistant", f"answer {m}: " + "text " * 60,
                                     created=now + m * 30,
                                     meta={"prompt_eval_count": 1000 + m % 4000,
                                           "prompt_eval_cached_count": 900, "num_ctx": 8192,
                                           "prompt_tokens": 1200})
        store.save_summary(conversation.id, SummaryState(
            summary="The first half, folded.", through_seq=messages // 2, fold_count=20))
        return conversation.id


async def ttfb(http: aiohttp.ClientSession, url: str, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        async with http.get(url) as reply:
            first_byte = time.perf_counter() - started
            assert reply.status == 200, (url, reply.status)
            await reply.read()
        times.append(first_byte)
    return times


async def signed_in(base: str, state_dir: Path) -> aiohttp.ClientSession:
    http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    link = ConsoleKeys(state_dir).issue_link((OWNER,), time.time())
    async with http.post(f"{base}/console/login", data={"t": link},
                         allow_redirects=False) as reply:
        assert reply.status == 303, reply.status
    return http


async def reload_loop(http: aiohttp.ClientSession, url: str, stop: asyncio.Event,
                      limit: float) -> int:
    """Reload `url` until `stop` (or `limit` seconds); how many times it answered."""
    count = 0
    ends = time.perf_counter() + limit
    while not stop.is_set() and time.perf_counter() < ends:
        async with http.get(url) as reply:
            await reply.read()
        count += 1
    return count


async def main(args: argparse.Namespace) -> None:
    make_private()
    with tempfile.TemporaryDirectory(prefix="roost-console-bench-") as tmp:
        state_dir = Path(tmp) / "state"
        started = time.perf_counter()
        year = build_year(state_dir, args.scale)
        big = build_big(state_dir, args.big)
        print(f"year: {year['conversations']:,} conversations, {year['messages']:,} messages, "
              f"plus one of {args.big:,} messages (built in {time.perf_counter() - started:.0f} s)")
        async with FakeTelegram(started=STARTED) as telegram, FakeOllama() as ollama:
            spec = roost_spec(state_dir, Fakes.of(telegram, ollama), args.chats)
            async with daemon(spec) as served:
                http = await signed_in(served.url, state_dir)
                async with http:
                    pages = {"/healthz": "/healthz", "conversation list": "/console/",
                             f"a {args.big:,}-message conversation": f"/console/c/{big}"}
                    for path in pages.values():  # warm: first imports and template compiles
                        await ttfb(http, served.url + path, 3)
                    figures = {name: await ttfb(http, served.url + path, args.requests)
                               for name, path in pages.items()}
                    base = statistics.median(figures["/healthz"])
                    print(f"pages (time to first byte, {args.requests} requests each, goal "
                          f"<= {GOAL_MS:.0f} ms):")
                    for name, times in figures.items():
                        p50, p99 = percentile(times, 0.5), percentile(times, 0.99)
                        print(f"  {name:<34} p50 {p50 * 1000:7.1f} ms  p99 {p99 * 1000:7.1f} ms"
                              f"  {p50 / base:6.1f}x /healthz")
                    alone, beside, reloads = await acks(served.url, http, big, args)
        print(f"acks ({args.burst:,} updates, concurrency {args.concurrency}):")
        print(alone.line("roost alone"))
        print(beside.line(f"with the console reloaded ({reloads} times)",
                          ("of alone", alone.rate)))


async def acks(base: str, http: aiohttp.ClientSession, big: str,
               args: argparse.Namespace) -> tuple[AckFigures, AckFigures, int]:
    door = base + TELEGRAM.path
    await post_all(door, TELEGRAM.burst(args.chats, args.chats, WARM_FIRST), args.concurrency)
    alone = await post_all(door, TELEGRAM.burst(args.burst, args.chats, 10**8),
                           args.concurrency)
    stop = asyncio.Event()
    loop = asyncio.create_task(reload_loop(http, f"{base}/console/c/{big}", stop, 300.0))
    beside = await post_all(door, TELEGRAM.burst(args.burst, args.chats, 2 * 10**8),
                            args.concurrency)
    stop.set()
    return alone, beside, await loop


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="of the year (1.0: 100,000)")
    parser.add_argument("--big", type=int, default=2000, help="messages in the long one")
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--burst", type=int, default=1000, help="webhook updates per run")
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=32)
    asyncio.run(main(parser.parse_args()))
