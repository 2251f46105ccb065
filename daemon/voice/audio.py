"""How long a recording is, read from its container without decoding a sample (no GPU, no
ffmpeg): the length cap is enforced and "0:42" written before any backend is asked.

mutagen reads the formats phones send: OGG/Opus (Telegram's and WhatsApp's voice notes), OGG
Vorbis, MP3, MP4/M4A and AAC, FLAC, WAV. An OGG stream's length is its last page's granule
position, so a two-hour recording is known to be two hours from its last few kilobytes.
Synchronous: the caller runs it in a thread.
"""

from __future__ import annotations

from pathlib import Path

import mutagen

from daemon.core.errors import VoiceError


def duration_of(path: Path, what: str = "That voice note") -> float:
    """The recording's length in seconds; VoiceError ("unreadable") with a message for the user
    when the file is damaged or in a format whose length cannot be read."""
    try:
        audio = mutagen.File(path)
    except Exception as exc:
        # Untrusted bytes: whatever the parser raises (RecursionError from 20,000 nested MP4
        # boxes, MemoryError, any bug) is the file's fault, never a reason to fail the message.
        raise _unreadable(what) from exc
    info = getattr(audio, "info", None)
    length = getattr(info, "length", None)
    if audio is None or not isinstance(length, int | float) or length != length or length < 0:
        raise _unreadable(what)
    return float(length)


def clock(seconds: float) -> str:
    """42.4 -> "0:42", 605 -> "10:05", 7200 -> "2:00:00"."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _unreadable(what: str) -> VoiceError:
    return VoiceError(f"{what} could not be read as audio (it may be damaged, or in a format I "
                      "cannot read), so I only know you sent it. Please send it again.",
                      "unreadable")
