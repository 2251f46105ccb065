"""The Ollama client's error translation covers the ollama library and httpx, nothing of roost's;
an answer past its cap is one of those errors."""

from __future__ import annotations

import asyncio
import logging

import pytest

from daemon.app.assembly import assemble
from daemon.core.errors import ContextOverflow, LLMError, LLMUnavailable
from daemon.llm.client import ModelClient
from daemon.store import Store
from tests.conftest import RecordingChannel, SettingsFactory, wait_until
from tests.daemon.turn.test_turn import fast, say
from tests.fakes.flood import Flood
from tests.fakes.ollama import FakeOllama, Reply


class StreamingBug(Exception):
    """Stands for a bug in roost's own streaming code (a formatter, a channel's preview)."""


def broken_callback(piece: str) -> None:
    raise StreamingBug(f"cannot show {piece!r}")


async def test_a_bug_in_the_streaming_callback_surfaces_as_itself_not_as_a_model_error(
    fake_ollama: FakeOllama, make_settings: SettingsFactory
) -> None:
    fake_ollama.script(Reply(content="one two three", chunks=3))
    llm = ModelClient(fast(make_settings, fake_ollama, concurrency=1).model)
    try:
        with pytest.raises(StreamingBug) as raised:
            await llm.chat([{"role": "user", "content": "hi"}], on_delta=broken_callback)
        assert not isinstance(raised.value, LLMError)
        assert raised.value.__cause__ is None  # nothing of the model server wrapped around it
        # The model is free again: the next call is answered.
        result = await asyncio.wait_for(llm.chat([{"role": "user", "content": "again"}]), 10)
        assert result.content == "echo: again"
    finally:
        await llm.close()


async def test_the_ollama_clients_own_errors_are_still_translated(
    fake_ollama: FakeOllama, make_settings: SettingsFactory
) -> None:
    llm = ModelClient(fast(make_settings, fake_ollama).model)
    await fake_ollama.refuse_connections()
    try:
        with pytest.raises(LLMUnavailable):
            await llm.chat([{"role": "user", "content": "hi"}], on_delta=broken_callback)
    finally:
        await llm.close()


class BrokenPreview(RecordingChannel):
    """A channel whose streaming preview has a bug."""

    def write(self, delta: str) -> None:
        broken_callback(delta)


async def test_a_streaming_bug_in_a_turn_is_logged_with_its_traceback_not_told_as_a_model_error(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, caplog: pytest.LogCaptureFixture,
) -> None:
    settings = fast(make_settings, fake_ollama)
    channel = BrokenPreview()
    store = Store.open(settings.daemon.state_dir)
    llm = ModelClient(settings.model)
    engine = assemble(settings, store, llm, {"console": channel}).engine
    await engine.start()
    try:
        with caplog.at_level(logging.WARNING, logger="roost"):
            await say(engine, "hello")
    finally:
        await engine.stop(grace=0)
        await llm.close()
        store.close()
    notices = channel.texts("notice")
    assert not any("model server answered with an error" in n for n in notices), notices
    assert any("went wrong inside roost" in n for n in notices), notices
    logged = [r for r in caplog.records
              if r.exc_info and isinstance(r.exc_info[1], StreamingBug)]
    assert logged, [r.getMessage() for r in caplog.records]
    assert channel.texts("reply") == []


async def test_every_chat_tells_ollama_never_to_cut_or_shift(
    fake_ollama: FakeOllama, make_settings: SettingsFactory
) -> None:
    llm = ModelClient(fast(make_settings, fake_ollama).model)
    try:
        await llm.chat([{"role": "user", "content": "hi"}])
        await llm.chat([{"role": "user", "content": "fold this"}], background=True)
    finally:
        await llm.close()
    assert [(b.get("truncate"), b.get("shift")) for b in fake_ollama.chat_requests] == [
        (False, False), (False, False)]


async def test_an_over_window_prompt_is_refused_as_an_overflow_not_cut(
    fake_ollama: FakeOllama, make_settings: SettingsFactory
) -> None:
    llm = ModelClient(fast(make_settings, fake_ollama).model)
    messages = [{"role": "user", "content": "x" * 40_000}]
    try:
        with pytest.raises(ContextOverflow) as refused:
            await llm.chat(messages)
    finally:
        await llm.close()
    assert refused.value.prompt_tokens == fake_ollama.count_tokens(messages)
    assert fake_ollama.cuts == 0


@pytest.mark.parametrize("declared", [False, True])
async def test_an_answer_past_its_cap_is_a_model_error_read_no_further(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, declared: bool
) -> None:
    # A server gone wrong answers 200 MB, in one line that never ends (issue 48 item 6: every
    # body read from outside has a cap); chunked, or with its length said up front.
    fake_ollama.flood = flood = Flood(200 * 1024 * 1024, declared, "application/x-ndjson")
    llm = ModelClient(fast(make_settings, fake_ollama, concurrency=1).model)
    try:
        with pytest.raises(LLMError) as raised:
            await asyncio.wait_for(llm.chat([{"role": "user", "content": "hi"}]), 60)
        assert "Ollama's answer was too large: an answer larger than 64 MB" in str(raised.value)
        await wait_until(lambda: flood.done, 10)
        assert flood.cut and flood.sent < 100 * 1024 * 1024, flood  # roost hung up at its cap
        # And the next answer is read as ever.
        result = await asyncio.wait_for(llm.chat([{"role": "user", "content": "again"}]), 10)
        assert result.content == "echo: again"
    finally:
        await llm.close()
