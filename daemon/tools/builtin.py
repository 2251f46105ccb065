"""The built-in tools: recall (nothing folded is lost), the clock, files, and tool discovery.

They register through `register(registry)`, the same path an extra would use.

Recall is scoped (`daemon.tools.scope`): a conversation id, message ref or attachment path
outside the conversation's scope gets the very answer one that does not exist gets. Nothing a
tool is given becomes a path: ids and refs must have the form roost makes them in, and a file
is read only once its reference was found on a message in scope.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from io import BytesIO
from pathlib import Path
from typing import Any

from PIL import Image

from daemon.core.config import Settings
from daemon.core.conversations import Conversation, Message
from daemon.core.errors import AttachmentError
from daemon.core.ids import ID_PATTERN, is_id
from daemon.parsing.data import as_data
from daemon.parsing.note import kind_of
from daemon.store import Store
from daemon.store.attachments import is_ref, ref_time, stored_path
from daemon.store.facts import HOUSEHOLD, FactsBook, Person, matching
from daemon.store.search_index import SearchIndex
from daemon.tools.ranking import Hit
from daemon.tools.registry import Capability, Registry, Tool, ToolOutput
from daemon.tools.scope import RecallScope, recall_scope

READ_CAP_CHARS = 6_000
GET_CAP_CHARS = 12_000
FILE_CAP_CHARS = 8_000
FILE_MAX_LINES = 200
SEARCH_MAX = 10
FILES_LISTED = 20
FILES_LISTED_MAX = 50
IMAGE_SUFFIXES = (".jpg", ".png")  # what store_image writes
# A conversation that ended this long before a file was stored cannot hold it (the slack
# covers a clock set back); older ones are not read when looking for a file's message.
FILE_SLACK = 86_400.0
# tool_activate may wait for an MCP server that is starting; the wait bounds itself by the
# server's start timeout, so this only catches what nothing else would.
ACTIVATE_TIMEOUT = 900.0
# Tool names a tool_search answer shows a capability with: a server of 14 tools would make
# five answers hundreds of tokens; tool_activate names them all.
SEARCH_TOOLS_SHOWN = 6
_MSG_REF = re.compile(rf"msg:({ID_PATTERN}):([0-9]{{1,12}})")
_SUMMARY_REF = re.compile(rf"summary:({ID_PATTERN})")


@dataclass
class ToolContext:
    """What a tool may use during one turn of one conversation."""

    store: Store
    settings: Settings
    registry: Registry
    conversation_id: str
    clock: Callable[[], float]
    index: SearchIndex | None = None
    active: list[str] = field(default_factory=list)  # capabilities activated in this conversation
    # Whose conversations recall may read; None: worked out from this conversation's record.
    scope: RecallScope | None = None
    facts: FactsBook | None = None  # the facts files (daemon.tools.facts)
    person: Person | None = None  # whose facts this conversation uses; None in a group
    household: bool = False  # whether the person may keep household facts (daemon.tools.roles)
    noted: list[str] = field(default_factory=list)  # "Noted: ..." lines the reply owes

    def recall_scope(self) -> RecallScope:
        """The scope (synchronous: it may read the store; call it in a thread)."""
        if self.scope is None:
            conversation = self.store.get_conversation(self.conversation_id)
            self.scope = (recall_scope(conversation, self.settings.automations,
                                       self.settings.linked)
                          if conversation is not None
                          else RecallScope(frozenset(), frozenset({self.conversation_id})))
        return self.scope


def _visible(ctx: ToolContext, conversation_id: str) -> Conversation | None:
    """The conversation, if it is one this conversation may recall; None alike for a
    malformed id, one that does not exist and one of someone else."""
    if not is_id(conversation_id):
        return None
    conversation = ctx.store.get_conversation(conversation_id)
    if conversation is None or not ctx.recall_scope().covers(conversation):
        return None
    return conversation


def _kept_facts(ctx: ToolContext, query: str) -> str:
    """The person's kept facts that match `query` (and the household's, for an owner or a
    member), as lines ("" for none, and in a group)."""
    if ctx.facts is None or ctx.person is None:
        return ""
    found = [(f, "") for f in matching(ctx.facts.facts(ctx.person), query)]
    if ctx.household:
        found += [(f, "the household's, ") for f in matching(ctx.facts.facts(HOUSEHOLD), query)]
    if not found:
        return ""
    return "\n".join([f"Kept facts matching {query!r}:",
                      *(f"- {f.text} ({whose}noted {f.added})" for f, whose in found)])


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
    conversation = await asyncio.to_thread(_visible, ctx, cid)
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
        full = with_files(message)
        body = full[start:]
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
                     f"{len(full)})\n{body[:room]}")
        parts.append(f'[more: conversation_read("{cid}", {message.seq}, {last}, offset={end})]')
        break
    return "\n".join(parts)


async def memory_search(ctx: ToolContext, query: str, limit: int = 5) -> str:
    """Ranked snippets from the messages and summaries of the conversations in scope, after
    the person's kept facts that match (those the prompt leaves out for room too)."""
    kept = await asyncio.to_thread(_kept_facts, ctx, query)
    if ctx.index is None:
        return kept or "ERROR: the search index is not available right now."
    limit = max(1, min(limit, SEARCH_MAX))
    index = ctx.index
    scope = await asyncio.to_thread(ctx.recall_scope)
    hits = await asyncio.to_thread(lambda: index.search(
        query, limit, ctx.store, chats=scope.chat_keys, conversations=scope.conversation_ids))
    if not hits:
        return kept or (f"Nothing found for {query!r}. Try other words (a name, a number, a "
                        "distinctive term) before concluding it was never said.")
    tz = ctx.settings.daemon.tz
    lines = [kept] if kept else []
    lines.append(f"{len(hits)} results for {query!r} (memory_get(ref) returns one whole):")
    for hit in hits:
        when = (datetime.fromtimestamp(hit.created, tz).strftime("%Y-%m-%d")
                if hit.created else "")
        who = hit.role or hit.kind
        lines.append(f"- {hit.ref} [{hit.chat_key} {who} {when}] {hit.snippet}")
    return "\n".join(lines)


async def memory_get(ctx: ToolContext, ref: str) -> str:
    """One search result whole: `msg:<conversation>:<seq>` or `summary:<conversation>`."""
    ref = ref.strip()
    if summary_ref := _SUMMARY_REF.fullmatch(ref):
        cid = summary_ref.group(1)
        conversation = await asyncio.to_thread(_visible, ctx, cid)
        if conversation is None:
            return f"ERROR: no conversation {cid!r}"
        summary = conversation.summary
        return (f"Summary of conversation {cid} (messages 1-{summary.through_seq}):\n"
                f"{summary.summary}\n\nThe user's own words:\n{summary.user_notes}")
    message_ref = _MSG_REF.fullmatch(ref)
    if message_ref is None:
        return (f"ERROR: {ref!r} is not a reference; use one from memory_search, like "
                "msg:<conversation id>:<seq> or summary:<conversation id>")
    cid, seq = message_ref.group(1), int(message_ref.group(2))
    found: list[Message] = []
    if await asyncio.to_thread(_visible, ctx, cid) is not None:
        found = await asyncio.to_thread(ctx.store.messages, cid, seq, seq)
    if not found:
        return f"ERROR: no message #{seq} in conversation {cid!r}"
    message = found[0]
    body = full = with_files(message)
    if len(body) > GET_CAP_CHARS:
        body = (body[:GET_CAP_CHARS] + f"\n[{len(full) - GET_CAP_CHARS:,} more "
                f'characters: conversation_read("{cid}", {seq}, {seq}, offset={GET_CAP_CHARS})]')
    return f"{_header(message, ctx.settings.daemon.tz)} in conversation {cid}\n{body}"


async def file_read(ctx: ToolContext, path: str, from_line: int = 1, to_line: int = 0) -> str:
    """Lines of a file the user sent (stored under attachments/), in a conversation in scope."""
    target = await asyncio.to_thread(sent_file, ctx, path)
    if target is None:
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


async def files_list(ctx: ToolContext, limit: int = FILES_LISTED) -> str:
    """The files the person sent in the conversations recall may read, newest first: what a
    reference like "the PDF I sent this morning" resolves against after any fold or rotation."""
    limit = max(1, min(limit, FILES_LISTED_MAX))
    found = await asyncio.to_thread(_sent_files, ctx)
    if not found:
        return "You have no stored files from the user in these conversations."
    tz = ctx.settings.daemon.tz
    lines = [f"{len(found)} file{'' if len(found) == 1 else 's'} you sent, newest first"
             + (f" (the {limit} newest):" if len(found) > limit else ":")]
    for created, doc in found[:limit]:
        day = datetime.fromtimestamp(created, tz).strftime("%Y-%m-%d")
        mime = str(doc.get("mime") or "")
        name = as_data(str(doc.get("name") or ""))
        kind = kind_of(name, mime)
        quoted = f' "{name}"' if name else ""
        lines.append(f'- {day} {doc.get("kind", "file")}{quoted} '
                     f'({kind.upper() if kind else mime}): {doc["path"]}')
    return "\n".join(lines)


async def image_view(ctx: ToolContext, ref: str) -> str | ToolOutput:
    """An earlier image of the person's own, shown again to a model that can see (the turn
    stores and attaches it as it does a tool's image, or notes that the model cannot see)."""
    target = await asyncio.to_thread(sent_file, ctx, ref)
    if target is None or target.suffix.lower() not in IMAGE_SUFFIXES:
        return (f"ERROR: {ref!r} is not an image the user sent; files_list and the image's "
                "note give paths like attachments/2026-12/<id>.jpg.")
    data = await asyncio.to_thread(target.read_bytes)
    with Image.open(BytesIO(data)) as image:
        size = f"{image.width}x{image.height}"
    return ToolOutput(f"The image {ref} ({size}) is attached to this result.", (data,))


def _sent_files(ctx: ToolContext) -> list[tuple[float, Mapping[str, Any]]]:
    scope = ctx.recall_scope()
    ids = dict.fromkeys([*sorted(scope.conversation_ids),
                         *(c.id for key in sorted(scope.chat_keys)
                           for c in ctx.store.list_conversations(chat_key=key))])
    found = [(message.created, doc) for cid in ids if _visible(ctx, cid) is not None
             for message in ctx.store.messages(cid) if message.role == "user"
             for doc in message.attachments if doc.get("path")]
    return sorted(found, key=lambda item: -item[0])


def with_files(message: Message) -> str:
    """A message's text and the notes of the files on it (name, kind, reference): what recall
    shows, so a file stays reachable after the request no longer carries its message."""
    notes = [str(doc["note"]) for doc in message.attachments if doc.get("note")]
    return "\n".join([message.content, *notes]).strip() if notes else message.content


def sent_file(ctx: ToolContext, ref: str) -> Path | None:
    """The stored file `ref` names, if a message of a conversation in scope carries it; None
    alike for a malformed reference, a file that is not there and one of someone else."""
    if not is_ref(ref):
        return None
    # Not later than now: ids made in a burst count up from the newest one (`new_id`), and an
    # id made for a time ahead (a test's clock) would push every later one there.
    since = min(ref_time(ref), ctx.clock()) - FILE_SLACK
    scope = ctx.recall_scope()
    # This conversation first (where a file is nearly always read), then the others in scope,
    # newest first, skipping those that ended before the file was stored.
    candidates = [c for key in sorted(scope.chat_keys)
                  for c in ctx.store.list_conversations(chat_key=key)
                  if c.status == "active" or c.last_active >= since]
    ids = dict.fromkeys([ctx.conversation_id, *sorted(scope.conversation_ids),
                         *(c.id for c in sorted(candidates, key=lambda c: -c.created))])
    for cid in ids:
        conversation = _visible(ctx, cid)
        if conversation is None:
            continue
        for message in reversed(ctx.store.messages(cid)):
            if any(a.get("path") == ref for a in message.attachments):
                try:
                    return stored_path(ref, ctx.store.state_dir / "attachments")
                except AttachmentError:
                    return None
    return None


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
    """The capabilities not loaded yet that `query` means, best first, each with why it
    matched; with no query, all of them."""
    found = ctx.registry.search(query, ctx.active)
    if not found:
        return (f"No capability that is not loaded matches {query!r}; try other words, or "
                "tool_search() with none to list them all.")
    order = ", best match first" if query.strip() else ""
    return (f"Capabilities you can load with tool_activate(name){order}:\n"
            + "\n".join(_found_line(hit) for hit in found))


def _found_line(hit: Hit) -> str:
    """One capability of a tool_search answer: its index words, its first tools, why."""
    capability = hit.capability
    about = f": {capability.description}" if capability.description else ""
    names = [t.name for t in capability.tools]
    more = len(names) - SEARCH_TOOLS_SHOWN
    tools = (", ".join(names[:SEARCH_TOOLS_SHOWN]) + (f" and {more} more" if more > 0 else "")
             if names else "listed once its server is up")
    return f"- {capability.name}{about} (tools: {tools}){f'; {hit.why}' if hit.why else ''}"


async def tool_activate(ctx: ToolContext, name: str) -> str:
    capability = ctx.registry.capabilities.get(name)
    if capability is None:
        return f"ERROR: no capability {name!r}; tool_search lists them."
    if capability.core or name in ctx.active:
        return f"{name} is already loaded."
    if not capability.tools and name in ctx.registry.starting:  # an MCP server coming up
        await ctx.registry.starting[name]()
        capability = ctx.registry.capabilities[name]
    if not capability.tools:  # an MCP server that has not listed any (yet)
        problem = ctx.registry.problems.get(name)
        return (f"ERROR: {name} has no tools right now"
                f"{f' ({problem})' if problem else ''}; it was not loaded. Try again later.")
    ctx.active.append(name)
    tools = ", ".join(t.name for t in capability.tools)
    return f"Loaded {name}: you can call {tools} now."


def _schema(
    properties: dict[str, dict[str, str]], required: tuple[str, ...] = ()
) -> dict[str, Any]:
    # An empty "required" is left out: it is the default, and costs tokens in every request.
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    return schema | ({"required": list(required)} if required else {})


def register(registry: Registry) -> None:
    """The tools every roost has."""
    registry.register(Capability(
        name="memory", core=True, group="recall",
        description="search and read everything said before",
        tools=(
            Tool("memory_search", "Search past messages and summaries; ranked snippets "
                 "with refs.",
                 _schema({"query": {"type": "string"},
                          "limit": {"type": "integer"}},
                         ("query",)), memory_search,
                 progress="searching your conversations…"),
            Tool("memory_get", "One search result whole, by ref.",
                 _schema({"ref": {"type": "string"}}, ("ref",)), memory_get,
                 progress="reading an earlier message…"),
            Tool("conversation_read", "A conversation's messages word for word, by seq.",
                 _schema({"conversation_id": {"type": "string"},
                          "from_seq": {"type": "integer"}, "to_seq": {"type": "integer"},
                          "offset": {"type": "integer"}}, ("conversation_id",)),
                 conversation_read, progress="reading an earlier conversation…"),
        )))
    # No current_time tool: every user message carries its [sent Thu 2026-12-03 07:30] stamp in
    # the person's timezone, so the tool only cost ~60 tokens in every request (issue 29).
    registry.register(Capability(
        name="tools", core=True, group="basics",
        description="find and load more tools",
        tools=(
            Tool("tool_search", "List capabilities not loaded yet.",
                 _schema({"query": {"type": "string"}}), tool_search,
                 progress="looking for the right tool…"),
            Tool("tool_activate", "Load a capability's tools.",
                 _schema({"name": {"type": "string"}}, ("name",)), tool_activate,
                 timeout=ACTIVATE_TIMEOUT, progress="getting a tool ready…"),
        )))
    registry.register(Capability(
        name="files", group="files",
        description="list and read files the user sent",
        tools=(Tool("file_read", "Read lines of a file the user sent.",
                    _schema({"path": {"type": "string"}, "from_line": {"type": "integer"},
                             "to_line": {"type": "integer"}}, ("path",)), file_read,
                    progress="reading your file…"),
               Tool("files_list", "The files the user sent, newest first, with their paths.",
                    _schema({"limit": {"type": "integer"}}), files_list,
                    progress="looking through your files…"),
               Tool("image_view", "Look again at an image the user sent earlier.",
                    _schema({"ref": {"type": "string"}}, ("ref",)), image_view,
                    progress="looking at your picture…"))))
