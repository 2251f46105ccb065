"""The duplicate window: how long a part's record takes after the platform took the part.

    python bench/delivery_window.py [--parts 300] [--dir PATH]

Delivery is at least once: a process killed after Telegram or WhatsApp took a part and before
its record (`parts_sent` on the outbox item) is on disk sends that part again after the restart.
The record is the first thing after the platform's answer, so the window is the time of that
write, through the thread hop the daemon makes. This times it as the channels make it now (no
folder fsync: a crash cannot undo the rename, a power cut brings back the previous progress)
against the baseline of a fully durable write, alternating in one run on the same disk. Use
`--dir` for a folder on the disk the state directory lives on (default: the system's temp).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from daemon.core.messages import Outbound
from daemon.store import Store

REPLY = "A reply part of ordinary length. " * 100  # about 3,300 characters, like a long answer


async def measure(store: Store, parts: int) -> dict[bool, list[float]]:
    item = Outbound(chat_key="telegram:1111111", text=REPLY, created=time.time())
    store.outbox_add(item.to_doc())
    timings: dict[bool, list[float]] = {True: [], False: []}
    ids: list[str] = []
    for index in range(parts * 2):
        durable = index % 2 == 0  # alternate, so that both see the same disk and load
        ids.append(str(index))
        started = time.perf_counter()
        await asyncio.to_thread(store.outbox_update, item.id, parts_sent=len(ids),
                                platform_ids=ids[-8:], attempting=len(ids),
                                durable_rename=durable)
        timings[durable].append(time.perf_counter() - started)
    return timings


def _line(name: str, values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (f"{name:<34} median {statistics.median(ordered) * 1000:6.3f} ms   "
            f"p99 {p99 * 1000:7.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", type=int, default=300, help="records of each kind")
    parser.add_argument("--dir", type=Path, default=None, help="where to put the state")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        store = Store.open(Path(folder))
        try:
            timings = asyncio.run(measure(store, max(1, min(args.parts, 10_000))))
        finally:
            store.close()
    print(_line("baseline: record with folder fsync", timings[True]))
    print(_line("now: record without folder fsync", timings[False]))
    ratio = statistics.median(timings[True]) / statistics.median(timings[False])
    print(f"window, median baseline / now: {ratio:.2f}")


if __name__ == "__main__":
    main()
