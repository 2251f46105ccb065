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
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from channels.formatting import to_whatsapp
from channels.media import attachment_limits
from channels.webhooks import read_at_most, too_deep
from channels.whatsapp.api import REENGAGEMENT, GraphClient
from channels.whatsapp.delivery import ECHO_WAIT, REENGAGEMENT_NOTE, SentPart, WhatsAppChannel
from channels.whatsapp.doctor import doctor_checks
from channels.whatsapp.intake import MAX_AGE, SubmitAndDeliver, WhatsAppIntake
from channels.whatsapp.media import WhatsAppMedia
from channels.whatsapp.parse import (
    SIGNATURE_HEADER,
    NotAWebhook,
    Signature,
    WaStatus,
    chat_key,
    check_signature,
    parse_webhook,
)
from channels.whatsapp.platform import WHATSAPP, WhatsAppSettings, log
from channels.whatsapp.setup import set_up
from daemon.core.approval import Approver
from daemon.core.config import AttachmentSettings
from daemon.core.errors import StoreError
from daemon.core.ids import inbound_id
from daemon.intake.gate import Access
from daemon.intake.platforms import PlatformParts, Route, Runtime
from daemon.store import Store
from daemon.store.event_log import Records

WEBHOOK_PATH = "/webhooks/whatsapp"
MAX_DEPTH = 40  # JSON nesting of a webhook body (Meta's nest about ten levels)


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
    echo_wait: float = ECHO_WAIT  # a part that may have gone out waits for its status this long


class WhatsApp:
    """The WhatsApp part of the daemon: the Graph client, delivery, intake and webhook routes.

    `open()` (before the engine exists) starts the Graph client; `start(engine)` (after)
    resumes stored messages; `stop()` stops the intake's workers; `close()` the client.
    """

    def __init__(self, settings: WhatsAppSettings, store: Store, records: Records,
                 tuning: WhatsAppTuning | None = None,
                 attachments: AttachmentSettings | None = None,
                 access: Access | None = None,
                 on_resent: Callable[[], None] | None = None) -> None:
        """`on_resent` is told of each part of a reply sent again (see channels/progress.py)."""
        self.settings = settings
        self.access = access
        self.store = store
        self.records = records
        self.tuning = tuning or WhatsAppTuning()
        self.client = GraphClient(settings)
        self.channel = WhatsAppChannel(self.client, store, settings,
                                       typing_refresh=self.tuning.typing_refresh,
                                       read_delay=self.tuning.read_delay, records=records,
                                       on_resent=on_resent, echo_wait=self.tuning.echo_wait)
        self.media = WhatsAppMedia(self.client, store.state_dir / "attachments",
                                   limits=attachment_limits(attachments or AttachmentSettings()),
                                   backoff=self.tuning.media_backoff)
        self.intake: WhatsAppIntake | None = None

    async def open(self) -> None:
        await self.client.start()

    async def start(self, engine: SubmitAndDeliver, approver: Approver | None = None) -> None:
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

    def routes(self) -> list[Route]:
        return [Route("GET", WEBHOOK_PATH, self.verify, stores=False),
                Route("POST", WEBHOOK_PATH, self.webhook)]

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
        if status.tracking and status.status != "failed":  # Meta took that send
            self.channel.echoed(status.tracking, status.id)
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

    async def _resend_later(self, wamid: str, sent: SentPart) -> None:
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


def _open(parts: PlatformParts) -> WhatsApp:
    return WhatsApp(WHATSAPP.of(parts.settings.platforms), parts.store, parts.records,
                    parts.tuning, parts.settings.attachments, parts.access,
                    on_resent=parts.on_resent)


RUNTIME = Runtime(
    tuning=WhatsAppTuning,
    render=to_whatsapp,
    open=_open,
    doctor=doctor_checks,
    setup=set_up)
