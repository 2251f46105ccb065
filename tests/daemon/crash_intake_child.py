"""The process test_crash_safety kills during group commits: waves of 32 concurrent accepts
through the shared intake's `GroupCommit`, until it is SIGKILLed.

    python crash_intake_child.py STATE_DIR RUN

Prints `ready` once the store is open, then `ack <key>` for each accept that returned True
(the update would now get its 200), and half of the acknowledged keys are marked done (as the
workers do), alternately remembered and forgotten, so commits and removals interleave.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from daemon.intake.durable import GroupCommit
from daemon.store import Store


async def main(state_dir: Path, run: str) -> None:
    store = Store.open(state_dir)
    commit = GroupCommit(store, "telegram")
    print("ready", flush=True)
    wave = 0
    while True:
        wave += 1
        keys = [f"telegram:update:{run}-{wave}-{i}" for i in range(32)]
        payloads = [{"update_id": i, "text": f"wave {wave} ✉ {i}" * (1 + i % 7)}
                    for i in range(32)]
        answers = await asyncio.gather(*(commit.accept(k, p, time.time())
                                         for k, p in zip(keys, payloads, strict=True)))
        for key, new in zip(keys, answers, strict=True):
            if not new:
                raise SystemExit(f"{key} was new but refused")
            print(f"ack {key}", flush=True)
        for i, key in enumerate(keys[::2]):
            await asyncio.to_thread(store.updates_done, key, remember=i % 2 == 0)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))
