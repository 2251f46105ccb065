"""A shared MCP server's tool (`shared = true`: the house's lights) is approved by an owner alone.

The engine with the household the daemon has (`[people]`: Dana the owner on WhatsApp, which is
not enabled here, and Telegram; Omar a member; Sam a guest), a real stdio MCP server (the SDK's
server class, tests/fakes/mcp_server.py) and the Ollama fake scripting the model's calls. A
question's buttons are answered through the approver, where the channels hand a tap.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from daemon.cli.main import main
from daemon.core.approval import (
    ANSWERED,
    ANSWERED_FOR,
    NOT_AN_OWNER,
    NOT_YOURS,
    Answer,
    Choice,
    parse,
)
from daemon.core.config import (
    GUEST,
    MEMBER,
    OWNER,
    McpServerSettings,
    PersonSettings,
    Settings,
    load_settings,
)
from daemon.core.errors import ConfigError
from daemon.core.messages import Inbound, Outbound
from daemon.engine.workers import Engine
from daemon.intake.household import Household
from daemon.intake.pairing import PairingBook
from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.store.approvals import ApprovalBook
from daemon.tools.mcp.servers import McpServers, with_servers
from daemon.tools.registry import Tool
from daemon.tools.roles import NoRoles
from daemon.turn.approvals import Approvals
from daemon.turn.owners import Owners
from daemon.turn.parts import TurnParts
from tests.conftest import RecordingChannel, SettingsFactory, wait_until
from tests.fakes.mcp_results import unlabelled
from tests.fakes.ollama import FakeOllama, Reply

SERVER = Path(__file__).resolve().parents[2] / "fakes" / "mcp_server.py"
DANA, DANA_WA = "telegram:1111111", "whatsapp:972544401243"
OMAR, SAM = "telegram:2222222", "telegram:3333333"
GROUP = "telegram:-1001234567890"
HOME = McpServerSettings(name="home", command=sys.executable, args=(str(SERVER),), shared=True)
NOTES = McpServerSettings(name="notes", command=sys.executable, args=(str(SERVER),))


def calls(server: str, text: str, *, activate: bool = True) -> list[Reply]:
    steps = [("tool_activate", {"name": server})] if activate else []
    steps.append((f"{server}__echo", {"text": text}))
    return [Reply(tool_calls=[{"function": {"name": n, "arguments": a}}]) for n, a in steps]


class Home:
    def __init__(self, engine: Engine, fake: FakeOllama,
                 channels: dict[str, RecordingChannel]) -> None:
        self.engine, self.fake, self.channels = engine, fake, channels

    async def send(self, chat: str, text: str) -> None:
        assert await self.engine.submit(Inbound(chat_key=chat, text=text, received=time.time()))

    async def idle(self, chat: str) -> None:
        await asyncio.wait_for(self.engine.wait_idle(chat), 30)

    def sent(self, chat: str) -> list[Outbound]:
        return [o for o in self.channels[chat.partition(":")[0]].sent if o.chat_key == chat]

    def questions(self, chat: str) -> list[Outbound]:
        return [o for o in self.sent(chat) if o.buttons]

    async def question(self, chat: str, count: int = 1) -> tuple[str, str]:
        """The `count`th question asked in `chat` once it came: (approval id, its text)."""
        await wait_until(lambda: len(self.questions(chat)) >= count, 30)
        asked = self.questions(chat)[count - 1]
        found = parse(asked.buttons[0].id)
        assert found is not None
        return found[0], asked.text

    async def tap(self, approval_id: str, choice: Choice, chat: str, person: str) -> str:
        """A tap on a button of the question, as a channel hands it to the approver."""
        approvals = self.engine.parts.approvals
        assert approvals is not None
        return await approvals.answer(Answer(approval_id, choice, chat, person))

    def tool_results(self) -> list[str]:
        return [unlabelled(m["content"]) for m in self.fake.chat_requests[-1]["messages"]
                if m["role"] == "tool"]


def household(make_settings: SettingsFactory, fake: FakeOllama, *servers: McpServerSettings,
              timeout: float = 60.0, telegram: bool = True) -> Settings:
    settings = make_settings(model={"host": fake.url, "retry_backoff": 0.01},
                             telegram={"enabled": telegram},
                             mcp={"servers": servers, "approve_timeout": timeout})
    return dataclasses.replace(settings, people=MappingProxyType({
        "dana": PersonSettings(chats=(DANA_WA, DANA), role=OWNER),
        "omar": PersonSettings(chats=(OMAR,), role=MEMBER),
        "sam": PersonSettings(chats=(SAM,), role=GUEST, daily_messages=30),
    }))


Start = Callable[[Settings], Awaitable[Home]]


@pytest.fixture
async def start(fake_ollama: FakeOllama, state_dir: Path) -> AsyncIterator[Start]:
    started: list[tuple[Engine, McpServers, ModelClient, Store]] = []

    async def begin(settings: Settings) -> Home:
        registry, mcp = with_servers(settings.mcp, state_dir)
        await mcp.start()
        await asyncio.wait_for(mcp.wait_started(), 60)
        store = Store.open(settings.daemon.state_dir)
        llm = ModelClient(settings.model)
        channels = {k: RecordingChannel(k) for k in ("telegram", "whatsapp", "console")}
        parts = TurnParts.build(settings=settings, store=store, llm=llm, registry=registry,
                                roles=Household.of(settings))
        engine = Engine(settings=settings, store=store, llm=llm, channels=channels, parts=parts)
        await engine.start()
        started.append((engine, mcp, llm, store))
        return Home(engine, fake_ollama, channels)

    yield begin
    for engine, mcp, llm, store in started:
        await engine.stop(grace=0)
        await mcp.stop()
        await llm.close()
        store.close()


async def test_a_members_shared_call_asks_the_owner_whose_allow_runs_it(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, start: Start
) -> None:
    home = await start(household(make_settings, fake_ollama, HOME))
    fake_ollama.script(*calls("home", "lights on"), Reply("The lights are on."))
    await home.send(OMAR, "turn the lights on")
    approval_id, question = await home.question(DANA)
    # Dana's first chat that can be reached (WhatsApp is not enabled), and only there.
    assert "omar \\(telegram\\:2222222\\)" in question and "home\\_\\_echo" in question
    assert '"lights on"' in question
    assert home.sent(DANA_WA) == [] and home.sent("console:local") == []
    # Omar hears, in one line, that it waits for the owner; he has no buttons to tap.
    await wait_until(lambda: len(home.sent(OMAR)) == 1, 10)
    (told,) = home.sent(OMAR)
    assert "an owner has to approve it" in told.text and not told.buttons
    # A message meanwhile is told what it waits for.
    await home.send(OMAR, "hello?")
    await wait_until(lambda: len(home.sent(OMAR)) == 2, 10)
    assert "waiting for an owner's answer" in home.sent(OMAR)[1].text
    # Omar cannot answer it: not in his own chat, not (were it possible) in Dana's.
    assert await home.tap(approval_id, Choice.ONCE, OMAR, OMAR) == NOT_AN_OWNER
    assert await home.tap(approval_id, Choice.ONCE, DANA, OMAR) == NOT_AN_OWNER
    assert len(fake_ollama.chat_requests) == 2  # still waiting: nothing ran
    assert await home.tap(approval_id, Choice.ONCE, DANA, DANA) == ANSWERED[Choice.ONCE]
    await wait_until(lambda: any(o.text == "The lights are on." for o in home.sent(OMAR)), 20)
    assert "echo: lights on" in home.tool_results()
    assert ApprovalBook(home.engine.store.state_dir).standing() == []  # once is not always


async def test_the_owners_deny_keeps_the_tool_from_running(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, start: Start
) -> None:
    home = await start(household(make_settings, fake_ollama, HOME))
    fake_ollama.script(*calls("home", "unlock the door"), Reply("Dana said no."))
    await home.send(OMAR, "unlock the door")
    approval_id, _ = await home.question(DANA)
    assert await home.tap(approval_id, Choice.DENY, DANA, DANA) == ANSWERED[Choice.DENY]
    await home.idle(OMAR)
    assert home.sent(OMAR)[-1].text == "Dana said no."  # the turn ends as any other
    results = home.tool_results()
    assert any("denied" in r for r in results)
    assert not any("echo: unlock the door" in r for r in results)


async def test_no_answer_from_the_owner_counts_as_deny(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, start: Start
) -> None:
    home = await start(household(make_settings, fake_ollama, HOME, timeout=1.0))
    fake_ollama.script(*calls("home", "heating up"), Reply("Nobody answered."))
    await home.send(SAM, "warm the house")
    _, question = await home.question(DANA)
    assert "sam \\(telegram\\:3333333\\)" in question  # a guest asks the owner likewise
    await home.idle(SAM)
    texts = [o.text for o in home.sent(SAM)]
    assert any("No owner answered within" in t for t in texts)
    assert texts[-1] == "Nobody answered."
    results = home.tool_results()
    assert any("did not answer" in r for r in results)
    assert not any("echo: heating up" in r for r in results)


async def test_the_owners_always_is_for_that_person_alone(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, start: Start,
    capsys: pytest.CaptureFixture[str]
) -> None:
    home = await start(household(make_settings, fake_ollama, HOME))
    fake_ollama.script(*calls("home", "one"), Reply("First."),
                       *calls("home", "two", activate=False), Reply("Second."))
    await home.send(OMAR, "lights")
    approval_id, _ = await home.question(DANA)
    said = await home.tap(approval_id, Choice.ALWAYS, DANA, DANA)
    assert said == ANSWERED_FOR[Choice.ALWAYS]
    await home.idle(OMAR)
    await home.send(OMAR, "again")
    await home.idle(OMAR)
    assert home.sent(OMAR)[-1].text == "Second." and "echo: two" in home.tool_results()
    assert len(home.questions(DANA)) == 1  # Omar's second call ran on Dana's yes
    # Sam's call is asked all the same: Dana's "Always" was for Omar.
    fake_ollama.script(*calls("home", "three"), Reply("Third."))
    await home.send(SAM, "lights")
    approval_id, _ = await home.question(DANA, 2)
    await home.tap(approval_id, Choice.DENY, DANA, DANA)
    await home.idle(SAM)
    assert main(["approvals", "list"]) == 0
    listed = capsys.readouterr().out
    assert "telegram:2222222 home__echo (since " in listed
    assert "given by the owner telegram:1111111)" in listed
    assert SAM not in listed


async def test_a_members_own_tool_and_the_owners_own_call_are_asked_as_before(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, start: Start
) -> None:
    home = await start(household(make_settings, fake_ollama, HOME, NOTES))
    # A tool that is not shared: Omar is asked, in his chat, and he answers.
    fake_ollama.script(*calls("notes", "milk"), Reply("Noted."))
    await home.send(OMAR, "note milk")
    approval_id, question = await home.question(OMAR)
    assert question.startswith("May I run **notes\\_\\_echo**?")
    assert await home.tap(approval_id, Choice.ONCE, OMAR, DANA) == NOT_YOURS
    assert await home.tap(approval_id, Choice.ONCE, OMAR, OMAR) == ANSWERED[Choice.ONCE]
    await home.idle(OMAR)
    assert "echo: milk" in home.tool_results() and home.sent(DANA) == []
    # Dana's own call of the shared tool: asked in her chat, as any call.
    fake_ollama.script(*calls("home", "lights off"), Reply("Off."))
    await home.send(DANA, "lights off")
    approval_id, question = await home.question(DANA)
    assert question.startswith("May I run **home\\_\\_echo**?")
    assert await home.tap(approval_id, Choice.ONCE, DANA, DANA) == ANSWERED[Choice.ONCE]
    await home.idle(DANA)
    assert [o.text for o in home.sent(DANA)][-1] == "Off."
    assert "echo: lights off" in home.tool_results()


async def test_in_a_group_even_a_never_tool_waits_for_the_owner(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, start: Start
) -> None:
    home = await start(household(make_settings, fake_ollama,
                                 dataclasses.replace(HOME, approve="never")))
    fake_ollama.script(*calls("home", "music"), Reply("Playing."))
    assert await home.engine.submit(Inbound(chat_key=GROUP, text="music please",
                                            received=time.time(), sender="2222222"))
    approval_id, question = await home.question(DANA)
    assert "omar \\(telegram\\:2222222\\) in telegram\\:\\-1001234567890" in question
    assert await home.tap(approval_id, Choice.ONCE, DANA, DANA) == ANSWERED[Choice.ONCE]
    await home.idle(GROUP)
    assert "echo: music" in home.tool_results()
    # In the owner's own chat the policy holds: "never" runs it unasked.
    fake_ollama.script(*calls("home", "quiet"), Reply("Quiet."))
    await home.send(DANA, "quiet")
    await home.idle(DANA)
    assert "echo: quiet" in home.tool_results() and len(home.questions(DANA)) == 1


async def test_with_no_owner_chat_to_reach_the_terminal_is_asked_and_y_answers(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, start: Start
) -> None:
    home = await start(household(make_settings, fake_ollama, HOME, telegram=False))
    fake_ollama.script(*calls("home", "porch light"), Reply("Porch light on."))
    await home.send(OMAR, "porch light")
    _, question = await home.question("console:local")
    assert "omar" in question and home.sent(DANA) == []
    approvals = home.engine.parts.approvals
    assert approvals is not None
    assert await approvals.answer_typed("console:local", "y")
    await home.idle(OMAR)
    assert home.sent(OMAR)[-1].text == "Porch light on."
    assert "echo: porch light" in home.tool_results()


# ---- the parts ----------------------------------------------------------------------------


async def _never(**_: Any) -> str:
    raise AssertionError("not run")


async def test_with_no_owner_listed_a_shared_call_is_refused(
    make_settings: SettingsFactory, state_dir: Path
) -> None:
    tool = Tool(name="home__echo", description="Echo.", parameters={}, handler=_never,
                shared=True)
    approvals = Approvals(ApprovalBook(state_dir), timeout=30, clock=lambda: 0.0)
    store = Store.open(state_dir)
    asked: list[str] = []

    async def ask(chat_key: str, text: str, **_: Any) -> None:
        asked.append(chat_key)

    try:
        owners = Owners(NoRoles(), make_settings(), store)
        refused = await approvals.check(tool, {}, chat_key=OMAR, person=OMAR, ask=ask,
                                        released=contextlib.nullcontext, owners=owners)
    finally:
        store.close()
    assert refused is not None and "no owner is listed" in refused and asked == []


def test_the_owners_chats_in_the_configs_order_the_terminal_last(
    make_settings: SettingsFactory, state_dir: Path
) -> None:
    settings = dataclasses.replace(
        make_settings(),
        people=MappingProxyType({"omar": PersonSettings((OMAR,), MEMBER),
                                 "dana": PersonSettings(("console:local", DANA), OWNER)}),
        identities=MappingProxyType({"eli": (DANA_WA,)}))
    assert Household.of(settings, PairingBook(state_dir)).owner_chats() == (
        DANA, "console:local")
    lone = Household.of(make_settings(), PairingBook(state_dir))
    assert lone.owner_chats() == ("console:local",)
    assert NoRoles().owner_chats() == ()


def test_shared_is_a_boolean_of_a_server(tmp_path: Path) -> None:
    path = tmp_path / "roost.toml"
    path.write_text('[mcp.servers.home]\ncommand = "x"\nshared = true\n', "utf-8")
    (server,) = load_settings(path, {}).mcp.servers
    assert server.shared is True
    path.write_text('[mcp.servers.home]\ncommand = "x"\nshared = "yes"\n', "utf-8")
    with pytest.raises(ConfigError, match=r"mcp\.servers\.home\.shared"):
        load_settings(path, {})
    path.write_text('[mcp.servers.home]\ncommand = "x"\n', "utf-8")
    assert load_settings(path, {}).mcp.servers[0].shared is False
