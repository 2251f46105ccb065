"""The Telegram and WhatsApp drivers (see drivers.py), each starting roost as that platform's
own tests do, with their helpers; Matrix's is in matrix_driver.py (matrix-nio is optional)."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Sequence
from typing import Any

from channels.whatsapp.channel import WhatsAppTuning
from daemon.app.serve import PLATFORMS, build_app
from tests.channels.shared.drivers import Daemon, Person, serving
from tests.channels.telegram.test_telegram import message, start_roost
from tests.channels.whatsapp.test_whatsapp import APP_SECRET, FAST, VERIFY
from tests.channels.whatsapp.test_whatsapp import Daemon as WhatsAppDaemon
from tests.conftest import SettingsFactory
from tests.fakes.graph import API_VERSION, PHONE_NUMBER_ID, FakeGraph, text_message, webhook
from tests.fakes.ollama import FakeOllama
from tests.fakes.telegram import FakeTelegram, parse_html


def access(pairing: bool) -> dict[str, Any]:
    return {"unknown_senders": "pair" if pairing else "ignore"}


class TelegramDriver:
    """Updates on roost's webhook; what the fake Bot API took is what the phone shows."""

    name = "telegram"

    def __init__(self, fake: FakeTelegram, ollama: FakeOllama,
                 make_settings: SettingsFactory) -> None:
        self.fake = fake
        self.ollama = ollama
        self.make_settings = make_settings
        self._users = itertools.count(2_000_001)
        self._updates = itertools.count(1)
        self._post: Any = None

    async def person(self, name: str) -> Person:
        user = next(self._users)
        return Person(name, str(user), f"telegram:{user}")

    @contextlib.asynccontextmanager
    async def roost(self, allow: Sequence[Person] = (), *, pairing: bool = True
                    ) -> AsyncIterator[Daemon]:
        daemon = await start_roost(self.make_settings, self.fake, self.ollama,
                                   telegram={"allow": tuple(int(p.id) for p in allow)},
                                   access=access(pairing))
        self._post = daemon.post
        intake = daemon.telegram.intake
        assert intake is not None
        try:
            yield Daemon(daemon.app, intake.idle)
        finally:
            await daemon.stop()

    async def send(self, person: Person, text: str) -> None:
        user = int(person.id)
        self.fake.start_chat(user)  # who writes to a bot has started it
        chat = {"id": user, "type": "private", "first_name": person.name.title()}
        assert await self._post(message(next(self._updates), text, user=user, chat=chat)) == 200

    async def seen(self, person: Person) -> list[str]:
        return [parse_html(str(m["text"])) if m.get("parse_mode") == "HTML" else str(m["text"])
                for m in self.fake.sent_messages if m["chat_id"] == int(person.id)]

    async def writing(self, person: Person) -> bool:
        return any(d["chat_id"] == int(person.id) and d["text"] for d in self.fake.drafts)

    async def break_delivery(self) -> None:
        await self.fake.stop()  # nothing listens: every Bot API call is refused

    async def mend_delivery(self) -> None:
        await self.fake.start()  # on the same port


class WhatsAppDriver:
    """Signed webhooks as Meta sends them; the sends the fake Graph API took are the phone's."""

    name = "whatsapp"

    def __init__(self, graph: FakeGraph, ollama: FakeOllama,
                 make_settings: SettingsFactory) -> None:
        self.graph = graph
        self.ollama = ollama
        self.make_settings = make_settings
        self._numbers = itertools.count(15550002001)
        self._wamids = itertools.count(1)
        self._daemon: WhatsAppDaemon | None = None

    async def person(self, name: str) -> Person:
        number = str(next(self._numbers))
        return Person(name, number, f"whatsapp:{number}")

    @contextlib.asynccontextmanager
    async def roost(self, allow: Sequence[Person] = (), *, pairing: bool = True
                    ) -> AsyncIterator[Daemon]:
        whatsapp = {"enabled": True, "phone_number_id": PHONE_NUMBER_ID,
                    "api_base": self.graph.url, "api_version": API_VERSION,
                    "allow": tuple(p.id for p in allow), "token": self.graph.token,
                    "app_secret": APP_SECRET, "verify_token": VERIFY}
        settings = self.make_settings(model={"host": self.ollama.url, "retry_backoff": 0.05},
                                      access=access(pairing), whatsapp=whatsapp)
        tuning: WhatsAppTuning = FAST
        app = build_app(settings, tunings={"whatsapp": tuning})
        async with serving(app) as runner:
            self._daemon = WhatsAppDaemon(app, runner, f"http://127.0.0.1:{runner.addresses[0][1]}")
            intake = app[PLATFORMS]["whatsapp"].intake
            assert intake is not None
            yield Daemon(app, intake.intake.idle)

    async def send(self, person: Person, text: str) -> None:
        assert self._daemon is not None
        body = webhook(text_message(f"wamid.shared{next(self._wamids)}", person.id, text))
        assert await self._daemon.post(body) == 200

    async def seen(self, person: Person) -> list[str]:
        return self.graph.texts(person.id)

    async def writing(self, person: Person) -> bool:
        return True  # WhatsApp shows no reply before it is sent

    async def break_delivery(self) -> None:
        # The fake's own lifecycle: it stops listening, and starts again on the same port.
        await self.graph.__aexit__(None, None, None)

    async def mend_delivery(self) -> None:
        await self.graph.__aenter__()
