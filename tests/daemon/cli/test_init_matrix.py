"""`roost init` setting Matrix up against a real Synapse (tests/synapse): the config and the
credential file it writes, the owner let in by `matrix.allow`, and the bot's list of devices
left as init found it (the password is checked by a login whose device is logged out)."""

from __future__ import annotations

import asyncio
import io
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("nio", reason="no matrix-nio in roost's venv")

from daemon.cli.init import run_init
from daemon.cli.main import build_parser
from daemon.core.config import load_settings
from tests.daemon.cli import test_init as base
from tests.fakes.ollama import FakeOllama
from tests.synapse import fixtures
from tests.synapse.server import Homeserver, Registered

# Fixtures by assignment, not import (ruff reads a parameter named like an import as shadowing).
synapse_session = fixtures.synapse_session
synapse = fixtures.synapse
matrix_localpart = fixtures.matrix_localpart
home = base.home

PASSWORD = "correct horse battery staple"


async def devices(synapse: Homeserver, bot: Registered) -> list[str]:
    """The bot's devices, as the homeserver lists them to the bot itself."""
    answer = await asyncio.to_thread(synapse.request, "GET", "/_matrix/client/v3/devices",
                                     token=bot.access_token)
    return sorted(device["device_id"] for device in answer["devices"])


def matrix_flags(ollama: FakeOllama, synapse: Homeserver, user_id: str, *more: str) -> list[str]:
    return ["--non-interactive", "--ollama-url", ollama.url, "--no-service",
            "--matrix-homeserver", synapse.url, "--matrix-user", user_id, *more]


async def test_non_interactive_matrix_writes_a_config_roost_loads_and_leaves_no_device(
    home: dict[str, str], fake_ollama: FakeOllama, synapse: Homeserver,
    matrix_localpart: Callable[[str], str]
) -> None:
    bot = await synapse.aregister(matrix_localpart("roost"), PASSWORD)
    owner = synapse.user_id(matrix_localpart("owner"))
    status, out, err = await base.init_process(
        home, *matrix_flags(fake_ollama, synapse, bot.user_id, "--matrix-owner", owner),
        ROOST_MATRIX_PASSWORD=PASSWORD)
    assert status == 0, err
    assert f"Matrix: {synapse.url} is a homeserver" in out
    config, credentials = base.config_of(home), base.credentials_of(home)
    assert base.mode(config) == 0o600 and PASSWORD not in config.read_text()
    assert (credentials / "ROOST_MATRIX_PASSWORD").read_text() == PASSWORD
    assert base.mode(credentials / "ROOST_MATRIX_PASSWORD") == 0o600
    settings = load_settings(config, env={**home, "CREDENTIALS_DIRECTORY": str(credentials)})
    matrix = settings.platforms["matrix"]
    assert matrix.enabled and matrix.homeserver == synapse.url
    assert matrix.user_id == bot.user_id and matrix.password == PASSWORD
    assert matrix.allow == (owner,)  # the owner needs no pairing
    assert not settings.platforms["telegram"].enabled
    assert not settings.platforms["whatsapp"].enabled
    # The login that checked the password was logged out: only registration's device is left.
    assert await devices(synapse, bot) == [bot.device_id]


async def test_a_wrong_matrix_password_is_exit_78_and_writes_nothing(
    home: dict[str, str], fake_ollama: FakeOllama, synapse: Homeserver,
    matrix_localpart: Callable[[str], str]
) -> None:
    bot = await synapse.aregister(matrix_localpart("roost"), PASSWORD)
    status, _, err = await base.init_process(
        home, *matrix_flags(fake_ollama, synapse, bot.user_id),
        ROOST_MATRIX_PASSWORD="not the password")
    assert status == 78, err
    assert f"the homeserver refused the password of {bot.user_id}" in err
    assert "not the password" not in err and "Traceback" not in err
    assert not base.config_of(home).exists() and not base.credentials_of(home).exists()
    assert await devices(synapse, bot) == [bot.device_id]


async def test_an_access_token_is_checked_without_a_login(
    home: dict[str, str], fake_ollama: FakeOllama, synapse: Homeserver,
    matrix_localpart: Callable[[str], str]
) -> None:
    bot = await synapse.aregister(matrix_localpart("roost"), PASSWORD)
    other = await synapse.aregister(matrix_localpart("other"), PASSWORD)
    status, _, err = await base.init_process(
        home, *matrix_flags(fake_ollama, synapse, bot.user_id),
        ROOST_MATRIX_TOKEN=other.access_token)
    assert status == 78 and f"{other.user_id}'s, not {bot.user_id}'s" in err, err
    assert other.access_token not in err and not base.config_of(home).exists()
    status, _, err = await base.init_process(
        home, *matrix_flags(fake_ollama, synapse, bot.user_id),
        ROOST_MATRIX_TOKEN=bot.access_token)
    assert status == 0, err
    credentials = base.credentials_of(home)
    assert (credentials / "ROOST_MATRIX_TOKEN").read_text() == bot.access_token
    assert not (credentials / "ROOST_MATRIX_PASSWORD").exists()
    assert await devices(synapse, bot) == [bot.device_id]


async def test_a_homeserver_that_cannot_be_reached_is_exit_69(
    home: dict[str, str], fake_ollama: FakeOllama
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{probe.getsockname()[1]}"
    status, _, err = await base.init_process(
        home, "--non-interactive", "--ollama-url", fake_ollama.url, "--no-service",
        "--matrix-homeserver", nowhere, "--matrix-user", "@roost:example.org",
        ROOST_MATRIX_PASSWORD=PASSWORD)
    assert status == 69 and f"cannot reach the homeserver at {nowhere}" in err, err
    assert "Traceback" not in err and not base.config_of(home).exists()


async def test_interactive_init_offers_matrix_and_asks_again_for_a_refused_password(
    home: dict[str, str], fake_ollama: FakeOllama, synapse: Homeserver,
    matrix_localpart: Callable[[str], str]
) -> None:
    bot = await synapse.aregister(matrix_localpart("roost"), PASSWORD)
    owner = synapse.user_id(matrix_localpart("owner"))
    # Model: the default; Telegram? WhatsApp? no; Matrix? yes (the default, nothing chosen).
    answers = "\n".join(["", "n", "n", "", synapse.url + "/", bot.user_id, "wrong", PASSWORD,
                         "dana", owner]) + "\n"
    args = build_parser().parse_args(["init", "--ollama-url", fake_ollama.url, "--no-service",
                                      "--config", str(base.config_of(home)),
                                      "--credentials-dir", str(base.credentials_of(home))])
    out = io.StringIO()
    status = await run_init(args, stdin=io.StringIO(answers), stdout=out, env=home, root=False)
    text = out.getvalue()
    assert status == 0, text
    assert "Set up Telegram? [Y/n]" in text and "Set up Matrix? [Y/n]" in text
    assert f"the homeserver refused the password of {bot.user_id}" in text
    assert "That is not a Matrix user id" in text  # "dana", then the owner's own id
    settings = load_settings(base.config_of(home), env={
        **home, "CREDENTIALS_DIRECTORY": str(base.credentials_of(home))})
    matrix = settings.platforms["matrix"]
    assert matrix.homeserver == synapse.url and matrix.allow == (owner,)
    assert not settings.platforms["telegram"].enabled
    assert await devices(synapse, bot) == [bot.device_id]
    pairing = Path(home["STATE_DIRECTORY"], "pairing.json")
    assert not await asyncio.to_thread(pairing.exists)  # nobody to pair
