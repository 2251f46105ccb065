"""tool_search before and after ranking (issue 49 item 1), on roost's own capabilities and eight
real MCP servers' recordings (tests/fixtures/mcp), registered as the daemon registers them.

For each of the 20 everyday queries of tests/daemon/tools/test_tool_search.py it prints where
the capability the query means stands: before, in what 3adc5af's `tool_search` listed (every
capability not loaded whose name, description or tools mention any word of the query, by
name), that tree's own code run in a child process on the same recordings; and after, in the
ranked answer (at most 5). Then the time to build the index and to answer a query.

Run from the repository root: `python bench/tool_search.py`.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# ROOST_BENCH_TREE: the child that lists with BASELINE's code runs this file on that tree.
sys.path.insert(0, os.environ.get("ROOST_BENCH_TREE") or str(Path(__file__).resolve().parents[1]))

from daemon.core.config import McpServerSettings, McpSettings, Settings
from daemon.tools.builtin import ToolContext, tool_search
from daemon.tools.mcp.servers import with_servers
from tests.conftest import standard_registry

BASELINE = "3adc5af"
ROUNDS = 200


def registered(state: Path, names: list[str]) -> tuple[Settings, object]:
    """roost's own capabilities and the servers `names`, from the catalog in `state`."""
    settings = Settings.defaults(env={"STATE_DIRECTORY": str(state)})
    mcp = McpSettings(tuple(McpServerSettings(name=n, command="unused") for n in names))
    registry, _ = with_servers(mcp, state, standard_registry(settings))
    return settings, registry


async def listed(registry: object, query: str) -> list[str]:
    """The capability names tool_search answers, in its order (the same on both trees)."""
    context = ToolContext(store=None, settings=None, registry=registry,  # type: ignore[arg-type]
                          conversation_id="c", clock=time.time, active=[])
    answer = await tool_search(context, query)
    return [line[2:].split(":", 1)[0].split(" (", 1)[0] for line in answer.splitlines()
            if line.startswith("- ")]


async def child(state: Path, names: list[str], queries: list[str]) -> None:
    _, registry = registered(state, names)
    print(json.dumps([await listed(registry, q) for q in queries]))


def baseline(state: Path, names: list[str], queries: list[str]) -> list[list[str]]:
    """What BASELINE's tool_search listed: this file run on a copy of that tree."""
    here = Path(__file__).resolve()
    with tempfile.TemporaryDirectory() as folder:
        archive = subprocess.run(["git", "-C", str(here.parents[1]), "archive", BASELINE],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
        out = subprocess.run([sys.executable, str(here), "--child", str(state),
                              json.dumps(names)], input=json.dumps(queries),
                             env={**os.environ, "ROOST_BENCH_TREE": folder}, check=True,
                             capture_output=True, text=True).stdout
    return list(json.loads(out))


def place(names: list[str], expected: str) -> str:
    where = str(names.index(expected) + 1) if expected in names else "-"
    return f"{where} of {len(names)}"


async def main() -> None:
    # Only on this tree (the child runs BASELINE's, which has none of them).
    from daemon.tools.ranking import Ranking
    from tests.daemon.tools.mcp_recordings import SERVERS, with_recorded_servers
    from tests.daemon.tools.test_tool_search import QUERIES

    queries = [q for q, _ in QUERIES]
    with tempfile.TemporaryDirectory() as folder:
        state = Path(folder)
        registry = with_recorded_servers(
            state, standard_registry(Settings.defaults(env={"STATE_DIRECTORY": folder})))
        before = baseline(state, list(SERVERS), queries)
        print(f"{len(registry.capabilities)} capabilities, "
              f"{sum(len(c.tools) for c in registry.capabilities.values())} tools; where the "
              f"capability a query means stands in tool_search's answer ({BASELINE}, now):")
        print(f"  {'query':<40} {'expected':<11} {'before':>9} {'after':>8}")
        firsts = [0, 0]
        for (query, expected), old in zip(QUERIES, before, strict=True):
            new = await listed(registry, query)
            firsts[0] += old[:1] == [expected]
            firsts[1] += new[:1] == [expected]
            print(f"  {query:<40} {expected:<11} {place(old, expected):>9} "
                  f"{place(new, expected):>8}")
        print(f"first for {firsts[0]} of {len(QUERIES)} queries before, {firsts[1]} now")
        capabilities = list(registry.capabilities.values())
        started = time.perf_counter()
        for _ in range(ROUNDS // 10):
            Ranking(capabilities)
        built = (time.perf_counter() - started) / (ROUNDS // 10)
        ranking = registry.ranking()
        timings = []
        for _ in range(ROUNDS // len(QUERIES)):
            for query in queries:
                started = time.perf_counter()
                ranking.search(query, {"memory", "tools", "facts"}, 5)
                timings.append(time.perf_counter() - started)
        print(f"index built once per listing in {built * 1000:.1f} ms; a query "
              f"{statistics.median(timings) * 1e6:.0f} µs (median of {len(timings)})")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        asyncio.run(child(Path(sys.argv[2]), json.loads(sys.argv[3]),
                          json.loads(sys.stdin.read())))
    else:
        asyncio.run(main())
