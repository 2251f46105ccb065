"""The Matrix driver (see drivers.py): a real Synapse, roost's bot account and people on nio
clients (tests/synapse), as tests/channels/matrix uses them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from nio import Event, RedactionEvent, RoomMessageNotice, RoomMessageText

from daemon.app.serve import PLATFORMS, build_app
from tests.channels.matrix.conftest import PASSWORD, TUNING
from tests.channels.shared.drivers import Daemon, Person, serving
from tests.channels.shared.platforms import access
from tests.conftest import SettingsFactory
from tests.fakes.ollama import FakeOllama
from tests.synapse.server import Homeserver
from tests.synapse.user import MatrixUser


class MatrixDriver:
    """A real Synapse: the bot's account logs in from roost, each person is a nio client
    (tests/synapse/user.py) writing in a direct room they made with the bot."""

    name = "matrix"

    def __init__(self, synapse: Homeserver, ollama: FakeOllama, make_settings: SettingsFactory,
                 folder: Path, bot: str, localpart: Callable[[str], str]) -> None:
        self.synapse = synapse
        self.ollama = ollama
        self.make_settings = make_settings
        self.folder = folder
        self.bot = bot
        self.localpart = localpart
        self.users: dict[str, MatrixUser] = {}

    async def person(self, name: str) -> Person:
        registered = await self.synapse.aregister(self.localpart(name), PASSWORD,
                                                  displayname=name.title())
        user = await MatrixUser.connect(self.synapse.url, registered,
                                        self.folder / f"{name}-store")
        self.users[user.user_id] = user
        return Person(name, user.user_id, f"matrix:{user.user_id}")

    @contextlib.asynccontextmanager
    async def roost(self, allow: Sequence[Person] = (), *, pairing: bool = True
                    ) -> AsyncIterator[Daemon]:
        matrix = {"enabled": True, "homeserver": self.synapse.url, "user_id": self.bot,
                  "password": PASSWORD, "allow": tuple(p.id for p in allow),
                  "stream_interval": 0.2}
        settings = self.make_settings(model={"host": self.ollama.url, "retry_backoff": 0.05},
                                      access=access(pairing), matrix=matrix)
        app = build_app(settings, tunings={"matrix": TUNING})
        async with serving(app):
            intake = app[PLATFORMS]["matrix"].intake
            assert intake is not None
            yield Daemon(app, intake.idle)

    async def send(self, person: Person, text: str) -> None:
        user = self.users[person.id]
        if person.room is None:  # a first message: the person opens a direct room first
            person.room = await user.create_dm(self.bot)
            await user.wait_joined(person.room, self.bot)
        await user.send_text(person.room, text)

    async def seen(self, person: Person) -> list[str]:
        if person.room is None:
            return []
        user = self.users[person.id]
        await user.sync(timeout_ms=500)
        return shown([e for room, e in user.events if room == person.room], self.bot)

    async def writing(self, person: Person) -> bool:
        """A message of the bot's after the person's last one: the preview (stream.py)."""
        if person.room is None:
            return False
        user = self.users[person.id]
        await user.sync(timeout_ms=500)
        events = [e for room, e in user.events if room == person.room]
        last = max((i for i, e in enumerate(events) if e.sender == person.id), default=-1)
        return bool(shown(events[last + 1:], self.bot))

    async def break_delivery(self) -> None:
        await self.synapse.astop()

    async def mend_delivery(self) -> None:
        await self.synapse.astart()

    async def close(self) -> None:
        for user in self.users.values():
            await user.close()


def shown(events: Sequence[Event], sender: str) -> list[str]:
    """What a Matrix client shows of `sender`'s messages: each in its latest edit, redacted
    ones gone."""
    order: list[str] = []
    text: dict[str, str] = {}
    for event in events:
        if event.sender != sender:
            continue
        if isinstance(event, RedactionEvent):
            text.pop(event.redacts, None)
        elif isinstance(event, RoomMessageText | RoomMessageNotice):
            content = event.source.get("content", {})
            relation = content.get("m.relates_to") or {}
            if relation.get("rel_type") == "m.replace":
                if relation.get("event_id") in text:
                    text[relation["event_id"]] = content["m.new_content"]["body"]
            else:
                order.append(event.event_id)
                text[event.event_id] = event.body
    return [text[i] for i in order if i in text]
