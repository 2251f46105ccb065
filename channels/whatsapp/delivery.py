"""WhatsApp delivery (`WhatsAppChannel`): the reply in parts, "typing…" while a turn runs,
read receipts, and the 24-hour window.

`send` writes the model's Markdown in WhatsApp's own syntax, split at 4,096 characters, progress
recorded per part. Rate limits, 5xx and network errors are retried; a refused message gives way
to the next; outside the 24-hour window (131047) the reply goes to `whatsapp.fallback` or waits
until the user writes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from channels.formatting import WHATSAPP_LIMIT, split_text, to_whatsapp
from channels.progress import Progress
from channels.whatsapp.api import BUTTONS_BODY_LIMIT, Failure, GraphClient, GraphError
from channels.whatsapp.invite import Invitations
from channels.whatsapp.parse import wa_id_of
from channels.whatsapp.platform import WhatsAppSettings, log
from channels.whatsapp.voice import send_voice
from channels.working import kept_up
from daemon.core.errors import DeliveryError
from daemon.core.messages import UNSEEN, Outbound, ReplySink
from daemon.store import Store
from daemon.store.event_log import Records

REENGAGEMENT_NOTE = ("(WhatsApp would not take this reply: it has been more than 24 hours since "
                     "you last wrote there.)")
_SENT_REMEMBERED = 1000  # wamids of recent sends, to name the conversation in status records
# A part that may have gone out waits this long for Meta's status of it before it is sent again:
# statuses come within seconds, and Meta delivers one that roost missed (down) again later.
ECHO_WAIT = 30.0
TRACKING_PREFIX = "roost:"  # biz_opaque_callback_data of a reply part: roost:<outbox id>:<part>
WINDOW = 24 * 3600.0  # WhatsApp takes free-form messages this long after the user last wrote
LAST_INBOUND = "last_inbound"  # the chat flag with the time the user last wrote
# The flag is rewritten only when it is this much older than the newest message (one write per
# chat per ten minutes, not one per message); this process knows the exact time meanwhile.
LAST_INBOUND_REFRESH = 600.0


@dataclass(frozen=True)
class SentPart:
    """A part roost sent, remembered until Meta reports what became of it."""

    outbound: Outbound
    text: str


class WhatsAppChannel:
    """Delivery to WhatsApp users; the typing indicator while a turn holds the model."""

    name = "whatsapp"

    def __init__(self, client: GraphClient, store: Store, settings: WhatsAppSettings, *,
                 typing_refresh: float = 20.0, read_delay: float = 0.5,
                 clock: Callable[[], float] = time.time,
                 records: Records | None = None,
                 on_resent: Callable[[], None] | None = None,
                 echo_wait: float = ECHO_WAIT) -> None:
        self.client = client
        self.invitations = Invitations(client, store, settings, records, clock)
        self.store = store
        self.progress = Progress(store, on_resent)
        self.settings = settings
        self.typing_refresh = typing_refresh
        self.read_delay = read_delay
        self.clock = clock
        self.last_received: dict[str, str] = {}  # chat key -> newest wamid
        self.marked_read: dict[str, str] = {}  # chat key -> newest wamid marked read
        self._receipts: dict[str, asyncio.Task[None]] = {}  # chat key -> its pending receipt
        self.last_inbound: dict[str, float] = {}  # chat key -> when the user last wrote
        self.inbound_stored: dict[str, float] = {}  # chat key -> that time as last stored
        self.sent: OrderedDict[str, SentPart] = OrderedDict()  # wamid -> what it carried
        self.echo_wait = echo_wait
        self._echoes: OrderedDict[str, str] = OrderedDict()  # tracking -> wamid, from statuses
        self._awaiting: dict[str, asyncio.Future[str]] = {}  # tracking -> a part waiting on it
        # The "typing…" of each chat's running turn, and the chats where it shows already.
        self._turn_typing: dict[str, contextlib.AsyncExitStack] = {}
        self._typing_shown: set[str] = set()

    @contextlib.asynccontextmanager
    async def streaming(self, chat_key: str) -> AsyncIterator[ReplySink]:
        """WhatsApp has no drafts (and its messages cannot grow): the turn shows "typing…"
        instead, kept up from its first model call to its end (see `working`), tools and
        later calls included; leaving here stops it, before the reply is sent."""
        typing = contextlib.AsyncExitStack()
        self._turn_typing[chat_key] = typing
        try:
            yield UNSEEN
        finally:
            if self._turn_typing.get(chat_key) is typing:
                del self._turn_typing[chat_key]
            await typing.aclose()

    def working(self, chat_key: str) -> contextlib.AbstractAsyncContextManager[None]:
        """"typing…" from the first time a turn holds the model (not while it waits for it)
        to the turn's end, refreshed before WhatsApp drops it after 25 seconds; outside a
        turn's `streaming`, for as long as the call holds the model."""
        typing = self._turn_typing.get(chat_key)
        if typing is None:
            return self._typing(chat_key)
        return self._typing_for_turn(chat_key, typing)

    @contextlib.asynccontextmanager
    async def _typing_for_turn(self, chat_key: str, typing: contextlib.AsyncExitStack
                               ) -> AsyncIterator[None]:
        if chat_key not in self._typing_shown:
            self._typing_shown.add(chat_key)
            typing.callback(self._typing_shown.discard, chat_key)
            await typing.enter_async_context(self._typing(chat_key))
        yield

    def _typing(self, chat_key: str) -> contextlib.AbstractAsyncContextManager[None]:
        async def show() -> None:
            wamid = self.last_received.get(chat_key)
            if wamid is None:
                return
            self.marked_read[chat_key] = wamid
            try:
                await self.client.mark_read(wamid, typing=True)
            except GraphError as exc:  # cosmetic: never worth failing a turn for
                log.debug("typing indicator for %s failed: %s", chat_key, exc)

        return kept_up(show, self.typing_refresh, f"roost-typing-{chat_key}")

    def received(self, chat_key: str, wamid: str) -> None:
        """A message came in: it is marked read within `read_delay` (with the typing indicator
        if its turn starts by then), and with it every earlier one of the chat."""
        self.last_received[chat_key] = wamid
        if chat_key not in self._receipts:
            self._receipts[chat_key] = asyncio.create_task(
                self._mark_read_soon(chat_key), name=f"roost-read-{chat_key}")

    async def _mark_read_soon(self, chat_key: str) -> None:
        try:
            while True:  # again if more came in while a receipt was on its way
                await asyncio.sleep(self.read_delay)
                wamid = self.last_received.get(chat_key)
                if wamid is None or self.marked_read.get(chat_key) == wamid:
                    return
                self.marked_read[chat_key] = wamid
                try:
                    await self.client.mark_read(wamid, typing=False)
                except GraphError as exc:  # the blue ticks are a courtesy
                    log.debug("marking %s read failed: %s", wamid, exc)
        finally:
            self._receipts.pop(chat_key, None)

    async def stop(self) -> None:
        """Cancel the receipts still waiting."""
        for task in list(self._receipts.values()):
            task.cancel()
        await asyncio.gather(*self._receipts.values(), return_exceptions=True)

    async def send(self, outbound: Outbound) -> None:
        """Send the parts not yet delivered, recording progress (and Meta's ids) after each."""
        to = wa_id_of(outbound.chat_key)
        last = await self._last_inbound(outbound.chat_key)
        if last is not None and self.clock() - last > WINDOW:
            # Meta would take it and then report it failed (131047): do not even try. (With no
            # record, e.g. a pairing code for a stranger, it is tried; a failed status comes
            # back to `WhatsApp._record_status`.)
            await self.invite(outbound)
            raise self._window_closed("more than 24 hours since the user last wrote")
        parts = ([outbound.text] if outbound.kind == "voice"  # one voice note: voice.py
                 else split_text(to_whatsapp(outbound.text), WHATSAPP_LIMIT))
        if outbound.buttons and len(parts[-1]) > BUTTONS_BODY_LIMIT:
            parts.append("Your answer:")  # the buttons' message takes a shorter body
        done, ids = self.progress.start(outbound)
        for index in range(done, len(parts)):
            tracking = tracking_of(outbound, index)
            wamid = await self._recognised(outbound, index, tracking)
            if wamid is None:
                wamid = await self._send_part(to, outbound, parts, index, tracking)
            self._remember(wamid, SentPart(outbound, parts[index]))
            ids += [wamid] if wamid else []
            # First thing after Meta's answer (nothing awaited before it): a crash before this
            # write leaves the part in doubt, for its status echo to settle after the restart.
            await self.progress.record(outbound, index + 1, ids, more=index + 1 < len(parts))

    async def _send_part(self, to: str, outbound: Outbound, parts: list[str], index: int,
                         tracking: str) -> str:
        """Part `index`, written down first as in flight, carrying `tracking`; its wamid."""
        await self.progress.attempt(outbound, index)
        try:
            if outbound.kind == "voice":
                return await send_voice(self.client, to, outbound, tracking)
            if outbound.buttons and index + 1 == len(parts):  # an approval question
                return await self.client.send_buttons(
                    to, parts[index], [(b.id, b.label) for b in outbound.buttons],
                    tracking=tracking)
            return await self.client.send_text(to, parts[index], tracking=tracking)
        except GraphError as exc:
            if exc.maybe_sent:  # a retry waits for the status echo (see `_recognised`)
                self.progress.answer_lost(outbound, index)
            error = self._delivery_error(exc)
            if error.window_closed:
                await self.invite(outbound)
            raise error from exc

    async def _recognised(self, outbound: Outbound, index: int, tracking: str) -> str | None:
        """A part that may have reached the chat (its answer was lost, or it was in flight
        when roost died) is not sent again blindly: Meta's statuses of a message carry the
        `tracking` it was sent with, so one that comes within `echo_wait` proves Meta took
        it (its wamid is returned). None: send it (again, if it did go out)."""
        if not self.progress.in_doubt(outbound, index):
            return None
        wamid = await self._echo(tracking)
        if wamid is None:
            log.info("no status from WhatsApp for part %d of a %s for %s within %.0f s: "
                     "sending it again", index + 1, outbound.kind, outbound.chat_key,
                     self.echo_wait)
            return None
        self.progress.recognised(outbound, index)
        log.info("WhatsApp's status shows part %d of a %s for %s arrived: not sent again",
                 index + 1, outbound.kind, outbound.chat_key)
        return wamid

    def echoed(self, tracking: str, wamid: str) -> None:
        """Meta reported a status (sent, delivered, read) of a message roost sent with
        `tracking`: Meta took that send, whatever became of its answer."""
        if not tracking.startswith(TRACKING_PREFIX):
            return  # not one of roost's outbox parts
        self._echoes[tracking] = wamid
        self._echoes.move_to_end(tracking)
        while len(self._echoes) > _SENT_REMEMBERED:
            self._echoes.popitem(last=False)
        waiter = self._awaiting.get(tracking)
        if waiter is not None and not waiter.done():
            waiter.set_result(wamid)

    async def _echo(self, tracking: str) -> str | None:
        """The wamid of the send with `tracking` as a status reported it, waiting up to
        `echo_wait` for one; None when none came (Meta did not take it, or is late)."""
        if (wamid := self._echoes.get(tracking)) is not None:
            return wamid
        waiter: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._awaiting[tracking] = waiter
        try:
            async with asyncio.timeout(self.echo_wait):
                return await waiter
        except TimeoutError:
            return None
        finally:
            self._awaiting.pop(tracking, None)

    async def invite(self, outbound: Outbound) -> None:
        """A reply is held for the 24-hour rule: the template, if one is set and due (not when
        the reply goes to `fallback` or to the person's next chat instead: nothing would wait
        for the person's answer)."""
        if self.settings.fallback or outbound.fallbacks:
            return
        await self.invitations.invite(outbound.chat_key, wa_id_of(outbound.chat_key),
                                      outbound.text)

    async def note_inbound(self, chat_key: str, when: float) -> None:
        """The user wrote: WhatsApp takes free-form replies for the next 24 hours (the
        engine's delivery releases the held ones). The time is kept on disk for after a
        restart, rewritten only when it is LAST_INBOUND_REFRESH old: at most one store call
        (a thread hop) per message, and none for most."""
        self.last_inbound[chat_key] = max(when, self.last_inbound.get(chat_key, 0.0))
        stored = self.inbound_stored.get(chat_key)
        if stored is not None and when - stored <= LAST_INBOUND_REFRESH:
            return
        self.inbound_stored[chat_key] = await asyncio.to_thread(self._user_wrote, chat_key,
                                                                when, stored)

    def _user_wrote(self, chat_key: str, when: float, stored: float | None) -> float:
        """On a worker thread: the stored time, rewritten when it is too old."""
        if stored is None:  # the chat's first message since the start
            flag = self.store.chat_flags(chat_key).get(LAST_INBOUND)
            stored = flag if isinstance(flag, int | float) else None
        if stored is None or when - stored > LAST_INBOUND_REFRESH:
            self.store.set_chat_flag(chat_key, LAST_INBOUND, when)
            stored = when
        return stored

    async def _last_inbound(self, chat_key: str) -> float | None:
        """When the user last wrote, as exactly as this process knows it; after a restart the
        stored flag, which may lag by up to LAST_INBOUND_REFRESH (so it is read as that much
        newer: at worst Meta refuses the send itself, with 131047)."""
        if chat_key in self.last_inbound:
            return self.last_inbound[chat_key]
        stored = (await asyncio.to_thread(self.store.chat_flags, chat_key)).get(LAST_INBOUND)
        return stored + LAST_INBOUND_REFRESH if isinstance(stored, int | float) else None

    def _delivery_error(self, exc: GraphError) -> DeliveryError:
        if exc.kind is Failure.REENGAGE:
            return self._window_closed(exc.title)
        if exc.kind is Failure.REFUSED:
            return DeliveryError(f"WhatsApp refused it: {exc.title} (code {exc.code})",
                                 permanent=True)
        return DeliveryError(f"WhatsApp did not take it yet: {exc}")

    def _window_closed(self, reason: str) -> DeliveryError:
        return DeliveryError(f"WhatsApp refused it: {reason}", window_closed=True,
                             fallback=self.settings.fallback, note=REENGAGEMENT_NOTE)

    def _remember(self, wamid: str, sent: SentPart) -> None:
        if wamid:
            self.sent[wamid] = sent
            while len(self.sent) > _SENT_REMEMBERED:
                self.sent.popitem(last=False)


def tracking_of(outbound: Outbound, index: int) -> str:
    """What part `index` of the item is sent with, to be recognised in Meta's statuses: the
    same in every process, so a restart recognises a part the previous one sent."""
    return f"{TRACKING_PREFIX}{outbound.id}:{index}"
