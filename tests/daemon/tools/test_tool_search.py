"""tool_search ranks: the capability a query means comes first (issue 49 item 1), measured on
eight real MCP servers' recordings beside roost's own capabilities."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.tools.builtin import ToolContext, tool_search
from daemon.tools.ranking import stem
from daemon.tools.registry import Capability, Registry, Tool
from tests.conftest import SettingsFactory, standard_registry
from tests.daemon.tools.mcp_recordings import with_recorded_servers

# Everyday queries a small model sends, with the capability that answers them. Where one of
# roost's own capabilities does the job it is the answer ("fetch a web page": web; a bare
# "read a file" means a file the user sent as much as one on the disk, so the query says which).
QUERIES = (
    ("current time in Tokyo", "clock"),
    ("what time is it in New York", "clock"),
    ("convert 9am London time to Sydney time", "clock"),
    ("fetch a web page", "web"),
    ("download a URL from the internet", "fetch"),
    ("read a file on the file system", "filesystem"),
    ("list the contents of a directory", "filesystem"),
    ("move or rename a file", "filesystem"),
    ("search for files matching a pattern", "filesystem"),
    ("step by step reasoning", "thinking"),
    ("think through a hard problem", "thinking"),
    ("show the latest commits", "git"),
    ("what changed in the git repository", "git"),
    ("create a new branch", "git"),
    ("run a SQL query", "sqlite"),
    ("create a table in the database", "sqlite"),
    ("add a person to the knowledge graph", "knowledge"),
    ("remind me to call mom tomorrow", "reminders"),
    ("read a PDF the user sent", "documents"),
    ("echo a message back", "everything"),
)


@pytest.fixture
def registry(make_settings: SettingsFactory, state_dir: Path) -> Registry:
    """roost's own capabilities and the eight recorded servers, as the daemon has them."""
    return with_recorded_servers(state_dir, standard_registry(make_settings()))


def context(registry: Registry, active: list[str] | None = None) -> ToolContext:
    return ToolContext(store=None, settings=None, registry=registry,  # type: ignore[arg-type]
                       conversation_id="c", clock=lambda: 0.0, active=active or [])


def listed(answer: str) -> list[str]:
    """The capability names of a tool_search answer, in its order."""
    return [line[2:].split(":", 1)[0] for line in answer.splitlines() if line.startswith("- ")]


@pytest.mark.parametrize(("query", "expected"), QUERIES)
async def test_the_capability_a_query_means_comes_first(
    registry: Registry, query: str, expected: str
) -> None:
    answer = await tool_search(context(registry), query)
    names = listed(answer)
    assert names and names[0] == expected, answer
    assert len(names) <= 5, answer
    lines = [line for line in answer.splitlines() if line.startswith("- ")]
    # Each says why it matched, in a few words.
    assert all("matched " in line for line in lines), answer


async def test_step_by_step_reasoning_finds_sequential_thinking(registry: Registry) -> None:
    assert "thinking" in listed(await tool_search(context(registry), "step by step reasoning"))


async def test_what_is_loaded_is_not_offered_again(registry: Registry) -> None:
    names = listed(await tool_search(context(registry, ["clock"]), "current time in Tokyo"))
    assert "clock" not in names


async def test_a_query_nothing_answers_says_so(registry: Registry) -> None:
    answer = await tool_search(context(registry), "zebra astronomy")
    assert listed(answer) == [] and "zebra astronomy" in answer


async def test_no_query_lists_every_capability_not_loaded(registry: Registry) -> None:
    names = listed(await tool_search(context(registry), ""))
    assert names == sorted(names) and {"clock", "web", "files", "thinking"} <= set(names)
    assert "memory" not in names  # core: always loaded


def test_the_ranking_is_built_once_per_listing(make_settings: SettingsFactory) -> None:
    registry = standard_registry(make_settings())
    ranking = registry.ranking()
    assert registry.ranking() is ranking  # many queries, one index
    ping = Tool("ping_tool", "Ping the orchard's sprinklers.", {"type": "object"},
                handler=_never)
    registry.register(Capability("garden", "watering", (ping,)))
    assert registry.ranking() is not ranking
    assert [h.capability.name for h in registry.ranking().search("sprinkler")] == ["garden"]


async def test_a_server_listing_anew_is_ranked_by_its_new_tools(
    make_settings: SettingsFactory, state_dir: Path
) -> None:
    registry = with_recorded_servers(state_dir, standard_registry(make_settings()),
                                     ("clock",))
    before = registry.ranking()
    registry.replace(Capability("clock", "garden", (Tool(
        "clock__water", "Water the orchard's sprinklers.", {"type": "object"},
        handler=_never),)))
    assert registry.ranking() is not before
    assert listed(await tool_search(context(registry), "sprinklers"))[:1] == ["clock"]


async def _never(context: object) -> str:
    return ""


@pytest.mark.parametrize(("forms", "same"), [
    (("file", "files", "filed"), True),
    (("directory", "directories"), True),
    (("think", "thinking", "thinks"), True),
    (("fetch", "fetches", "fetched", "fetching"), True),
    (("remind", "reminder", "reminders"), True),
    (("change", "changes", "changed", "changing"), True),
    (("commit", "commits", "committed"), True),
    (("branch", "branches"), True),
    (("status", "statuses"), True),
    (("time", "timezone"), False),
    (("string", "str"), False),
])
def test_word_forms_meet_in_one_stem(forms: tuple[str, ...], same: bool) -> None:
    assert (len({stem(word) for word in forms}) == 1) is same, [stem(w) for w in forms]
