"""Overflows and cuts anywhere in a turn, against the fake Ollama: a prompt Ollama cut silently
is answered anew, an overflow is refitted and retried once, the user never reads a raw error."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from tests.daemon.turn.test_context_lifecycle import (  # noqa: F401  (rig_for is a fixture)
    Rig,
    ratio_of,
    rig_for,
)

GARBLED = "🙂🙂🙂 sorry what"


async def underestimating(rig_for: Callable[..., Any]) -> Rig:  # noqa: F811
    """A rig whose conversation underestimates its tokens by far (ratio 0.5 against the
    fake's 1.33), on a server that cuts although told not to, with a 12 KB tool result."""
    rig: Rig = await rig_for(window=4096)
    rig.fake.ignores_truncate = True
    await rig.say("first")
    conversation = rig.store.get_conversation(rig.conversation_id())
    assert conversation is not None
    rig.store.save_conversation(replace(conversation, token_ratio=0.5))
    rig.tool_cycle(12_000)
    return rig


async def test_an_answer_to_a_silently_cut_prompt_is_discarded_and_asked_again(
    rig_for: Callable[..., Any],  # noqa: F811
) -> None:
    rig = await underestimating(rig_for)
    rig.fake.script(GARBLED)  # what the model says to a prompt without its system message
    await rig.say("What does it say?", wait_fold=False)
    assert rig.channel.texts("reply") == ["echo: first", "echo: What does it say?"]
    stored = [m.content for m in rig.store.messages(rig.conversation_id())]
    assert GARBLED not in stored
    assert rig.fake.cuts == 1  # the request sent again fitted
    assert len(rig.turn_requests()) == 3
    # The cut proves the size: the ratio moved past one step (x1.5), far enough to fit.
    assert ratio_of(rig) > 0.75
    events = rig.engine.parts.records.events("2026-12-01")
    assert sum("silent-cut" in e for e in events) == 1


async def test_a_second_cut_gets_the_user_a_clear_line(
    rig_for: Callable[..., Any],  # noqa: F811
) -> None:
    rig = await underestimating(rig_for)
    # The model's real context is far smaller than /api/show said: every request is cut.
    rig.fake.models[0].context_length = 512
    rig.fake.script(GARBLED, GARBLED)
    await rig.say("What does it say?", wait_fold=False)
    assert rig.channel.texts("reply") == ["echo: first"]
    [notice] = rig.channel.texts("notice")
    assert "context window" in notice and "/compact" in notice
    assert "{" not in notice
    stored = [m.content for m in rig.store.messages(rig.conversation_id())]
    assert GARBLED not in stored and "What does it say?" in stored
    assert len(rig.turn_requests()) == 3
