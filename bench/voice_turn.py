"""What roost adds to a voice note's turn beyond the transcription backend's own time.

roost's engine (a real store on disk, the real model client) answers one chat against the fake
Ollama, and transcribes through the loopback OpenAI-compatible server of the tests
(`tests/fakes/transcription.py`, which records how long it spent on each request). Rounds
alternate, in one run:

* baseline: a text message carrying the words the transcript would give;
* voice: the real OGG/Opus voice note (stored as a channel stores it), transcribed, then
  answered.

Each time is from `submit` to the reply handed to the channel. What roost adds is the voice
turn less the backend's time less the paired text turn: reading the recording's length,
the multipart upload, waiting for the model's slot, rewriting the inbox item, the longer
message (target: <= 50 ms at the median). Then the end-to-end time of a real 60-second note
(bench/data/voice-60s.opus.ogg, 145 KB) with the loopback backend.

    python bench/voice_turn.py [--rounds 30] [--backend-delay 0.0]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests` is not installed

from daemon.app.assembly import DaemonParts, assemble
from daemon.core.config import Settings, VoiceSettings
from daemon.core.messages import Inbound
from daemon.engine.workers import Engine
from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.store.attachments import store_file
from daemon.voice.backends import HttpBackend
from daemon.voice.hearing import Hearing
from tests.conftest import RecordingChannel
from tests.fakes.ollama import FakeOllama
from tests.fakes.transcription import FakeTranscriber

ROOT = Path(__file__).resolve().parents[1]
NOTE = ROOT / "tests/fixtures/media/voice-note.opus.ogg"  # 1.9 s, 5.7 KB
MINUTE = ROOT / "bench/data/voice-60s.opus.ogg"  # 60 s, 145 KB
CHAT = "console:local"
TARGET = 0.050


async def turn(engine: Engine, channel: RecordingChannel, item: Inbound) -> float:
    """Seconds from submit to the reply handed to the channel."""
    before = len(channel.sent)
    started = time.perf_counter()
    assert await engine.submit(item)
    await engine.wait_idle(CHAT)
    assert len(channel.sent) == before + 1, channel.texts()[before:]
    return time.perf_counter() - started


def voice_item(store: Store, path: Path, n: int) -> Inbound:
    stored = store_file(path.read_bytes(), store.state_dir / "attachments",
                        name="voice-note.ogg", mime="audio/ogg", kind="voice")
    return Inbound(chat_key=CHAT, text="", received=time.time(), platform_id=f"v{n}",
                   attachments=(stored.to_doc(),))


async def run(rounds: int, delay: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with FakeOllama() as ollama, FakeTranscriber(delay=delay) as whisper:
            base = Settings.defaults(env={"STATE_DIRECTORY": tmp})
            settings = replace(base, model=replace(base.model, host=ollama.url))
            voice_settings = VoiceSettings(backend="http", url=whisper.url)
            store = Store.open(Path(tmp))
            llm = ModelClient(settings.model)
            channel = RecordingChannel("console")
            voice = Hearing(voice_settings, store, HttpBackend(voice_settings), hold=llm.slot)
            engine = assemble(settings, store, llm, {"console": channel},
                              extra=DaemonParts(voice=voice)).engine
            engine.worker_idle_exit = 60.0
            await engine.start()
            try:
                words = f"[voice note, 0:02] {whisper.text}"
                await turn(engine, channel, Inbound(CHAT, "warm up", time.time()))
                await turn(engine, channel, voice_item(store, NOTE, 0))
                text_times, voice_times, busy, added = [], [], [], []
                for n in range(1, rounds + 1):
                    text = await turn(engine, channel, Inbound(CHAT, words, time.time()))
                    spoken = await turn(engine, channel, voice_item(store, NOTE, n))
                    backend = whisper.requests[-1].busy
                    text_times.append(text)
                    voice_times.append(spoken)
                    busy.append(backend)
                    added.append(spoken - backend - text)
                minute = []
                for n in range(5):
                    minute.append(await turn(engine, channel,
                                             voice_item(store, MINUTE, 1000 + n)))
                minute_busy = [r.busy for r in whisper.requests[-5:]]
            finally:
                await engine.stop(1.0)
                await voice.close()
                await llm.close()
                store.close()
    ms = 1000.0
    med = statistics.median
    print(f"voice turns: {rounds} rounds, each a text turn (baseline) and a voice-note turn, "
          f"backend delay {delay * ms:.0f} ms")
    print(f"  text turn (baseline)        median {med(text_times) * ms:7.1f} ms")
    print(f"  voice-note turn             median {med(voice_times) * ms:7.1f} ms "
          f"({med(voice_times) / med(text_times):.2f}x the text turn)")
    print(f"  backend's own time          median {med(busy) * ms:7.1f} ms")
    p90 = statistics.quantiles(added, n=10)[-1]
    verdict = "meets" if med(added) <= TARGET else "MISSES"
    print(f"  roost adds beyond backend   median {med(added) * ms:7.1f} ms, p90 {p90 * ms:.1f} ms "
          f"({verdict} the <= {TARGET * ms:.0f} ms goal)")
    print(f"60-second note (real OGG/Opus, {MINUTE.stat().st_size // 1024} KB), loopback "
          f"backend: end to end median {med(minute) * ms:.1f} ms (backend "
          f"{med(minute_busy) * ms:.1f} ms of it), {med(minute) / med(text_times):.2f}x the "
          f"text turn")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--backend-delay", type=float, default=0.0,
                        help="seconds the fake backend takes per recording")
    args = parser.parse_args()
    asyncio.run(run(args.rounds, args.backend_delay))


if __name__ == "__main__":
    main()
