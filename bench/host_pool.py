"""How much of each prompt two Ollama hosts can serve from their caches: roost's pinned routing
against a round-robin balancer in front of them, in one run.

Twenty chats, several turns each, through roost's engine against two fake Ollama hosts (each
takes `ANSWER_S` per answer, as a GPU does). Each chat sends its next message a moment after the
reply to the last one came. Once with `[model] hosts` = the two: roost pins each conversation to
one host (daemon/llm/pool.py). Once with `[model] host` = a loopback round-robin balancer in
front of the same two hosts, which sends each request to the next host, as a generic proxy does.

Ollama keeps a prompt's evaluated tokens on the host that evaluated them. From the requests
each host received (in order), a prompt's tokens count as cached when its leading messages (and
tools) equal those of an earlier request on the same host: the longest such prefix, counted with
the fake's tokenizer. (A real server keeps a few slots, not every earlier prompt: this is the
most either routing could get from the caches, and the same rule for both.) Printed for each:
the requests each host answered, the prompt tokens, the cached share and the tokens evaluated
anew (what costs GPU time), and the ratios of both.

Run from the repository root with the test extra installed: `python bench/host_pool.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.scenario import WORDS
from daemon.app.assembly import assemble
from daemon.core.config import Settings
from daemon.core.config.sections import HostSettings
from daemon.core.messages import Inbound, Outbound
from daemon.llm.client import ModelClient
from daemon.store import Store
from tests.conftest import RecordingChannel
from tests.fakes.ollama import FakeModel, FakeOllama, Reply, echo_reply

CHATS = 20
TURNS = 10
WINDOW = 8192  # room for every turn: no fold changes a prompt's start here
ANSWER_S = 0.05  # seconds a host takes for one answer
PAUSE_S = (0.05, 0.5)  # a person reads the reply and types the next message meanwhile
TOPICS = WORDS[WORDS.index("garden"):]


def slow_echo(body: dict[str, Any]) -> Reply:
    return dataclasses.replace(echo_reply(body), delay=ANSWER_S)


class RoundRobin:
    """A loopback HTTP proxy that sends each request to the next of `upstreams` and streams
    its answer back, as a load balancer in front of Ollama does."""

    def __init__(self, upstreams: list[str]) -> None:
        self.upstreams = itertools.cycle(upstreams)
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None
        self.url = ""

    async def start(self) -> None:
        self._http = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._http is not None
        target = next(self.upstreams) + request.path_qs
        async with self._http.request(request.method, target, data=await request.read(),
                                      headers={"Content-Type": request.content_type}) as up:
            answer = web.StreamResponse(status=up.status, headers={
                "Content-Type": up.headers.get("Content-Type", "application/json")})
            await answer.prepare(request)
            async for chunk in up.content.iter_any():
                await answer.write(chunk)
            await answer.write_eof()
            return answer


class Replies(RecordingChannel):
    """Lets each chat wait for its reply."""

    def __init__(self) -> None:
        super().__init__("telegram")
        self.replies: dict[str, asyncio.Queue[None]] = defaultdict(asyncio.Queue)

    async def send(self, outbound: Outbound) -> None:
        await super().send(outbound)
        if outbound.kind == "reply":
            self.replies[outbound.chat_key].put_nowait(None)


async def chat(engine: Any, channel: Replies, key: str, turns: int) -> None:
    rng = random.Random(key)
    for turn in range(turns):
        await asyncio.sleep(rng.uniform(*PAUSE_S))
        text = f"message {turn} of {key}: " + " ".join(
            TOPICS[(turn * 7 + i + len(key)) % len(TOPICS)] for i in range(60))
        assert await engine.submit(Inbound(chat_key=key, text=text, received=time.time()))
        await asyncio.wait_for(channel.replies[key].get(), 120)


async def run(pinned: bool, turns: int) -> tuple[list[FakeOllama], float]:
    """The chats through roost with the two hosts pinned, or behind the round-robin balancer;
    the hosts (with the requests they received) and the seconds it took."""
    hosts = [FakeOllama([FakeModel(context_length=32768)]) for _ in range(2)]
    balancer = RoundRobin([])
    for host in hosts:
        host.default_reply = slow_echo
        await host.start()
    if not pinned:
        balancer = RoundRobin([h.url for h in hosts])
        await balancer.start()
    with tempfile.TemporaryDirectory() as state:
        base = Settings.defaults(env={"STATE_DIRECTORY": state})
        where: dict[str, Any] = ({"hosts": tuple(HostSettings(h.url) for h in hosts)}
                                 if pinned else {"host": balancer.url})
        settings = dataclasses.replace(base, model=dataclasses.replace(
            base.model, window=WINDOW, think=False, **where))
        store = Store.open(Path(state))
        llm = ModelClient(settings.model)
        channel = Replies()
        engine = assemble(settings, store, llm, {"telegram": channel}).engine
        await engine.start()
        started = time.monotonic()
        try:
            await asyncio.gather(*(chat(engine, channel, f"telegram:{1000 + n}", turns)
                                   for n in range(CHATS)))
            return hosts, time.monotonic() - started
        finally:
            await engine.stop(grace=0)
            await llm.close()
            store.close()
            await balancer.stop()
            for host in hosts:
                await host.stop()


def cached_tokens(host: FakeOllama, earlier: list[dict[str, Any]], body: dict[str, Any]) -> int:
    """Tokens of `body`'s prompt that lead an earlier prompt of the same host too: its longest
    run of leading messages equal to one of theirs, with the tools when they are the same."""
    messages, tools = body.get("messages") or [], body.get("tools")
    best = 0
    for old in earlier:
        if old.get("tools") != tools:
            continue
        shared = 0
        for a, b in zip(old.get("messages") or [], messages[:-1], strict=False):
            if a != b:
                break
            shared += 1
        best = max(best, shared)
    return host.count_tokens(messages[:best], tools) if best else 0


def shares(hosts: list[FakeOllama]) -> tuple[int, int, list[int]]:
    """(prompt tokens, of them cached, requests per host) over every chat request."""
    total = cached = 0
    for host in hosts:
        bodies = host.chat_requests
        for index, body in enumerate(bodies):
            total += host.count_tokens(body.get("messages") or [], body.get("tools"))
            cached += cached_tokens(host, bodies[:index], body)
    return total, cached, [len(h.chat_requests) for h in hosts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=TURNS, help="messages each chat sends")
    turns = parser.parse_args().turns
    print(f"{CHATS} chats x {turns} turns over 2 hosts ({ANSWER_S * 1000:.0f} ms an answer, "
          "model.concurrency 1 each)")
    share_of, uncached_of = {}, {}
    for label, pinned in (("round-robin balancer", False), ("roost, pinned", True)):
        hosts, seconds = asyncio.run(run(pinned, turns))
        total, cached, per_host = shares(hosts)
        share_of[pinned], uncached_of[pinned] = cached / total, total - cached
        print(f"{label:22} requests per host {per_host}  prompt tokens {total:,}  cached "
              f"{cached:,} ({cached / total:.1%})  evaluated anew {total - cached:,}  "
              f"{seconds:.1f} s")
    print(f"cached share, pinned over round-robin: x{share_of[True] / share_of[False]:.2f}; "
          f"tokens evaluated anew, round-robin over pinned: "
          f"x{uncached_of[False] / uncached_of[True]:.2f}")


if __name__ == "__main__":
    main()
