"""A fold a chat owes never makes another chat's reply wait (issue 48 item 8): with 20 chats
at a 2K window, one turn a chat waited 60 s behind the folds other turns landed first."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from daemon.core.messages import Inbound
from tests.conftest import wait_until
from tests.daemon.turn.test_context_lifecycle import (  # noqa: F401  (rig_for is a fixture)
    CHAT,
    Rig,
    is_fold,
    rig_for,
)
from tests.fakes.ollama import Reply

OTHER = "telegram:2222222"


async def test_a_turn_owing_a_fold_answers_first_while_another_chat_is_answered(
    rig_for: Callable[..., Any],  # noqa: F811
) -> None:
    rig: Rig = await rig_for(window=2048)
    for n in range(8):  # history enough that a fold has something to fold
        await rig.say(f"message {n}: " + "words of some length " * 20)
    owed = rig.conversation_id()
    before = len(rig.fake.chat_requests)
    # The other chat's answer holds the model, paused mid-answer.
    rig.fake.script(Reply(content="the other answer", chunks=2, pause_after_chunks=1))
    engine = rig.engine
    assert await engine.submit(Inbound(chat_key=OTHER, text="hello", received=rig.clock()))
    await wait_until(lambda: rig.fake.paused == 1)
    engine.parts.folder.schedule(owed, urgent=True)  # the last request reached its budget
    assert await engine.submit(Inbound(chat_key=CHAT, text="and now?", received=rig.clock()))
    # This chat's turn goes on without its fold, so its call waits behind the one running.
    await wait_until(lambda: engine.parts.llm.gate.waiting == 1, timeout=10)
    rig.fake.resume_paused()
    await asyncio.wait_for(asyncio.gather(engine.wait_idle(CHAT), engine.wait_idle(OTHER)), 20)
    assert any(t.startswith("echo: and now?") for t in rig.channel.texts("reply"))
    served = ["fold" if is_fold(b) else b["messages"][-1]["content"].split("\n")[0]
              for b in rig.fake.chat_requests[before:]]
    assert served[:2] == ["hello", "and now?"]
