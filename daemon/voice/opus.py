"""Synthesised speech in any format a backend returns -> a platform voice note: OGG/Opus, mono,
48 kHz (what Telegram's `sendVoice` and WhatsApp's `voice: true` audio play as a voice bubble).

PyAV (FFmpeg and libopus in its wheel) decodes and encodes; no container code of our own. A
server's own Ogg Opus in mono at a speech bitrate is kept as it is; anything else (WAV, MP3,
FLAC, stereo or high-bitrate Opus) is decoded, resampled and encoded at a speech bitrate.
Synchronous and CPU-bound: the caller runs it in a thread. PyAV is the `speech` extra, imported
on first use.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from daemon.core.errors import VoiceError

RATE = 48_000
BIT_RATE = 32_000  # speech at 32 kb/s: a minute is about 240 KB, under WhatsApp's 512 KB
# A server's Opus is kept up to half again our bitrate; above, it is encoded again, so a minute
# stays under WhatsApp's 512 KB for a voice bubble.
_KEPT_BYTES_PER_SECOND = BIT_RATE / 8 * 1.5
EXTRA = "pip install 'roost[speech]'"  # what installs PyAV beside roost


@dataclass(frozen=True)
class Encoded:
    data: bytes  # OGG/Opus, mono, 48 kHz
    seconds: float
    kept: bool  # True when the backend's own Opus was kept as it is


def load_av() -> Any:
    """The `av` module, or VoiceError naming the extra that installs it."""
    try:
        import av
    except ImportError as exc:
        raise VoiceError("PyAV is not installed, so speech cannot be encoded as a voice note "
                         f"({EXTRA})", "unavailable") from exc
    return av


def voice_note(audio: bytes, cap_seconds: float) -> Encoded:
    """`audio` as a voice note of at most `cap_seconds` (a server gone wrong is cut, not sent
    whole); VoiceError ("failed") when it is not audio PyAV can read."""
    av = load_av()
    try:
        with av.open(io.BytesIO(audio)) as source:
            if not source.streams.audio:
                raise VoiceError("the speech engine's answer holds no audio", "failed")
            stream = source.streams.audio[0]
            seconds = (source.duration or 0) / 1_000_000
            if (source.format.name == "ogg" and stream.codec_context.name == "opus"
                    and stream.channels == 1 and 0 < seconds <= cap_seconds
                    and len(audio) <= seconds * _KEPT_BYTES_PER_SECOND):
                return Encoded(audio, seconds, kept=True)
            data, seconds = _encode(av, source, stream, cap_seconds)
    except (av.FFmpegError, ValueError, OSError) as exc:
        raise VoiceError(f"the speech engine's answer is not audio I can read ({exc})"[:300],
                         "failed") from exc
    if seconds <= 0:
        raise VoiceError("the speech engine answered with silence of no length", "failed")
    return Encoded(data, seconds, kept=False)


def _encode(av: Any, source: Any, stream: Any, cap_seconds: float) -> tuple[bytes, float]:
    out = io.BytesIO()
    cap = int(cap_seconds * RATE)
    samples = 0
    with av.open(out, "w", format="ogg") as sink:
        # 60 ms frames and the lowest complexity: a sixth of libopus's default encoding time
        # (tuned for music) for speech that whisper-tiny still hears word for word
        # (tests/daemon/voice/test_speech_roundtrip.py); bench/speech.py shows the time.
        encoder = sink.add_stream("libopus", rate=RATE, layout="mono",
                                  options={"frame_duration": "60", "compression_level": "0"})
        encoder.bit_rate = BIT_RATE
        # PyAV resamples each decoded frame to the encoder's format, layout and rate.
        for frame in source.decode(stream):
            for packet in encoder.encode(frame):
                sink.mux(packet)
            samples += round(frame.samples * RATE / frame.sample_rate)
            if samples >= cap:
                break
        for packet in encoder.encode(None):
            sink.mux(packet)
    return out.getvalue(), min(samples, cap) / RATE
