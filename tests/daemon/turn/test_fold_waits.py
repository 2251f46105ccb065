"""A fold a chat owes never makes another chat's reply wait for more than one fold call (issue 48
item 8): with 20 chats at a 2K window, one turn a chat waited 60 s behind the folds other turns
landed first."""

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
OWING = ("telegram:3000001", "telegram:3000002", "telegram:3000003")
LATE = "telegram:4000004"
LONG = "words of some length " * 20


async def talk(rig: Rig, chat_key: str, text: str) -> None:
    assert await rig.engine.submit(Inbound(chat_key=chat_key, text=text, received=rig.clock()))
    await asyncio.wait_for(rig.engine.wait_idle(chat_key), 20)


def conversation_of(rig: Rig, chat_key: str) -> str:
    conversation = rig.store.active_conversation(chat_key)
    assert conversation is not None
    return conversation.id


async def owing_chats(rig: Rig) -> None:
    """The OWING chats, each with history no fold has taken yet (as a busy chat's is)."""
    for key in OWING:
        await talk(rig, key, f"hello: {LONG}")
        cid = conversation_of(rig, key)
        await rig.engine.parts.folder.wait(cid)
        for n in range(4):
            rig.store.append_message(cid, "user", f"message {n}: {LONG}", created=rig.clock())
            rig.store.append_message(cid, "assistant", f"answer {n}: {LONG}",
                                     created=rig.clock())


async def owing_chats_write(rig: Rig, text: str) -> None:
    """While the model is held, each OWING chat's request reached its budget (its fold is
    owed) and it writes `text`: their calls wait for the model."""
    for key in OWING:
        rig.engine.parts.folder.schedule(conversation_of(rig, key), urgent=True)
        assert await rig.engine.submit(Inbound(chat_key=key, text=f"{key} {text}",
                                               received=rig.clock()))
    await wait_until(lambda: rig.engine.parts.llm.gate.waiting == len(OWING), timeout=10)


def served_since(rig: Rig, before: int) -> list[str]:
    """What the model answered since request `before`: "fold", or a turn's first line."""
    return ["fold" if is_fold(b) else b["messages"][-1]["content"].split("\n")[0]
            for b in rig.fake.chat_requests[before:]]


async def hold_the_model(rig: Rig, text: str) -> None:
    """Another chat's answer holds the model, paused mid-answer."""
    rig.fake.script(Reply(content="the other answer", chunks=2, pause_after_chunks=1))
    assert await rig.engine.submit(Inbound(chat_key=OTHER, text=text, received=rig.clock()))
    await wait_until(lambda: rig.fake.paused == 1)


async def test_a_turn_owing_a_fold_answers_first_while_another_chat_is_answered(
    rig_for: Callable[..., Any],  # noqa: F811
) -> None:
    rig: Rig = await rig_for(window=2048)
    for n in range(8):  # history enough that a fold has something to fold
        await rig.say(f"message {n}: " + "words of some length " * 20)
    owed = rig.conversation_id()
    before = len(rig.fake.chat_requests)
    await hold_the_model(rig, "hello")
    engine = rig.engine
    engine.parts.folder.schedule(owed, urgent=True)  # the last request reached its budget
    assert await engine.submit(Inbound(chat_key=CHAT, text="and now?", received=rig.clock()))
    # This chat's turn goes on without its fold, so its call waits behind the one running.
    await wait_until(lambda: engine.parts.llm.gate.waiting == 1, timeout=10)
    rig.fake.resume_paused()
    await asyncio.wait_for(asyncio.gather(engine.wait_idle(CHAT), engine.wait_idle(OTHER)), 20)
    assert any(t.startswith("echo: and now?") for t in rig.channel.texts("reply"))
    assert served_since(rig, before)[:2] == ["hello", "and now?"]


async def test_chats_owing_folds_while_the_model_is_busy_delay_no_other_chat(
    rig_for: Callable[..., Any],  # noqa: F811
) -> None:
    rig: Rig = await rig_for(window=2048)
    folder, gate = rig.engine.parts.folder, rig.engine.parts.llm.gate
    for round_ in range(2):  # the second time each chat owes its fold again
        await owing_chats(rig)
        before = len(rig.fake.chat_requests)
        await hold_the_model(rig, f"hold {round_}")
        await owing_chats_write(rig, f"round {round_}")
        assert await rig.engine.submit(Inbound(chat_key=LATE, text=f"late {round_}",
                                               received=rig.clock()))
        await wait_until(lambda: gate.waiting == len(OWING) + 1, timeout=10)
        rig.fake.resume_paused()
        for key in (OTHER, *OWING, LATE):
            await asyncio.wait_for(rig.engine.wait_idle(key), 20)
        for key in OWING:  # their folds land, in the lane, once their turns are answered
            await asyncio.wait_for(folder.wait(conversation_of(rig, key)), 20)
            assert not folder.owes(conversation_of(rig, key))
        served = served_since(rig, before)
        # Before, each turn of a chat that had gone on once without its fold landed it first:
        # the late chat's reply waited behind three folds.
        assert served.index(f"late {round_}") == 1 + len(OWING), served
        assert served.count("fold") >= len(OWING)


async def test_folds_in_the_lane_go_one_at_a_time_so_a_turn_waits_behind_one(
    rig_for: Callable[..., Any],  # noqa: F811
) -> None:
    rig: Rig = await rig_for(window=2048)
    await owing_chats(rig)
    folder, gate = rig.engine.parts.folder, rig.engine.parts.llm.gate
    await hold_the_model(rig, "hold")
    await owing_chats_write(rig, "now")
    before = len(rig.fake.chat_requests)
    # Two of the owing chats are answered and their folds wait; the third one's answer holds
    # the model, paused, while the late chat writes.
    rig.fake.script("answer one", "answer two",
                    Reply(content="answer three", chunks=2, pause_after_chunks=1))
    rig.fake.resume_paused()
    await wait_until(lambda: rig.fake.paused == 1 and gate.waiting == 1, timeout=10)
    assert await rig.engine.submit(Inbound(chat_key=LATE, text="late", received=rig.clock()))
    await wait_until(lambda: gate.waiting == 2, timeout=10)
    rig.fake.resume_paused()
    await asyncio.wait_for(rig.engine.wait_idle(LATE), 20)
    for key in OWING:
        await asyncio.wait_for(rig.engine.wait_idle(key), 20)
        await asyncio.wait_for(folder.wait(conversation_of(rig, key)), 20)
    served = served_since(rig, before)
    # The first answered chat's fold was queued when the late one came; the second's waited.
    assert sorted(served[:3]) == [f"{key} now" for key in OWING], served
    assert served[3:5] == ["fold", "late"], served
    assert served.count("fold") >= len(OWING)
