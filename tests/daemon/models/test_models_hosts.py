"""`roost models` with several Ollama hosts (`[model] hosts`): it probes the first host up by
priority and says which, `--host URL` probes another, and each host's card is kept: the boxes'
hardware differs, and so do their timings."""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from daemon.cli.models import run_models
from daemon.core.config import Settings
from daemon.core.config.sections import HostSettings
from daemon.models import all_cards, store_cards
from tests.conftest import SettingsFactory
from tests.daemon.models.test_card_surfaces import card
from tests.fakes.ollama import FakeModel, FakeOllama


@pytest.fixture
async def hosts() -> AsyncIterator[tuple[FakeOllama, FakeOllama]]:
    async with FakeOllama([FakeModel(load_duration=9.5)]) as small, \
            FakeOllama([FakeModel(load_duration=1.5)]) as big:
        yield small, big


def pool_of(make_settings: SettingsFactory, *hosts: HostSettings) -> Settings:
    return make_settings(model={"hosts": hosts, "window": 2048})


async def models(settings: Settings, *names: str, **flags: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = await run_models(settings, names, out=out, err=err, stdin=io.StringIO(),
                              **flags)
    return status, out.getvalue(), err.getvalue()


async def test_the_first_host_up_by_priority_is_probed_and_named_and_host_probes_another(
    hosts: tuple[FakeOllama, FakeOllama], make_settings: SettingsFactory, state_dir: Path,
) -> None:
    small, big = hosts
    settings = pool_of(make_settings, HostSettings(small.url), HostSettings(big.url, priority=5))
    status, out, err = await models(settings, "qwen3:4b")
    assert status == 0, err
    assert out.splitlines()[0] == (f"Ollama at {big.url} (of 2 in model.hosts; --host URL "
                                   "probes another)")
    assert small.chat_requests == [] and big.chat_requests

    status, out, err = await models(settings, "qwen3:4b", host=small.url)
    assert status == 0, err
    assert out.splitlines()[0].startswith(f"Ollama at {small.url} (of 2")
    assert small.chat_requests
    cards = {c.host: c for c in all_cards(state_dir)}  # the second probe kept the first's card
    assert set(cards) == {small.url, big.url}
    assert (cards[small.url].load_s, cards[big.url].load_s) == (9.5, 1.5)

    await big.refuse_connections()  # the evening box is off: the other is probed
    status, out, _ = await models(settings, "qwen3:4b", as_json=True)
    assert status == 0 and [c["host"] for c in json.loads(out)] == [small.url]

    await small.refuse_connections()
    status, out, err = await models(settings, "qwen3:4b")
    assert status == 1 and out == ""
    assert err == (f"roost: cannot reach Ollama at any of the hosts ({small.url}, {big.url}): "
                   "start one with `ollama serve`, or name one with --host\n")


async def test_host_takes_a_pool_hosts_credentials_from_the_config(
    hosts: tuple[FakeOllama, FakeOllama], make_settings: SettingsFactory,
) -> None:
    small, big = hosts
    secret = big.url.replace("http://", "http://roost:hunter2@")
    settings = pool_of(make_settings, HostSettings(small.url), HostSettings(secret))
    shown = big.url.replace("http://", "http://***@")
    status, out, err = await models(settings, "qwen3:4b", host=shown)  # as roost shows it
    assert status == 0, err
    assert out.splitlines()[0].startswith(f"Ollama at {shown} (of 2")
    assert big.chat_requests and small.chat_requests == [] and "hunter2" not in out


async def test_roost_models_host_on_the_command_line(
    hosts: tuple[FakeOllama, FakeOllama], tmp_path: Path,
) -> None:
    small, big = hosts
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n[model]\n'
                      f'hosts = ["{small.url}", "{big.url}"]\nwindow = 2048\n')
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ROOST_")}
    run = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "models", "--model", "qwen3:4b", "--host", big.url,
        "--config", str(config), env=clean, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(run.communicate(), 60)
    assert run.returncode == 0, err.decode()
    assert out.decode().splitlines()[0].startswith(f"Ollama at {big.url} (of 2")
    assert big.chat_requests and small.chat_requests == []


async def test_a_card_from_before_hosts_were_named_is_replaced_by_a_new_probe(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, state_dir: Path,
) -> None:
    store_cards(state_dir, [card(), card("llama3.2:3b")])  # kept without a host
    settings = make_settings(model={"host": fake_ollama.url, "window": 2048})
    status, out, err = await models(settings, "qwen3:4b")
    assert status == 0, err
    assert out.startswith("MODEL")  # one host: the table as it always was
    assert {(c.name, c.host) for c in all_cards(state_dir)} == {
        ("qwen3:4b", fake_ollama.url), ("llama3.2:3b", "")}
