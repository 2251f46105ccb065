"""Matrix: a matrix-nio `AsyncClient` driven by roost's own sync loop, never `sync_forever`.

`open()` logs the bot in on its stable device (`session.py`: the device, its token and nio's
encryption store live in `<state_dir>/matrix/` and survive restarts) and uploads its keys.
`start(engine)` resumes what the intake holds, redacts a preview a crash left, and starts the
sync loop (`Matrix._sync`). Each sync hands every timeline event to the intake's door and only
then stores the sync's `next_batch`: an event is on disk before the position after it is, so a
crash in between makes the next start sync from the old position and the intake drop what it
already has (by event id). The loop also joins rooms the allowed (or, for direct rooms,
unknown) people invite the bot to, and does what nio's `sync_forever` does for encryption:
sends to-device messages, uploads, queries and claims keys.

A homeserver that cannot be reached makes the loop wait, doubling up to a minute, and sync
again from the stored position: nothing is lost while it is down.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nio import (  # type: ignore[import-untyped]
    AsyncClient,
    AsyncClientConfig,
    ErrorResponse,
    MatrixRoom,
    MegolmEvent,
    ProfileGetDisplayNameResponse,
    SyncResponse,
)

from channels.formatting import to_matrix_html
from channels.matrix.api import NETWORK_ERRORS
from channels.matrix.delivery import MatrixChannel
from channels.matrix.doctor import doctor_checks
from channels.matrix.intake import Arrival, Bot, MatrixIntake
from channels.matrix.media import DOWNLOAD_LIMIT, MatrixMedia
from channels.matrix.parse import direct_partner, person_key, room_key
from channels.matrix.platform import MATRIX, log
from channels.matrix.prompts import Questions
from channels.matrix.rooms import Rooms
from channels.matrix.session import SessionFile, sign_in
from channels.matrix.settings import MatrixSettings
from channels.matrix.setup import set_up
from channels.media import attachment_limits
from daemon.core.approval import Approver
from daemon.core.config import AttachmentSettings, Settings
from daemon.core.errors import ChannelError, ConfigError
from daemon.intake.durable import Submitter
from daemon.intake.gate import Access
from daemon.intake.platforms import PlatformParts, Route, Runtime
from daemon.store import Store

SYNC_BACKOFF_MAX = 60.0
# Synapse gives 10 events a room per sync unless asked for more, and marks the timeline
# "limited" past that: a burst while roost was down would then skip events. This many is far
# beyond what a home bot's rooms see between two syncs.
SYNC_FILTER = {"room": {"timeline": {"limit": 1000}}}


@dataclass(frozen=True)
class MatrixTuning:
    """Timings and limits that are not user settings; tests make them short."""

    poll_timeout: float = 30.0  # seconds a sync long poll may wait on the homeserver
    sync_backoff: float = 1.0  # first pause after a failed sync or store, doubled to a minute
    typing_interval: float = 20.0  # a typing notification is renewed this often
    request_timeout: float = 60.0  # seconds any other request may take
    max_timeouts: int = 2  # network failures nio retries itself before roost hears of them
    rate_limit_retries: int = 5  # 429s nio waits out (retry_after_ms) before a send fails
    join_wait: float = 20.0  # how long a first message waits for its new room to be ready
    download_limit: int = DOWNLOAD_LIMIT


def check_settings(settings: MatrixSettings) -> None:
    if not settings.homeserver.startswith(("https://", "http://")):
        raise ConfigError("matrix.homeserver", "must be the homeserver's base URL, such as "
                          "https://matrix.example.org")
    if not settings.user_id.startswith("@") or ":" not in settings.user_id:
        raise ConfigError("matrix.user_id", "must be the bot's full user id, such as "
                          "@roost:example.org")


class Matrix:
    """The Matrix part of the daemon: login, delivery, the sync loop and its intake.

    `open()` (before the engine exists) logs in; `start(engine)` (after) resumes stored
    events and starts syncing; `stop()` stops the loop and the intake; `close()` closes nio's
    HTTP session and store."""

    def __init__(self, settings: MatrixSettings, store: Store,
                 tuning: MatrixTuning | None = None,
                 attachments: AttachmentSettings | None = None,
                 access: Access | None = None,
                 on_resent: Callable[[], None] | None = None) -> None:
        check_settings(settings)
        self.settings = settings
        self.store = store
        self.tuning = tuning or MatrixTuning()
        self.access = access
        self.limits = attachment_limits(attachments or AttachmentSettings())
        folder = store.state_dir / "matrix"
        self.session = SessionFile(folder)
        self.client = AsyncClient(settings.homeserver, settings.user_id,
                                  device_id=settings.device_id or None, store_path=str(folder),
                                  config=AsyncClientConfig(
                                      encryption_enabled=True, store_sync_tokens=False,
                                      max_limit_exceeded=self.tuning.rate_limit_retries,
                                      max_timeouts=self.tuning.max_timeouts,
                                      request_timeout=self.tuning.request_timeout))
        self.rooms = Rooms(self.client, store, join_wait=self.tuning.join_wait)
        self.questions = Questions()
        self.channel = MatrixChannel(self.client, store, self.rooms, self.questions,
                                     typing_interval=self.tuning.typing_interval,
                                     streaming=settings.streaming == "edit",
                                     stream_interval=settings.stream_interval,
                                     on_resent=on_resent)
        self.bot = Bot(settings.user_id, "")
        self.intake: MatrixIntake | None = None
        self._syncer: asyncio.Task[None] | None = None
        self._synced_rooms: set[str] = set()  # a room's first sync is "limited" by nature

    def routes(self) -> list[Route]:
        """None: Matrix is read by syncing, not by webhooks."""
        return []

    async def open(self) -> None:
        """Log in (ConfigError for refused credentials, ChannelError when the homeserver
        cannot be reached) and publish the device's keys."""
        self.session.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            await sign_in(self.client, self.settings, self.session)
            if self.client.should_upload_keys:
                await self.client.keys_upload()
            named = await self.client.get_displayname(self.settings.user_id)
        except BaseException:
            await self.client.close()
            raise
        name = named.displayname if isinstance(named, ProfileGetDisplayNameResponse) else None
        self.bot = Bot(self.settings.user_id, name or "")

    async def start(self, engine: Submitter, approver: Approver | None = None) -> None:
        """Process what an earlier run left, then sync; answers to approval questions go to
        `approver`."""
        media = MatrixMedia(self.client, self.store.state_dir / "attachments",
                            limits=self.limits, download_limit=self.tuning.download_limit)
        self.intake = MatrixIntake(store=self.store, engine=engine, client=self.client,
                                   bot=self.bot, rooms=self.rooms, media=media,
                                   questions=self.questions, allow=self.settings.allow,
                                   require_mention=self.settings.require_mention,
                                   access=self.access, approver=approver)
        await self.intake.resume()
        self._syncer = asyncio.create_task(self._sync(), name="roost-matrix-sync")
        log.info("syncing with %s", self.settings.homeserver)

    async def stop(self) -> None:
        """Stop syncing, then the intake's workers (what they hold stays stored)."""
        if self._syncer is not None:
            self._syncer.cancel()
            await asyncio.gather(self._syncer, return_exceptions=True)
            self._syncer = None
        if self.intake is not None:
            await self.intake.stop()

    async def close(self) -> None:
        await self.client.close()

    # ---- the sync loop ---------------------------------------------------------------------

    async def _sync(self) -> None:
        await self.channel.clear_orphans()
        first, failures = True, 0
        while True:
            since = self.session.saved.next_batch or None
            # nio skips a sync whose next_batch it saw last; after a failed store the same
            # events come again and must be read (and decrypted) again.
            self.client.next_batch = since  # type: ignore[assignment]
            try:
                answer = await self.client.sync(
                    timeout=int(self.tuning.poll_timeout * 1000), sync_filter=SYNC_FILTER,
                    since=since, full_state=True if first else None)
                if isinstance(answer, ErrorResponse):
                    raise _SyncFailed(f"{answer.status_code} {answer.message}")
                assert isinstance(answer, SyncResponse)
                await self._take(answer, fresh=since is None)
                await asyncio.to_thread(self.session.save, next_batch=answer.next_batch)
            except (_SyncFailed, *NETWORK_ERRORS) as exc:
                failures += 1
                delay = min(self.tuning.sync_backoff * 2 ** (failures - 1), SYNC_BACKOFF_MAX)
                log.warning("syncing with the homeserver failed (%s); again in %.0fs", exc,
                            delay)
                await asyncio.sleep(delay)
                continue
            except Exception:  # the boundary of one sync: its token stays, it comes again
                failures += 1
                log.exception("storing a sync's events failed; syncing again")
                await asyncio.sleep(min(self.tuning.sync_backoff * 2 ** (failures - 1),
                                        SYNC_BACKOFF_MAX))
                continue
            first, failures = False, 0
            await self.rooms.synced()
            await self._crypto_chores()

    async def _take(self, answer: SyncResponse, *, fresh: bool) -> None:
        """The sync's invitations and timeline events, each through the door; on the first
        sync of a new bot (no position stored) the rooms' history is not answered."""
        assert self.intake is not None
        for room_id, invited in answer.rooms.invite.items():
            await self._invited(room_id, invited.invite_state)
        if fresh:
            log.info("first sync of this bot: earlier messages in its rooms are not answered")
            return
        for room_id, joined in answer.rooms.join.items():
            room = self.client.rooms.get(room_id)
            if room is None:
                continue
            partner = direct_partner(set(room.users) | set(room.invited_users),
                                     self.bot.user_id)
            key = person_key(partner) if partner else room_key(room_id)
            if joined.timeline.limited and room_id in self._synced_rooms:
                log.warning("the homeserver left out earlier events of %s (a gap of more than "
                            "%d); they are not answered", key, SYNC_FILTER["room"]["timeline"]
                            ["limit"])
            for event in joined.timeline.events:
                if isinstance(event, MegolmEvent):
                    await self._request_key(event)
                source: Mapping[str, Any] = event.source
                sender = source.get("sender")
                await self.intake.accept(Arrival(
                    room_id=room_id, chat_key=key, direct=partner is not None, event=source,
                    sender_name=_name(room, sender) if isinstance(sender, str) else ""))
            self._synced_rooms.add(room_id)

    async def _invited(self, room_id: str, state: list[Any]) -> None:
        """Join a room an allowed person invites the bot to; a stranger's direct room too
        when strangers may pair (they get their code when they write)."""
        assert self.intake is not None
        invite = next((e for e in state if getattr(e, "state_key", None) == self.bot.user_id
                       and getattr(e, "membership", None) == "invite"), None)
        if invite is None:
            return
        inviter = invite.sender
        direct = bool(invite.content.get("is_direct"))
        pairs = self.access is not None and self.access.pairs and direct
        if not (await self.intake.gate.may_talk(inviter) or pairs):
            log.warning("ignored an invitation to %s from unknown Matrix user %s", room_id,
                        inviter)
            return
        try:
            joined = await self.client.join(room_id)
        except NETWORK_ERRORS as exc:
            log.warning("joining %s failed: %s", room_id, exc)
            return
        if isinstance(joined, ErrorResponse):
            log.warning("joining %s failed: %s", room_id, joined.message)
        else:
            log.info("joined %s at the invitation of %s", room_id, inviter)

    async def _request_key(self, event: MegolmEvent) -> None:
        """Ask the sender's devices for a key the bot lacks (answered, maybe, before long)."""
        try:
            await self.client.request_room_key(event)
        except (*NETWORK_ERRORS, ValueError, LookupError) as exc:
            log.debug("room key request failed: %s", exc)
        except Exception as exc:  # nio raises its own LocalProtocolError for a repeat
            log.debug("room key not requested: %s", exc)

    async def _crypto_chores(self) -> None:
        """What nio's sync_forever does between syncs for encryption."""
        client = self.client
        try:
            if client.outgoing_to_device_messages:
                await client.send_to_device_messages()
            if client.should_upload_keys:
                await client.keys_upload()
            if client.should_query_keys:
                await client.keys_query()
            if client.should_claim_keys:
                await client.keys_claim(client.get_users_for_key_claiming())
        except NETWORK_ERRORS as exc:  # the next sync's chores try again
            log.warning("encryption key upkeep failed: %s", exc)


def _name(room: MatrixRoom, user: str) -> str:
    member = room.users.get(user)
    return (member.display_name or "") if member is not None else ""


class _SyncFailed(ChannelError):
    """The homeserver answered a sync with an error."""


def _open(parts: PlatformParts) -> Matrix:
    return Matrix(MATRIX.of(parts.settings.platforms), parts.store, parts.tuning,
                  parts.settings.attachments, parts.access, on_resent=parts.on_resent)


def _check(settings: Settings) -> None:
    check_settings(MATRIX.of(settings.platforms))


RUNTIME = Runtime(
    tuning=MatrixTuning,
    render=to_matrix_html,
    open=_open,
    check=_check,
    doctor=doctor_checks,
    setup=set_up)
