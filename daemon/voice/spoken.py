"""What of a reply is read aloud (pure): a minimal stand-in until the speech work merges with
the real rendering (code and links summarised, tables not read as symbols)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Spoken:
    """The text to speak; `cut` when the reply was longer than `max_seconds` of speech."""

    text: str
    cut: bool


def spoken_text(markdown: str, *, max_seconds: float,
                words_per_second: float = 2.5) -> Spoken:
    """The reply's words up to `max_seconds` at `words_per_second`."""
    words = markdown.replace("`", "").replace("*", "").replace("#", "").split()
    keep = max(1, int(max_seconds * words_per_second))
    return Spoken(" ".join(words[:keep]), len(words) > keep)
