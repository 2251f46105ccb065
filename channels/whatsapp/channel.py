"""WhatsApp through the official Business Cloud API: webhooks in, Graph API calls out.

* `GET /webhooks/whatsapp` answers Meta's subscription check: `hub.mode=subscribe` with the right
  `hub.verify_token` gets the raw `hub.challenge` back, anything else 403.
* `POST /webhooks/whatsapp` takes only `application/json` (else 415), checks
  `X-Hub-Signature-256` over the raw body (401 without it, 403 when wrong), then parses it (400
  when it is not JSON or nests absurdly deep) and hands every message, in the order Meta listed
  them, to the shared intake (`daemon.intake`): each is on disk before the 200, keyed by its
  wamid so Meta's retries (for up to 7 days) are dropped. A message older than that (`max_age`)
  cannot be one of Meta's deliveries, only a replay: acked, logged, counted, never answered.
  Status webhooks are recorded.
* Processing (`WhatsAppIntake.process`, per sender in order): have the message marked read
  (within `read_delay`, by the typing indicator when its turn starts by then), fetch its media,
  build the `Inbound`, submit. A reaction is noted, not answered.
* Delivery (`WhatsAppChannel.send`): the model's Markdown in WhatsApp's own syntax, split at 4,096
  characters, progress recorded per part. Rate limits, 5xx and network errors are retried; a
  refused message gives way to the next; outside the 24-hour window (131047) the reply goes to
  `whatsapp.fallback` or waits until the user writes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from channels.formatting import WHATSAPP_LIMIT, split_text, to_whatsapp
from channels.media import attachment_limits
from channels.progress import Progress
from channels.webhooks import read_at_most, too_deep
from channels.whatsapp.api import (
    BUTTONS_BODY_LIMIT,
    REENGAGEMENT,
    Failure,
    GraphClient,
    GraphError,
)
from channels.whatsapp.invite import Invitations
from channels.whatsapp.media import WhatsAppMedia
from channels.whatsapp.parse import (
    SIGNATURE_HEADER,
    NotAWebhook,
    Signature,
    WaMessage,
    WaStatus,
    approval_reply,
    chat_key,
    check_signature,
    describe,
    parse_webhook,
    wa_id_of,
)
from channels.working import kept_up
from daemon.core.approval import ACCEPTED, NOT_WAITING, Answer, Approver
from daemon.core.config import AttachmentSettings, WhatsAppSettings
from daemon.core.errors import DeliveryError, StoreError
from daemon.core.ids import inbound_id
from daemon.core.logs import whatsapp_log as log
from daemon.core.messages import UNSEEN, Inbound, Outbound, ReplySink
from daemon.intake.durable import Intake, Outcome, Pending, Submitter
from daemon.intake.gate import Access, Gate
from daemon.store import Store
from daemon.store.event_log import Records

WEBHOOK_PATH = "/webhooks/whatsapp"
CHANNEL = "whatsapp"
UNSUPPORTED = ("I can read text, photos, voice notes, audio, video, documents, locations and "
               "contacts; that kind of message I cannot use. Please describe it in words.")
REENGAGEMENT_NOTE = ("(WhatsApp would not take this reply: it has been more than 24 hours since "
                     "you last wrote there.)")
_SENT_REMEMBERED = 1000  # wamids of recent sends, to name the conversation in status records
WINDOW = 24 * 3600.0  # WhatsApp takes free-form messages this long after the user last wrote
LAST_INBOUND = "last_inbound"  # the chat flag with the time the user last wrote
# The flag is rewritten only when it is this much older than the newest message (one write per
# chat per ten minutes, not one per message); this process knows the exact time meanwhile.
LAST_INBOUND_REFRESH = 600.0
# Meta retries an unanswered webhook "with decreasing frequency ... for up to 7 days" (Cloud API,
# Set up webhooks): a message older than that is not a delivery but a replay of a signed body.
MAX_AGE = 7 * 24 * 3600.0
MAX_DEPTH = 40  # JSON nesting of a webhook body (Meta's nest about ten levels)


class Engine(Submitter, Protocol):
    """What WhatsApp needs of the engine besides submitting messages: its delivery holds the
    replies refused for the 24-hour rule (`deliver` with `held`) and lets them go when the
    user writes again (`release`, as every channel)."""

    async def deliver(self, outbound: Outbound) -> bool: ...


@dataclass(frozen=True)
class _Sent:
    """A part roost sent, remembered until Meta reports what became of it."""

    outbound: Outbound
    text: str


@dataclass(frozen=True)
class WhatsAppTuning:
    """Timings and limits that are not user settings; tests make them short."""

    typing_refresh: float = 20.0  # WhatsApp drops the typing indicator after 25 seconds
    # A read receipt waits this long: a turn that starts meanwhile marks the message read with
    # its typing indicator (one Graph call, not two), and a burst costs one receipt.
    read_delay: float = 0.5
    max_body: int = 4 * 1024 * 1024  # above Meta's largest batches; larger bodies get a 413
    media_backoff: float = 0.5
    max_age: float = MAX_AGE  # a message sent longer ago than this is dropped, unanswered


def message_key(wamid: str) -> str:
    return f"whatsapp:msg:{wamid}"


class WhatsAppChannel:
    """Delivery to WhatsApp users; the typing indicator while a turn holds the model."""

    name = CHANNEL

    def __init__(self, client: GraphClient, store: Store, settings: WhatsAppSettings, *,
                 typing_refresh: float = 20.0, read_delay: float = 0.5,
                 clock: Callable[[], float] = time.time,
                 records: Records | None = None) -> None:
        self.client = client
        self.invitations = Invitations(client, store, settings, records, clock)
        self.store = store
        self.progress = Progress(store)
        self.settings = settings
        self.typing_refresh = typing_refresh
        self.read_delay = read_delay
        self.clock = clock
        self.last_received: dict[str, str] = {}  # chat key -> newest wamid
        self.marked_read: dict[str, str] = {}  # chat key -> newest wamid marked read
        self._receipts: dict[str, asyncio.Task[None]] = {}  # chat key -> its pending receipt
        self.last_inbound: dict[str, float] = {}  # chat key -> when the user last wrote
        self.inbound_stored: dict[str, float] = {}  # chat key -> that time as last stored
        self.sent: OrderedDict[str, _Sent] = OrderedDict()  # wamid -> what it carried
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
        parts = split_text(to_whatsapp(outbound.text), WHATSAPP_LIMIT)
        if outbound.buttons and len(parts[-1]) > BUTTONS_BODY_LIMIT:
            parts.append("Your answer:")  # the buttons' message takes a shorter body
        done, ids = self.progress.start(outbound)
        for index in range(done, len(parts)):
            await self.progress.attempt(outbound, index)
            try:
                if outbound.buttons and index + 1 == len(parts):  # an approval question
                    wamid = await self.client.send_buttons(
                        to, parts[index], [(b.id, b.label) for b in outbound.buttons])
                else:
                    wamid = await self.client.send_text(to, parts[index])
            except GraphError as exc:
                if exc.maybe_sent:  # a retry may show it twice: counted (channels.progress)
                    self.progress.answer_lost(outbound, index)
                error = self._delivery_error(exc)
                if error.window_closed:
                    await self.invite(outbound)
                raise error from exc
            self._remember(wamid, _Sent(outbound, parts[index]))
            ids += [wamid] if wamid else []
            # First thing after Meta's answer (nothing awaited before it): a crash before this
            # write sends the part again.
            await self.progress.record(outbound, index + 1, ids, more=index + 1 < len(parts))

    async def invite(self, outbound: Outbound) -> None:
        """A reply is held for the 24-hour rule: the template, if one is set and due (not when
        the reply goes to `fallback` instead: nothing would wait for the person's answer)."""
        if self.settings.fallback:
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

    def _remember(self, wamid: str, sent: _Sent) -> None:
        if wamid:
            self.sent[wamid] = sent
            while len(self.sent) > _SENT_REMEMBERED:
                self.sent.popitem(last=False)


class WhatsAppIntake:
    """WhatsApp messages into the shared intake, and out of it to the engine (its Handler)."""

    def __init__(self, *, store: Store, engine: Engine, channel: WhatsAppChannel,
                 media: WhatsAppMedia, allow: Collection[str], access: Access | None = None,
                 clock: Callable[[], float] = time.time, max_age: float = MAX_AGE,
                 approver: Approver | None = None) -> None:
        self.approver = approver
        self.store = store
        self.engine = engine
        self.channel = channel
        self.media = media
        self.access = access
        # Pairing and pacing (daemon.intake.gate); access None: the allow list only.
        self.gate = Gate(CHANNEL, "WhatsApp", allow, access, engine.notify, log)
        self.clock = clock
        self.max_age = max_age
        self.intake = Intake(store=store, channel=CHANNEL, handler=self, clock=clock)

    async def accept(self, message: WaMessage) -> bool:
        """Persist one message before Meta is answered, if its sender may talk; False for a
        redelivery or a message that is dropped. Raises when it could not be stored."""
        age = self.clock() - message.timestamp
        if message.timestamp and age > self.max_age:  # 0: none given (Meta always gives one)
            # Past Meta's retry window: a replayed body, or a clock far off. Acked (Meta would
            # only send it again), never stored or answered, even to ask a stranger to pair.
            log.warning("dropped WhatsApp message %s from %s: sent %.0f days ago, longer than "
                        "the %.0f days Meta retries a webhook", message.id, message.sender,
                        age / 86400, self.max_age / 86400)
            if self.access is not None:
                self.access.count(CHANNEL, "stale")
            return False
        if not await self.gate.door(message.sender, message.chat_key,
                                    message.profile_name or ""):
            return False
        if (choice := approval_reply(message.body)) is not None:
            # A tap on an approval question's button: an answer for the waiting turn, never
            # a message for the model (parse.describe would read it as one).
            said = NOT_WAITING
            if self.approver is not None:
                said = await self.approver.answer(Answer(
                    choice[0], choice[1], message.chat_key, f"{CHANNEL}:{message.sender}"))
            if said not in ACCEPTED:
                await self.engine.notify(message.chat_key, said)
            return False
        payload = {"message": dict(message.body), "profile_name": message.profile_name,
                   "business_number": message.business_number}
        return await self.intake.accept(message_key(message.id), message.chat_key, payload)

    # ---- the intake's Handler --------------------------------------------------------------

    def route(self, payload: Mapping[str, Any]) -> str | None:
        sender = payload["message"]["from"]
        return chat_key(sender) if isinstance(sender, str) and sender.isdigit() else None

    def group(self, item: Pending) -> str | None:
        return None  # WhatsApp has no albums: several photos come as several messages

    async def process(self, batch: list[Pending]) -> Outcome:
        (item,) = batch
        message = _stored_message(item.payload)
        key = message.chat_key
        if await item.submitted_before(self.store):
            return Outcome.DONE
        await self.gate.pace(message.sender, key)
        self.channel.received(key, message.id)
        # Counted from receipt: a message Meta redelivered days late is refused by Meta itself
        # (131047), which holds or reroutes the reply just the same.
        await self.channel.note_inbound(key, item.received)
        # Also when this message starts no turn (a reaction).
        if released := await self.engine.release(key):
            log.info("%s wrote again: %d held replies go out", key, released)
        described = describe(message)
        if described.reaction is not None:
            # Understood, not answered: a reaction is no new turn.
            log.info("%s reacted %s to %s", key, described.reaction, described.reacted_to)
            return Outcome.DONE
        if described.unsupported:
            await self.engine.notify(key, UNSUPPORTED)
            return Outcome.DONE
        fetched = await self.media.fetch(described)
        for problem in fetched.problems:
            await self.engine.notify(key, problem)
        if not described.text and not fetched.attachments:
            return Outcome.DONE
        inbound = Inbound(chat_key=key, text=described.text, received=item.received,
                          id=item.inbound_id, platform_id=message.id, sender=message.sender,
                          attachments=fetched.attachments)
        return Outcome.DONE if await self.engine.submit(inbound) else Outcome.LATER


def _stored_message(payload: Mapping[str, Any]) -> WaMessage:
    body = payload["message"]
    return WaMessage(id=body["id"], sender=body["from"], timestamp=int(body.get("timestamp", 0)),
                     type=str(body.get("type")), body=body,
                     profile_name=payload.get("profile_name"),
                     business_number=payload.get("business_number"))


class WhatsApp:
    """The WhatsApp part of the daemon: the Graph client, delivery, intake and webhook routes.

    `open()` (before the engine exists) starts the Graph client; `start(engine)` (after)
    resumes stored messages; `stop()` stops the intake's workers; `close()` the client.
    """

    def __init__(self, settings: WhatsAppSettings, store: Store, records: Records,
                 tuning: WhatsAppTuning | None = None,
                 attachments: AttachmentSettings | None = None,
                 access: Access | None = None) -> None:
        self.settings = settings
        self.access = access
        self.store = store
        self.records = records
        self.tuning = tuning or WhatsAppTuning()
        self.client = GraphClient(settings)
        self.channel = WhatsAppChannel(self.client, store, settings,
                                       typing_refresh=self.tuning.typing_refresh,
                                       read_delay=self.tuning.read_delay, records=records)
        self.media = WhatsAppMedia(self.client, store.state_dir / "attachments",
                                   limits=attachment_limits(attachments or AttachmentSettings()),
                                   backoff=self.tuning.media_backoff)
        self.intake: WhatsAppIntake | None = None

    async def open(self) -> None:
        await self.client.start()

    async def start(self, engine: Engine, approver: Approver | None = None) -> None:
        """Resume, then take messages; approval button replies go to `approver`."""
        self.intake = WhatsAppIntake(store=self.store, engine=engine, channel=self.channel,
                                     media=self.media, allow=self.settings.allow,
                                     access=self.access, max_age=self.tuning.max_age,
                                     approver=approver)
        await self.intake.intake.resume()

    async def stop(self) -> None:
        if self.intake is not None:
            await self.intake.intake.stop()
        await self.channel.stop()

    async def close(self) -> None:
        await self.client.close()

    async def verify(self, request: web.Request) -> web.Response:
        """`GET /webhooks/whatsapp`: Meta's subscription handshake."""
        query = request.query
        token = query.get("hub.verify_token", "").encode("utf-8", "surrogateescape")
        expected = (self.settings.verify_token or "").encode()
        if (query.get("hub.mode") == "subscribe" and expected
                and hmac.compare_digest(token, expected) and "hub.challenge" in query):
            log.info("Meta verified the webhook subscription")
            return web.Response(text=query["hub.challenge"], content_type="text/plain")
        log.debug("webhook verification from %s refused", request.remote)  # the guard logs it
        return web.Response(status=403, text="forbidden\n")

    async def webhook(self, request: web.Request) -> web.Response:
        """`POST /webhooks/whatsapp`: check, persist, answer; processing comes after."""
        if request.content_type != "application/json":  # what Meta sends, and nothing else
            return web.Response(status=415, text="expected application/json\n")
        body = await read_at_most(request, self.tuning.max_body)
        if body is None:
            return web.Response(status=413, text="too large\n")
        assert self.settings.app_secret is not None  # config requires it when enabled
        verdict = check_signature(self.settings.app_secret, body,
                                  request.headers.get(SIGNATURE_HEADER))
        if verdict is not Signature.OK:
            # Counted and logged once a minute by the HTTP guard: a stranger cannot fill the log.
            log.debug("webhook call from %s with a %s signature; refused", request.remote,
                      verdict.value)
            status = 401 if verdict is Signature.MISSING else 403
            return web.Response(status=status, text=f"signature {verdict.value}\n")
        try:
            payload = json.loads(body)
            if too_deep(payload, MAX_DEPTH):
                # Reading or storing it would exhaust Python's recursion limit further on.
                raise NotAWebhook(f"nested more than {MAX_DEPTH} levels deep")
            hook = parse_webhook(payload, self.settings.phone_number_id)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            # NotAWebhook is a ValueError too; json raises RecursionError past ~1,000 levels.
            reason = (str(exc) if isinstance(exc, NotAWebhook) else "nested too deeply to read"
                      if isinstance(exc, RecursionError) else "malformed JSON")
            log.warning("webhook body refused: %s", reason)
            return web.Response(status=400, text=f"{reason}\n")
        if self.intake is None:
            return web.Response(status=503, text="starting\n")
        intake = self.intake
        try:
            # Together, so one write (one fsync) stores the whole batch; the intake keeps the
            # order in which they were handed over. (Most calls carry one message: no tasks.)
            if len(hook.messages) == 1:
                await intake.accept(hook.messages[0])
            else:
                await asyncio.gather(*(intake.accept(m) for m in hook.messages))
        except StoreError as exc:  # e.g. the disk is full: Meta delivers the batch again later
            log.error("storing a WhatsApp webhook failed: %s", exc)
            return web.Response(status=503, text="not stored\n")
        except Exception:
            # The boundary of the route: without a 2xx Meta delivers the batch again.
            log.exception("storing a WhatsApp webhook failed")
            return web.Response(status=503, text="not stored\n")
        for delivery in hook.statuses:
            await self._record_status(delivery)
        return web.Response(status=200)

    async def _record_status(self, status: WaStatus) -> None:
        sent = self.channel.sent.get(status.id)
        where = (sent.outbound.conversation_id or sent.outbound.chat_key if sent
                 else chat_key(status.recipient))
        errors = "; ".join(f"{code} {title}" for code, title in status.errors)
        detail = f"WhatsApp {status.status} {status.id}" + (f": {errors}" if errors else "")
        if status.status == "failed":
            log.warning("WhatsApp could not deliver %s to %s: %s", status.id, status.recipient,
                        errors or "no reason given")
        await asyncio.to_thread(self.records.event, time.time(), "delivery", where, detail)
        if (status.status == "failed" and sent is not None and self.intake is not None
                and any(code == REENGAGEMENT for code, _ in status.errors)):
            await self._resend_later(status.id, sent)

    async def _resend_later(self, wamid: str, sent: _Sent) -> None:
        """Meta took a part and then refused it for the 24-hour rule: it goes to the fallback
        chat, or waits for the user's next message, like a part refused at once."""
        assert self.intake is not None
        original = sent.outbound
        again_id = inbound_id(original.created, f"{original.id}:{wamid}")  # once per part
        if self.settings.fallback:
            await self.intake.engine.deliver(dataclasses.replace(
                original, id=again_id, chat_key=self.settings.fallback, parts_sent=0,
                platform_ids=(), attempting=None, reply_to=None,
                text=f"{REENGAGEMENT_NOTE}\n\n{sent.text}"))
            return
        await self.channel.invite(original)
        await self.intake.engine.deliver(dataclasses.replace(
            original, id=again_id, text=sent.text, parts_sent=0, platform_ids=(), attempting=None,
            held="WhatsApp refused it: more than 24 hours since the user last wrote"))
