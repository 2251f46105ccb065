"""What roost does differently for one model, from its card (daemon.models): the client reads
it on every call, so chats, automations and folds all get the same treatment.

Defined here, below the models layer that fills it in, so the client can ask for it without
importing the cards; a model without a card gets `Habits()`, roost's behaviour for any model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Habits:
    """`no_tools`: it never called the tool it was offered, so it gets none (and no word of
    them: schemas it ignores only cost it context). `text_tool_calls`: it writes its tool
    calls as JSON in the content, so they are read and run like Ollama's own.
    `no_thinking_with_tools`: with tools offered it thinks and answers nothing, so it gets
    `think: false` whenever tools go with the request. `inline_reasoning`: its reasoning comes
    in the content (`<think>`, or an unopened block ending in `</think>`), so that is moved out
    of what is shown and stored. `cuts`: the server answered a prompt over the window instead
    of refusing it, so requests keep a wider margin and every low count is checked for a cut.
    `start_ratio`: the token ratio a new chat starts from, from the card's measured estimate
    error (None: 1.0)."""

    no_tools: bool = False
    text_tool_calls: bool = False
    no_thinking_with_tools: bool = False
    inline_reasoning: bool = False
    cuts: bool = False
    start_ratio: float | None = None


HabitsOf = Callable[[str], Habits]  # model name -> its habits


def no_habits(model: str) -> Habits:
    return Habits()
