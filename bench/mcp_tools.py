"""MCP servers as capabilities: what they cost the prompt, the first call, and every call.

1. Fresh request tokens (the fake Ollama's tokenizer; a new conversation's first request, built
   and sent by the real turn path) with 0, 10 and 100 MCP tools installed, in 1, 3 and 20
   servers. The servers' tool lists come from the catalog (what each listed last time), so no
   process is started for this part. Goal: one index line per server and nothing else; with
   100 tools the fresh request stays <= 1,000 tokens.
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
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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
from daemon.turn.parts import TurnParts
from tests.fakes.ollama import FakeOllama

SERVER = Path(__file__).resolve().parents[1] / "tests" / "fakes" / "mcp_server.py"
CALLS = 200


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


async def fresh_request_tokens(fake: FakeOllama, tools: int, servers: int) -> tuple[int, int]:
    """(tokens of the first request, index lines of MCP servers in its system message)."""
    with tempfile.TemporaryDirectory() as folder:
        state = Path(folder)
        per = [tools // servers + (1 if i < tools % servers else 0) for i in range(servers)]
        configured = tuple(McpServerSettings(name=f"svc{i}", command="unused")
                           for i in range(servers)) if tools else ()
        Catalog(state).write({f"svc{i}": listing(i, n) for i, n in enumerate(per)})
        settings = Settings.defaults(env={"STATE_DIRECTORY": str(state)})
        settings = dataclasses.replace(
            settings, mcp=McpSettings(configured),
            model=dataclasses.replace(settings.model, host=fake.url))
        registry, _ = with_servers(settings.mcp, state)  # registered, not started
        store = Store.open(state)
        llm = ModelClient(settings.model)
        try:
            parts = TurnParts.build(settings=settings, store=store, llm=llm, registry=registry)
            runner = parts.runner(notify=_nothing)
            before = len(fake.chat_requests)
            await runner.run("console:local", [Inbound("console:local", "hello", time.time())])
            body = fake.chat_requests[before]
            lines = sum(line.startswith("- svc")
                        for line in body["messages"][0]["content"].splitlines())
            return fake.count_tokens(body["messages"], body.get("tools")), lines
        finally:
            await llm.close()
            parts.index.close()
            store.close()


async def _nothing(chat_key: str, text: str) -> None:
    return None


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
        print("fresh request tokens (fake tokenizer), by MCP tools installed:")
        baseline, _ = await fresh_request_tokens(fake, 0, 1)
        for tools, servers in ((0, 1), (10, 3), (100, 20)):
            tokens, lines = await fresh_request_tokens(fake, tools, servers)
            shown = f"{servers} servers" if tools else "no servers"
            print(f"  {tools:>3} tools in {shown:<11}: {tokens:>5} tokens, "
                  f"{tokens / baseline:.2f}x of none, {lines} index lines "
                  f"(goal: one per server, <= 1,000 tokens)")
    with tempfile.TemporaryDirectory() as folder:
        listed, first = await first_result(Path(folder))
        print(f"stdio server: start to tools listed {listed * 1000:.0f} ms; tool_activate to "
              f"first result {first * 1000:.1f} ms")
        through, direct = await per_call(Path(folder))
        print(f"per call (median of {CALLS}): through roost {through * 1000:.2f} ms, directly "
              f"with the SDK {direct * 1000:.2f} ms: {through / direct:.2f}x (goal <= 1.2x)")


if __name__ == "__main__":
    asyncio.run(main())
