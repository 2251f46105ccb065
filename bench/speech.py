"""What roost adds to a spoken reply beyond the speech backend's own time.

From a reply's text ready to a voice note stored (`Speaking.speak`: the spoken text, the
synthesis, the OGG/Opus encoding in a thread, the atomic store), for a 20-second answer (50
words at 2.5 words a second), with:

* espeak-ng: the backend's time is its subprocess, from spawn to the WAV read back;
* the loopback OpenAI-compatible server of the tests (`tests/fakes/speech.py`), answering Opus
  (kept as sent) and, like speaches, WAV (encoded by roost): the backend's time is what the
  fake spent making the audio (`Request.busy`); the HTTP round trip counts as roost's.

roost's own time = the whole `speak` less the backend's, p50 over the rounds (goal <= 100 ms),
with the ratio own / backend and the size of the 20-second voice note. For espeak-ng also the
CPU time roost spent (this process's; the subprocess is not in it), which a loaded machine does
not inflate as it does the wall-clock time.

    python bench/speech.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests` is not installed

from daemon.core.config import SpeechSettings
from daemon.store import Store
from daemon.voice.speaking import Speaking, VoiceNote
from daemon.voice.speech_backends import SpeechBackend, build_speech_backend
from tests.fakes.speech import FakeSpeaker

GOAL = 0.100
# Five sentences, 50 words: 20 seconds at 2.5 words a second.
ANSWER = (
    "Here is **your plan** for tomorrow morning. You have a call with the bank at nine, so "
    "keep the account papers near the phone. After that, the dentist expects you at half past "
    "ten in the old town. Lunch with Maria is at one, and she asked you to bring the photos. "
    "The rest of the day is free."
)


class Timed:
    """A backend whose every synthesis is timed (`seconds`, the last one)."""

    def __init__(self, backend: SpeechBackend) -> None:
        self.backend = backend
        self.where = backend.where
        self.seconds = 0.0

    async def synthesize(self, text: str) -> bytes:
        started = time.perf_counter()
        try:
            return await self.backend.synthesize(text)
        finally:
            self.seconds = time.perf_counter() - started

    async def close(self) -> None:
        await self.backend.close()


async def rounds(speaking: Speaking, backend_time: object, count: int
                 ) -> tuple[list[float], list[float], list[float], VoiceNote]:
    """(own times, backend times, roost's CPU seconds, the last note); `backend_time()` reads
    the last round's. The CPU time is this process's: espeak-ng's subprocess is not in it, the
    in-process fake server is."""
    own: list[float] = []
    backend: list[float] = []
    cpu: list[float] = []
    note: VoiceNote | None = None
    for _ in range(count):
        started, cpu_started = time.perf_counter(), time.process_time()
        note = await speaking.speak(ANSWER)
        total = time.perf_counter() - started
        cpu.append(time.process_time() - cpu_started)
        spent = backend_time()  # type: ignore[operator]
        own.append(total - spent)
        backend.append(spent)
    assert note is not None
    return own, backend, cpu, note


def report(name: str, own: list[float], backend: list[float], cpu: list[float] | None,
           note: VoiceNote) -> bool:
    own_p50, backend_p50 = statistics.median(own), statistics.median(backend)
    ok = own_p50 <= GOAL
    cpu_text = f"{statistics.median(cpu) * 1000:6.1f} ms" if cpu is not None else "   n/a   "
    print(f"{name:<22} own p50 {own_p50 * 1000:6.1f} ms (cpu {cpu_text})  backend p50 "
          f"{backend_p50 * 1000:7.1f} ms  ratio own/backend {own_p50 / backend_p50:5.2f}  "
          f"note {note.seconds:4.1f} s {note.size / 1024:5.1f} KB  "
          f"{'ok' if ok else 'OVER'} (goal <= {GOAL * 1000:.0f} ms)")
    return ok


async def main(count: int) -> int:
    ok = True
    # Wall-clock times: on a shared machine, the load says how far to trust them.
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {count} rounds")
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp) / "state")
        try:
            if shutil.which("espeak-ng"):
                settings = SpeechSettings(backend="espeak-ng", voice="en-us")
                inner = build_speech_backend(settings)
                assert inner is not None
                timed = Timed(inner)
                speaking = Speaking(settings, store, timed)
                ok &= report("espeak-ng (wav->opus)",
                             *await rounds(speaking, lambda: timed.seconds, count))
            else:
                print("espeak-ng: not installed, skipped")
            for formats, name in ((("opus", "wav", "mp3"), "http opus (kept)"),
                                  (("wav", "mp3"), "http wav->opus")):
                async with FakeSpeaker(formats=formats) as fake:
                    settings = SpeechSettings(backend="http", url=fake.url)
                    backend = build_speech_backend(settings)
                    assert backend is not None
                    speaking = Speaking(settings, store, backend)
                    await speaking.speak("Warm up.")  # the format is settled before timing
                    try:
                        own, backend_s, _cpu, note = await rounds(
                            speaking, lambda f=fake: f.requests[-1].busy, count)
                        ok &= report(name, own, backend_s, None, note)  # cpu: the fake's too
                    finally:
                        await speaking.close()
        finally:
            store.close()
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, choices=range(3, 201),
                        metavar="3..200")
    sys.exit(asyncio.run(main(parser.parse_args().rounds)))
