"""The system prefix: byte-stable within a day, lean, and carrying the operating contract."""

from __future__ import annotations

import random
import re
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from daemon.context.budget import MESSAGE_OVERHEAD_TOKENS, estimate_tokens
from daemon.context.prefix import (
    Capability,
    MemoryMap,
    bucket,
    capability_index,
    channel_note,
    system_prefix,
)
from daemon.context.replay import sent_stamp

DAY = date(2026, 3, 4)
BERLIN = ZoneInfo("Europe/Berlin")

CORE_CAPABILITIES = (
    Capability("memory_search", "search earlier conversations and notes", loaded=True,
               group="memory"),
    Capability("conversation_read", "read stored messages verbatim", loaded=True, group="memory"),
    Capability("tool_search", "find a capability that is not loaded", loaded=True, group="meta"),
    Capability("web_fetch", "fetch a web page as text", group="web"),
    Capability("files", "read files the user sent", group="files"),
    Capability("reminders", "set a one-shot reminder", group="automation"),
)


def memory(day: date = DAY, **counts: int) -> MemoryMap:
    values = {"conversations": 37, "messages": 1234, "summaries": 12, "automations": 2, **counts}
    return MemoryMap(day=day, first_day=date(2025, 11, 2), last_day=day - timedelta(days=1),
                     **values)


def prefix_for(
    *,
    capabilities: tuple[Capability, ...] = CORE_CAPABILITIES,
    memory_map: MemoryMap | None = None,
    variables: dict[str, str] | None = None,
) -> str:
    return system_prefix(capabilities=capabilities,
                         memory=memory_map if memory_map is not None else memory(),
                         variables=variables)


def section(text: str, tag: str) -> str:
    """The body of the one `<tag>` block in `text`."""
    found = re.findall(rf"<{tag}>\n(.*?)\n</{tag}>", text, flags=re.S)
    assert len(found) == 1, f"expected exactly one <{tag}> block, found {len(found)}"
    return found[0]


# --- byte stability -------------------------------------------------------------------------


def test_identical_inputs_give_identical_bytes() -> None:
    first = prefix_for(variables={"city": "Berlin"}).encode()
    for _ in range(50):
        again = prefix_for(variables={"city": "Berlin"}, memory_map=memory()).encode()
        assert again == first


def test_the_same_counts_on_another_day_give_the_same_bytes() -> None:
    # The map is recomputed on a new day, but the day itself is not part of the text.
    today = memory(DAY)
    tomorrow = MemoryMap(day=DAY + timedelta(days=1), conversations=today.conversations,
                         messages=today.messages, summaries=today.summaries,
                         automations=today.automations, first_day=today.first_day,
                         last_day=today.last_day)
    assert prefix_for(memory_map=tomorrow) == prefix_for(memory_map=today)


def test_counts_within_a_bucket_change_nothing() -> None:
    # A new day's map whose counts moved but stayed in their buckets: same bytes.
    today = memory(messages=1234, conversations=37)
    tomorrow = MemoryMap(day=DAY + timedelta(days=1), conversations=39, messages=1249,
                         summaries=today.summaries, automations=today.automations,
                         first_day=today.first_day, last_day=today.last_day)
    assert prefix_for(memory_map=tomorrow) == prefix_for(memory_map=today)


def test_a_new_days_map_with_new_counts_changes_the_prefix() -> None:
    base = prefix_for(memory_map=memory(messages=1234))
    grown = prefix_for(memory_map=memory(DAY + timedelta(days=1), messages=1250))
    assert grown != base
    # Only the memory map differs: everything before it is the same bytes.
    cut = base.index("<memory_map>")
    assert grown[:cut] == base[:cut]
    assert "1200+ messages" in base and "1250+ messages" in grown


def test_the_prefix_has_no_clock_in_it() -> None:
    prefix = prefix_for()
    assert "[now:" not in prefix
    assert DAY.isoformat() not in prefix  # only the stored span's dates, never today


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (0, "0"),
        (1, "1"),
        (19, "19"),  # exact under 20
        (20, "20+"),  # then to 10
        (21, "20+"),
        (29, "20+"),
        (30, "30+"),
        (199, "190+"),
        (200, "200+"),  # then to 50
        (249, "200+"),
        (250, "250+"),
        (1234, "1200+"),
        (1249, "1200+"),
        (1250, "1250+"),
    ],
)
def test_bucket_edges(count: int, expected: str) -> None:
    assert bucket(count) == expected


def test_memory_map_shows_bucketed_counts_and_the_stored_span() -> None:
    body = section(prefix_for(memory_map=memory(conversations=7, messages=205, summaries=45,
                                                automations=3)), "memory_map")
    assert "7 conversations" in body
    assert "200+ messages" in body
    assert "40+ summaries" in body
    assert "3 automations" in body
    assert "2025-11-02" in body and "2026-03-03" in body


# --- sections -------------------------------------------------------------------------------


def test_channel_overlays_differ_per_channel_and_stay_out_of_the_system_message() -> None:
    overlays = {kind: section(channel_note(kind), "channel")
                for kind in ("telegram", "whatsapp", "console", "automation")}
    assert len(set(overlays.values())) == 4
    assert "Markdown is fine" in overlays["telegram"]
    assert "plain text" in overlays["console"]
    assert "automation" in overlays["automation"]
    # The system message is one for every channel: no overlay in it.
    assert "<channel>" not in prefix_for()


def test_whatsapp_overlay_asks_for_the_markdown_roost_converts() -> None:
    # roost renders the model's Markdown into WhatsApp's syntax; a model writing WhatsApp's
    # *bold* itself would come out in italics, so the overlay asks for Markdown.
    overlay = section(channel_note("whatsapp"), "channel")
    assert "WhatsApp" in overlay and "Write Markdown as usual" in overlay
    for missing in ("headings", "tables", "link labels"):
        assert missing in overlay


def test_capabilities_one_line_each_with_loaded_marks() -> None:
    lines = section(prefix_for(), "capabilities").splitlines()
    assert len(lines) == len(CORE_CAPABILITIES)
    for capability in CORE_CAPABILITIES:
        (line,) = [ln for ln in lines if f"- {capability.name}" in ln]
        assert capability.description in line
        assert ("[loaded]" in line) == capability.loaded


def test_a_capability_with_no_words_yet_is_its_name_alone() -> None:
    # An MCP server starting for the first time, with no description configured.
    assert capability_index([Capability("fake", "", group="mcp")]) == "- fake"


def test_no_capabilities_no_block() -> None:
    assert "<capabilities>" not in prefix_for(capabilities=())


def many_capabilities(count: int) -> list[Capability]:
    groups = ("files", "web", "home", "calendar")
    return [Capability(f"cap{i:03d}", f"does thing {i}", loaded=i % 9 == 0,
                       group=groups[i % len(groups)]) for i in range(count)]


def test_sixty_capabilities_are_all_listed() -> None:
    lines = capability_index(many_capabilities(60)).splitlines()
    assert len(lines) == 60
    assert not any("more" in ln for ln in lines)


def test_past_sixty_the_rest_collapse_into_one_grouped_count() -> None:
    capabilities = many_capabilities(75)
    lines = capability_index(capabilities).splitlines()
    assert len(lines) == 61
    listed = lines[:60]
    collapsed = lines[60]
    assert "15 more" in collapsed
    # The grouped counts add up to the 15 collapsed ones.
    counts = [int(n) for n in re.findall(r"(\d+) (?:files|web|home|calendar)", collapsed)]
    assert sum(counts) == 15
    # What is callable now stays visible.
    for capability in capabilities:
        if capability.loaded:
            assert any(ln.startswith(f"- {capability.name} [loaded]") for ln in listed)


def test_capability_index_does_not_depend_on_input_order() -> None:
    capabilities = many_capabilities(75)
    expected = prefix_for(capabilities=tuple(capabilities))
    rng = random.Random(7)
    for _ in range(10):
        shuffled = capabilities[:]
        rng.shuffle(shuffled)
        assert prefix_for(capabilities=tuple(shuffled)) == expected


def test_variables_only_when_defined_and_in_a_stable_order() -> None:
    assert "<variables>" not in prefix_for(variables=None)
    assert "<variables>" not in prefix_for(variables={})
    one = prefix_for(variables={"home": "Berlin", "editor": "helix"})
    two = prefix_for(variables={"editor": "helix", "home": "Berlin"})
    assert one == two
    body = section(one, "variables")
    assert "home = Berlin" in body and "editor = helix" in body


@pytest.mark.parametrize("variables", [None, {"k": "v"}])
@pytest.mark.parametrize("capabilities", [(), CORE_CAPABILITIES])
def test_local_model_note_is_always_there(
    variables: dict[str, str] | None, capabilities: tuple[Capability, ...]
) -> None:
    prefix = system_prefix(capabilities=capabilities, variables=variables)
    assert section(prefix, "local_model").strip()


def test_core_prompt_states_the_operating_contract() -> None:
    prefix = prefix_for()
    core = prefix[: prefix.index("<capabilities>")]
    assert "lean working set" in core
    assert "search first" in core
    assert re.search(r"two differently[- ]worded searches", core)
    assert "that file" in core and "like last time" in core
    assert "remember" in core


# --- size -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["telegram", "whatsapp", "console", "automation"])
def test_first_request_of_a_fresh_conversation_is_lean(kind: str) -> None:
    prefix = system_prefix(capabilities=CORE_CAPABILITIES, memory=memory(),
                           variables={"home": "Berlin", "name": "Dana"})
    first_user = (f"{channel_note(kind)}\n\n"
                  "Hi! Can you remind me tomorrow at 9 to call the dentist about my crown?")
    stamp = sent_stamp(datetime(2026, 3, 4, 9, 15, tzinfo=BERLIN).timestamp(), BERLIN)
    tokens = (2 * MESSAGE_OVERHEAD_TOKENS + estimate_tokens(prefix)
              + estimate_tokens(first_user + stamp))
    assert tokens < 1500


def test_a_count_of_one_is_singular() -> None:
    body = section(prefix_for(memory_map=memory(conversations=1, messages=1, summaries=1,
                                                automations=1)), "memory_map")
    assert "1 conversation, 1 message, 1 summary, 1 automation." in body
