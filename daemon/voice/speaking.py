"""Speaking a reply: the interface the delivery of voice replies codes against.

A minimal stand-in until the speech backends (issue 35 item 1, built in parallel) merge: they
keep these names and signatures and replace the bodies. Without a `[speech]` backend roost does
not speak, so `build_speaking` gives None here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from daemon.core.config import Settings
from daemon.core.errors import VoiceError


@dataclass(frozen=True)
class VoiceNote:
    """An OGG/Opus mono file under the attachments folder, ready to send as a voice note."""

    path: Path
    seconds: float
    size: int


class Speaking:
    """Turns text into a voice note with the configured backend."""

    async def speak(self, text: str) -> VoiceNote:
        """The text spoken; raises VoiceError with a plain reason."""
        raise VoiceError("speech is off on this roost", "off")


def build_speaking(settings: Settings) -> Speaking | None:
    """The `[speech]` backend of these settings; None when speech is off."""
    return None
