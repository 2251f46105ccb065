"""The web tools against the loopback site and the fake search services."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from daemon.core.config import Settings
from daemon.store import Store
from daemon.tools.builtin import ToolContext
from daemon.tools.registry import Registry, ToolCall, ToolResult
from daemon.tools.web import tools as web_tools
from daemon.tools.web.guard import Resolve
from tests.conftest import SettingsFactory
from tests.fakes.search import FakeSearch
from tests.fakes.website import FakeSite


@pytest.fixture
async def site() -> AsyncIterator[FakeSite]:
    async with FakeSite() as fake:
        yield fake


@pytest.fixture
async def searxng() -> AsyncIterator[FakeSearch]:
    async with FakeSearch() as fake:
        yield fake


@pytest.fixture
def store(make_settings: SettingsFactory) -> Iterator[Store]:
    store = Store.open(make_settings().daemon.state_dir)
    yield store
    store.close()


Call = Callable[..., Awaitable[ToolResult]]


def web_settings(make_settings: SettingsFactory, **web: Any) -> Settings:
    if "allow_hosts" in web:
        web["allow_hosts"] = tuple(web["allow_hosts"])
    return make_settings(web=web)


@pytest.fixture
def tools(make_settings: SettingsFactory, store: Store) -> Callable[..., tuple[Registry, Call]]:
    """`tools(resolve=..., **web settings)` -> the registry with the web capability and a
    function that runs one tool call in a conversation that loaded it."""

    def build(resolve: Resolve | None = None, **web: Any) -> tuple[Registry, Call]:
        settings = web_settings(make_settings, **web)
        registry = Registry()
        extra = {"resolve": resolve} if resolve else {}
        web_tools.register(registry, settings.web, **extra)
        conversation = store.create_conversation("telegram:1111111", time.time())
        ctx = ToolContext(store=store, settings=settings, registry=registry,
                          conversation_id=conversation.id, clock=time.time)

        async def call(name: str, **arguments: Any) -> ToolResult:
            return await registry.run(ToolCall(name, arguments), ctx, ["web"])

        return registry, call

    return build


def replace_web(settings: Settings, **web: Any) -> Settings:
    return dataclasses.replace(settings, web=dataclasses.replace(settings.web, **web))
