"""Recordings for the voice tests: the real ones under tests/fixtures/media, and ones made from
them cheaply (an OGG/Opus stream whose last granule position says two hours: 6 KB, not 2 h)."""

from __future__ import annotations

import io
from pathlib import Path

from mutagen.ogg import OggPage

from tests.conftest import FIXTURES

MEDIA = FIXTURES / "media"
OPUS = MEDIA / "voice-note.opus.ogg"  # OGG/Opus, as Telegram and WhatsApp send voice notes
VORBIS = MEDIA / "record.ogg"  # OGG/Vorbis
MP3 = MEDIA / "record.mp3"
SECONDS = 1.875  # how long each of them is


def opus_lasting(seconds: float) -> bytes:
    """The real OGG/Opus note with its last page's granule position (48 kHz samples after the
    pre-skip) rewritten to say `seconds`; each page's CRC is computed afresh, so it is a valid
    stream whose audio simply ends early."""
    source = io.BytesIO(OPUS.read_bytes())
    pages: list[OggPage] = []
    while True:
        try:
            pages.append(OggPage(source))
        except EOFError:
            break
    pre_skip = int.from_bytes(pages[0].packets[0][10:12], "little")
    pages[-1].position = pre_skip + round(seconds * 48000)
    return b"".join(page.write() for page in pages)


def write(folder: Path, name: str, data: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(data)
    return path


def nested_moov(depth: int = 20_000) -> bytes:
    """A hostile M4A: an `ftyp` box, then `depth` `moov` boxes each inside the last (8 bytes
    apiece, 160 KB for 20,000), deeper than Python's recursion limit for a recursive parser."""
    ftyp = (24).to_bytes(4, "big") + b"ftypM4A " + bytes(4) + b"M4A isom"
    return ftyp + b"".join((8 * (depth - i)).to_bytes(4, "big") + b"moov" for i in range(depth))
