"""How much of an automation's prompt Ollama can reuse: from the previous run, across a restart,
and from a chat on another channel.

Runs one hourly automation 24 times over a simulated day (a controllable clock) through the real
scheduler's run path against the fake Ollama, and prints per run: the prompt tokens (the fake's
tokenizer) and the share of the prompt that repeats the previous run's leading tokens (what
Ollama's prompt cache reuses; target >= 0.95). Beside it, the same figures for a naive build that
puts the current time in the system prompt instead of at the very end.

Then, in the same run, two figures against the old layout (the `<channel>` note inside the system
message, the memory map counted from what the process sees stored when it makes its first
request of the day), rebuilt from the very requests roost sent:

* two runs on one day across a restart (a chat and a run, stop, start, a run): the share of the
  second run's prompt that repeats the first's leading bytes (target >= 0.99);
* the first request of a Telegram chat, a WhatsApp chat, the console and an automation run: the
  leading bytes each pair shares, and whether that covers the whole system message and tools.

Run from the repository root with the test extra installed: `python bench/automation_prefix.py`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import sys
import tempfile
from datetime import date, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from daemon.context.prefix import CORE_PROMPT, MemoryMap, channel_note, memory_map_text
from daemon.core.config import Settings
from daemon.core.messages import Inbound
from daemon.store import StoreStats
from tests.automations.conftest import TZ, Clock, Daemon, at, automation
from tests.conftest import RecordingChannel
from tests.fakes.ollama import FakeOllama

PROMPT = ("Check what I asked you to keep an eye on and report anything new since the last "
          "hour, in at most five bullet points.")


def rendered(body: dict[str, Any]) -> bytes:
    """The prompt roughly as a chat template lays it out: tools first, then each message. (A
    template that puts the tools after the system text, as qwen3's does, leaves the naive build
    even less to reuse: its clock then comes before them.)"""
    parts = [json.dumps(body.get("tools") or [], sort_keys=True)]
    parts += [f"<|{m['role']}|>\n{m.get('content') or ''}\n" for m in body["messages"]]
    return "".join(parts).encode("utf-8")


def rendered_system_first(body: dict[str, Any]) -> bytes:
    """The layout of qwen3's template: the system text, then the tools, then the messages."""
    messages = body["messages"]
    parts = [f"<|{messages[0]['role']}|>\n{messages[0].get('content') or ''}\n",
             json.dumps(body.get("tools") or [], sort_keys=True)]
    parts += [f"<|{m['role']}|>\n{m.get('content') or ''}\n" for m in messages[1:]]
    return "".join(parts).encode("utf-8")


LAYOUTS = (("tools first", rendered), ("system text first, as qwen3", rendered_system_first))


def shared_share(previous: bytes | None, current: bytes) -> float:
    """Share of `current` that repeats `previous`'s leading bytes (the fake counts a token per
    three bytes, so this is the token share too)."""
    if previous is None:
        return 0.0
    return shared_bytes(previous, current) / len(current)


def shared_bytes(a: bytes, b: bytes) -> int:
    same = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        same += 1
    return same


def old_layout(body: dict[str, Any], kind: str, stats: StoreStats | None = None,
               automations: int = 1) -> dict[str, Any]:
    """The request as roost built it before one prefix for all: the channel's note in the
    system message after the core prompt, and (given `stats`, what the process saw stored when
    it first built that day's map) the memory map counted from them."""
    note = channel_note(kind)
    system, first, *rest = body["messages"]
    content = str(system["content"]).replace(CORE_PROMPT, f"{CORE_PROMPT}\n\n{note}", 1)
    if stats is not None:
        day = TODAY
        memory = MemoryMap(
            day=day, conversations=stats.conversations, messages=stats.messages,
            summaries=stats.summaries, automations=automations,
            first_day=datetime.fromtimestamp(stats.first, TZ).date() if stats.first else None,
            last_day=datetime.fromtimestamp(stats.last, TZ).date() if stats.last else None)
        start = content.index("<memory_map>\n") + len("<memory_map>\n")
        end = content.index("\n</memory_map>")
        # The old text said "1 conversations"; the singular changes no byte count that matters.
        content = content[:start] + memory_map_text(memory) + content[end:]
    opening = str(first["content"]).replace(f"\n\n{note}", "", 1)
    return {**body, "messages": [{**system, "content": content},
                                 {**first, "content": opening}, *rest]}


def naive(body: dict[str, Any], stamp: str) -> dict[str, Any]:
    """The request in the old layout with the clock in the system prompt, the prompt bare."""
    old = old_layout(body, "automation")
    system, user = old["messages"][0], old["messages"][-1]
    return {**old, "messages": [
        {**system, "content": f"Current date and time: {stamp}\n\n{system['content']}"},
        {**user, "content": PROMPT}]}


TODAY = date(2026, 12, 1)
CHATS = ("telegram:1111111", "whatsapp:972544401243", "console:local")


async def main() -> None:
    # The bench's chats have no Telegram or WhatsApp to send to: their replies wait, and say so.
    logging.getLogger("roost").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="roost-bench-") as tmp:
        bodies, stamps, fake = await simulate_day(Path(tmp) / "day")
        report(bodies, stamps, fake)
        report_restart(*await across_a_restart(Path(tmp) / "restart"))
        report_channels(await across_channels(Path(tmp) / "channels"))


def bench_settings(state: Path, url: str) -> Settings:
    base = Settings.defaults(env={"STATE_DIRECTORY": str(state)})
    return dataclasses.replace(
        base, daemon=dataclasses.replace(base.daemon, timezone="Europe/Berlin"),
        model=dataclasses.replace(base.model, host=url),
        automations=(automation("hourly", "0 * * * *", prompt=PROMPT),))


async def chat(daemon: Daemon, fake: FakeOllama, chat_key: str, text: str) -> None:
    """One message from a user on `chat_key`, answered (the reply waits in its outbox: the
    bench has no Telegram or WhatsApp, only their requests to the model matter here)."""
    assert daemon.engine is not None
    count = len(fake.chat_requests)
    await daemon.engine.submit(Inbound(chat_key=chat_key, text=text, received=daemon.clock()))
    async with asyncio.timeout(30):
        while len(fake.chat_requests) == count:  # noqa: ASYNC110 (the fake has no event)
            await asyncio.sleep(0.01)
        await daemon.engine.wait_idle(chat_key)


async def across_a_restart(state: Path) -> tuple[list[dict[str, Any]], list[StoreStats]]:
    """Yesterday a chat and a run; today a chat and the 10:00 run, a restart, the 11:00 run.
    The two runs of today, and what each process saw stored at its first request today."""
    async with FakeOllama() as fake:
        settings = bench_settings(state, fake.url)
        daemon = Daemon(settings, Clock(at(2026, 11, 30, 19, 30)), RecordingChannel())
        automations = await daemon.start()
        await chat(daemon, fake, "telegram:1111111", "What is on tomorrow?")
        daemon.clock.set(at(2026, 11, 30, 20, 0, 2))
        await automations.fire("hourly")
        daemon.clock.set(at(2026, 12, 1, 9, 30))
        assert daemon.store is not None
        seen = [daemon.store.stats()]  # the old map: what this process sees at 09:30
        await chat(daemon, fake, "telegram:1111111", "Good morning!")
        daemon.clock.set(at(2026, 12, 1, 10, 0, 2))
        await automations.fire("hourly")
        first_run = fake.chat_requests[-1]
        await daemon.stop()
        restarted = Daemon(settings, Clock(at(2026, 12, 1, 10, 59)), RecordingChannel())
        automations = await restarted.start()
        assert restarted.store is not None
        seen.append(restarted.store.stats())  # ... and what the restarted one sees at 11:00
        restarted.clock.set(at(2026, 12, 1, 11, 0, 2))
        await automations.fire("hourly")
        second_run = fake.chat_requests[-1]
        await restarted.stop()
    return [first_run, second_run], seen


def report_restart(runs: list[dict[str, Any]], seen: list[StoreStats]) -> None:
    first, second = runs
    olds = [old_layout(first, "automation", seen[0]), old_layout(second, "automation", seen[1])]
    print()
    print("two runs on one day across a restart (10:00, restart, 11:00):")
    for label, render in LAYOUTS:
        now_b, old_b = render(second), render(olds[1])
        share_now = shared_share(render(first), now_b)
        share_old = shared_share(render(olds[0]), old_b)
        print(f"  {label}: reused share of the 11:00 prompt: roost {share_now:.3f} "
              f"(target >= 0.99), old layout {share_old:.3f} (ratio {share_now / share_old:.2f}x);"
              f" new tokens ~{math.ceil(len(now_b) * (1 - share_now) / 3)} vs "
              f"~{math.ceil(len(old_b) * (1 - share_old) / 3)}")


async def across_channels(state: Path) -> dict[str, dict[str, Any]]:
    """The first request of a chat on each channel and of an automation run, on one day."""
    async with FakeOllama() as fake:
        # Past the 08:00 slot's grace: nothing runs at start.
        daemon = Daemon(bench_settings(state, fake.url), Clock(at(2026, 12, 1, 8, 20)),
                        RecordingChannel())
        automations = await daemon.start()
        firsts: dict[str, dict[str, Any]] = {}
        for minute, chat_key in enumerate(CHATS, 21):
            daemon.clock.set(at(2026, 12, 1, 8, minute))
            await chat(daemon, fake, chat_key, "What is new today?")
            firsts[chat_key.split(":")[0]] = fake.chat_requests[-1]
        daemon.clock.set(at(2026, 12, 1, 9, 0, 2))
        await automations.fire("hourly")
        firsts["automation"] = fake.chat_requests[-1]
        await daemon.stop()
    return firsts


def report_channels(firsts: dict[str, dict[str, Any]]) -> None:
    kinds = list(firsts)
    system = {json.dumps(b["messages"][0]) for b in firsts.values()}
    tools = {json.dumps(b.get("tools"), sort_keys=True) for b in firsts.values()}
    print()
    print(f"first requests on each channel and of a run (one system message: {len(system) == 1}"
          f", one tool list: {len(tools) == 1}): leading bytes shared, roost / old layout, of the"
          " tools + system message")
    for label, render in LAYOUTS:
        now = {k: render(b) for k, b in firsts.items()}
        old = {k: render(old_layout(b, k)) for k, b in firsts.items()}
        # What one prefix covers: the tools and the system message, as `render` lays them out.
        head = {k: len(render({**b, "messages": b["messages"][:1]})) for k, b in firsts.items()}
        print(f"  {label}:")
        print(f"{'':>14}" + "".join(f"{k:>26}" for k in kinds[1:]))
        ratios, whole = [], True
        for i, a in enumerate(kinds[:-1]):
            cells = [" " * 26] * i
            for b in kinds[i + 1:]:
                same_now, same_old = shared_bytes(now[a], now[b]), shared_bytes(old[a], old[b])
                ratios.append(same_now / same_old)
                whole = whole and same_now >= min(head[a], head[b])
                cell = f"{same_now:,} / {same_old:,} of {min(head[a], head[b]):,}"
                cells.append(f"{cell:>26}")
            print(f"{a:>14}" + "".join(cells))
        print(f"  every pair shares the whole tools + system message: {whole}; shared bytes, "
              f"roost/old: {min(ratios):.2f}x to {max(ratios):.2f}x")


async def simulate_day(state: Path) -> tuple[list[dict[str, Any]], list[str], FakeOllama]:
    """24 hourly runs on one day; the requests the fake Ollama received and each run's time."""
    async with FakeOllama() as fake:
        settings = bench_settings(state, fake.url)
        daemon = Daemon(settings, Clock(at(2026, 11, 30, 23, 30)), RecordingChannel())
        automations = await daemon.start()
        stamps = []
        for hour in range(24):
            daemon.clock.set(at(2026, 12, 1, hour, 0, 2))
            stamps.append(f"Tue 2026-12-01 {hour:02d}:00")
            await automations.fire("hourly")
        await daemon.stop()
    return fake.chat_requests, stamps, fake


def report(bodies: list[dict[str, Any]], stamps: list[str], fake: FakeOllama) -> None:
    print(f"{'run':>4} {'roost tokens':>13} {'reused':>7}   {'naive tokens':>13} {'reused':>7}")
    prev_r = prev_n = None
    shares_r, shares_n = [], []
    for hour, (body, stamp) in enumerate(zip(bodies, stamps, strict=True)):
        plain = naive(body, stamp)
        tokens_r = fake.count_tokens(body["messages"], body.get("tools"))
        tokens_n = fake.count_tokens(plain["messages"], plain.get("tools"))
        r, n = rendered(body), rendered(plain)
        share_r, share_n = shared_share(prev_r, r), shared_share(prev_n, n)
        if hour:
            shares_r.append(share_r)
            shares_n.append(share_n)
        print(f"{hour:>4} {tokens_r:>13} {share_r:>7.3f}   {tokens_n:>13} {share_n:>7.3f}")
        prev_r, prev_n = r, n
    print(f"mean reused share over runs 2-24: roost {sum(shares_r) / len(shares_r):.3f} "
          f"(min {min(shares_r):.3f}), naive {sum(shares_n) / len(shares_n):.3f}; target >= 0.95")
    new_r = [math.ceil(len(rendered(b)) * (1 - s) / 3)
             for b, s in zip(bodies[1:], shares_r, strict=True)]
    new_n = [math.ceil(len(rendered(naive(b, t))) * (1 - s) / 3)
             for b, t, s in zip(bodies[1:], stamps[1:], shares_n, strict=True)]
    print(f"new tokens Ollama evaluates per run after the first: roost ~{max(new_r)}, "
          f"naive ~{max(new_n)}")

if __name__ == "__main__":
    asyncio.run(main())
