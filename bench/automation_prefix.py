"""How much of an automation's prompt Ollama can reuse from the previous run.

Runs one hourly automation 24 times over a simulated day (a controllable clock) through the real
scheduler's run path against the fake Ollama, and prints per run: the prompt tokens (the fake's
tokenizer) and the share of the prompt that repeats the previous run's leading tokens (what
Ollama's prompt cache reuses; target >= 0.95). Beside it, the same figures for a naive build that
puts the current time in the system prompt instead of at the very end.

Run from the repository root with the test extra installed: `python bench/automation_prefix.py`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from daemon.config import Settings
from tests.automations.conftest import Clock, Daemon, at, automation
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


def shared_share(previous: bytes | None, current: bytes) -> float:
    """Share of `current` that repeats `previous`'s leading bytes (the fake counts a token per
    three bytes, so this is the token share too)."""
    if previous is None:
        return 0.0
    same = 0
    for a, b in zip(previous, current, strict=False):
        if a != b:
            break
        same += 1
    return same / len(current)


def naive(body: dict[str, Any], stamp: str) -> dict[str, Any]:
    """The same request with the clock in the system prompt, the prompt left bare."""
    system, user = body["messages"][0], body["messages"][-1]
    return {**body, "messages": [
        {**system, "content": f"Current date and time: {stamp}\n\n{system['content']}"},
        {**user, "content": PROMPT}]}


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="roost-bench-") as tmp:
        bodies, stamps, fake = await simulate_day(Path(tmp))
    report(bodies, stamps, fake)


async def simulate_day(state: Path) -> tuple[list[dict[str, Any]], list[str], FakeOllama]:
    """24 hourly runs on one day; the requests the fake Ollama received and each run's time."""
    async with FakeOllama() as fake:
        base = Settings.defaults(env={"STATE_DIRECTORY": str(state)})
        settings = dataclasses.replace(
            base, daemon=dataclasses.replace(base.daemon, timezone="Europe/Berlin"),
            model=dataclasses.replace(base.model, host=fake.url),
            automations=(automation("hourly", "0 * * * *", prompt=PROMPT),))
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
