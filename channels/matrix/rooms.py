"""Which room a chat key is: a group's key names its room; a person's key their direct room.

A person's direct room is recorded when they write from it (a chat flag on their key, so a
restart keeps it); for a message to a person with none recorded, it is the room the bot shares
with them alone (a stranger's, whose pairing code goes there) or else (an automation's report,
a reminder) created: a private, encrypted room flagged `is_direct`, the person invited. The
first message waits for them to join, bounded: an invited person's devices are not yet
members the room's keys are shared with, so a message sent before they join is one they
could never decrypt. Until they join, delivery fails retryably and the engine tries again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from nio import AsyncClient, RoomCreateResponse, RoomPreset  # type: ignore[import-untyped]

from channels.matrix.api import checked, network_errors
from channels.matrix.parse import address_of, direct_partner
from channels.matrix.platform import log
from daemon.core.errors import DeliveryError
from daemon.store import Store

ROOM_FLAG = "matrix_room"  # on a person's chat key: the room id of their direct room
_ENCRYPTED = {"type": "m.room.encryption", "state_key": "",
              "content": {"algorithm": "m.megolm.v1.aes-sha2"}}


class Rooms:
    def __init__(self, client: AsyncClient, store: Store, *, join_wait: float = 20.0) -> None:
        self.client = client
        self.store = store
        self.join_wait = join_wait
        self._synced = asyncio.Condition()
        self._creating: dict[str, asyncio.Lock] = {}

    async def synced(self) -> None:
        """The sync loop took a sync: rooms and members may have changed."""
        async with self._synced:
            self._synced.notify_all()

    async def wait_for(self, ready: Callable[[], bool], seconds: float) -> bool:
        """Wait (bounded) until `ready()` holds after some sync; whether it does."""
        try:
            async with asyncio.timeout(seconds):
                async with self._synced:
                    await self._synced.wait_for(ready)
        except TimeoutError:
            return ready()
        return True

    async def remember(self, user: str, room_id: str, chat_key: str) -> None:
        if (await asyncio.to_thread(self.store.chat_flags, chat_key)).get(ROOM_FLAG) != room_id:
            await asyncio.to_thread(self.store.set_chat_flag, chat_key, ROOM_FLAG, room_id)
            log.info("%s's direct room is %s", user, room_id)

    async def room_for(self, chat_key: str) -> str:
        """The room to send a chat's messages to, ready for them (DeliveryError when not)."""
        address = address_of(chat_key)
        if address.room is not None:
            return await self._ready(address.room)
        assert address.user is not None
        lock = self._creating.setdefault(chat_key, asyncio.Lock())
        async with lock:  # two replies at once must not make two rooms
            room = (await asyncio.to_thread(self.store.chat_flags, chat_key)).get(ROOM_FLAG)
            if not isinstance(room, str):
                room = self._shared_with(address.user) or await self._create(address.user)
                await asyncio.to_thread(self.store.set_chat_flag, chat_key, ROOM_FLAG, room)
        await self._ready(room)
        if not await self.wait_for(lambda: self._joined(room, address.user or ""),
                                   self.join_wait):
            raise DeliveryError(f"waiting for {address.user} to accept the invitation to "
                                f"{room}")
        return room

    def _shared_with(self, user: str) -> str | None:
        """A room the bot is in with only this person, which the intake keys as their chat: a
        stranger's direct room, joined for pairing and never remembered (the door stores
        nothing of a stranger), is where their pairing code goes, not a new room."""
        for room_id, room in self.client.rooms.items():
            members = set(room.users) | set(room.invited_users)
            if direct_partner(members, str(self.client.user_id)) == user:
                return str(room_id)
        return None

    def _joined(self, room_id: str, user: str) -> bool:
        room = self.client.rooms.get(room_id)
        return room is not None and user in room.users and user not in room.invited_users

    async def _ready(self, room_id: str) -> str:
        """A room the bot just joined or made is known to nio only after the next sync."""
        if room_id not in self.client.rooms and not await self.wait_for(
                lambda: room_id in self.client.rooms, self.join_wait):
            raise DeliveryError(f"the bot is not in room {room_id}", permanent=True,
                                chat_blocked=True)
        return room_id

    async def _create(self, user: str) -> str:
        with network_errors("an invitation"):
            answer = await self.client.room_create(
                is_direct=True, invite=[user], preset=RoomPreset.trusted_private_chat,
                initial_state=[_ENCRYPTED])
        created = checked(answer, f"a direct room with {user}")
        assert isinstance(created, RoomCreateResponse)
        log.info("made direct room %s for %s", created.room_id, user)
        return created.room_id
