"""Who may press "Sign in": only roost's own sign-in page, in the browser that opened the link.

A sign-in link is a bearer token, and anyone with one of their own (any person who sends
`/console`) could otherwise make another browser post it from a page of theirs and sign that
browser in as themselves (login CSRF): the owner would then type into the attacker's scope.
Two checks close it, each enough on its own in the browsers that support it:

- **Fetch Metadata.** A browser that sends `Sec-Fetch-Site` says where the press came from,
  whatever referrer policy the page has; only `same-origin` is roost's own page. Without it,
  `Origin` must be roost's own address or absent; `null` (what any page that sets no-referrer
  sends) is refused, because it cannot be told from a press on another site.
- **A form token bound to the link and the browser.** The sign-in page sets a random cookie
  (SameSite=Strict, HttpOnly, only for the sign-in path) and puts HMAC(key, cookie, link) in
  the form. Another site can read a token for its own link, but not this browser's cookie, and
  a Strict cookie never rides on its post. The key is made when the console starts, so a page
  opened before a restart asks for the link to be opened again (the link is not used up).

Whose view a session gives is its scope (daemon/store/console_keys.py): `*` alone is the
terminal's (`roost console`: whoever runs roost on the box owns it), a person's chats are that
person's own view, and `*` with a person's chats is the view `/console` gives the household's
owner. That last one lasts only as long as the role: each use of the link or the session asks
the household again (`Sessions`), so an owner the config demotes or drops is signed out.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Callable, Collection, Mapping
from urllib.parse import urlsplit

from aiohttp import web

from daemon.core.config import OWNER
from daemon.core.errors import StoreError
from daemon.core.logs import http_log as log
from daemon.store.console_keys import OWNER as ALL_CHATS
from daemon.store.console_keys import ConsoleKeys, ConsoleSession

COOKIE = "roost_signin"
FIELD = "signin_token"
_NONCE = re.compile(r"[A-Za-z0-9_-]{32}")


class SignInForms:
    """The form tokens of the sign-in page, under a key this process made."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def token(self, nonce: str, link: str) -> str:
        message = f"{nonce}\n{link}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def valid(self, nonce: str | None, link: str, given: str) -> bool:
        """Whether `given` is the token this browser's page carried for this link."""
        if not nonce or not _NONCE.fullmatch(nonce) or not link or not given:
            return False
        return hmac.compare_digest(given.encode(), self.token(nonce, link).encode())


def browser_nonce(existing: str | None) -> str:
    """The browser's sign-in cookie: the one it has (a second tab of the same link keeps a
    working form), else a new one."""
    if existing and _NONCE.fullmatch(existing):
        return existing
    return secrets.token_urlsafe(24)  # 32 characters


def pressed_on_our_page(headers: Mapping[str, str], hosts: Collection[str]) -> bool:
    """Whether the request headers allow a press on roost's own page, served at one of
    `hosts` (the request's Host, and `console.url`'s behind a proxy that rewrites it)."""
    site = headers.get("Sec-Fetch-Site")
    origin = headers.get("Origin")
    if site is not None:
        # The browser's own word, which no page can set; `same-site` is a neighbouring host
        # (another app under the same domain), not roost.
        return site == "same-origin" and (origin in (None, "null") or _ours(origin, hosts))
    return origin is None or _ours(origin, hosts)


def _ours(origin: str, hosts: Collection[str]) -> bool:
    return origin != "null" and origin.split("://", 1)[-1] in hosts


def secure(request: web.Request, console_url: str | None) -> bool:
    """Whether the console's cookies go over https only."""
    return request.secure or (console_url or "").startswith("https://")


def our_hosts(host: str, console_url: str | None) -> tuple[str, ...]:
    """Where roost's own pages are served: the request's host, and `console.url`'s (a proxy
    may pass another Host on)."""
    configured = urlsplit(console_url or "").netloc.rpartition("@")[2]
    return (host, configured) if configured else (host,)


class Sessions:
    """The console's links and sessions (daemon/store/console_keys.py) as the household gives
    them now: an owner's from `/console` ends once its person is no longer an owner, whether
    its link is used then or its session. Synchronous (files): the console calls it in a
    thread."""

    def __init__(self, keys: ConsoleKeys, role_of: Callable[[str], str | None],
                 clock: Callable[[], float]) -> None:
        self.keys = keys
        self.role_of = role_of  # the household's (daemon/intake/household.py), read anew
        self.clock = clock
        self.forms = SignInForms()

    def session(self, token: str) -> ConsoleSession | None:
        """The browser's session, if it has one the household still gives; none while the
        household cannot be read (the pairing book), not ended: it works again once it can."""
        session = self.keys.session(token, self.clock())
        try:
            if session is None or self._still_theirs(token, session):
                return session
        except StoreError as exc:
            log.warning("console: an owner's session waits: cannot tell its role (%s)", exc)
        return None

    def redeem(self, link: str) -> tuple[str, ConsoleSession] | str:
        """Use a link up: the new session's token and the session, or why not, for the page."""
        made = self.keys.redeem(link, self.clock())
        if made is None:
            return ("This sign-in link was used already or has expired (links work once, for "
                    "10 minutes). Ask for a new one: `roost console`, or /console in your chat.")
        if not self._still_theirs(*made):
            return ("This link was for the owner's view, and you are no longer the household's "
                    "owner. Send /console in your chat again for a link to your own "
                    "conversations.")
        return made

    def end(self, token: str) -> None:
        """Sign one browser out."""
        self.keys.end(token)

    def _still_theirs(self, token: str, session: ConsoleSession) -> bool:
        if still_theirs(session, self.role_of):
            return True
        self.keys.end(token)  # a new /console gives the person their own view
        log.info("console: ended an owner's session; its person is no longer an owner")
        return False


def still_theirs(session: ConsoleSession, role_of: Callable[[str], str | None]) -> bool:
    """Whether the household still gives this session its view: always for the terminal's
    and for a person's own; for an owner's from `/console`, while every chat it was given
    for is still an owner's (the role, or the chat's place in the config, may have changed
    since). `role_of` is the household's (daemon/intake/household.py), asked only then."""
    chats = given_for(session)
    if not session.is_owner or not chats:
        return True
    return all(role_of(chat) == OWNER for chat in chats)


def given_for(session: ConsoleSession) -> tuple[str, ...]:
    """The chats of the person a session was given to; none for the terminal's."""
    return tuple(chat for chat in session.scope if chat != ALL_CHATS)
