"""`driver`: each shared test once per platform, its id the platform's name."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.channels.shared.drivers import Driver
from tests.channels.shared.platforms import TelegramDriver, WhatsAppDriver
from tests.conftest import FIXTURE_USER, SettingsFactory
from tests.fakes.graph import FakeGraph
from tests.fakes.ollama import FakeOllama
from tests.fakes.telegram import FakeTelegram
from tests.synapse import fixtures

# The Synapse harness's fixtures, registered here as tests/channels/matrix does (names, not
# imports). `synapse` skips the Matrix runs with one line when Synapse is not installed.
synapse_session = fixtures.synapse_session
synapse = fixtures.synapse
matrix_localpart = fixtures.matrix_localpart

PLATFORMS = ["telegram", "whatsapp", "matrix"]


@pytest.fixture(params=PLATFORMS)
async def driver(request: pytest.FixtureRequest, fake_ollama: FakeOllama,
                 make_settings: SettingsFactory, tmp_path: Path) -> AsyncIterator[Driver]:
    if request.param == "telegram":
        async with FakeTelegram(started=[FIXTURE_USER]) as fake:
            yield TelegramDriver(fake, fake_ollama, make_settings)
    elif request.param == "whatsapp":
        async with FakeGraph() as graph:
            yield WhatsAppDriver(graph, fake_ollama, make_settings)
    else:
        homeserver = request.getfixturevalue("synapse")  # skips without Synapse or nio
        # Imported only now: matrix-nio is an optional extra, and without it the Matrix runs
        # skip (above) while the others go on.
        from tests.channels.shared.matrix_driver import PASSWORD, MatrixDriver

        localpart = request.getfixturevalue("matrix_localpart")
        bot = await homeserver.aregister(localpart("roost"), PASSWORD, displayname="roost")
        made = MatrixDriver(homeserver, fake_ollama, make_settings, tmp_path, bot.user_id,
                            localpart)
        try:
            yield made
        finally:
            await made.close()
