"""Shared fixtures: every test gets its own state directory and, when asked, a fake Ollama."""

from __future__ import annotations

import asyncio
import compileall
import contextlib
import dataclasses
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

import channels.installed  # noqa: F401 (installs the platforms in the core's registry)
from automations.reminders import Reminders
from automations.state import AutomationState
from daemon.app.assembly import tool_registry
from daemon.core.config import Settings
from daemon.core.messages import Outbound, ReplySink
from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.tools.registry import Registry
from daemon.turn.parts import TurnParts
from tests.fakes.ollama import FakeOllama
from tests.fakes.telegram import FakeTelegram

# Real payloads from public sources (see fixtures/README.md); the project carries its own copy.
FIXTURES = Path(__file__).resolve().parent / "fixtures"
ROOT = FIXTURES.parent.parent


def pytest_sessionstart(session: pytest.Session) -> None:
    """The tests start hundreds of Python processes (`python -m daemon ...`, MCP servers,
    document workers) that import roost's own modules. Where PYTHONDONTWRITEBYTECODE is set
    (as on CI) none of them keeps what it compiled, and each compiles them all again (0.2 s of
    CPU a process): compile them once, before the workers start. Not into the checkout, which
    that setting asks to keep clean (it may be read-only, or shared): into a folder this session
    owns, which PYTHONPYCACHEPREFIX names to the xdist workers and every child."""
    if hasattr(session.config, "workerinput"):  # an xdist worker: its controller did it
        return
    if sys.dont_write_bytecode and sys.pycache_prefix is None:
        prefix = tempfile.mkdtemp(prefix="roost-tests-pycache-")
        session.config.add_cleanup(lambda: shutil.rmtree(prefix, ignore_errors=True))
        os.environ["PYTHONPYCACHEPREFIX"] = sys.pycache_prefix = prefix
    for package in ("daemon", "channels", "automations", "tests"):
        compileall.compile_dir(ROOT / package, quiet=1)


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point every default state directory at the test's own tmp_path."""
    path = tmp_path / "state"
    monkeypatch.setenv("STATE_DIRECTORY", str(path))
    monkeypatch.delenv("ROOST_CONFIG", raising=False)
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    # Secrets default to ~/.config/roost/credentials: never the developer's own.
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config-home"))
    return path


@pytest.fixture
async def fake_ollama() -> AsyncIterator[FakeOllama]:
    async with FakeOllama() as fake:
        yield fake


# The user of the recorded fixtures (tests/fixtures/telegram), who has started the bot; anyone
# else a test talks to must start it too (`fake_telegram.start_chat`), as on Telegram.
FIXTURE_USER = 1111111


@pytest.fixture
async def fake_telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(started=[FIXTURE_USER]) as fake:
        yield fake


SettingsFactory = Callable[..., Settings]


@pytest.fixture
def make_settings(state_dir: Path) -> SettingsFactory:
    """Settings with defaults for tests; keyword groups override sections, e.g.
    `make_settings(model={"host": url, "retry_backoff": 0.01})`."""

    def make(**sections: dict[str, Any]) -> Settings:
        base = Settings.defaults(env={"STATE_DIRECTORY": str(state_dir)})
        # The quiet probe of a model without a card adds requests to the fake's record after
        # a chat; the tests of it (tests/daemon/models) turn it on.
        base = dataclasses.replace(base, model=dataclasses.replace(base.model, probe_new=False))
        changes: dict[str, Any] = {}
        platforms = dict(base.platforms)
        for name, values in sections.items():
            if name in platforms:  # a platform's table: telegram={"enabled": True, ...}
                platforms[name] = dataclasses.replace(platforms[name], **values)
            else:
                changes[name] = dataclasses.replace(getattr(base, name), **values)
        return dataclasses.replace(base, platforms=MappingProxyType(platforms), **changes)

    return make


class RecordingChannel:
    """A channel that keeps what it was asked to send (for engine tests)."""

    def __init__(self, name: str = "console") -> None:
        self.name = name
        self.sent: list[Outbound] = []
        self.deltas: list[str] = []
        self.statuses: list[str] = []

    def streaming(self, chat_key: str) -> contextlib.AbstractAsyncContextManager[ReplySink]:
        return contextlib.nullcontext(self)

    def write(self, delta: str) -> None:
        self.deltas.append(delta)

    def status(self, line: str) -> None:
        self.statuses.append(line)

    def working(self, chat_key: str) -> contextlib.AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()

    async def send(self, outbound: Outbound) -> None:
        self.sent.append(outbound)

    def texts(self, kind: str | None = None) -> list[str]:
        return [o.text for o in self.sent if kind is None or o.kind == kind]


@pytest.fixture
def recording_channel() -> RecordingChannel:
    return RecordingChannel()


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:  # noqa: ASYNC109
    """Wait for a condition on plain state (no event to wait on), bounded: a TimeoutError
    otherwise."""
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


def standard_registry(settings: Settings) -> Registry:
    """Every built-in tool, registered as the daemon registers them (daemon/app/assembly.py),
    for a test that builds its own turn parts."""
    state = AutomationState(settings.daemon.state_dir)
    return tool_registry(settings, Reminders(settings.daemon.tz, state))


def standard_parts(settings: Settings, store: Store, llm: ModelClient) -> TurnParts:
    return TurnParts.build(settings=settings, store=store, llm=llm,
                           registry=standard_registry(settings))
