"""The one id encoder: ULIDs (48 bits of milliseconds, 80 bits of entropy) in Crockford base32.

Every id roost makes (conversations, messages, inbox and outbox items, events, attachments) and
every id it derives from a platform payload comes from here, so all of them sort by time and
pass `is_id`.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# What `new_id` makes: 26 characters of Crockford base32, the first at most 7 (128 bits).
ID_PATTERN = "[0-7][0-9A-HJKMNP-TV-Z]{25}"
_ID = re.compile(ID_PATTERN)


_last_id = [0, 0]  # (millis, random) of the last id made here, for monotonic ids
_id_lock = threading.Lock()


def _encode(millis: int, entropy: int) -> str:
    value = (millis << 80) | entropy
    return "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


def new_id(now: float | None = None) -> str:
    """A ULID: 48 bits of milliseconds then 80 random bits, 26 characters of Crockford base32.

    Sortable by creation time and unique without coordination, so ids can be made in any process.
    Within one millisecond the random part counts up (monotonic ULID), so ids made in a burst
    still sort in the order they were made.
    """
    millis = int((time.time() if now is None else now) * 1000)
    with _id_lock:
        if millis <= _last_id[0]:
            millis, entropy = _last_id[0], _last_id[1] + 1
        else:
            entropy = int.from_bytes(os.urandom(10), "big") >> 1  # room to count up
        _last_id[:] = [millis, entropy]
    return _encode(millis, entropy)


def inbound_id(received: float, platform_key: str) -> str:
    """A ULID-shaped id fixed by the platform payload: processing the same stored payload again
    after a crash makes the same inbox id, so roost can tell it was already submitted."""
    entropy = int.from_bytes(hashlib.sha256(platform_key.encode()).digest()[:10], "big")
    return _encode(int(received * 1000), entropy)


def is_id(text: str) -> bool:
    """Whether `text` has the form of an id `new_id` makes. Ids from outside (a tool's
    arguments) are checked with this before they reach the store, so none can name a path."""
    return _ID.fullmatch(text) is not None


def id_time(text: str) -> float:
    """When an id was made (its first 48 bits are milliseconds); `text` must pass `is_id`."""
    millis = 0
    for char in text[:10]:
        millis = millis * 32 + _CROCKFORD.index(char)
    return millis / 1000  # the first 10 characters are bits 80-129 of the id: the milliseconds
