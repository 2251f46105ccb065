"""A pool of Ollama hosts (`[model] hosts`) as the model client uses it, against two and three
fake Ollama servers: each route pinned to one host, new routes spread by priority, loaded model
and load, a failed host left and gone back to only after a fold, the health check, a model on
one host only or on none, and a pool of one as roost always was."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import ollama
import pytest

from daemon.core.config import ModelSettings
from daemon.core.config.sections import HostSettings
from daemon.core.errors import LLMError, LLMUnavailable, ModelNotFound, ModelNowhere
from daemon.llm.client import ChatResult, ModelClient
from daemon.llm.pool import HostPool
from tests.conftest import wait_until
from tests.fakes.ollama import VERSION, FakeModel, FakeOllama, Reply


@pytest.fixture
async def hosts() -> AsyncIterator[tuple[FakeOllama, FakeOllama, FakeOllama]]:
    async with FakeOllama() as a, FakeOllama() as b, FakeOllama() as c:
        yield a, b, c


@pytest.fixture
async def clients() -> AsyncIterator[list[ModelClient]]:
    made: list[ModelClient] = []
    yield made
    for llm in made:
        await llm.close()


def pool_of(clients: list[ModelClient], *hosts: FakeOllama | HostSettings,
            **model: Any) -> ModelClient:
    settings = ModelSettings(hosts=tuple(h if isinstance(h, HostSettings) else HostSettings(h.url)
                                         for h in hosts), **model)
    llm = ModelClient(settings)
    clients.append(llm)
    return llm


def said(fake: FakeOllama) -> list[str]:
    """What each chat a host was asked ended with: the user's words."""
    return [str(body["messages"][-1]["content"]) for body in fake.chat_requests]


async def ask(llm: ModelClient, text: str, **chat: Any) -> ChatResult:
    return await llm.chat([{"role": "user", "content": text}], **chat)


async def test_each_conversation_stays_on_its_host_and_two_at_once_spread_by_load(
    hosts: tuple[FakeOllama, FakeOllama, FakeOllama], clients: list[ModelClient],
) -> None:
    a, b, _ = hosts
    llm = pool_of(clients, a, b)
    a.script(Reply(content="slow answer", pause_after_chunks=1))

    async def first() -> ChatResult:
        with llm.routing("conversation-1"):
            return await ask(llm, "one")

    slow = asyncio.create_task(first())
    await wait_until(lambda: a.paused == 1)
    # The first conversation holds A: the second one (same priority, nothing loaded yet) goes
    # to B, and the gate lets it go now (one slot per host), not after the first.
    with llm.routing("conversation-2"):
        assert (await ask(llm, "two")).host == b.url
    a.resume_paused()
    assert (await slow).host == a.url
    # Pinned: with both idle, each conversation's calls keep going to its own host.
    for n in range(3):
        for route in ("conversation-1", "conversation-2"):
            with llm.routing(route):
                await ask(llm, f"{route} {n}")
    assert said(a) == ["one", *(f"conversation-1 {n}" for n in range(3))]
    assert said(b) == ["two", *(f"conversation-2 {n}" for n in range(3))]
    assert (llm.host_of("conversation-1"), llm.host_of("conversation-2")) == (a.url, b.url)


async def test_a_new_conversation_takes_priority_then_the_host_with_the_model_loaded(
    hosts: tuple[FakeOllama, FakeOllama, FakeOllama], clients: list[ModelClient],
) -> None:
    a, b, c = hosts
    evening = pool_of(clients, HostSettings(a.url), HostSettings(b.url, priority=10))
    with evening.routing("conversation-1"):
        assert (await ask(evening, "hello")).host == b.url
    assert said(a) == []

    c.loaded["qwen3:4b"] = 8192  # C has the model in memory (its /api/ps says so)
    warm = pool_of(clients, a, c)
    await warm.pool.check_all()
    assert warm.pool.hosts[1].loaded == {"qwen3:4b": 2_600_000_000}  # size_vram from /api/ps
    with warm.routing("conversation-2"):
        assert (await ask(warm, "hello")).host == c.url


async def test_a_failed_host_is_left_at_once_and_gone_back_to_only_after_a_fold(
    hosts: tuple[FakeOllama, FakeOllama, FakeOllama], clients: list[ModelClient],
) -> None:
    a, b, _ = hosts
    llm = pool_of(clients, a, b)
    with llm.routing("conversation-1"):
        assert (await ask(llm, "one")).host == a.url
    await a.refuse_connections()
    with llm.routing("conversation-1"):
        with pytest.raises(LLMUnavailable) as failed:
            await ask(llm, "two")
        assert failed.value.host == a.url
        assert llm.fail_over(None, failed.value) == b.url
        assert (await ask(llm, "two")).host == b.url
    assert not llm.pool.hosts[0].up and llm.pool.hosts[0].error
    home = llm.pool.home_of("conversation-1")
    assert home is not None and home.name == a.url

    await a.accept_connections()
    await llm.pool.check_all()  # the health check finds A back
    assert llm.pool.hosts[0].up
    with llm.routing("conversation-2"):  # a new conversation goes there at once
        assert (await ask(llm, "new")).host == a.url
    with llm.routing("conversation-1"):  # the moved one stays where its cache now is ...
        assert (await ask(llm, "three")).host == b.url
    with llm.routing("conversation-1", fold=1):  # ... until a fold rebuilds its prompt
        assert (await ask(llm, "four")).host == a.url
    assert said(a) == ["one", "new", "four"] and said(b) == ["two", "three"]
    assert llm.pool.home_of("conversation-1") is None


async def test_the_last_host_of_a_conversation_is_kept_across_a_restart_by_the_hint(
    hosts: tuple[FakeOllama, FakeOllama, FakeOllama], clients: list[ModelClient],
) -> None:
    a, b, _ = hosts
    llm = pool_of(clients, a, b)  # a fresh process: no pins
    with llm.routing("conversation-1", hint=b.url):
        assert (await ask(llm, "after the restart")).host == b.url
    with llm.routing("conversation-1"):
        assert (await ask(llm, "and on")).host == b.url
    await b.refuse_connections()
    await llm.pool.check_all()
    with llm.routing("conversation-2", hint=b.url):  # the hinted host is down: the best up
        assert (await ask(llm, "elsewhere")).host == a.url


async def test_a_model_on_one_host_only_goes_there_and_one_on_none_names_every_host(
    clients: list[ModelClient],
) -> None:
    async with FakeOllama() as a, FakeOllama(models=[FakeModel(), FakeModel("qwen3:14b")]) as b:
        llm = pool_of(clients, a, b)
        with llm.routing("conversation-1"):
            answer = await ask(llm, "big question", model="qwen3:14b")
        assert answer.host == b.url and said(a) == []
        with llm.routing("conversation-2"):
            with pytest.raises(ModelNowhere) as nowhere:
                await ask(llm, "hi", model="llama3.2:1b")
        assert a.url in str(nowhere.value) and b.url in str(nowhere.value)
        assert "ollama pull llama3.2:1b" in str(nowhere.value)

        # A host's `models` keeps it for those: the small model goes to A, though B has it.
        kept = pool_of(clients, HostSettings(a.url), HostSettings(b.url, models=("qwen3:14b",)),
                       concurrency=4)
        for n in range(3):
            with kept.routing(f"small-{n}"):
                assert (await ask(kept, "hi")).host == a.url


async def test_a_pool_of_one_is_roost_as_before(
    fake_ollama: FakeOllama, clients: list[ModelClient],
) -> None:
    llm = ModelClient(ModelSettings(host=fake_ollama.url))
    clients.append(llm)
    with llm.routing("conversation-1"):
        assert (await ask(llm, "hi")).host == fake_ollama.url
        with pytest.raises(ModelNotFound) as missing:
            await ask(llm, "hi", model="llama3.2:1b")
    assert not isinstance(missing.value, ModelNowhere)
    assert str(missing.value) == "model 'llama3.2:1b' is not available on the Ollama server"
    await fake_ollama.refuse_connections()
    with pytest.raises(LLMError) as down:
        await ask(llm, "again")
    assert llm.fail_over(None, down.value) is None  # no other host: the caller's outage
    # No health check runs for a pool of one: only the calls' own requests.
    assert {r.path for r in fake_ollama.requests} == {"/api/show", "/api/chat"}
    assert llm.gate.concurrency == 1


async def test_the_health_check_marks_a_host_down_and_up_and_reads_what_it_runs(
    hosts: tuple[FakeOllama, FakeOllama, FakeOllama],
) -> None:
    a, b, c = hosts
    a.loaded["qwen3:4b"] = 8192
    pool = HostPool([HostSettings(f.url) for f in hosts], lambda url: ollama.AsyncClient(url),
                    every=0.05, down_every=0.05, check_timeout=2.0)
    first = pool.hosts[0]
    try:
        pool.start()
        await wait_until(lambda: all(h.version_text for h in pool.hosts))
        assert first.models == frozenset({"qwen3:4b"}) and first.version_text == VERSION
        assert "qwen3:4b" in first.loaded and pool.hosts[1].loaded == {}
        await a.refuse_connections()
        await wait_until(lambda: not first.up)
        assert first.error and first.down_since is not None
        assert pool.first_up() is pool.hosts[1]
        await a.accept_connections()
        await wait_until(lambda: first.up)
        assert first.error is None and pool.first_up() is first
    finally:
        await pool.close()
    checked = len(b.requests)
    await asyncio.sleep(0.2)  # room for a check, were one still running after close
    assert len(b.requests) == checked and c.requests


async def test_a_hosts_credentials_are_never_shown(
    fake_ollama: FakeOllama, clients: list[ModelClient],
) -> None:
    async with FakeOllama() as other:
        secret = fake_ollama.url.replace("http://", "http://roost:s3cret@")
        llm = pool_of(clients, HostSettings(secret), HostSettings(other.url))
        with llm.routing("conversation-1"):
            result = await ask(llm, "hi")
        hidden = fake_ollama.url.replace("http://", "http://***@")
        assert result.host == hidden == llm.host == llm.host_of("conversation-1")
        await fake_ollama.refuse_connections()
        with llm.routing("conversation-1"), pytest.raises(LLMUnavailable) as failed:
            await ask(llm, "again")
        assert failed.value.host == hidden and "s3cret" not in str(failed.value)


async def test_the_models_without_a_route_are_every_hosts(clients: list[ModelClient]) -> None:
    # /model and the health probe ask without a route: a model on the second host alone is
    # there to switch to, and the chat model counts as pulled; a host down is passed over.
    async with FakeOllama() as a, FakeOllama(models=[FakeModel("qwen3:14b")]) as b, \
            FakeOllama() as c:
        llm = pool_of(clients, a, b, c)
        assert set(await llm.pulled_models()) == {"qwen3:4b", "qwen3:14b"}
        await c.refuse_connections()
        assert set(await llm.pulled_models()) == {"qwen3:4b", "qwen3:14b"}
        with llm.routing("conversation-1"):  # a conversation asks its own host only
            assert await llm.pulled_models() == ["qwen3:4b"]
