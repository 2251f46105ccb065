"""The in-turn safety net on a long tool turn (issue 29, item 4): one pass reaches its target,
its state call never costs the model a tool round, and an image a tool just returned is shown
to the model before anything drops it."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable
from typing import Any

from PIL import Image

from daemon.context.compact import STATE_REQUEST, request_tokens
from daemon.tools.registry import Capability, Tool, ToolOutput
from daemon.turn.tool_loop import LAST_CALL_NUDGE, SAFETY_NET_LINE
from tests.daemon.tools.test_tools import Setup, call, last_user, setup_for, tool_messages
from tests.fakes.ollama import Reply

__all__ = ["setup_for"]  # the fixture, shared with the tool tests

PAGE = 30_000
STATE = "TASK: read pages\nPROGRESS: some read\nREMAINING: the rest\nDATA: facts\nDECISIONS: none"


def page(n: int) -> str:
    return (f"Page {n} line with facts. " * 1300)[:PAGE]


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (30, 30, 200)).save(out, "PNG")
    return out.getvalue()


def install_pages(setup: Setup, image_on: int | None = None) -> None:
    async def fetch_page(context: object, n: int) -> str | ToolOutput:
        if n == image_on:
            return ToolOutput(page(n), images=(png(640, 480),))
        return page(n)

    setup.engine.parts.registry.register(Capability(
        name="pages", core=True, description="fetch pages", tools=(Tool(
            "fetch_page", "Fetch page n.",
            {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
            fetch_page),)))


def reader() -> Callable[[dict[str, Any]], Reply]:
    """A model that reads 30 KB pages one at a time until it is told to answer."""
    fetched = iter(range(1, 100))

    def answer(body: dict[str, Any]) -> Reply:
        if STATE_REQUEST in last_user(body):
            return Reply(content=STATE)
        if not body.get("tools"):
            return Reply(content="Here is what the pages say.")
        return Reply(tool_calls=[call("fetch_page", n=next(fetched))])
    return answer


def state_calls(setup: Setup) -> int:
    return sum(STATE_REQUEST in last_user(b) for b in setup.fake.chat_requests)


async def test_the_30kb_pages_turn_reads_a_page_every_round_and_the_net_runs_seldom(
    setup_for: Callable[..., Any],
) -> None:
    setup: Setup = await setup_for()  # 8 model calls, an 8,192 window
    install_pages(setup)
    setup.fake.default_reply = reader()
    await setup.say("Read the pages one by one and tell me what they say.")
    # Every call but the last (which must answer) fetched a page: the safety net's state
    # calls did not eat the turn's rounds.
    assert len(tool_messages(setup)) == 7
    assert setup.channel.texts("reply")[-1].endswith("Here is what the pages say.")
    assert LAST_CALL_NUDGE.strip() in str(setup.fake.chat_requests[-1]["messages"][-1])
    # Each pass reaches half the budget, so 7 pages of ~1,200 tokens need at most 2 passes.
    assert state_calls(setup) <= 2
    budget = 8192 - 1024
    for body in setup.fake.chat_requests:
        tokens = setup.fake.count_tokens(body["messages"], body.get("tools"))
        assert tokens <= budget
        if STATE_REQUEST in last_user(body):  # a pass ends at half the budget
            assert setup.fake.count_tokens(body["messages"]) <= budget // 2
    assert setup.fake.cuts == 0 and setup.fake.overflows == 0


async def test_the_user_sees_a_line_when_the_net_ran_and_status_counts_its_passes(
    setup_for: Callable[..., Any],
) -> None:
    setup: Setup = await setup_for()
    install_pages(setup)
    setup.fake.default_reply = reader()
    await setup.say("Read the pages one by one and tell me what they say.")
    [reply] = setup.channel.texts("reply")
    assert "long turn: I condensed earlier tool results" in reply
    assert reply.endswith("Here is what the pages say.")
    assert SAFETY_NET_LINE in setup.channel.statuses  # also while it runs
    # The line is for the user: the model's stored words stay its own.
    stored = [m.content for m in setup.store.messages(setup.conversation_id())
              if m.role == "assistant"]
    assert stored[-1] == "Here is what the pages say."
    passes = state_calls(setup)
    await setup.say("/status")
    assert f"Safety net: {passes} passes in long turns" in setup.channel.texts("notice")[-1]


async def test_an_image_a_tool_just_returned_reaches_the_model_through_a_safety_net_pass(
    setup_for: Callable[..., Any],
) -> None:
    setup: Setup = await setup_for(capabilities=("completion", "tools", "vision"))
    install_pages(setup, image_on=4)  # page 4 comes with a picture, and tips the net
    setup.fake.default_reply = reader()
    await setup.say("Read the pages one by one and tell me what they say.")
    assert state_calls(setup) >= 1
    first_state = next(i for i, b in enumerate(setup.fake.chat_requests)
                       if STATE_REQUEST in last_user(b))
    # The request after page 4's result (the state call, then the resumed turn) carries its
    # image: the model is shown it before any pass may drop it.
    after = setup.fake.chat_requests[first_state + 1]["messages"]
    [with_image] = [m for m in after if m.get("images")]
    assert "Page 4 line" in with_image["content"]
    size = Image.open(io.BytesIO(base64.b64decode(with_image["images"][0]))).size
    assert size == (640, 480)


def test_images_in_a_turn_are_counted_by_their_pixels() -> None:
    big = base64.b64encode(png(2048, 1024)).decode()
    small = base64.b64encode(png(64, 64)).decode()
    text: dict[str, Any] = {"role": "tool", "content": "x"}
    with_big = request_tokens([{**text, "images": [big]}], 1.0)  # type: ignore[list-item]
    with_small = request_tokens([{**text, "images": [small]}], 1.0)  # type: ignore[list-item]
    plain = request_tokens([text], 1.0)  # type: ignore[list-item]
    assert with_big - plain == 2048 * 1024 // 1024  # as replay counts a stored image
    assert with_small - plain == 256  # the floor
    out = io.BytesIO()
    Image.new("RGB", (1280, 960), (1, 2, 3)).save(out, "JPEG")
    photo = base64.b64encode(out.getvalue()).decode()
    with_photo = request_tokens([{**text, "images": [photo]}], 1.0)  # type: ignore[list-item]
    assert with_photo - plain == 1280 * 960 // 1024


async def test_debug_snapshots_keep_every_request_of_a_turn_and_50_in_all(
    setup_for: Callable[..., Any],
) -> None:
    setup: Setup = await setup_for()
    install_pages(setup)
    setup.fake.default_reply = reader()
    await setup.say("Read the pages one by one and tell me what they say.")
    debug = setup.store.state_dir / "debug"
    snapshots = [json.loads(p.read_text("utf-8")) for p in sorted(debug.glob("*.json"))]
    sent = [b["messages"] for b in setup.fake.chat_requests]
    # Every request the turn sent is there, state calls included, with what it was sent.
    assert len(snapshots) == len(sent) == 10
    assert sorted(len(s["messages"]) for s in snapshots) == sorted(len(m) for m in sent)
    assert sum(STATE_REQUEST in str(s["messages"][-1]["content"]) for s in snapshots) == 2
    assert all(s["estimate"] <= s["budget"] for s in snapshots)
    for turn in range(5):  # 50 more requests: the oldest go
        await setup.say(f"Read more, round {turn}.")
    assert len(list(debug.glob("*.json"))) == 50
