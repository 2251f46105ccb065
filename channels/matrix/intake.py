"""Matrix events into the shared intake (`daemon.intake`), and out of it to the engine.

The sync loop (`channels.matrix.channel`) calls `MatrixIntake.accept` for every timeline event
of a sync before it stores the sync's token. The door decides with what the event says: the
bot's own echoes, redactions and reactions are not stored (a reaction or typed answer to an
approval question goes to the approver here); in a group room a message must mention the bot
or reply to it; the sender must be allowed or approved (a stranger in a direct room gets a
pairing code). What passes goes to `intake.durable.Intake` under its event id, which persists
it and drops a redelivery. `process` (per chat, in order) tells the engine the user wrote
again, downloads media, builds the `Inbound` and submits it, then marks the event read.

An event the bot could not decrypt is stored too and answered with one line, so the sender
is not left in silence.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from nio import AsyncClient  # type: ignore[import-untyped]

from channels.matrix.api import NETWORK_ERRORS
from channels.matrix.media import UNSUPPORTED, MatrixMedia
from channels.matrix.parse import (
    MEDIA_TYPES,
    TEXT_TYPES,
    Incoming,
    address_of,
    addressed,
    context_lines,
    fallback_author,
    message_text,
    reaction_choice,
    read_event,
    typed_choice,
)
from channels.matrix.platform import log
from channels.matrix.prompts import Question, Questions
from channels.matrix.rooms import Rooms
from channels.wording import edit_text, with_context
from daemon.core.approval import ACCEPTED, NOT_WAITING, Answer, Approver, Choice
from daemon.core.logs import outside
from daemon.core.messages import Inbound
from daemon.intake.durable import Intake, Outcome, Pending, Submitter
from daemon.intake.gate import Access, Gate
from daemon.intake.quarantine import UNREADABLE
from daemon.store import Store

CHANNEL = "matrix"
CANNOT_DECRYPT = ("I could not decrypt your message: my device has no key for it (sent before I "
                  "joined, or your client did not share it with me). Please send it again; if "
                  "this keeps happening, check that your client shares keys with unverified "
                  "devices.")


def event_key(event_id: str) -> str:
    return f"matrix:event:{event_id}"


@dataclass(frozen=True)
class Bot:
    user_id: str
    name: str  # display name, also a mention in a group


@dataclass(frozen=True)
class Arrival:
    """One timeline event at the door, with what the room says about it."""

    room_id: str
    chat_key: str
    direct: bool
    event: Mapping[str, Any]
    sender_name: str


class MatrixIntake:
    """Matrix events into the shared intake, and out of it to the engine (its Handler)."""

    def __init__(self, *, store: Store, engine: Submitter, client: AsyncClient, bot: Bot,
                 rooms: Rooms, media: MatrixMedia, questions: Questions,
                 allow: Collection[str], require_mention: bool = True,
                 access: Access | None = None, approver: Approver | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.engine = engine
        self.client = client
        self.bot = bot
        self.rooms = rooms
        self.media = media
        self.questions = questions
        self.require_mention = require_mention
        self.access = access
        self.approver = approver
        self.gate = Gate(CHANNEL, "Matrix", allow, access, engine.notify, log)
        self.intake = Intake(store=store, channel=CHANNEL, handler=self, clock=clock)

    # ---- the door --------------------------------------------------------------------------

    async def accept(self, arrival: Arrival) -> bool:
        """Persist one event, if roost handles it; False for one dropped or delivered before.
        Raises (StoreError) when it could not be stored: the sync token then stays."""
        incoming = read_event(arrival.event)
        if incoming is None or incoming.sender == self.bot.user_id:
            return False
        if incoming.kind == "reaction":
            key = str(incoming.content.get("key", ""))
            await self._answer(self.questions.about(incoming.target), reaction_choice(key),
                               arrival, incoming, quiet=True)
            return False
        if incoming.kind == "redaction":
            log.info("%s redacted %s in %s", incoming.sender, outside(incoming.target),
                     arrival.chat_key)
            return False
        if incoming.kind == "message" and (choice := typed_choice(incoming.body)) is not None:
            question = (self.questions.about(incoming.reply_to)
                        or self.questions.waiting_in(arrival.chat_key))
            if question is not None:
                await self._answer(question, choice, arrival, incoming, quiet=False)
                return False
        if not arrival.direct and incoming.kind != "undecryptable" and self.require_mention \
                and not addressed(incoming.content, self.bot.user_id, self.bot.name,
                                  fallback_author(incoming.body) == self.bot.user_id):
            log.debug("ignored a message in %s not addressed to the bot", arrival.chat_key)
            return False
        if not await self.gate.door(incoming.sender, arrival.chat_key, arrival.sender_name,
                                    private=arrival.direct):
            return False
        if arrival.direct:
            await self.rooms.remember(incoming.sender, arrival.room_id, arrival.chat_key)
        payload = {"room": arrival.room_id, "chat": arrival.chat_key, "direct": arrival.direct,
                   "sender_name": arrival.sender_name, "event": dict(arrival.event)}
        return await self.intake.accept(event_key(incoming.event_id), arrival.chat_key, payload)

    async def _answer(self, question: Question | None, choice: Choice | None, arrival: Arrival,
                      incoming: Incoming, *, quiet: bool) -> None:
        """An answer to an approval question goes to the approver; the line it returns is
        said in the room unless the question was answered (a reaction says nothing more)."""
        if question is None or choice is None:
            return
        said = NOT_WAITING
        if self.approver is not None:
            said = await self.approver.answer(Answer(question.approval_id, choice,
                                                     question.chat_key,
                                                     f"{CHANNEL}:{incoming.sender}"))
        if said in ACCEPTED or said == NOT_WAITING:
            self.questions.settled(question)
        if said not in ACCEPTED or not quiet:
            await self.engine.notify(arrival.chat_key, said)

    async def resume(self) -> int:
        return await self.intake.resume()

    async def idle(self) -> None:
        await self.intake.idle()

    async def stop(self) -> None:
        await self.intake.stop()

    # ---- the intake's Handler --------------------------------------------------------------

    def route(self, payload: Mapping[str, Any]) -> str | None:
        chat = payload.get("chat")
        try:
            return chat if isinstance(chat, str) and address_of(chat) else None
        except ValueError:
            return None

    def group(self, item: Pending) -> str | None:
        return None  # every Matrix message is one event, pictures too

    async def unreadable(self, batch: list[Pending]) -> None:
        """An event roost could not read was set aside: its sender is told, in their own
        chat, when they may talk."""
        payload = batch[0].payload
        event = payload.get("event")
        sender = event.get("sender") if isinstance(event, Mapping) else None
        if payload.get("direct") is True and isinstance(sender, str) \
                and await self.gate.may_talk(sender):
            await self.engine.notify(str(payload["chat"]), UNREADABLE)

    async def process(self, batch: list[Pending]) -> Outcome:
        (item,) = batch
        key = str(item.payload["chat"])
        incoming = read_event(item.payload["event"])
        if incoming is None:
            return Outcome.DROPPED
        if await item.submitted_before(self.store):
            return Outcome.DONE
        await self.gate.pace(incoming.sender, key)
        if released := await self.engine.release(key):  # also when no turn follows
            log.info("%s wrote again: %d held replies go out", key, released)
        if incoming.kind == "undecryptable":
            await self.engine.notify(key, CANNOT_DECRYPT)
            return Outcome.DONE
        inbound = await self._inbound(item, key, incoming)
        if inbound is None:
            return Outcome.DONE
        if not await self.engine.submit(inbound):
            return Outcome.LATER
        await self._mark_read(str(item.payload["room"]), incoming.event_id)
        return Outcome.DONE

    async def _inbound(self, item: Pending, key: str, incoming: Incoming) -> Inbound | None:
        content = incoming.content
        edited = incoming.kind == "edit" and incoming.target is not None \
            and await self._seen(key, incoming.target)
        attachments: tuple[dict[str, Any], ...] = ()
        if incoming.msgtype in TEXT_TYPES:
            text = message_text(content, self.bot.user_id, self.bot.name)
            if incoming.msgtype == "m.emote":
                text = f"* {item.payload.get('sender_name') or incoming.sender} {text}"
        elif incoming.msgtype in MEDIA_TYPES:
            text = _caption(content)
            if not edited:  # an edit changes the words; its media was handled the first time
                fetched = await self.media.fetch(content)
                attachments = fetched.attachments
                for problem in fetched.problems:
                    await self.engine.notify(key, problem)
        else:  # a location, a poll, a sticker...
            await self.engine.notify(key, UNSUPPORTED)
            return None
        if not text and not attachments:
            return None
        meta: dict[str, Any] = {}
        if edited:
            assert incoming.target is not None
            text = edit_text(incoming.target, text)
            meta["edit_of"] = incoming.target
        else:
            text = with_context(text, self._context(item.payload, incoming))
        return Inbound(chat_key=key, text=text, received=item.received, id=item.inbound_id,
                       platform_id=incoming.event_id, sender=incoming.sender,
                       attachments=attachments, meta=meta)

    def _context(self, payload: Mapping[str, Any], incoming: Incoming) -> list[str]:
        author = fallback_author(incoming.body)
        quoted = None
        if author is not None:
            lines = incoming.body.split("\n")
            first = lines[0].split("> ", 2)[-1] if lines else ""
            quoted = " ".join([first, *(line.removeprefix("> ") for line in lines[1:]
                                        if line.startswith(">"))])
        elif incoming.reply_to is not None:
            author = "an earlier message"
        return context_lines(
            group=not payload.get("direct"), sender=incoming.sender,
            sender_name=str(payload.get("sender_name") or ""),
            reply_author="you" if author == self.bot.user_id else author, reply_text=quoted)

    async def _seen(self, key: str, event_id: str) -> bool:
        """Whether the chat's current conversation (or its inbox) holds that message."""

        def look() -> bool:
            if any(doc.get("platform_id") == event_id for doc in self.store.inbox_pending(key)):
                return True
            conversation = self.store.active_conversation(key)
            return conversation is not None and any(
                event_id in m.channel_message_ids
                for m in self.store.messages(conversation.id) if m.role == "user")

        return await asyncio.to_thread(look)

    async def _mark_read(self, room: str, event_id: str) -> None:
        """A read receipt for the processed message (cosmetic: failures only logged)."""
        try:
            await self.client.room_read_markers(room, event_id, event_id)
        except NETWORK_ERRORS as exc:
            log.debug("read receipt in %s failed: %s", room, exc)


def _caption(content: Mapping[str, Any]) -> str:
    """A media message's caption: its body when a filename is given beside it (MSC2530);
    otherwise the body is only the file's name."""
    body, name = content.get("body"), content.get("filename")
    if isinstance(body, str) and isinstance(name, str) and body != name:
        return body.strip()
    return ""
