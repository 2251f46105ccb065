"""How fast roost acknowledges webhooks, and what it adds to a turn, on an empty store and on a
store holding a year of use. Every figure comes with its baseline from the same run.

    python bench/webhook_load.py                 # everything, a year at full scale
    python bench/webhook_load.py --scale 0.1     # a tenth of the year (3,000 -> 300 ...)
    python bench/webhook_load.py --skip-year --turns 100
    python bench/webhook_load.py --channel whatsapp --skip-year --turns 0 --group-turns 0

* **acks**: 2,000 updates from 50 chats posted at concurrency 64 to a bare aiohttp handler
  (reads and parses the body, answers 200), then to roost (`POST /webhooks/telegram`, every
  update fsynced before its 200) on an empty store, then on the year. Acks/s and ack latency
  p50/p99, with ratios to the bare handler and to the empty store. With `--channel whatsapp`
  the same burst is also posted as signed WhatsApp webhooks (one message each, to
  `POST /webhooks/whatsapp`, each signature checked over the raw body), `--rounds` times each
  channel in turn, and the medians are compared (issue 8: no slower than Telegram).
* **year**: 3,000 archived conversations with 100,000 messages and 50,000 dedupe keys of the
  last 14 days, built through the Store's own methods (with fsync switched off while building,
  one `sync` at the end); **cold start** is the time from nothing to a running daemon on it.
* **turn overhead**: one chat, one message at a time, against a fake model that answers at
  once: webhook in -> request at the fake Ollama, and webhook in -> sendMessage, p50 of turns
  1-10 against turns N-9..N; then 20 chats writing at once.

roost (and the bare handler) runs in a child process, as the daemon runs alone in production;
the fakes (the test suite's, tests/fakes, speaking the real wire protocols on 127.0.0.1) and the
sender share this process.
Per-sender pacing (`access.rate_limit`) is set out of reach: it is a limit on people, not a
cost of roost's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from channels.telegram.channel import SECRET_HEADER, WEBHOOK_PATH, TelegramTuning
from channels.whatsapp.channel import WEBHOOK_PATH as WA_WEBHOOK_PATH
from daemon.app.serve import STORE, build_app
from daemon.core.config import Settings
from daemon.core.conversations import Role
from daemon.core.filemodes import make_private
from daemon.store import Store
from daemon.store.search_index import SearchIndex
from tests.fakes.graph import API_VERSION, PHONE_NUMBER_ID, FakeGraph, sign, text_message, webhook
from tests.fakes.ollama import FakeOllama, Reply, echo_reply
from tests.fakes.telegram import FakeTelegram

SECRET = "bench-secret"
FIRST_USER = 2_000_000
# The bench's users have all started the bot (the fake Bot API refuses to write first).
STARTED = range(FIRST_USER, FIRST_USER + 10_000)
APP_SECRET = "bench-app-secret"
FIRST_WA_ID = 972_500_000_000
TUNING = TelegramTuning(album_window=0.3, typing_interval=4.0)
DAY = 86400.0
WARM_FIRST = 90_000_000  # ids of the warm-up messages, one per chat, before the timed burst
WARM_UP = 50  # warm-up calls to the bare handler
WARM_UP_TIMEOUT = 60.0
GRAPH_RATE = 80.0  # calls a second the fake Graph API answers (Meta's default throughput)
# Between one chat's turns: a turn makes two Bot API calls (typing, the reply), and back to
# back they would reach Telegram's flood limit of 30 calls/s, which PTB's AIORateLimiter keeps
# by delaying the reply; that wait is Telegram's limit, not roost's overhead.
TURN_GAP = 0.1


# ---- payloads --------------------------------------------------------------------------------


def update(update_id: int, user: int, text: str) -> dict[str, Any]:
    person = {"id": user, "is_bot": False, "first_name": "Bench"}
    return {"update_id": update_id, "message": {
        "message_id": update_id, "date": int(time.time()), "text": text,
        "from": person, "chat": {"id": user, "type": "private", "first_name": "Bench"}}}


def burst(count: int, chats: int, first_id: int) -> list[bytes]:
    return [json.dumps(update(first_id + i, FIRST_USER + i % chats, f"load {i}")).encode()
            for i in range(count)]


def wa_burst(count: int, chats: int, first_id: int) -> list[bytes]:
    """The same burst as WhatsApp webhooks, one message per call as Meta usually sends them."""
    return [webhook(text_message(f"wamid.bench{first_id + i}", str(FIRST_WA_ID + i % chats),
                                 f"load {i}")) for i in range(count)]


@dataclasses.dataclass(frozen=True)
class Door:
    """One channel's webhook: its path and how a body is authenticated."""

    name: str
    path: str
    sign: bool  # WhatsApp: X-Hub-Signature-256 over the body; Telegram: the secret header

    def burst(self, count: int, chats: int, first_id: int) -> list[bytes]:
        return (wa_burst if self.sign else burst)(count, chats, first_id)

    def headers(self, body: bytes) -> dict[str, str]:
        if self.sign:
            return {"Content-Type": "application/json",
                    "X-Hub-Signature-256": sign(APP_SECRET, body)}
        return {"Content-Type": "application/json", SECRET_HEADER: SECRET}


TELEGRAM = Door("telegram", WEBHOOK_PATH, sign=False)
WHATSAPP = Door("whatsapp", WA_WEBHOOK_PATH, sign=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ---- acks ------------------------------------------------------------------------------------


@dataclasses.dataclass
class AckFigures:
    rate: float
    p50: float
    p99: float
    statuses: dict[int, int]
    # CPU the daemon's process used from the first post to the last ack, per ack (with what the
    # drain did meanwhile); steadier than the rate on a loaded machine. None: not measured.
    cpu: float | None = None

    def line(self, name: str, *ratios: tuple[str, float]) -> str:
        extra = "".join(f"  {self.rate / base:5.2f}x {label}" for label, base in ratios)
        bad = {s: n for s, n in self.statuses.items() if s != 200}
        cpu = f"  CPU {self.cpu * 1000:5.3f} ms/ack" if self.cpu is not None else ""
        return (f"  {name:<38} {self.rate:8.1f} acks/s  p50 {self.p50 * 1000:8.1f} ms  "
                f"p99 {self.p99 * 1000:8.1f} ms{cpu}{extra}"
                f"{f'  non-200: {bad}' if bad else ''}")


async def post_all(url: str, bodies: list[bytes], concurrency: int,
                   door: Door = TELEGRAM) -> AckFigures:
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    # Signed before the clock starts: the sender's work is not roost's.
    queue = [(body, door.headers(body)) for body in reversed(bodies)]
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as http:
        async def client() -> None:
            while queue:
                body, headers = queue.pop()
                started = time.perf_counter()
                async with http.post(url, data=body, headers=headers) as reply:
                    await reply.read()
                    statuses[reply.status] = statuses.get(reply.status, 0) + 1
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return AckFigures(len(bodies) / elapsed, percentile(latencies, 0.5),
                      percentile(latencies, 0.99), statuses)


async def bare_handler(bodies: list[bytes], concurrency: int,
                       door: Door = TELEGRAM) -> AckFigures:
    async with daemon({"kind": "bare", "path": door.path}) as served:
        await post_all(served.url + door.path, door.burst(WARM_UP, WARM_UP, WARM_FIRST),
                       concurrency, door)
        return await post_all(served.url + door.path, bodies, concurrency, door)


@dataclasses.dataclass(frozen=True)
class Fakes:
    """Where the fakes listen, as plain values: the daemon runs in a process of its own."""

    telegram_api: str
    telegram_files: str
    telegram_token: str
    ollama: str
    graph: str | None = None  # WhatsApp on, against this fake Graph API
    graph_token: str | None = None

    @classmethod
    def of(cls, telegram: FakeTelegram, ollama: FakeOllama,
           graph: FakeGraph | None = None) -> Fakes:
        return cls(telegram.api_base, telegram.file_base, telegram.token, ollama.url,
                   graph.url if graph else None, graph.token if graph else None)


def settings_for(state_dir: Path, fakes: Fakes, chats: int) -> Settings:
    base = Settings.defaults(env={"STATE_DIRECTORY": str(state_dir)})
    whatsapp = base.platforms["whatsapp"]
    if fakes.graph is not None:
        whatsapp = dataclasses.replace(
            whatsapp, enabled=True, phone_number_id=PHONE_NUMBER_ID, api_base=fakes.graph,
            api_version=API_VERSION, token=fakes.graph_token, app_secret=APP_SECRET,
            verify_token="bench-verify", allow=tuple(str(FIRST_WA_ID + i) for i in range(chats)))
    return dataclasses.replace(
        base,
        daemon=dataclasses.replace(base.daemon, state_dir=state_dir),
        # Pacing off: a bench sender writes faster than `access.rate_limit` allows a person,
        # and the figures are roost's speed, not the limit's (at 20 a minute, 500 turns of
        # one chat would take 25 minutes and the backlog a minute per 20 messages a chat).
        access=dataclasses.replace(base.access, rate_limit=1_000_000),
        model=dataclasses.replace(base.model, host=fakes.ollama, retry_backoff=0.05),
        platforms={**base.platforms, "telegram": dataclasses.replace(
            base.platforms["telegram"], enabled=True, mode="webhook",
            webhook_url="https://bot.example.org/webhooks/telegram",
            api_base=fakes.telegram_api, file_base=fakes.telegram_files,
            token=fakes.telegram_token, secret=SECRET,
            allow=tuple(FIRST_USER + i for i in range(chats))),
            "whatsapp": whatsapp})


# ---- the daemon's process ----------------------------------------------------------------------
# roost (or the bare handler) runs in a process of its own, as in production, where Telegram's
# and Meta's servers are not in the daemon's process: here the fakes and the sender share the
# bench's process, and their work (hundreds of Graph or Bot API calls during a burst) is not
# counted as roost's.

STATE_PATH = "/bench/state"  # the child's: is anything on its way, and its CPU time so far


@dataclasses.dataclass(frozen=True)
class Served:
    url: str
    cold: float  # seconds from nothing to the webhook served

    async def pending(self, http: aiohttp.ClientSession) -> bool:
        """Whether any payload, inbox message or reply is still on its way."""
        return bool((await self._state(http))["pending"])

    async def cpu(self, http: aiohttp.ClientSession) -> float:
        """CPU seconds the daemon's process has used so far, all its threads."""
        return float((await self._state(http))["cpu"])

    async def _state(self, http: aiohttp.ClientSession) -> dict[str, Any]:
        async with http.get(self.url + STATE_PATH) as reply:
            state: dict[str, Any] = await reply.json()
            return state


@contextlib.asynccontextmanager
async def daemon(spec: dict[str, Any], stop: bool = True) -> AsyncIterator[Served]:
    """Run `serve(spec)` in a child process for the duration of the block; at its end the
    child stops as the daemon does, or is killed (`stop=False`: what it had not done is of no
    more use)."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve", json.dumps(spec),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    try:
        ready = json.loads(await asyncio.wait_for(child.stdout.readline(), 120))
        yield Served(f"http://127.0.0.1:{ready['port']}", ready["cold"])
    finally:
        if not stop:
            child.kill()
        child.stdin.close()  # the child stops when its stdin closes
        try:
            await asyncio.wait_for(child.wait(), 60)
        except TimeoutError:
            child.kill()
            await child.wait()


async def drain(served: Served, http: aiohttp.ClientSession, within: float) -> float:
    """Seconds until nothing is on its way any more; inf if not `within` seconds."""
    started = time.perf_counter()
    while time.perf_counter() - started < within:
        if not await served.pending(http):
            return time.perf_counter() - started
        await asyncio.sleep(0.05)
    return float("inf")


def roost_spec(state_dir: Path, fakes: Fakes, chats: int) -> dict[str, Any]:
    return {"kind": "roost", "state_dir": str(state_dir), "fakes": dataclasses.asdict(fakes),
            "chats": chats}


async def serve(spec: dict[str, Any]) -> None:
    """The child's side: serve until stdin closes, having printed the port and cold start."""
    if spec["kind"] == "bare":
        async def handle(request: web.Request) -> web.Response:
            json.loads(await request.read())
            return web.Response(status=200)

        app = web.Application()
        app.router.add_post(spec["path"], handle)
    else:
        settings = settings_for(Path(spec["state_dir"]), Fakes(**spec["fakes"]), spec["chats"])
        app = build_app(settings, tunings={"telegram": TUNING})

        async def state(request: web.Request) -> web.Response:
            store = request.app[STORE]
            busy = (store.updates_pending("telegram") or store.updates_pending("whatsapp")
                    or store.inbox_pending() or store.outbox_pending())
            return web.json_response({"pending": bool(busy), "cpu": time.process_time()})

        app.router.add_get(STATE_PATH, state)
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    started = time.perf_counter()
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    cold = time.perf_counter() - started
    print(json.dumps({"port": runner.addresses[0][1], "cold": cold}), flush=True)
    try:
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    finally:
        await runner.cleanup()


async def roost_acks(state_dir: Path, bodies: list[bytes], chats: int, concurrency: int,
                     drain_timeout: float | None, door: Door = TELEGRAM,
                     model_delay: float = 0.0) -> tuple[AckFigures, float, float]:
    """Ack figures, cold start, and how long after the last ack every message was answered
    (the backlog drained) with a fake model that answers at once, or after `model_delay`
    seconds; inf if not in time, nan if not waited for (`drain_timeout` None: the daemon is
    killed after the last ack)."""
    # The Graph API answers at Meta's default throughput for a number (80 messages a second),
    # as python-telegram-bot paces the Bot API (30 a second).
    async with FakeTelegram(started=STARTED) as telegram, FakeOllama() as ollama, \
            FakeGraph(rate=GRAPH_RATE) as graph:
        fakes = Fakes.of(telegram, ollama, graph if door.sign else None)

        def counts() -> tuple[int, int]:
            """Replies, and typing (Telegram) or read and typing (WhatsApp) calls so far."""
            if door.sign:
                return len(graph.sent), len(graph.calls_of("read"))
            return (len(telegram.calls_to("sendMessage")),
                    len(telegram.calls_to("sendChatAction")))

        async with daemon(roost_spec(state_dir, fakes, chats),
                          stop=drain_timeout is not None) as served, \
                aiohttp.ClientSession() as http:
            # A daemon runs for months: the first requests' one-off costs (imports, pools,
            # connections) are left out, as are these messages' answers.
            await post_all(served.url + door.path, door.burst(chats, chats, WARM_FIRST),
                           concurrency, door)
            if await drain(served, http, WARM_UP_TIMEOUT) == float("inf"):
                raise SystemExit("the warm-up was not answered in time")
            warm = counts()
            if model_delay:
                ollama.default_reply = lambda body: Reply(content=echo_reply(body).content,
                                                          delay=model_delay)
            cpu = await served.cpu(http)
            figures = await post_all(served.url + door.path, bodies, concurrency, door)
            figures.cpu = (await served.cpu(http) - cpu) / len(bodies)
            if drain_timeout is None:
                return figures, served.cold, float("nan")
            drained = await drain(served, http, drain_timeout)
            calls = counts()
    replies, typing = (after - before for after, before in zip(calls, warm, strict=True))
    what = ("read and typing calls" if door.sign else "typing actions; Telegram's flood limit, "
            "kept by PTB's rate limiter, is 30 calls/s")
    print(f"  (the drain sent {replies} replies and {typing} {what})")
    return figures, served.cold, drained


# ---- a year of data --------------------------------------------------------------------------


@contextlib.contextmanager
def no_fsync() -> Iterator[None]:
    """Building the year is set-up, not what is measured: no fsync per write, one sync after."""
    real = os.fsync
    os.fsync = lambda fd: None
    try:
        yield
    finally:
        os.fsync = real
        os.sync()


def build_year(state_dir: Path, scale: float) -> dict[str, int]:
    rng = random.Random(12)
    conversations = int(3000 * scale)
    messages = int(100_000 * scale)
    keys = int(50_000 * scale)
    per_conversation = max(messages // max(conversations, 1), 1)
    now = time.time()
    start = now - 365 * DAY
    with no_fsync(), Store.open(state_dir) as store:
        for c in range(conversations):
            created = start + c * (365 * DAY - 15 * DAY) / max(conversations, 1)
            chat = f"telegram:{3_000_000 + c % 300}"
            conversation = store.create_conversation(chat, created)
            for m in range(per_conversation):
                role: Role = "user" if m % 2 == 0 else "assistant"
                text = f"year message {m} of conversation {c}: " + "lorem ipsum " * rng.randint(
                    3, 40)
                store.append_message(conversation.id, role, text, created=created + m * 60)
            store.save_conversation(conversation.touched(created + per_conversation * 60)
                                    .archived("idle"))
        for k in range(keys):
            store.dedupe_claim(f"telegram:update:{10**9 + k}", now - 14 * DAY * (1 - k / keys))
        # A year-old install has its search index; building it is the first start's work.
        index = SearchIndex.open(state_dir / "memory.sqlite3")
        index.sync(store)
        index.close()
    return {"conversations": conversations, "messages": per_conversation * conversations,
            "keys": keys}


# ---- turn overhead ---------------------------------------------------------------------------


@dataclasses.dataclass
class Turn:
    to_model: float
    total: float


async def one_chat_turns(state_dir: Path, turns: int, gap: float = TURN_GAP) -> list[Turn]:
    async with FakeTelegram(started=STARTED) as telegram, FakeOllama() as ollama:
        spec = roost_spec(state_dir, Fakes.of(telegram, ollama), 1)
        async with daemon(spec) as served:
            url = served.url
            results = []
            async with aiohttp.ClientSession() as http:
                for i in range(1, turns + 1):
                    marker = f"turn {i} marker"
                    body = json.dumps(update(5_000_000 + i, FIRST_USER, marker)).encode()
                    posted = time.monotonic()
                    async with http.post(url + WEBHOOK_PATH, data=body, headers={
                            "Content-Type": "application/json", SECRET_HEADER: SECRET}) as r:
                        assert r.status == 200, r.status
                    sent = await telegram.wait_for("sendMessage", count=i, timeout=60)
                    results.append(Turn(model_time(ollama, marker) - posted,
                                        sent[i - 1].time - posted))
                    await asyncio.sleep(gap)
            return results


def model_time(ollama: FakeOllama, marker: str) -> float:
    for request in ollama.requests:
        if request.path == "/api/chat" and request.body and marker in json.dumps(
                request.body.get("messages", [])[-1:]):
            return request.time
    return float("nan")


async def many_chat_turns(state_dir: Path, chats: int, turns: int) -> list[list[float]]:
    """Per round r: the in->sendMessage times of every chat's r-th message, all sent at once."""
    async with FakeTelegram(started=STARTED) as telegram, FakeOllama() as ollama:
        spec = roost_spec(state_dir, Fakes.of(telegram, ollama), chats)
        async with daemon(spec) as served:
            url = served.url
            rounds = []
            async with aiohttp.ClientSession() as http:
                for r in range(1, turns + 1):
                    posted = time.monotonic()

                    async def send(c: int, r: int = r) -> None:
                        body = json.dumps(update(6_000_000 + r * chats + c, FIRST_USER + c,
                                                 f"round {r} chat {c}")).encode()
                        async with http.post(url + WEBHOOK_PATH, data=body, headers={
                                "Content-Type": "application/json", SECRET_HEADER: SECRET}) as x:
                            assert x.status == 200, x.status

                    await asyncio.gather(*(send(c) for c in range(chats)))
                    sent = await telegram.wait_for("sendMessage", count=r * chats, timeout=120)
                    rounds.append([c.time - posted for c in sent[(r - 1) * chats:r * chats]])
            return rounds


def p50_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


# ---- main ------------------------------------------------------------------------------------


async def whatsapp_acks(state: Callable[[str], Path], args: argparse.Namespace, label: str,
                        telegram: AckFigures, rounds: int, drain_each: bool) -> None:
    """WhatsApp's acks beside Telegram's (`telegram`, from this run): one run with its drain,
    then `rounds` rounds of one run of each channel, taken in turn (the order alternating) so
    that a change in the machine's load falls on both, and the medians compared. Without
    `drain_each` a round's daemons are killed after their last ack."""
    def bodies(door: Door, round_: int) -> list[bytes]:
        # New ids each round: on a state the rounds share (the year) they are new messages.
        return door.burst(args.updates, args.chats, 1 + round_ * args.updates)

    bare = await bare_handler(bodies(WHATSAPP, 0), args.concurrency, WHATSAPP)
    print(bare.line("bare handler, WhatsApp bodies"))
    first, _, drained = await roost_acks(state("whatsapp"), bodies(WHATSAPP, 0), args.chats,
                                         args.concurrency, args.drain_timeout, WHATSAPP,
                                         args.model_delay)
    print(first.line(f"roost WhatsApp, {label}", ("bare", bare.rate),
                     ("Telegram", telegram.rate)))
    print(f"  backlog of {args.updates} drained {drained:.1f} s after the last ack")
    runs: dict[Door, list[AckFigures]] = {TELEGRAM: [], WHATSAPP: []}
    for round_ in range(1, rounds + 1):
        for door in (TELEGRAM, WHATSAPP) if round_ % 2 else (WHATSAPP, TELEGRAM):
            figures, _, _ = await roost_acks(
                state(f"{door.name}-{round_}"), bodies(door, round_), args.chats,
                args.concurrency,
                args.drain_timeout if drain_each else None, door, args.model_delay)
            print(figures.line(f"  round {round_}, {door.name}"))
            runs[door].append(figures)

    def ratio(field: str) -> str:
        wa, tg = (statistics.median(getattr(run, field) for run in runs[door])
                  for door in (WHATSAPP, TELEGRAM))
        return f"{wa / tg:.2f}x"

    paired = [wa.rate / tg.rate for wa, tg in zip(runs[WHATSAPP], runs[TELEGRAM], strict=True)]
    print(f"  WhatsApp/Telegram, medians of {rounds} rounds ({label}): acks/s {ratio('rate')}, "
          f"ack p50 {ratio('p50')}, p99 {ratio('p99')}, CPU per ack {ratio('cpu')}")
    print(f"  WhatsApp/Telegram acks/s within each round (the two runs side by side): median "
          f"{statistics.median(paired):.2f}x, geometric mean "
          f"{statistics.geometric_mean(paired):.2f}x; WhatsApp faster in "
          f"{sum(r > 1 for r in paired)} of {rounds}")


async def main(args: argparse.Namespace) -> None:
    make_private()  # the state this bench builds is made as roost makes it
    bodies = burst(args.updates, args.chats, 1)
    whatsapp = args.channel == "whatsapp"
    print(f"acks: {args.updates} updates from {args.chats} chats, concurrency {args.concurrency}")
    bare = await bare_handler(bodies, args.concurrency)
    print(bare.line("bare aiohttp handler"))
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        empty, cold_empty, drain = await roost_acks(Path(tmp) / "empty", bodies, args.chats,
                                                    args.concurrency, args.drain_timeout,
                                                    model_delay=args.model_delay)
        print(empty.line("roost, empty store", ("bare", bare.rate)))
        print(f"  backlog of {args.updates} drained {drain:.1f} s after the last ack")
        if whatsapp:
            await whatsapp_acks(lambda name: Path(tmp) / f"empty-{name}", args, "empty store",
                                empty, args.rounds, drain_each=False)
        year_state = Path(tmp) / "year"
        if not args.skip_year:
            started = time.perf_counter()
            built = build_year(year_state, args.scale)
            print(f"year (scale {args.scale}): {built['conversations']} archived conversations, "
                  f"{built['messages']} messages, {built['keys']} dedupe keys; built in "
                  f"{time.perf_counter() - started:.0f} s")
            year, cold_year, drain = await roost_acks(year_state, bodies, args.chats,
                                                      args.concurrency, args.drain_timeout,
                                                      model_delay=args.model_delay)
            print(year.line("roost, a year of data", ("bare", bare.rate),
                            ("empty", empty.rate)))
            print(f"  backlog of {args.updates} drained {drain:.1f} s after the last ack")
            print(f"  ack p50 year/empty: {year.p50 / empty.p50:.2f}x")
            if whatsapp:
                # Each run adds its 2,000 messages to the year: a few percent of it.
                await whatsapp_acks(lambda name: year_state, args, "a year of data", year,
                                    max(1, args.rounds // 4), drain_each=True)
            print(f"cold start (store, Telegram, engine; until the webhook is served): "
                  f"empty store {cold_empty:.2f} s, a year of data {cold_year:.2f} s")
        states = [("empty", Path(tmp) / "turns-empty")]
        if not args.skip_year:
            states.append(("year", year_state))
        if args.turns:
            print(f"turn overhead, one chat, {args.turns} turns (fake model answers at once):")
        for name, state in states if args.turns else []:
            turns = await one_chat_turns(state, args.turns)
            head, tail = turns[:10], turns[-10:]
            h_model, t_model = p50_ms([t.to_model for t in head]), p50_ms(
                [t.to_model for t in tail])
            h_total, t_total = p50_ms([t.total for t in head]), p50_ms([t.total for t in tail])
            tail_label = f"turns {args.turns - 9}-{args.turns}"
            print(f"  {name:<6} in->model p50 turns 1-10 {h_model:7.1f} ms, "
                  f"{tail_label} {t_model:7.1f} ms ({t_model / h_model:.2f}x)"
                  f";  in->sendMessage {h_total:7.1f} ms -> {t_total:7.1f} ms "
                  f"({t_total / h_total:.2f}x)")
        if args.group_turns:
            rounds = await many_chat_turns(Path(tmp) / "group", 20, args.group_turns)
            first = p50_ms([t for r in rounds[:10] for t in r])
            last = p50_ms([t for r in rounds[-10:] for t in r])
            print(f"turn overhead, 20 chats at once, {args.group_turns} rounds: in->sendMessage "
                  f"p50 rounds 1-10 {first:7.1f} ms, last 10 rounds {last:7.1f} ms "
                  f"({last / first:.2f}x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=2000)
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of a year of data")
    parser.add_argument("--skip-year", action="store_true")
    parser.add_argument("--channel", choices=("telegram", "whatsapp"), default="telegram",
                        help="whatsapp: also WhatsApp's acks, beside Telegram's")
    parser.add_argument("--turns", type=int, default=500, help="0: skip (else at least 10)")
    parser.add_argument("--group-turns", type=int, default=30,
                        help="rounds of 20 chats writing at once (0: skip)")
    parser.add_argument("--drain-timeout", type=float, default=300.0,
                        help="seconds to wait for the backlog after the acks")
    parser.add_argument("--rounds", type=int, default=12,
                        help="with --channel whatsapp: runs of each channel, taken in turn "
                             "(a quarter of them on the year)")
    parser.add_argument("--tmp", default=None, help="where the state directories go")
    parser.add_argument("--model-delay", type=float, default=0.0,
                        help="seconds the fake model takes per answer in the ack runs "
                             "(0: at once)")
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # the daemon's process (internal)
    arguments = parser.parse_args()
    asyncio.run(serve(json.loads(arguments.serve)) if arguments.serve else main(arguments))
