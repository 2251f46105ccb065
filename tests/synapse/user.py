"""The person in a Matrix test: a matrix-nio client with end-to-end encryption, as Element is.

It talks to the real homeserver (tests/synapse/server.py) and syncs only when asked to, inside
its `wait_*` methods: every timeline event it receives is kept (decrypted where it holds the key),
and `wait_for` returns the first kept event that matches and was not returned before, so a
reply that arrived before the test started waiting is still found, and two alike replies are two.

    user = await MatrixUser.connect(synapse.url, await synapse.aregister(name, "pw"), tmp_path)
    room = await user.create_dm(bot_id, encrypted=True)
    await user.wait_joined(room, bot_id)
    await user.send_text(room, "hello")
    reply = await user.wait_for(lambda e: isinstance(e, RoomMessageText), sender=bot_id)
    await user.close()
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from nio import (
    AsyncClient,
    AsyncClientConfig,
    Event,
    JoinError,
    LoginError,
    MegolmEvent,
    MessageDirection,
    RoomCreateError,
    RoomPreset,
    RoomSendError,
    SyncError,
    UploadError,
    UploadResponse,
)
from nio.api import RelationshipType
from nio.exceptions import EncryptionError

MEGOLM = "m.megolm.v1.aes-sha2"
# Synapse sends at most 10 events a room in a sync by default: a bot editing its reply as it
# streams would lose edits between two syncs (the timeline comes back "limited").
SYNC_FILTER = {"room": {"timeline": {"limit": 500}}}


class Credentials(Protocol):
    """What Homeserver.register returns (tests/synapse/server.py)."""

    @property
    def user_id(self) -> str: ...
    @property
    def access_token(self) -> str: ...
    @property
    def device_id(self) -> str: ...


class MatrixUserError(RuntimeError):
    pass


class MatrixUser:
    """One logged-in nio client with its own encryption store (a folder of the test's)."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.events: list[tuple[str, Event]] = []  # (room_id, event), as received
        self._returned: set[str] = set()

    @property
    def user_id(self) -> str:
        return str(self.client.user_id)

    @classmethod
    def _client(cls, url: str, user_id: str, store: Path) -> AsyncClient:
        store.mkdir(parents=True, exist_ok=True)
        config = AsyncClientConfig(
            store_sync_tokens=True, encryption_enabled=True, max_timeouts=5
        )
        return AsyncClient(url, user_id, store_path=str(store), config=config)

    @classmethod
    async def connect(cls, url: str, credentials: Credentials, store: Path) -> MatrixUser:
        """The device that registration logged in (no second password login, no bcrypt)."""
        client = cls._client(url, credentials.user_id, store)
        client.restore_login(credentials.user_id, credentials.device_id, credentials.access_token)
        user = cls(client)
        await user.sync()  # uploads this device's keys, learns its rooms
        return user

    @classmethod
    async def login(
        cls, url: str, user_id: str, password: str, store: Path, device_name: str = "test"
    ) -> MatrixUser:
        """A password login on a new device, as a person signing in to Element."""
        client = cls._client(url, user_id, store)
        answer = await client.login(password, device_name=device_name)
        if isinstance(answer, LoginError):
            await client.close()
            raise MatrixUserError(f"login as {user_id}: {answer.message}")
        user = cls(client)
        await user.sync()
        return user

    async def close(self) -> None:
        await self.client.close()

    # -- syncing ----------------------------------------------------------------------------

    async def sync(self, timeout_ms: int = 0) -> None:
        """One sync, then what nio's sync_forever does between syncs: upload this device's keys,
        query and claim other devices' keys, send queued to-device messages (room keys)."""
        client = self.client
        answer = await client.sync(timeout=timeout_ms, sync_filter=SYNC_FILTER)
        if isinstance(answer, SyncError):
            raise MatrixUserError(f"sync: {answer.message}")
        for room_id, room in answer.rooms.join.items():
            self.events.extend((room_id, event) for event in room.timeline.events)
        if client.should_upload_keys:
            await client.keys_upload()
        if client.should_query_keys:
            await client.keys_query()
        if client.should_claim_keys:
            await client.keys_claim(client.get_users_for_key_claiming())
        await client.send_to_device_messages()
        self._decrypt_late()

    def _decrypt_late(self) -> None:
        """A message whose room key came after it (a to-device message) is decrypted now."""
        for index, (room_id, event) in enumerate(self.events):
            if isinstance(event, MegolmEvent):
                try:
                    event.room_id = room_id
                    self.events[index] = (room_id, self.client.decrypt_event(event))
                except EncryptionError:
                    pass

    async def wait_until(
        self,
        condition: Callable[[], bool],
        timeout: float = 30.0,  # noqa: ASYNC109
    ) -> None:
        """Sync (long-polling a second at a time) until `condition()` holds; TimeoutError after
        `timeout` seconds, a homeserver that stopped answering included."""
        try:
            async with asyncio.timeout(timeout):
                while not condition():
                    await self.sync(timeout_ms=1000)
        except TimeoutError:
            raise TimeoutError(f"{self.user_id}: condition not met within {timeout} s") from None

    async def wait_for(
        self,
        condition: Callable[[Event], bool] = lambda event: True,
        *,
        room_id: str | None = None,
        sender: str | None = None,
        timeout: float = 30.0,  # noqa: ASYNC109
    ) -> Event:
        """The first received event matching all of room, sender and condition that no earlier
        wait_for returned. Encrypted ones are matched once decrypted (a MegolmEvent never
        matches unless the condition asks for one)."""
        found: list[Event] = []

        def match() -> bool:
            for event_room, event in self.events:
                if event.event_id in self._returned:
                    continue
                if room_id is not None and event_room != room_id:
                    continue
                if sender is not None and event.sender != sender:
                    continue
                if condition(event):
                    found.append(event)
                    return True
            return False

        try:
            await self.wait_until(match, timeout)
        except TimeoutError:
            seen = [
                f"{type(e).__name__} from {e.sender}: {e.source.get('content')}"
                for _, e in self.events[-10:]
            ]
            raise TimeoutError(
                f"{self.user_id}: no matching event within {timeout} s; last received:\n"
                + "\n".join(seen)
            ) from None
        self._returned.add(found[0].event_id)
        return found[0]

    async def wait_joined(
        self,
        room_id: str,
        user_id: str,
        timeout: float = 30.0,  # noqa: ASYNC109
    ) -> None:
        """Until `user_id` has joined (not only been invited to) the room."""

        def joined() -> bool:
            room = self.client.rooms.get(room_id)
            return room is not None and user_id in room.users and user_id not in room.invited_users

        await self.wait_until(joined, timeout)

    # -- rooms ------------------------------------------------------------------------------

    async def create_room(
        self,
        invite: Sequence[str] = (),
        *,
        name: str | None = None,
        direct: bool = False,
        encrypted: bool = False,
    ) -> str:
        """A private room, as Element makes one: a DM is `is_direct` with the trusted private
        chat preset; an encrypted room has m.room.encryption (megolm) in its initial state.
        Returns once this client knows the room (sending into it needs that)."""
        initial_state = []
        if encrypted:
            initial_state.append(
                {"type": "m.room.encryption", "state_key": "", "content": {"algorithm": MEGOLM}}
            )
        answer = await self.client.room_create(
            name=name,
            is_direct=direct,
            preset=RoomPreset.trusted_private_chat if direct else RoomPreset.private_chat,
            invite=list(invite),
            initial_state=initial_state,
        )
        if isinstance(answer, RoomCreateError):
            raise MatrixUserError(f"create room: {answer.message}")
        room_id = answer.room_id

        def known() -> bool:
            room = self.client.rooms.get(room_id)
            return room is not None and room.encrypted == encrypted

        await self.wait_until(known)
        return room_id

    async def create_dm(self, other: str, *, encrypted: bool = False) -> str:
        return await self.create_room([other], direct=True, encrypted=encrypted)

    async def create_group(
        self, invite: Sequence[str], name: str = "group", *, encrypted: bool = False
    ) -> str:
        return await self.create_room(invite, name=name, encrypted=encrypted)

    async def create_encrypted_room(self, invite: Sequence[str], name: str = "secret") -> str:
        return await self.create_room(invite, name=name, encrypted=True)

    async def join(self, room_id: str) -> None:
        answer = await self.client.join(room_id)
        if isinstance(answer, JoinError):
            raise MatrixUserError(f"join {room_id}: {answer.message}")
        await self.wait_until(lambda: room_id in self.client.rooms)

    # -- sending ----------------------------------------------------------------------------

    async def send(self, room_id: str, event_type: str, content: dict[str, Any]) -> str:
        """Any event (encrypted in an encrypted room, to every device, verified or not: the
        tests trust the bot's devices as a person clicking through Element's warning would)."""
        answer = await self.client.room_send(
            room_id, event_type, content, ignore_unverified_devices=True
        )
        if isinstance(answer, RoomSendError):
            raise MatrixUserError(f"send {event_type} to {room_id}: {answer.message}")
        return str(answer.event_id)

    async def send_text(
        self,
        room_id: str,
        body: str,
        *,
        reply_to: str | None = None,
        mention: str | None = None,
        html: str | None = None,
    ) -> str:
        """m.text; `reply_to` an event id makes it a reply (m.in_reply_to), `mention` a user id
        a mention (m.mentions, and a matrix.to pill in the HTML body, as Element sends)."""
        content: dict[str, Any] = {"msgtype": "m.text", "body": body, "m.mentions": {}}
        if mention is not None:
            content["m.mentions"] = {"user_ids": [mention]}
            pill = f'<a href="https://matrix.to/#/{mention}">{mention}</a>'
            html = f"{pill}: {html or body}"
            content["body"] = f"{mention}: {body}"
        if html is not None:
            content["format"] = "org.matrix.custom.html"
            content["formatted_body"] = html
        if reply_to is not None:
            content["m.relates_to"] = {"m.in_reply_to": {"event_id": reply_to}}
        return await self.send(room_id, "m.room.message", content)

    async def send_file(
        self,
        room_id: str,
        data: bytes,
        *,
        msgtype: str,
        mimetype: str,
        filename: str,
        info: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> str:
        """Upload then send m.image / m.audio / m.file...; in an encrypted room the file is
        encrypted too (content "file" with its key, instead of "url")."""
        room = self.client.rooms.get(room_id)
        encrypted = room is not None and room.encrypted
        answer, keys = await self.client.upload(
            io.BytesIO(data),
            content_type=mimetype,
            filename=filename,
            encrypt=encrypted,
            filesize=len(data),
        )
        if isinstance(answer, UploadError) or not isinstance(answer, UploadResponse):
            raise MatrixUserError(f"upload {filename}: {getattr(answer, 'message', answer)}")
        content: dict[str, Any] = {
            "msgtype": msgtype,
            "body": filename,
            "info": {"mimetype": mimetype, "size": len(data), **(info or {})},
            **(extra or {}),
        }
        if encrypted:
            assert keys is not None
            content["file"] = {"url": answer.content_uri, **keys}
        else:
            content["url"] = answer.content_uri
        return await self.send(room_id, "m.room.message", content)

    async def send_image(
        self,
        room_id: str,
        data: bytes,
        *,
        mimetype: str = "image/png",
        filename: str = "image.png",
        width: int | None = None,
        height: int | None = None,
    ) -> str:
        info = {k: v for k, v in (("w", width), ("h", height)) if v is not None}
        return await self.send_file(
            room_id, data, msgtype="m.image", mimetype=mimetype, filename=filename, info=info
        )

    async def send_audio(
        self,
        room_id: str,
        data: bytes,
        *,
        duration_ms: int,
        voice: bool = True,
        mimetype: str = "audio/ogg",
        filename: str = "Voice message.ogg",
    ) -> str:
        """m.audio; `voice` marks a recorded voice note as Element does (MSC3245's flag and
        MSC1767's audio block with the duration and a waveform)."""
        extra: dict[str, Any] = {}
        if voice:
            extra["org.matrix.msc1767.audio"] = {"duration": duration_ms, "waveform": [0] * 64}
            extra["org.matrix.msc3245.voice"] = {}
        return await self.send_file(
            room_id,
            data,
            msgtype="m.audio",
            mimetype=mimetype,
            filename=filename,
            info={"duration": duration_ms},
            extra=extra,
        )

    async def react(self, room_id: str, event_id: str, key: str) -> str:
        """An m.reaction (an m.annotation; never encrypted, per the spec)."""
        relation = {"rel_type": "m.annotation", "event_id": event_id, "key": key}
        return await self.send(room_id, "m.reaction", {"m.relates_to": relation})

    # -- reading ----------------------------------------------------------------------------

    async def edits(self, room_id: str, event_id: str) -> list[dict[str, Any]]:
        """The `m.new_content` of each edit (m.replace) of a message, oldest first, as the
        homeserver's relations API has them now (decrypted in an encrypted room). A test
        waiting for a last edit calls it in `wait_until`-like loop of its own, or first waits
        for the edit event itself with `wait_for`."""
        await self.sync()  # the room keys of edits already sent (they came before them)
        found: list[dict[str, Any]] = []
        async for event in self.client.room_get_event_relations(
            room_id,
            event_id,
            rel_type=RelationshipType.replacement,
            direction=MessageDirection.front,
        ):
            if isinstance(event, MegolmEvent):
                event.room_id = room_id
                event = self.client.decrypt_event(event)
            new_content = event.source.get("content", {}).get("m.new_content")
            if new_content is not None:
                found.append(new_content)
        return found

    def trust_devices(self, user_id: str) -> None:
        """Mark every known device of `user_id` verified (as after an emoji verification)."""
        for device in self.client.device_store.active_user_devices(user_id):
            self.client.verify_device(device)
