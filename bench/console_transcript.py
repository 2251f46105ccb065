"""The console's page of a 2,000-message conversation: weight (raw and gzipped) and server time
of its first page and of its fold page, side by side with the whole conversation on one page
(the console before paging) in the same run.

    python bench/console_transcript.py                  # 2,000 messages, 10 requests a page
    python bench/console_transcript.py --messages 500 --requests 5

* The conversation is bench/console_pages.py's `build_big` (replies carry their request counts,
  half of it folded), built through the Store's own methods in a temporary state directory.
* **render**: the console's own page renderer (`Console.conversation_html`, templates and
  markdown) called in this process: the latest page, the fold page, and every message at once.
* **served**: the latest and the fold page over HTTP from the console's routes on 127.0.0.1, with
  `Accept-Encoding: gzip`, from the request until the last byte (the median of `--requests`).
* gzip sizes: what the server sent for the paged pages; for the one-page baseline, the same
  page gzipped here at zlib's default level (aiohttp's).

Loopback only; bounded by --messages (at most 20,000) and --requests (at most 100).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import channels.installed  # noqa: F401  (the platforms a chat key may name)
from bench.console_pages import build_big
from daemon.console.conversation_page import Reading
from daemon.console.names import chat_names
from daemon.console.paging import PER_PAGE, transcript_page
from daemon.console.views import conversation_events
from daemon.console.web import COOKIE, Console
from daemon.core.config import Settings
from daemon.core.filemodes import make_private
from daemon.store import Store
from daemon.store.console_keys import OWNER, ConsoleKeys
from daemon.store.event_log import Records

GOAL_BYTES = 200_000  # every page, gzipped


def timed(work: Callable[[], str], count: int) -> tuple[float, str]:
    """The median seconds of `count` calls of `work`, and its last result."""
    times, result = [], ""
    for _ in range(count):
        started = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


async def served(base: str, path: str, token: str, count: int) -> tuple[float, int, int]:
    """Median seconds to the last byte, bytes sent (gzipped) and bytes of the page."""
    times, sent, page = [], 0, 0
    async with aiohttp.ClientSession(cookies={COOKIE: token}, auto_decompress=False) as http:
        for _ in range(count):
            started = time.perf_counter()
            async with http.get(base + path, headers={"Accept-Encoding": "gzip"}) as reply:
                assert reply.status == 200, (path, reply.status)
                assert reply.headers.get("Content-Encoding") == "gzip", path
                body = await reply.read()
            times.append(time.perf_counter() - started)
            sent, page = len(body), len(gzip.decompress(body))
    return statistics.median(times), sent, page


async def main(args: argparse.Namespace) -> None:
    make_private()
    with tempfile.TemporaryDirectory(prefix="roost-transcript-bench-") as tmp:
        state_dir = Path(tmp) / "state"
        state_dir.mkdir(mode=0o700)
        started = time.perf_counter()
        cid = build_big(state_dir, args.messages)
        print(f"a conversation of {args.messages:,} messages, folded through "
              f"{args.messages // 2:,} (built in {time.perf_counter() - started:.1f} s)")
        settings = Settings.defaults(env={"STATE_DIRECTORY": str(state_dir)})
        with Store.open(state_dir) as store:
            console = Console(settings, lambda: store)
            keys = ConsoleKeys(state_dir)
            made = keys.redeem(keys.issue_link((OWNER,), time.time()), time.time())
            assert made is not None
            token, session = made
            conversation = store.get_conversation(cid)
            assert conversation is not None
            messages = store.messages(cid)
            events = conversation_events(Records(state_dir, settings.daemon.tz), conversation)
            reading = Reading(conversation, messages, events)
            names = chat_names(settings.identities, console.people.pairing)
            fold = transcript_page([m.seq for m in messages],
                                   conversation.summary.through_seq, 0).fold
            assert fold is not None
            pages = {"latest page": (0, PER_PAGE),
                     f"fold page ({fold.page})": (fold.page, PER_PAGE),
                     "one page (before)": (0, len(messages))}
            rendered = {}
            for name, (number, per_page) in pages.items():
                def render(number: int = number, per_page: int = per_page) -> str:
                    return console.conversation_html(session, reading, names, number,
                                                     per_page)
                render()  # warm: template compiles
                seconds, html = timed(render, args.requests)
                page = html.encode()
                rendered[name] = (seconds, len(page), len(gzip.compress(page, 6)))

            app = web.Application()
            console.add_routes(app)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            base = f"http://127.0.0.1:{port}/console/c/{cid}"
            try:
                http_figures = {
                    "latest page": await served(base, "", token, args.requests),
                    f"fold page ({fold.page})": await served(base, f"?page={fold.page}",
                                                             token, args.requests)}
            finally:
                await runner.cleanup()

    before = rendered["one page (before)"]
    print(f"{'':22} {'raw':>10} {'gzipped':>10} {'render':>9} {'served':>9}   "
          f"(goal: gzipped < {GOAL_BYTES // 1000} KB)")
    for name, (seconds, raw, packed) in rendered.items():
        took = http_figures.get(name)
        served_ms = f"{took[0] * 1000:7.1f}ms" if took else "        -"
        sent = took[1] if took else packed
        print(f"{name:<22} {raw / 1000:8.1f}KB {sent / 1000:8.1f}KB {seconds * 1000:7.1f}ms "
              f"{served_ms}   ({raw / before[1]:.2f}x the bytes, {seconds / before[0]:.2f}x "
              f"the render time of one page)")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=10)
    args = parser.parse_args(argv)
    args.messages = min(max(args.messages, 2), 20_000)
    args.requests = min(max(args.requests, 1), 100)
    return args


if __name__ == "__main__":
    asyncio.run(main(parse()))
