"""A long conversation in pages, the latest first.

Pages are counted back from the newest message (page 0 holds the last `PER_PAGE`), because
that is what a person opening a conversation wants to read; the oldest page may be short. Two
places are one tap away from any page: the fold line (the first message the model still sees
whole, after which nothing is summarised) and the very first message.

Page numbers move as messages arrive; the links also carry the message's anchor (`#m<seq>`),
so a page that shifted by a message still lands the reader near it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PER_PAGE = 100  # messages a page shows: ~100 KB raw, well under 200 KB compressed


@dataclass(frozen=True)
class Place:
    page: int
    seq: int


@dataclass(frozen=True)
class TranscriptPage:
    number: int  # 0: the latest messages
    count: int  # pages in all (at least 1)
    start: int  # index of the first message shown
    end: int  # index past the last message shown
    fold: Place | None  # the first message the model still sees whole, after a fold
    first: Place | None  # the conversation's first message

    @property
    def newer(self) -> int | None:
        return self.number - 1 if self.number > 0 else None

    @property
    def older(self) -> int | None:
        return self.number + 1 if self.number + 1 < self.count else None


def transcript_page(seqs: Sequence[int], through_seq: int, number: int,
                    per_page: int = PER_PAGE) -> TranscriptPage:
    """Page `number` of a conversation whose messages have `seqs` (in order) and whose summary
    stands for the messages up to `through_seq` (0: nothing folded). A number past the oldest
    page shows the oldest page."""
    total = len(seqs)
    count = max(1, -(-total // per_page))
    number = min(max(number, 0), count - 1)
    end = total - number * per_page
    start = max(0, end - per_page)
    fold = None
    if through_seq > 0:
        whole = next((i for i, seq in enumerate(seqs) if seq > through_seq), None)
        if whole is not None:
            fold = Place((total - 1 - whole) // per_page, seqs[whole])
    first = Place(count - 1, seqs[0]) if seqs else None
    return TranscriptPage(number, count, start, end, fold, first)
