"""Who may talk to roost, and how fast: the one gate every channel's door goes through.

`Gate` is the allow / pair / stranger branch: a sender on the channel's allow list, listed in
the config's `[people]` or approved in the pairing book (`Access`, asking the `Household`), may
talk; a stranger gets a pairing code when
`access.unknown_senders = "pair"` (and the chat is a private one), else a log line, and costs no
stored state either way. `Gate.pace` holds every served sender to `access.rate_limit` messages a
minute. Over the limit a message is not dropped: the channel waits (the update stays stored) and
answers it later, and the sender is told once per flood. What is the channel's own (groups,
mentions, bots: e.g. `channels.telegram.parse.admit`) stays in the channel.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field

from daemon.core.config import AccessSettings
from daemon.core.errors import StoreError
from daemon.core.logs import outside
from daemon.core.logs import pairing_log as log
from daemon.intake.household import Household
from daemon.intake.pairing import CODE_TTL, PairingBook

WINDOW = 60.0  # the rate limit counts messages in this many seconds

SLOW_DOWN = ("You are sending messages faster than I can answer them. I have kept them all and "
             "will answer in order, a little later.")


def pairing_notice(code: str) -> str:
    minutes = int(CODE_TTL // 60)
    return (f"Hello! I only talk to people my owner has approved. Your pairing code is {code}. "
            f"Ask my owner to run: roost pairing approve {code} (the code expires in "
            f"{minutes} minutes).")


@dataclass
class RateLimit:
    """Messages per sender per minute; only served senders are tracked, so it stays small."""

    per_minute: int
    _times: dict[str, deque[float]] = field(default_factory=dict)
    _told: set[str] = field(default_factory=set)

    def delay(self, sender: str, now: float) -> float:
        """Seconds to wait before this message may go on (0: now); the message is counted."""
        times = self._times.setdefault(sender, deque())
        while times and now - times[0] >= WINDOW:
            times.popleft()
        if not times:
            self._told.discard(sender)  # a quiet minute ends a flood: tell them next time
        if len(times) < self.per_minute:
            times.append(now)
            return 0.0
        return times[0] + WINDOW - now

    def tell(self, sender: str) -> bool:
        """True the first time in a flood: the sender gets one notice, not one per message."""
        if sender in self._told:
            return False
        self._told.add(sender)
        return True


class Access:
    """Pairing and pacing for the channels' intakes."""

    def __init__(self, settings: AccessSettings, book: PairingBook, clock: Callable[[], float],
                 count: Callable[[str, str], None] | None = None,
                 household: Household | None = None) -> None:
        self.settings = settings
        self.book = book
        # Who is who (over this same book); None: the pairing book alone, nobody from config.
        self.household = household if household is not None else Household(book)
        self.clock = clock
        self.limit = RateLimit(settings.rate_limit)
        # count(channel, outcome) for /metrics: "stranger" and "paced" messages.
        self.count = count or (lambda channel, outcome: None)

    def approved(self, channel: str, sender: str) -> bool:
        """Listed in `[people]` or approved by pairing: the sender's id is their own chat's."""
        return self.household.may_talk(f"{channel}:{sender}")

    @property
    def pairs(self) -> bool:
        """Whether strangers get a pairing code (else the channel ignores and logs them)."""
        return self.settings.unknown_senders == "pair"

    def stranger(self, channel: str, sender: str, chat_key: str, name: str) -> str | None:
        """The pairing notice for a sender who is neither allowed nor approved (None: nothing
        to send, since they have a code already or enough codes are waiting)."""
        self.count(channel, "stranger")
        made = self.book.request(channel, sender, chat_key, name, self.clock())
        if made is None:
            log.debug("no new pairing code for %s user %s (has one, or %s has enough waiting)",
                      channel, sender, channel)
            return None
        log.warning("unknown %s user %s (%s) asked to talk; approve with: roost pairing approve "
                    "%s", channel, sender, outside(name) if name else "no name",
                    made.code)
        return pairing_notice(made.code)

    async def is_approved(self, channel: str, sender: str) -> bool:
        """`approved`, off the event loop (it may read the pairing file); a pairing file that
        cannot be read counts as no approval, never as a failed webhook call."""
        try:
            return await asyncio.to_thread(self.approved, channel, sender)
        except (StoreError, OSError, ValueError, TypeError, KeyError) as exc:
            log.error("cannot read the pairing file: %s", exc)
            return False

    async def greet(self, channel: str, sender: str, chat_key: str, name: str) -> str | None:
        """`stranger`, off the event loop (it locks and writes the pairing file); when that
        fails the stranger gets nothing, and the webhook call still succeeds."""
        try:
            return await asyncio.to_thread(self.stranger, channel, sender, chat_key, name)
        except (StoreError, OSError, ValueError, TypeError, KeyError) as exc:
            log.error("cannot record a pairing request from %s user %s: %s", channel, sender,
                      exc)
            return None

    async def pace(self, sender: str, tell: Callable[[str], Awaitable[None]]) -> None:
        """Wait until `sender` ("channel:id") is within the rate limit; `tell(text)` once per
        flood."""
        if (wait := self.limit.delay(sender, self.clock())) > 0:
            self.count(sender.partition(":")[0], "paced")
        while wait > 0:
            if self.limit.tell(sender):
                log.info("sender %s is over %d messages a minute; answering later",
                         sender, self.limit.per_minute)
                await tell(SLOW_DOWN)
            await asyncio.sleep(wait)
            wait = self.limit.delay(sender, self.clock())


Notify = Callable[[str, str], Awaitable[None]]  # (chat key, text): the engine's `notify`


class Gate:
    """One channel's allow / pair / stranger branch and its pacing; see the module docstring.

    `name` is the channel as the log names it ("Telegram"); `channel` its key in the pairing
    book, the settings and the metrics ("telegram"); `log` the channel's logger. Senders are
    compared as strings."""

    def __init__(self, channel: str, name: str, allow: Collection[object],
                 access: Access | None, notify: Notify, log: logging.Logger) -> None:
        self.channel = channel
        self.name = name
        self.log = log
        self.allow = frozenset(str(sender) for sender in allow)
        self.access = access  # None: the allow list only (no pairing, no pacing)
        self.notify = notify

    async def may_talk(self, sender: str) -> bool:
        """On the allow list, listed in `[people]`, or approved by the owner with `roost
        pairing approve`."""
        return sender in self.allow or (self.access is not None
                                        and await self.access.is_approved(self.channel, sender))

    async def door(self, sender: str, chat_key: str, name: str, *, private: bool = True
                   ) -> bool:
        """Whether `sender` may talk. A stranger costs no stored state: a pairing code at most
        (only in a `private` chat, never in a group's chatter), else a log line."""
        if await self.may_talk(sender):
            return True
        if self.access is not None and self.access.pairs and private:
            notice = await self.access.greet(self.channel, sender, chat_key, name)
            if notice:
                await self.notify(chat_key, notice)
        else:
            # Without pairing (access.unknown_senders = "ignore") the message is ignored.
            self.log.warning("ignored a message from unknown %s user %s in %s (not in %s.allow)",
                             self.name, sender, chat_key, self.channel)
        return False

    async def pace(self, sender: str, chat_key: str) -> None:
        """Wait until `sender` is within the rate limit (a flood waits here, stored, and is
        answered later); told once per flood, in `chat_key`."""
        if self.access is not None:
            await self.access.pace(f"{self.channel}:{sender}",
                                   lambda text: self.notify(chat_key, text))
