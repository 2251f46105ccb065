"""The built-in tools: recall (nothing folded is lost), the clock, files, and tool discovery.

They register through `register_builtin(registry)`, the same path an extra would use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any

from daemon.config import Settings
from daemon.conversations import Message
from daemon.memory_index import MemoryIndex
from daemon.store import Store
from daemon.tools.registry import Capability, Registry, Tool

READ_CAP_CHARS = 6_000
GET_CAP_CHARS = 12_000
FILE_CAP_CHARS = 8_000
FILE_MAX_LINES = 200
SEARCH_MAX = 10


@dataclass
class ToolContext:
    """What a tool may use during one turn of one conversation."""

    store: Store
    settings: Settings
    registry: Registry
    conversation_id: str
    clock: Callable[[], float]
    index: MemoryIndex | None = None
    active: list[str] = field(default_factory=list)  # capabilities activated in this conversation


def _header(message: Message, tz: tzinfo) -> str:
    when = datetime.fromtimestamp(message.created, tz).strftime("%Y-%m-%d %H:%M")
    who = f"tool {message.tool_name}" if message.role == "tool" else message.role
    calls = ""
    if message.tool_calls:
        names = ", ".join(str(c.get("function", {}).get("name", "?")) for c in message.tool_calls)
        calls = f" (called {names})"
    return f"--- #{message.seq} {who} {when}{calls}"


async def conversation_read(
    ctx: ToolContext, conversation_id: str = "", from_seq: int = 1, to_seq: int = 0,
    offset: int = 0,
) -> str:
    """Original messages, byte for byte, paged so that one call stays within a size cap."""
    cid = conversation_id or ctx.conversation_id
    conversation = await asyncio.to_thread(ctx.store.get_conversation, cid)
    if conversation is None:
        return f"ERROR: no conversation {cid!r}; memory_search returns valid references."
    messages = await asyncio.to_thread(ctx.store.messages, cid, max(from_seq, 1),
                                       to_seq if to_seq > 0 else None)
    if not messages:
        return f"No messages in conversation {cid} between #{from_seq} and #{to_seq or 'end'}."
    tz = ctx.settings.daemon.tz
    last = to_seq if to_seq > 0 else messages[-1].seq
    parts = [f"Conversation {cid} ({conversation.chat_key}, {conversation.status})"]
    used = 0
    for index, message in enumerate(messages):
        start = offset if index == 0 else 0
        body = message.content[start:]
        room = READ_CAP_CHARS - used
        if len(body) <= room:
            parts.append(f"{_header(message, tz)}\n{body}")
            used += len(body)
            continue
        if used and room < 500:  # not worth starting a message that cannot fit
            parts.append(f'[more: conversation_read("{cid}", {message.seq}, {last})]')
            break
        end = start + room
        parts.append(f"{_header(message, tz)} (characters {start}-{end} of "
                     f"{len(message.content)})\n{body[:room]}")
        parts.append(f'[more: conversation_read("{cid}", {message.seq}, {last}, offset={end})]')
        break
    return "\n".join(parts)


async def memory_search(ctx: ToolContext, query: str, limit: int = 5) -> str:
    """Ranked snippets from every message and summary of every conversation."""
    if ctx.index is None:
        return "ERROR: the search index is not available right now."
    limit = max(1, min(limit, SEARCH_MAX))
    hits = await asyncio.to_thread(ctx.index.search, query, limit, ctx.store)
    if not hits:
        return (f"Nothing found for {query!r}. Try other words (a name, a number, a "
                "distinctive term) before concluding it was never said.")
    tz = ctx.settings.daemon.tz
    lines = [f"{len(hits)} results for {query!r} (memory_get(ref) returns one whole):"]
    for hit in hits:
        when = (datetime.fromtimestamp(hit.created, tz).strftime("%Y-%m-%d")
                if hit.created else "")
        who = hit.role or hit.kind
        lines.append(f"- {hit.ref} [{hit.chat_key} {who} {when}] {hit.snippet}")
    return "\n".join(lines)


async def memory_get(ctx: ToolContext, ref: str) -> str:
    """One search result whole: `msg:<conversation>:<seq>` or `summary:<conversation>`."""
    kind, _, rest = ref.partition(":")
    if kind == "summary":
        conversation = await asyncio.to_thread(ctx.store.get_conversation, rest)
        if conversation is None:
            return f"ERROR: no conversation {rest!r}"
        summary = conversation.summary
        return (f"Summary of conversation {rest} (messages 1-{summary.through_seq}):\n"
                f"{summary.summary}\n\nThe user's own words:\n{summary.user_notes}")
    cid, _, seq_text = rest.rpartition(":")
    if kind != "msg" or not cid or not seq_text.isdigit():
        return (f"ERROR: {ref!r} is not a reference; use one from memory_search, like "
                "msg:<conversation id>:<seq> or summary:<conversation id>")
    seq = int(seq_text)
    found = await asyncio.to_thread(ctx.store.messages, cid, seq, seq)
    if not found:
        return f"ERROR: no message #{seq} in conversation {cid!r}"
    message = found[0]
    body = message.content
    if len(body) > GET_CAP_CHARS:
        body = (body[:GET_CAP_CHARS] + f"\n[{len(message.content) - GET_CAP_CHARS:,} more "
                f'characters: conversation_read("{cid}", {seq}, {seq}, offset={GET_CAP_CHARS})]')
    return f"{_header(message, ctx.settings.daemon.tz)} in conversation {cid}\n{body}"


async def current_time(ctx: ToolContext) -> str:
    now = datetime.fromtimestamp(ctx.clock(), ctx.settings.daemon.tz)
    return now.strftime(f"%A %Y-%m-%d %H:%M:%S %Z (UTC%z), timezone {ctx.settings.daemon.timezone}")


async def file_read(ctx: ToolContext, path: str, from_line: int = 1, to_line: int = 0) -> str:
    """Lines of a file the user sent (stored under attachments/)."""
    attachments = (ctx.store.state_dir / "attachments").resolve()
    target = (ctx.store.state_dir / path).resolve()
    if not target.is_relative_to(attachments) or not target.is_file():
        return (f"ERROR: {path!r} is not a file the user sent; paths look like "
                "attachments/2026-12/<id>.txt, as given in the file's note.")
    text = await asyncio.to_thread(_read_text, target)
    if text is None:
        return f"ERROR: {path} is not a text file; it cannot be read as lines."
    lines = text.splitlines()
    first = max(from_line, 1)
    last = min(to_line if to_line > 0 else first + FILE_MAX_LINES - 1, len(lines),
               first + FILE_MAX_LINES - 1)
    out = [f"{path}: lines {first}-{last} of {len(lines)}"]
    used = 0
    for number in range(first, last + 1):
        line = lines[number - 1]
        if used + len(line) > FILE_CAP_CHARS:
            out.append(f"[stopped at line {number - 1} to stay short: "
                       f'file_read("{path}", {number}, {last})]')
            break
        out.append(f"{number}: {line}")
        used += len(line) + 8
    return "\n".join(out)


def _read_text(path: Path) -> str | None:
    data = path.read_bytes()
    for encoding in ("utf-8-sig", "utf-16"):
        try:
            text = data.decode(encoding)
        except UnicodeDecodeError:
            continue
        return None if "\x00" in text else text
    return None


async def tool_search(ctx: ToolContext, query: str = "") -> str:
    found = ctx.registry.search(query, ctx.active)
    if not found:
        return f"No more capabilities match {query!r}; everything relevant is loaded."
    lines = [f"- {c.name}: {c.description} (tools: {', '.join(t.name for t in c.tools)})"
             for c in found]
    return "Capabilities you can load with tool_activate(name):\n" + "\n".join(lines)


async def tool_activate(ctx: ToolContext, name: str) -> str:
    capability = ctx.registry.capabilities.get(name)
    if capability is None:
        return f"ERROR: no capability {name!r}; tool_search lists them."
    if capability.core or name in ctx.active:
        return f"{name} is already loaded."
    ctx.active.append(name)
    tools = ", ".join(t.name for t in capability.tools)
    return f"Loaded {name}: you can call {tools} now."


def _schema(
    properties: dict[str, dict[str, str]], required: tuple[str, ...] = ()
) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required)}


def register_builtin(registry: Registry) -> None:
    """The tools every roost has."""
    registry.register(Capability(
        name="memory", core=True, group="recall",
        description="search and read everything said before, archived and folded included",
        tools=(
            Tool("memory_search", "Search every past message and summary. Returns ranked "
                 "snippets with refs.",
                 _schema({"query": {"type": "string", "description": "words to look for"},
                          "limit": {"type": "integer", "description": "results, 1-10"}},
                         ("query",)), memory_search),
            Tool("memory_get", "Return one search result whole by its ref.",
                 _schema({"ref": {"type": "string"}}, ("ref",)), memory_get),
            Tool("conversation_read", "Read original messages of a conversation, word for "
                 "word, by seq range.",
                 _schema({"conversation_id": {"type": "string"},
                          "from_seq": {"type": "integer"}, "to_seq": {"type": "integer"},
                          "offset": {"type": "integer"}}, ("conversation_id",)),
                 conversation_read),
        )))
    registry.register(Capability(
        name="time", core=True, group="basics", description="the current date and time",
        tools=(Tool("current_time", "The current local date and time.", _schema({}),
                    current_time),)))
    registry.register(Capability(
        name="tools", core=True, group="basics",
        description="find and load more capabilities",
        tools=(
            Tool("tool_search", "List capabilities that are not loaded yet.",
                 _schema({"query": {"type": "string"}}), tool_search),
            Tool("tool_activate", "Load a capability so its tools can be called.",
                 _schema({"name": {"type": "string"}}, ("name",)), tool_activate),
        )))
    registry.register(Capability(
        name="files", group="files",
        description="read text files the user sent, by line range",
        tools=(Tool("file_read", "Read lines of a file the user sent.",
                    _schema({"path": {"type": "string"}, "from_line": {"type": "integer"},
                             "to_line": {"type": "integer"}}, ("path",)), file_read),)))
