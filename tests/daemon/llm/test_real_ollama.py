"""Against a real Ollama, when ROOST_TEST_OLLAMA names one (e.g. http://gpu-box:11434)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from daemon.app.assembly import assemble
from daemon.core.messages import Inbound
from daemon.llm.client import ModelClient
from daemon.store import Store
from tests.conftest import RecordingChannel, SettingsFactory

HOST = os.environ.get("ROOST_TEST_OLLAMA")
MODEL = os.environ.get("ROOST_TEST_OLLAMA_MODEL", "qwen3:4b")

pytestmark = [
    pytest.mark.ollama,
    pytest.mark.skipif(not HOST, reason="set ROOST_TEST_OLLAMA to a real Ollama host"),
]


async def test_a_real_turn_streams_and_reports_its_counters(
    make_settings: SettingsFactory, recording_channel: RecordingChannel
) -> None:
    settings = make_settings(model={"host": HOST, "name": MODEL, "window": 4096})
    store = Store.open(settings.daemon.state_dir)
    llm = ModelClient(settings.model)
    engine = assemble(settings, store, llm, {"console": recording_channel}).engine
    await engine.start()
    try:
        await engine.submit(Inbound(chat_key="console:local", received=time.time(),
                                    text="Reply with the single word: pong"))
        await asyncio.wait_for(engine.wait_idle("console:local"), 300)
    finally:
        await engine.stop(grace=0)
        await llm.close()
        store.close()
    [reply] = recording_channel.texts("reply")
    assert "pong" in reply.lower()
    assert recording_channel.deltas, "the reply was not streamed"
    with Store.open(settings.daemon.state_dir, read_only=True) as reopened:
        conversation = reopened.active_conversation("console:local")
        assert conversation is not None
        answer = reopened.messages(conversation.id)[-1]
    assert 0 < answer.meta["num_ctx"] <= 4096
    assert answer.meta["prompt_eval_count"] > 0
