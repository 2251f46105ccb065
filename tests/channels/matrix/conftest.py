"""The Matrix channel against a real Synapse (tests/synapse), with a small echoing engine.

`EchoEngine` stands in for roost's engine at the port a channel is handed (`Submitter`): it
keeps each Inbound in the store's inbox as the engine does (so a message submitted twice is
recognised), answers "echo: <text>" through the channel's `send` with the outbox around it,
and sends notices the same way."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

pytest.importorskip("nio", reason="no matrix-nio in roost's venv")

from channels.matrix.channel import Matrix, MatrixTuning
from channels.matrix.settings import MatrixSettings
from daemon.core.messages import Inbound, Outbound
from daemon.store import Store
from tests.synapse import fixtures
from tests.synapse.server import Homeserver
from tests.synapse.user import MatrixUser

# The harness's fixtures, registered here for the Matrix tests (names, not imports: a fixture's
# parameter of the same name would read to ruff as shadowing an unused import).
synapse_session = fixtures.synapse_session
synapse = fixtures.synapse
matrix_localpart = fixtures.matrix_localpart

PASSWORD = "correct horse battery staple"
TUNING = MatrixTuning(poll_timeout=1.0, sync_backoff=0.2, typing_interval=1.0, join_wait=20.0)


class EchoEngine:
    """The engine's port, echoing; `reply` may be replaced to answer otherwise."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.matrix: Matrix | None = None
        self.inbounds: list[Inbound] = []
        self.notices: list[tuple[str, str]] = []
        self.reply: Callable[[Inbound], Awaitable[str]] = self._echo

    async def _echo(self, inbound: Inbound) -> str:
        return f"echo: {inbound.text}"

    async def submit(self, inbound: Inbound) -> bool:
        if not await asyncio.to_thread(self.store.inbox_add, inbound.to_doc()):
            return True
        self.inbounds.append(inbound)
        text = await self.reply(inbound)
        await self.deliver(Outbound(chat_key=inbound.chat_key, text=text, created=time.time(),
                                    reply_to=inbound.platform_id))
        await asyncio.to_thread(self.store.inbox_done, [inbound.id])
        return True

    async def deliver(self, outbound: Outbound) -> None:
        assert self.matrix is not None
        await asyncio.to_thread(self.store.outbox_add, outbound.to_doc())
        await self.matrix.channel.send(outbound)
        await asyncio.to_thread(self.store.outbox_done, outbound.id)

    async def notify(self, chat_key: str, text: str) -> None:
        self.notices.append((chat_key, text))
        await self.deliver(Outbound(chat_key=chat_key, text=text, created=time.time(),
                                    kind="notice"))

    async def release(self, chat_key: str) -> int:
        return 0


class Bot:
    """The bot's account, and how to run roost's Matrix channel as it."""

    def __init__(self, synapse: Homeserver, user_id: str, state_dir: Path) -> None:
        self.synapse = synapse
        self.user_id = user_id
        self.state_dir = state_dir
        self.running: list[tuple[Matrix, Store]] = []

    def settings(self, **changes: object) -> MatrixSettings:
        values: dict[str, object] = {"enabled": True, "homeserver": self.synapse.url,
                                     "user_id": self.user_id, "password": PASSWORD,
                                     "stream_interval": 0.2, **changes}
        return MatrixSettings(**values)  # type: ignore[arg-type]

    async def start(self, engine_class: type[EchoEngine] = EchoEngine,
                    **changes: object) -> tuple[Matrix, EchoEngine]:
        store = Store.open(self.state_dir)
        matrix = Matrix(self.settings(**changes), store, tuning=TUNING)
        engine = engine_class(store)
        engine.matrix = matrix
        await matrix.open()
        await matrix.start(engine)
        self.running.append((matrix, store))
        return matrix, engine

    async def stop(self, matrix: Matrix) -> None:
        for index, (running, store) in enumerate(self.running):
            if running is matrix:
                await matrix.stop()
                await matrix.close()
                store.close()
                del self.running[index]
                return


@pytest.fixture
async def bot(synapse: Homeserver, matrix_localpart: Callable[[str], str], tmp_path: Path
              ) -> AsyncIterator[Bot]:
    registered = await synapse.aregister(matrix_localpart("roost"), PASSWORD,
                                         displayname="roost")
    made = Bot(synapse, registered.user_id, tmp_path / "state")
    yield made
    for matrix, _ in list(made.running):
        await made.stop(matrix)


@pytest.fixture
async def person(synapse: Homeserver, matrix_localpart: Callable[[str], str], tmp_path: Path
                 ) -> AsyncIterator[Callable[[str], Awaitable[MatrixUser]]]:
    people: list[MatrixUser] = []

    async def make(name: str) -> MatrixUser:
        registered = await synapse.aregister(matrix_localpart(name), PASSWORD,
                                             displayname=name.title())
        user = await MatrixUser.connect(synapse.url, registered, tmp_path / f"{name}-store")
        people.append(user)
        return user

    yield make
    for user in people:
        await user.close()
