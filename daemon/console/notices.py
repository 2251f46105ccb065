"""What a form's action told the person, carried to the page the form leads back to.

After a form, the browser is sent back to its page (POST, redirect, GET: a reload sends
nothing twice) with `?done=KEY`. The words stay here, under the session that did the action:
the address holds only a random key, so a link made elsewhere (`?done=Your session expired,
call ...`) shows nothing, and one session's notice never shows in another. In memory only: a
notice matters for the next page load, and a restart just drops it.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict

PER_SESSION = 8  # notices a session keeps (a few tabs' worth)
SESSIONS = 64  # sessions with notices kept (the console keeps that many sessions at most)


class Notices:
    """Notices by session, each under a key made here; bounded, oldest dropped first."""

    def __init__(self) -> None:
        self._kept: OrderedDict[str, OrderedDict[str, str]] = OrderedDict()

    def put(self, session: str, text: str) -> str:
        """Keep `text` for `session` (its form token, a secret of that session); the key."""
        key = secrets.token_urlsafe(9)
        mine = self._kept.setdefault(session, OrderedDict())
        self._kept.move_to_end(session)
        mine[key] = text
        while len(mine) > PER_SESSION:
            mine.popitem(last=False)
        while len(self._kept) > SESSIONS:
            self._kept.popitem(last=False)
        return key

    def text(self, session: str, key: str) -> str:
        """The notice `key` names for this session; nothing for any other key."""
        mine = self._kept.get(session)
        return mine.get(key, "") if mine is not None else ""
