"""Median time of one message append at 100, 1,000 and 10,000 messages in one conversation.

    python bench/store_append.py [--samples 50]

Appending must not get slower as a conversation grows: messages live in bounded segments, so the
ratio of the median at 10,000 to the median at 100 should stay <= 2.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from daemon.store import Store

CHECKPOINTS = (100, 1_000, 10_000)
TEXT = "A typical chat line of moderate length, about a hundred and twenty characters long, " * 2


def measure(samples: int) -> dict[int, float]:
    with tempfile.TemporaryDirectory() as folder:
        store = Store.open(Path(folder))
        conversation = store.create_conversation("console:local", time.time())
        medians: dict[int, float] = {}
        count = 0
        for checkpoint in CHECKPOINTS:
            # Fill quickly up to the checkpoint, then time `samples` appends there.
            while count < checkpoint - samples // 2:
                store.append_message(conversation.id, "user", TEXT, created=time.time())
                count += 1
            timings = []
            for _ in range(samples):
                started = time.perf_counter()
                store.append_message(conversation.id, "assistant", TEXT, created=time.time())
                timings.append(time.perf_counter() - started)
                count += 1
            medians[checkpoint] = statistics.median(timings)
        store.close()
        return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=50)
    args = parser.parse_args()
    medians = measure(args.samples)
    for checkpoint, median in medians.items():
        print(f"append at {checkpoint:>6,} messages: median {median * 1000:7.3f} ms")
    ratio = medians[CHECKPOINTS[-1]] / medians[CHECKPOINTS[0]]
    print(f"ratio 10,000 / 100: {ratio:.2f} (target <= 2)")


if __name__ == "__main__":
    main()
