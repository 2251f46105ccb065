"""WhatsApp messages into the shared intake (`daemon.intake`), and out of it to the engine.

`WhatsAppIntake.accept` runs at the door, before Meta is answered: too old, not allowed, or a tap
on an approval button, else stored. `process` (per sender, in order) has the message marked read
(within `read_delay`, by the typing indicator when its turn starts by then), tells the engine the
user wrote again, fetches its media, builds the `Inbound` and submits it. A reaction is noted,
not answered.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from channels.whatsapp.delivery import WhatsAppChannel
from channels.whatsapp.media import WhatsAppMedia
from channels.whatsapp.parse import WaMessage, approval_reply, chat_key, describe
from channels.whatsapp.platform import log
from daemon.core.approval import ACCEPTED, NOT_WAITING, Answer, Approver
from daemon.core.logs import outside
from daemon.core.messages import Inbound
from daemon.intake.durable import Intake, Outcome, Pending
from daemon.intake.gate import Access, Gate
from daemon.intake.platforms import Port as SubmitAndDeliver
from daemon.intake.quarantine import UNREADABLE
from daemon.store import Store

CHANNEL = "whatsapp"
UNSUPPORTED = ("I can read text, photos, voice notes, audio, video, documents, locations and "
               "contacts; that kind of message I cannot use. Please describe it in words.")
# Meta retries an unanswered webhook "with decreasing frequency ... for up to 7 days" (Cloud API,
# Set up webhooks): a message older than that is not a delivery but a replay of a signed body.
MAX_AGE = 7 * 24 * 3600.0


def message_key(wamid: str) -> str:
    return f"whatsapp:msg:{wamid}"


class WhatsAppIntake:
    """WhatsApp messages into the shared intake, and out of it to the engine (its Handler)."""

    def __init__(self, *, store: Store, engine: SubmitAndDeliver, channel: WhatsAppChannel,
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
                        "the %.0f days Meta retries a webhook", outside(message.id), message.sender,
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

    async def unreadable(self, batch: list[Pending]) -> None:
        """A message roost could not read was set aside: its sender is told, when the payload
        names one (every WhatsApp chat is a private one) who may talk."""
        body = batch[0].payload.get("message")
        sender = body.get("from") if isinstance(body, Mapping) else None
        if (isinstance(sender, str) and sender.isdigit()
                and await self.gate.may_talk(sender)):
            await self.engine.notify(chat_key(sender), UNREADABLE)

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
            log.info("%s reacted %s to %s", key, outside(described.reaction),
                     outside(described.reacted_to))
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
