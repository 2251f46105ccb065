"""MCP tools in a turn: images reach a model that can see, a note one that cannot; a server that
is down is a line in /status; past 60 capabilities the index collapses MCP servers too."""

from __future__ import annotations

import asyncio
import base64
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import types

from daemon.context.prefix import capability_index
from daemon.core.config import McpServerSettings, McpSettings
from daemon.core.messages import Inbound
from daemon.engine.workers import Engine
from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.tools.mcp.catalog import Catalog
from daemon.tools.mcp.connection import Listing
from daemon.tools.mcp.servers import McpServers, with_servers
from daemon.turn.parts import TurnParts
from tests.conftest import RecordingChannel, SettingsFactory
from tests.fakes.mcp_results import unlabelled
from tests.fakes.ollama import FakeModel, FakeOllama, Reply

SERVER = Path(__file__).resolve().parents[2] / "fakes" / "mcp_server.py"
CHAT = "console:local"


def calls(*steps: tuple[str, dict[str, Any]]) -> list[Reply]:
    return [Reply(tool_calls=[{"function": {"name": n, "arguments": a}}]) for n, a in steps]


@pytest.fixture
async def engine_with(make_settings: SettingsFactory, state_dir: Path) -> AsyncIterator[Any]:
    made: list[tuple[Engine, McpServers, ModelClient, Store]] = []

    async def start(fake: FakeOllama, *servers: McpServerSettings) -> tuple[Engine,
                                                                             RecordingChannel]:
        settings = make_settings(model={"host": fake.url, "retry_backoff": 0.01},
                                 mcp={"servers": servers})
        registry, mcp = with_servers(settings.mcp, state_dir)
        await mcp.start()
        await asyncio.wait_for(mcp.wait_started(), 60)
        store = Store.open(state_dir)
        llm = ModelClient(settings.model)
        channel = RecordingChannel()
        engine = Engine(settings=settings, store=store, llm=llm, channels={"console": channel},
                        parts=TurnParts.build(settings=settings, store=store, llm=llm,
                                              registry=registry))
        await engine.start()
        made.append((engine, mcp, llm, store))
        return engine, channel

    yield start
    for engine, mcp, llm, store in made:
        await engine.stop(grace=0)
        await mcp.stop()
        await llm.close()
        store.close()


async def say(engine: Engine, text: str) -> None:
    await engine.submit(Inbound(chat_key=CHAT, text=text, received=engine.clock()))
    await asyncio.wait_for(engine.wait_idle(CHAT), 30)


def tool_messages(fake: FakeOllama) -> list[dict[str, Any]]:
    return [m for m in fake.chat_requests[-1]["messages"] if m["role"] == "tool"]


async def test_a_tools_image_is_shown_to_a_model_that_can_see(engine_with: Any) -> None:
    vision = FakeModel(capabilities=("completion", "tools", "vision"))
    async with FakeOllama(models=[vision]) as fake:
        engine, channel = await engine_with(fake, McpServerSettings(
            name="fake", command=sys.executable, args=(str(SERVER),), approve="never"))
        fake.script(*calls(("tool_activate", {"name": "fake"}), ("fake__picture", {})),
                    Reply("A single pixel."))
        await say(engine, "show me the picture")
        (picture,) = [m for m in tool_messages(fake) if "image/png" in m["content"]]
        (image,) = picture["images"]
        assert base64.b64decode(image).startswith(b"\x89PNG")
        assert "A single pixel." in channel.texts()
        conversation = engine.store.active_conversation(CHAT)
        assert conversation is not None
        stored = [m for m in engine.store.messages(conversation.id) if m.role == "tool"]
        assert [a["kind"] for a in stored[-1].attachments] == ["image"]


async def test_a_model_that_cannot_see_gets_a_note_instead(engine_with: Any) -> None:
    async with FakeOllama() as fake:
        engine, _ = await engine_with(fake, McpServerSettings(
            name="fake", command=sys.executable, args=(str(SERVER),), approve="never"))
        fake.script(*calls(("tool_activate", {"name": "fake"}), ("fake__picture", {})),
                    Reply("I cannot see it."))
        await say(engine, "show me the picture")
        (picture,) = [m for m in tool_messages(fake) if "image/png" in m["content"]]
        assert "images" not in picture
        assert "cannot see images" in picture["content"]


async def test_status_names_a_server_that_never_came_up(engine_with: Any) -> None:
    async with FakeOllama() as fake:
        engine, channel = await engine_with(
            fake, McpServerSettings(name="broken", command="/nonexistent/mcp-server"))
        await say(engine, "/status")
        assert any("MCP server broken: not working (command not found: /nonexistent/mcp-server)"
                   in text for text in channel.texts())
        # ...and where its own words are (its stderr: a traceback, often)
        log = engine.parts.store.state_dir / "logs" / "mcp-broken.log"
        assert any(f"its messages are in {log}" in text for text in channel.texts())


def test_past_60_capabilities_the_index_collapses_mcp_servers_too(state_dir: Path) -> None:
    servers = tuple(McpServerSettings(name=f"svc{i:02d}", command="unused") for i in range(70))
    ping = (types.Tool(name="ping", input_schema={"type": "object"}),)  # listed: in the index
    Catalog(state_dir).write({s.name: Listing(f"Service {s.name}", ping) for s in servers})
    registry, _ = with_servers(McpSettings(servers), state_dir)
    index = capability_index(registry.index([]))
    assert len(index.splitlines()) == 61
    assert "more (" in index.splitlines()[-1] and "mcp" in index.splitlines()[-1]


async def test_an_old_mcp_result_is_stubbed_like_a_built_in_one(engine_with: Any) -> None:
    async with FakeOllama() as fake:
        engine, _ = await engine_with(fake, McpServerSettings(
            name="fake", command=sys.executable, args=(str(SERVER),), approve="never"))
        fake.script(*calls(("tool_activate", {"name": "fake"}), ("fake__long_text", {"n": 3000})),
                    Reply("That was long."))
        await say(engine, "a long one please")
        assert any(unlabelled(m["content"]).startswith("x" * 100) for m in tool_messages(fake))
        for text in ("second", "third", "fourth"):
            await say(engine, text)
        shown = [m["content"] for m in tool_messages(fake) if m.get("tool_name") ==
                 "fake__long_text"]
        assert len(shown) == 1
        assert shown[0].startswith("[result of fake__long_text: 3,156 characters")  # label too


async def test_a_png_with_a_bad_checksum_in_its_colour_profile_is_shown(
    engine_with: Any
) -> None:
    # Browsers and Telegram show it (the reference server's get-tiny-image is such a file).
    vision = FakeModel(capabilities=("completion", "tools", "vision"))
    async with FakeOllama(models=[vision]) as fake:
        engine, channel = await engine_with(fake, McpServerSettings(
            name="fake", command=sys.executable, args=(str(SERVER),), approve="never"))
        fake.script(*calls(("tool_activate", {"name": "fake"}),
                           ("fake__picture", {"kind": "bad_profile_checksum"})),
                    Reply("A logo."))
        await say(engine, "show me the logo")
        (picture,) = [m for m in tool_messages(fake) if "image/png" in m["content"]]
        assert "could not be used" not in picture["content"]
        (image,) = picture["images"]
        assert base64.b64decode(image).startswith(b"\x89PNG")
        assert "A logo." in channel.texts()


async def test_a_broken_image_from_a_tool_is_the_tools_problem(engine_with: Any) -> None:
    vision = FakeModel(capabilities=("completion", "tools", "vision"))
    async with FakeOllama(models=[vision]) as fake:
        engine, _ = await engine_with(fake, McpServerSettings(
            name="fake", command=sys.executable, args=(str(SERVER),), approve="never"))
        fake.script(*calls(("tool_activate", {"name": "fake"}),
                           ("fake__picture", {"kind": "broken"})), Reply("It was broken."))
        await say(engine, "show me the broken one")
        (picture,) = [m for m in tool_messages(fake) if "image/png" in m["content"]]
        assert "images" not in picture
        note = picture["content"].splitlines()[-1]
        assert note == ("[the image fake__picture returned could not be used: it is damaged "
                        "(it cannot be decoded); that is a problem of the tool, not of anything "
                        "the user sent]")
        assert "send it again" not in picture["content"]
