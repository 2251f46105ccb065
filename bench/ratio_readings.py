"""How Ollama's prompt counts move a conversation's token ratio (issue 17, item 5).

Runs the same conversation of `--turns` turns (default 13) through roost against the loopback
fake Ollama, once per way a server counts the prompt:

* whole: `prompt_eval_count` is the whole prompt (Ollama before 0.30 and after #16428), the
  baseline;
* cached reported: the whole prompt plus `prompt_eval_cached_count` (after #17943);
* uncached only: only the tokens not taken from the cache (0.30.x before #16428), which made
  roost see false silent cuts and pin the ratio at 4.

For each it prints the silent cuts roost recorded, the ratio it ended with, the fake's cuts,
and the final ratio over the baseline's (the fake's tokenizer is bytes/3: the true ratio is
about 1.33). Run: `python bench/ratio_readings.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests` is not installed

from daemon.app.assembly import assemble
from daemon.core.config import Settings
from daemon.core.messages import Inbound
from daemon.llm.client import ModelClient
from daemon.store import Store
from tests.conftest import RecordingChannel
from tests.fakes.ollama import FakeModel, FakeOllama

CHAT = "telegram:1111111"
MODES = ("whole", "cached reported", "uncached only")


async def run(mode: str, turns: int) -> tuple[int, float, int]:
    """(silent cuts recorded, final ratio, cuts the fake made) for one way of counting."""
    fake = FakeOllama(models=[FakeModel(context_length=32768)])
    fake.report_cached = mode == "cached reported"
    fake.uncached_only = mode == "uncached only"
    if fake.uncached_only:
        fake.version = "0.30.1"
    await fake.start()
    with tempfile.TemporaryDirectory() as state:
        base = Settings.defaults(env={"STATE_DIRECTORY": state})
        settings = dataclasses.replace(base, model=dataclasses.replace(
            base.model, host=fake.url, window=8192, retry_backoff=0.01, retry_attempts=2))
        store = Store.open(Path(state))
        llm = ModelClient(settings.model)
        engine = assemble(settings, store, llm, {"telegram": RecordingChannel("telegram")}).engine
        await engine.start()
        try:
            for turn in range(turns):
                text = f"Turn {turn}: " + "tell me about the weather and the sea. " * 40
                assert await engine.submit(Inbound(chat_key=CHAT, text=text,
                                                   received=time.time()))
                await asyncio.wait_for(engine.wait_idle(CHAT), 60)
            conversation = store.active_conversation(CHAT)
            assert conversation is not None
            # The day's log is named in daemon.timezone (the system's here): look at both
            # dates the run can have touched.
            days = {time.strftime("%Y-%m-%d", t) for t in (time.localtime(), time.gmtime())}
            cuts = len({e for day in days for e in engine.parts.records.events(day)
                        if "silent-cut" in e})
            return cuts, conversation.token_ratio, fake.cuts
        finally:
            await engine.stop(grace=0)
            await llm.close()
            store.close()
            await fake.stop()


async def main(turns: int) -> None:
    results = {mode: await run(mode, turns) for mode in MODES}
    baseline = results["whole"][1]
    print(f"{turns} turns per way of counting; the fake's true ratio is about 1.33")
    print(f"{'server counts':<18}{'silent cuts':>12}{'final ratio':>13}{'fake cut':>10}"
          f"{'ratio / whole':>15}")
    for mode, (cuts, ratio, fake_cuts) in results.items():
        print(f"{mode:<18}{cuts:>12}{ratio:>13.2f}{fake_cuts:>10}{ratio / baseline:>15.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--turns", type=int, default=13)
    asyncio.run(main(parser.parse_args().turns))
