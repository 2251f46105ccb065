"""A conversation's page: what it reads of the store, and the values its template draws.

Synchronous (the web handlers call it through `asyncio.to_thread`). Scope is the caller's:
it hands over a conversation the session may see.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from daemon.console import views
from daemon.console.chart import requests_chart
from daemon.console.names import name_of
from daemon.console.paging import PER_PAGE, transcript_page
from daemon.core.config import Settings
from daemon.core.conversations import Conversation, Message
from daemon.store import Store
from daemon.store.attachments import AttachmentError, stored_path
from daemon.store.event_log import Records

ALONE = views.Neighbours(None, None)  # the chat's only conversation
NOTHING_HELD = views.Held({})


@dataclass(frozen=True)
class Reading:
    """Everything the page shows of one conversation, read at once."""

    conversation: Conversation
    messages: list[Message]
    events: list[str]
    around: views.Neighbours = ALONE
    sent: Sequence[Mapping[str, Any]] = ()  # voice notes sent for its replies
    held: views.Held = NOTHING_HELD


def read(store: Store, conversation: Conversation, settings: Settings) -> Reading:
    tz = settings.daemon.tz
    return Reading(conversation, store.messages(conversation.id),
                   views.conversation_events(Records(store.state_dir, tz), conversation),
                   views.neighbours(store, conversation), store.deliveries_of(conversation.id),
                   views.held_of(store, conversation, tz))


def values(settings: Settings, reading: Reading, names: Mapping[str, str], number: int,
           per_page: int = PER_PAGE, reminders: Sequence[str] = ()) -> dict[str, Any]:
    """The template's values for page `number` (0: the latest). The bench asks for every
    message on one page (`per_page`), as the console showed it before paging."""
    tz, conversation, messages = settings.daemon.tz, reading.conversation, reading.messages
    points = views.request_points(messages, tz)
    shown = transcript_page([m.seq for m in messages], conversation.summary.through_seq,
                            number, max(per_page, 1))
    on_page = views.message_views(messages, conversation, tz, shown.start, shown.end,
                                  reading.sent, reading.held.by_message)
    seqs = {m.seq for m in on_page}
    last = points[-1] if points else None
    return dict(
        conversation=conversation, chat=name_of(conversation.chat_key, names),
        started=views.local_time(conversation.created, tz), total=len(messages),
        messages=on_page, shown=shown, events=reading.events, waiting=reading.held.waiting,
        reminders=reminders, around=reading.around,
        # The chart draws every request; the table those of this page's messages.
        points=[p for p in points if p.seq in seqs], all_points=len(points), last=last,
        chart=requests_chart(views.chart_bars(points),
                             max((p.window or 0 for p in points), default=0)
                             or settings.model.window,
                             last.budget if last is not None else None))


def stored_file(store: Store, conversation: Conversation, seq: int,
                index: int) -> tuple[Path, Mapping[str, Any]]:
    """The file `index` of message `seq` (what came with it, then the voice notes sent for
    it) and its record; 404 when there is none, 410 when it is no longer stored."""
    found = store.messages(conversation.id, seq, seq)  # seqs run 1, 2, 3...: it or none
    files = views.files_of(found[0], store.deliveries_of(conversation.id)) if found else []
    if index >= len(files):
        raise web.HTTPNotFound(text="No such file.")
    try:
        return stored_path(str(files[index]["path"]), store.state_dir / "attachments"), \
            files[index]
    except AttachmentError as exc:
        raise web.HTTPGone(text=exc.args[0]) from exc
