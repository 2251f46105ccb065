"""Matrix delivery (`MatrixChannel`): the reply in parts, a preview while it is written,
typing notifications while a turn runs.

`send` renders the model's Markdown to Matrix HTML (`formatted_body`, with the plain `body`
beside it), split at `MATRIX_LIMIT`, and records after each part its event id, so a restart
resumes after the last part delivered. Every part is sent with a transaction id derived from
the reply and the part (`txn_id`): a part sent again after a crash, or after an answer lost on
the way back, is the same transaction to the homeserver, which answers with the event it
already made instead of a second message. (Synapse keeps transaction ids per device for a
while, so this covers a restart, not a part resent days later.) In an encrypted room nio
encrypts each part; it shares the room's key with every device of the room's members,
verified or not (`ignore_unverified_devices`): a home bot cannot verify its users' devices
interactively, and refusing unverified ones would leave every message unreadable.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from nio import AsyncClient, RoomSendResponse  # type: ignore[import-untyped]

from channels.formatting import split_matrix
from channels.matrix.api import NETWORK_ERRORS, checked, network_errors
from channels.matrix.media import upload
from channels.matrix.parse import address_of
from channels.matrix.platform import log
from channels.matrix.prompts import Question, Questions, approval_of, hint
from channels.matrix.rooms import Rooms
from channels.matrix.stream import EditStream
from channels.progress import Progress
from channels.working import kept_up
from daemon.core.errors import DeliveryError
from daemon.core.messages import UNSEEN, Outbound, ReplySink
from daemon.store import Store

HTML = "org.matrix.custom.html"
STREAMED_FLAG = "matrix_streamed"  # a chat's preview message: {"room": ..., "event": ...}


def txn_id(outbound_id: str, part: int, step: str = "") -> str:
    """The transaction id of one part: the same at every try, so a resend is idempotent."""
    return f"roost.{outbound_id}.{part}{step}"


def text_content(body: str, formatted: str, *, notice: bool = False) -> dict[str, Any]:
    return {"msgtype": "m.notice" if notice else "m.text", "body": body, "format": HTML,
            "formatted_body": formatted}


def replacement(event_id: str, body: str, formatted: str) -> dict[str, Any]:
    """An edit of one of the bot's messages (`m.replace`; the `* ` copy is for clients that
    do not know edits)."""
    return {**text_content(f"* {body}", f"* {formatted}"),
            "m.new_content": text_content(body, formatted),
            "m.relates_to": {"rel_type": "m.replace", "event_id": event_id}}


class MatrixChannel:
    """Delivery to Matrix rooms: HTML parts, resumable and idempotent; see the docstring."""

    name = "matrix"

    def __init__(self, client: AsyncClient, store: Store, rooms: Rooms, questions: Questions,
                 *, typing_interval: float = 20.0, streaming: bool = True,
                 stream_interval: float = 1.5,
                 on_resent: Callable[[], None] | None = None) -> None:
        self.client = client
        self.store = store
        self.rooms = rooms
        self.questions = questions
        self.progress = Progress(store, on_resent)
        self.typing_interval = typing_interval
        self.streaming_on = streaming
        self.stream_interval = stream_interval
        self._streamed: dict[str, tuple[str, str]] = {}  # reply id -> (room, preview event)

    # ---- the Channel port ------------------------------------------------------------------

    async def send(self, outbound: Outbound) -> None:
        """Send the parts not yet delivered, recording progress after each one."""
        room = await self.rooms.room_for(outbound.chat_key)
        if outbound.kind == "voice":
            await self._send_voice(outbound, room)
            return
        parts = split_matrix(outbound.text)
        if outbound.buttons and parts:  # an approval question: how to answer, under it
            body, formatted = parts[-1]
            line = hint(outbound.buttons)
            parts[-1] = (f"{body}\n\n{line}", f"{formatted}<br/>\n<em>{line}</em>")
        done, ids = self.progress.start(outbound)
        # Kept until the preview is the first part: a failed edit (the homeserver away) is
        # tried again, never followed by the reply as a second message beside a half preview.
        streamed = self._streamed.get(outbound.id)
        if streamed is not None and not done and parts and streamed[0] == room:
            await self._adopt(outbound, streamed[1], parts[0], more=len(parts) > 1)
            done, ids = 1, [streamed[1]]
        self._streamed.pop(outbound.id, None)
        group = address_of(outbound.chat_key).room is not None
        for index in range(done, len(parts)):
            content = text_content(*parts[index], notice=outbound.kind == "notice")
            if index == 0 and group and outbound.reply_to:  # whom it answers, in a group
                content["m.relates_to"] = {"m.in_reply_to": {"event_id": outbound.reply_to}}
            await self.progress.attempt(outbound, index)
            event_id = await self._send(room, content, txn_id(outbound.id, index), outbound,
                                        index)
            ids.append(event_id)
            # First thing after the homeserver's answer: a crash before this write sends the
            # part again, under the same transaction id.
            await self.progress.record(outbound, index + 1, ids, more=index + 1 < len(parts))
        if outbound.buttons and ids and (approval := approval_of(outbound.buttons)):
            self.questions.asked(Question(approval, outbound.chat_key, ids[-1]))

    @contextlib.asynccontextmanager
    async def streaming(self, chat_key: str) -> AsyncIterator[ReplySink]:
        """The reply as it is written, in a message edited as it grows (stream.py)."""
        if not self.streaming_on:
            yield UNSEEN
            return
        try:
            room = await self.rooms.room_for(chat_key)
        except DeliveryError as exc:  # the reply's delivery will meet it too, and say so
            log.info("no preview for %s: %s", chat_key, exc)
            yield UNSEEN
            return

        async def first(body: str, formatted: str) -> str | None:
            try:
                event_id = await self._send(room, text_content(body, formatted), None)
            except DeliveryError as exc:
                log.info("the preview for %s did not go out: %s", chat_key, exc)
                return None
            await asyncio.to_thread(self.store.set_chat_flag, chat_key, STREAMED_FLAG,
                                    {"room": room, "event": event_id})
            return event_id

        async def edit(event_id: str, body: str, formatted: str) -> None:
            try:
                await self._send(room, replacement(event_id, body, formatted), None)
            except DeliveryError as exc:  # the next edit, or the reply, shows it
                log.debug("an edit of the preview in %s failed: %s", chat_key, exc)

        stream = EditStream(first, edit, interval=self.stream_interval, name=chat_key)
        stream.start()
        try:
            yield stream
        finally:
            await stream.close()
            if stream.event_id is not None:
                await self._hand_over(chat_key, room, stream.event_id)

    def working(self, chat_key: str) -> contextlib.AbstractAsyncContextManager[None]:
        return self._typing(chat_key)

    # ---- the parts -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _typing(self, chat_key: str) -> AsyncIterator[None]:
        try:
            room = await self.rooms.room_for(chat_key)
        except DeliveryError:
            yield
            return
        timeout_ms = int(self.typing_interval * 1000) + 5000

        async def show(typing: bool = True) -> None:
            try:
                await self.client.room_typing(room, typing, timeout=timeout_ms)
            except NETWORK_ERRORS as exc:  # cosmetic: never worth failing a turn for
                log.debug("typing notification in %s failed: %s", room, exc)

        async with kept_up(show, self.typing_interval, f"roost-matrix-typing-{chat_key}"):
            yield
        await show(False)

    async def _send(self, room: str, content: dict[str, Any], txn: str | None,
                    outbound: Outbound | None = None, index: int = 0) -> str:
        try:
            with network_errors("a message"):
                answer = await self.client.room_send(room, "m.room.message", content,
                                                     tx_id=txn, ignore_unverified_devices=True)
        except DeliveryError:
            if outbound is not None:  # it may have landed: the same txn id makes it harmless
                self.progress.answer_lost(outbound, index)
            raise
        sent = checked(answer, "a message")
        assert isinstance(sent, RoomSendResponse)
        return sent.event_id

    async def _adopt(self, outbound: Outbound, event_id: str, part: tuple[str, str], *,
                     more: bool) -> None:
        """The preview becomes the reply's first part: one last edit to the part's words."""
        room = await self.rooms.room_for(outbound.chat_key)
        await self.progress.attempt(outbound, 0)
        await self._send(room, replacement(event_id, *part), txn_id(outbound.id, 0, "edit"),
                         outbound, 0)
        await self.progress.record(outbound, 1, [event_id], more=more)
        await asyncio.to_thread(self.store.set_chat_flag, outbound.chat_key, STREAMED_FLAG, None)

    async def _send_voice(self, outbound: Outbound, room: str) -> None:
        """A spoken reply as an m.audio flagged as a voice message (MSC3245), one part."""
        done, _ = self.progress.start(outbound)
        if done:
            return
        assert outbound.audio is not None  # synthesised by the engine before it is sent
        data = await asyncio.to_thread(Path(outbound.audio).read_bytes)
        encrypted = room in self.client.rooms and self.client.rooms[room].encrypted
        where = await upload(self.client, data, "audio/ogg", "voice-note.ogg",
                             encrypt=encrypted)
        ms = round(outbound.seconds * 1000)
        content: dict[str, Any] = {
            "msgtype": "m.audio", "body": "Voice message", "filename": "voice-note.ogg",
            "info": {"mimetype": "audio/ogg", "size": len(data), "duration": ms},
            "org.matrix.msc1767.audio": {"duration": ms}, "org.matrix.msc3245.voice": {},
            **where}
        await self.progress.attempt(outbound, 0)
        event_id = await self._send(room, content, txn_id(outbound.id, 0), outbound, 0)
        await self.progress.record(outbound, 1, [event_id], more=False)

    # ---- previews left behind --------------------------------------------------------------

    async def _hand_over(self, chat_key: str, room: str, event_id: str) -> None:
        """The preview goes to the reply the turn saved (its delivery edits it into the first
        part); with none (the turn failed), it is redacted."""
        pending = await asyncio.to_thread(self.store.outbox_pending, chat_key)
        for doc in reversed(pending):
            reply = Outbound.from_doc(doc)
            if reply.kind == "reply" and reply.parts_sent == 0:
                self._streamed[reply.id] = (room, event_id)
                return
        await self._redact(chat_key, room, event_id)

    async def _redact(self, chat_key: str, room: str, event_id: str) -> None:
        try:
            answer = await self.client.room_redact(room, event_id, reason="superseded")
            checked(answer, "a redaction")
        except (DeliveryError, *NETWORK_ERRORS) as exc:
            log.info("could not redact a preview in %s: %s", chat_key, exc)
        await asyncio.to_thread(self.store.set_chat_flag, chat_key, STREAMED_FLAG, None)

    async def clear_orphans(self) -> None:
        """At start: a preview a crash left, recorded by no reply's delivery, is redacted; the
        reply (written again, or resumed from the outbox) goes out whole."""
        flagged = await asyncio.to_thread(self.store.chats_with_flag, STREAMED_FLAG)
        for chat_key, where in flagged.items():
            pending = await asyncio.to_thread(self.store.outbox_pending, chat_key)
            recorded = {i for doc in pending for i in doc.get("platform_ids", ())}
            if isinstance(where, dict) and where.get("event") not in recorded:
                await self._redact(chat_key, str(where.get("room")), str(where.get("event")))
            else:
                await asyncio.to_thread(self.store.set_chat_flag, chat_key, STREAMED_FLAG, None)

