"""CPU time to build each turn's request over a long conversation, with token estimates counted
once per text against counting every text again on every build (the way it was before).

    python bench/estimate_cost.py [--turns 300] [--seed 7]

The conversation is bench/scenario.py's (short chat, 2-6 KB answers, 10-40 KB pages fetched by
a tool on some turns). Before each turn the request is built from the whole stored history as
the turn builds it (`daemon.context.replay.build_request`, an 8,192 window less 1,024 for the
reply), once with the daemon's estimator (`estimate_tokens`, memoised per text) and once with an
estimator that counts every text anew. The requests must be the same; the figures are the CPU
seconds of all the builds and the ratio. No fold is made, so the history grows as a
conversation that never folds would: the worst case for re-estimating.

Run from the repository root.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.scenario import WEB_FETCH, script, web_fetch_call
from daemon.context.budget import _COSTS, MULTILINGUAL, estimate_tokens, pieces_cost
from daemon.context.replay import build_request
from daemon.core.conversations import Message, Role

PREFIX = "You are roost, a helpful assistant on the user's own computer. " * 8
BUDGET = 8192 - 1024


def counted_anew(text: str, ratio: float = 1.0) -> int:
    return math.ceil(pieces_cost(text, MULTILINGUAL) * ratio)


def history_of(turns: int, seed: int) -> list[list[Message]]:
    """The stored history before each turn's request (the turn's user message last)."""
    messages: list[Message] = []
    before_each: list[list[Message]] = []

    def add(role: Role, content: str, **extra: Any) -> None:
        messages.append(Message(id=f"m{len(messages)}", seq=len(messages), role=role,
                                content=content, created=1_767_000_000.0 + len(messages),
                                **extra))

    for turn in script(turns, seed):
        add("user", turn.user)
        before_each.append(list(messages))
        if turn.tool is not None:
            add("assistant", "", tool_calls=(web_fetch_call(turn.tool.url),))
            add("tool", turn.tool.output, tool_name=WEB_FETCH)
        add("assistant", turn.answer)
    return before_each


def build_all(histories: list[list[Message]], estimate: Callable[[str, float], int]
              ) -> tuple[float, list[int]]:
    started = time.process_time()
    sizes = [build_request(conversation_id="c", prefix=PREFIX, history=history, budget=BUDGET,
                           estimate=estimate).estimate
             for history in histories]
    return time.process_time() - started, sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    histories = history_of(args.turns, args.seed)
    anew, anew_sizes = build_all(histories, counted_anew)
    _COSTS.clear()
    once, once_sizes = build_all(histories, estimate_tokens)
    assert once_sizes == anew_sizes, "the memo changed an estimate"
    print(f"{args.turns} requests built from a growing history ({len(histories[-1])} messages "
          f"at the end)")
    print(f"  every text counted anew    {anew:7.2f} s CPU  ({anew / args.turns * 1000:6.1f} ms "
          "a request)")
    print(f"  each text counted once     {once:7.2f} s CPU  ({once / args.turns * 1000:6.1f} ms "
          f"a request)  x{once / anew:.2f}")


if __name__ == "__main__":
    main()
