"""What an approval question shows: every argument by name, each value shortened only to its own
bound with the characters left out said; a call too big to show is refused, never approved."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from daemon.core.approval import Button
from daemon.store.approvals import ApprovalBook
from daemon.tools.registry import ERROR_PREFIX, Tool
from daemon.turn.approvals import Approvals
from tests.conftest import wait_until

CHAT = "telegram:1111111"


async def _never(**_: Any) -> str:
    raise AssertionError("an approval check never runs the tool")


TOOL = Tool(name="fs__remove", description="Remove files.", parameters={}, handler=_never,
            approve="always")


class Asked:
    """The notices the user got (the engine's notify with buttons)."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.buttons: list[tuple[Button, ...]] = []

    async def __call__(self, chat_key: str, text: str, *,
                       buttons: tuple[Button, ...] = ()) -> None:
        self.texts.append(text)
        self.buttons.append(buttons)


@contextlib.asynccontextmanager
async def _released() -> AsyncIterator[None]:
    yield


async def ask_and_allow(state_dir: Path, arguments: dict[str, Any]) -> tuple[Asked, str | None]:
    """Ask about `arguments`; tap Allow once on a question if one with buttons comes."""
    approvals = Approvals(ApprovalBook(state_dir), timeout=30, clock=lambda: 0.0)
    asked = Asked()
    check = asyncio.create_task(approvals.check(TOOL, arguments, chat_key=CHAT, person=CHAT,
                                                ask=asked, released=_released))
    await wait_until(lambda: check.done() or bool(approvals.waiting_in(CHAT)), 10)
    if not check.done():
        await approvals.answer_typed(CHAT, "y")
    return asked, await asyncio.wait_for(check, 10)


async def test_padding_the_first_argument_does_not_hide_the_others(state_dir: Path) -> None:
    # A model steered by a web page padded the first argument to 700 characters: the question
    # cut the JSON at 600, and "Allow once" approved arguments the user never saw.
    arguments = {"note": "x" * 700, "delete_everything": True, "target": "/home",
                 "options": {"pad": "y" * 900, "recursive": True}}
    asked, result = await ask_and_allow(state_dir, arguments)
    (question,) = asked.texts
    assert "delete_everything: true" in question
    assert 'target: "/home"' in question
    assert "options.recursive: true" in question
    assert "(502 more characters)" in question  # 702 with the quotes, 200 shown
    assert "(702 more characters)" in question
    assert len(question) < 2000
    assert result is None  # allowed once


async def test_a_call_too_big_to_show_is_refused_with_the_reason(state_dir: Path) -> None:
    arguments = {f"path{i}": f"/srv/data/{i}" for i in range(400)}
    asked, result = await ask_and_allow(state_dir, arguments)
    (told,) = asked.texts
    assert asked.buttons == [()]  # nothing to tap: nothing can be approved
    assert "fs__remove" in told and "too many arguments to show" in told
    assert result is not None and result.startswith(ERROR_PREFIX)
    assert "not run" in result


async def test_a_small_call_is_shown_whole(state_dir: Path) -> None:
    asked, result = await ask_and_allow(state_dir, {"target": "/tmp/a b", "force": False,
                                                    "depth": 2, "tags": ["x", "y"]})
    (question,) = asked.texts
    for line in ('target: "/tmp/a b"', "force: false", "depth: 2", 'tags[0]: "x"',
                 'tags[1]: "y"'):
        assert line in question
    assert "more characters" not in question
    assert result is None
