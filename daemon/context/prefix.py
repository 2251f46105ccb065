"""The system prefix: the same bytes on every turn of every conversation within a calendar day.

Ollama's prompt cache reuses a prompt only up to the first byte that differs, so everything here
is a pure function of inputs that change at most once a day: the capability index, the day's
memory map (counts bucketed) and the configured variables. The clock rides at the end of the
messages instead: each user message carries the time it was sent (see `replay.sent_stamp`), so
the last one says what time it is now and no earlier byte ever changes.

One prefix for everyone: nothing here depends on the channel or on the conversation, so a
Telegram chat, a WhatsApp chat, the console and an automation run share the whole system
message (and, with the same capabilities loaded, the tools), and one model slot serves them all
from its cache. What differs (the channel's note, "this is a scheduled report") is
`channel_note`, which goes in the conversation's first user message instead (`replay`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date

from daemon.core.platforms import installed

CORE_PROMPT = """\
You are roost, the user's personal assistant on their own computer; they reach you from their \
phone or terminal.

This prompt is a lean working set; earlier conversations and the user's files are stored. When \
the user refers to something you do not see ("that file", "like last time"), search first: two \
differently worded searches before you say you do not remember. Be direct; say when unsure."""

# For a model without the `tools` capability: no tools are sent, so none may be promised.
CORE_PROMPT_NO_TOOLS = """\
You are roost, the user's personal assistant. You run on a local model on the user's own \
computer and they reach you from their phone or terminal.

This prompt is a lean working set: older parts of this conversation may appear only as a \
summary. You have no tools, so when the user refers to something you do not see here, say so \
and ask them to repeat the detail. Be direct and useful; say so when you are unsure."""

# Each platform writes its own note (daemon/core/platforms.py); these are roost's own kinds.
CHANNEL_NOTES = {
    "console": "The user reads you in a terminal. Write plain text, no Markdown.",
    "automation": (
        "This is a scheduled automation, not a live chat: nobody answers follow-up questions. "
        "Write the report itself, complete and concise."
    ),
}

LOCAL_MODEL_NOTE = (
    "You are a small local model: say so when you cannot check something; never invent tool "
    "results, files or past conversations."
)

MAX_CAPABILITY_LINES = 60


@dataclass(frozen=True)
class Capability:
    """One entry of the capability index: a group of tools the model can use."""

    name: str
    description: str
    loaded: bool = False
    group: str = "other"


@dataclass(frozen=True)
class MemoryMap:
    """What the store held when `day` began (see `bucket`): every process on that day (the
    daemon after a restart, `roost automations run`) counts the same, so builds the same bytes."""

    day: date
    conversations: int = 0
    messages: int = 0
    summaries: int = 0
    automations: int = 0
    first_day: date | None = None
    last_day: date | None = None


def bucket(count: int) -> str:
    """Exact under 20, then rounded down to 10 (under 200), then to 50: stable over a day."""
    if count < 20:
        return str(count)
    if count < 200:
        return f"{count - count % 10}+"
    return f"{count - count % 50}+"


def capability_index(capabilities: Sequence[Capability]) -> str:
    """One line per capability in name order; past 60 the rest collapse into grouped counts."""
    ordered = sorted(capabilities, key=lambda c: (not c.loaded, c.name))
    shown = ordered[:MAX_CAPABILITY_LINES]
    # An MCP server starting for the first time may have no words yet: its name alone.
    lines = [f"- {c.name}{' [loaded]' if c.loaded else ''}"
             + (f": {c.description}" if c.description else "") for c in shown]
    rest = ordered[MAX_CAPABILITY_LINES:]
    if rest:
        groups: dict[str, int] = {}
        for c in rest:
            groups[c.group] = groups.get(c.group, 0) + 1
        counted = ", ".join(f"{n} {g}" for g, n in sorted(groups.items()))
        lines.append(f"- and {len(rest)} more ({counted}): find them with tool_search")
    return "\n".join(lines)


def memory_map_text(memory: MemoryMap) -> str:
    if not memory.conversations:
        return "No earlier conversations are stored yet."
    span = ""
    if memory.first_day and memory.last_day:
        span = f" from {memory.first_day.isoformat()} to {memory.last_day.isoformat()}"
    counts = ", ".join(_counted(n, one, many) for n, one, many in (
        (memory.conversations, "conversation", "conversations"),
        (memory.messages, "message", "messages"),
        (memory.summaries, "summary", "summaries"),
        (memory.automations, "automation", "automations")))
    return f"Stored{span}: {counts}."


def _counted(count: int, one: str, many: str) -> str:
    return f"{bucket(count)} {one if count == 1 else many}"


def channel_note(channel_kind: str) -> str:
    """What a conversation on `channel_kind` is told about where its replies go; it goes in
    the conversation's first user message (see the module docstring)."""
    platform = installed().get(channel_kind)
    note = platform.note if platform else CHANNEL_NOTES.get(channel_kind,
                                                            CHANNEL_NOTES["console"])
    return f"<channel>\n{note}\n</channel>"


def system_prefix(
    *,
    capabilities: Sequence[Capability] = (),
    memory: MemoryMap | None = None,
    variables: Mapping[str, str] | None = None,
    tools: bool = True,
) -> str:
    """The system message, the same for every conversation; `tools` False (a model without
    the tools capability) leaves out the capability index and every mention of tools."""
    parts = [CORE_PROMPT if tools else CORE_PROMPT_NO_TOOLS]
    if capabilities and tools:
        parts.append(f"<capabilities>\n{capability_index(capabilities)}\n</capabilities>")
    if memory is not None and memory.conversations:  # nothing stored yet: nothing to map
        parts.append(f"<memory_map>\n{memory_map_text(memory)}\n</memory_map>")
    if variables:
        lines = "\n".join(f"{key} = {value}" for key, value in sorted(variables.items()))
        parts.append(f"<variables>\n{lines}\n</variables>")
    parts.append(f"<local_model>\n{LOCAL_MODEL_NOTE}\n</local_model>")
    return "\n\n".join(parts)

