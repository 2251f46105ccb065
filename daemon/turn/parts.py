"""The parts every turn path shares, built once: the engine's chats and the automations' runs
answer through the same router, prompting, tools, memory index, event log and folder.

The app builds them and hands them to both; each asks for its own `TurnRunner` (its notices,
its stream, its channel's "working" context), so neither reaches into the other.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

from daemon.core.config import Settings
from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.store.approvals import ApprovalBook
from daemon.store.event_log import Records
from daemon.store.facts import FactsBook
from daemon.store.search_index import SearchIndex
from daemon.tools.registry import Registry
from daemon.tools.roles import Roles
from daemon.turn.approvals import Approvals, Ask
from daemon.turn.background_fold import BackgroundFold
from daemon.turn.models import model_of
from daemon.turn.prompting import Prompting
from daemon.turn.router import Router
from daemon.turn.runner import Notify, TurnRunner, Working, not_shown
from daemon.turn.streaming import Streaming, not_streamed

CardLine = Callable[[str], str | None]  # model -> its card in one line (daemon.models)


@dataclass(frozen=True)
class TurnParts:
    """See the module docstring."""

    settings: Settings
    store: Store
    llm: ModelClient
    router: Router
    records: Records
    registry: Registry
    index: SearchIndex
    prompting: Prompting
    folder: BackgroundFold
    clock: Callable[[], float]
    facts: FactsBook | None = None
    approvals: Approvals | None = None  # asks before a tool that needs a yes runs
    card_line: CardLine | None = None  # a model's card in one line, for /status


    @classmethod
    def build(cls, *, settings: Settings, store: Store, llm: ModelClient,
              registry: Registry, index: SearchIndex | None = None,
              clock: Callable[[], float] = time.time,
              on_event: Callable[[str], None] | None = None,
              card_line: CardLine | None = None, roles: Roles | None = None) -> TurnParts:
        """`index` is derived from the store and rebuilt from it when lost; the daemon opens it
        with the store, so that a disk that cannot take it stops the start before anything
        else runs. `registry` holds every tool (daemon/app/assembly.py builds it)."""
        index = index or SearchIndex.open(store.state_dir / "memory.sqlite3")
        records = Records(store.state_dir, settings.daemon.tz, on_event=on_event)
        facts = FactsBook(store.files)
        return cls(
            settings=settings, store=store, llm=llm,
            router=Router(store, settings.daemon.idle_rotation, functools.partial(
                _start_ratio, store, settings, llm)), records=records,
            registry=registry, index=index,
            prompting=Prompting(settings=settings, store=store, llm=llm, registry=registry,
                                clock=clock, facts=facts, roles=roles),
            folder=BackgroundFold(settings=settings, store=store, llm=llm, records=records,
                                  clock=clock, on_fold=index.mark_dirty),
            clock=clock, facts=facts,
            approvals=Approvals(ApprovalBook(store.state_dir), settings.mcp.approve_timeout,
                                clock),
            card_line=card_line)

    def runner(self, *, notify: Notify, streaming: Streaming = not_streamed,
               working: Working = not_shown, fold: bool = True,
               ask: Ask | None = None) -> TurnRunner:
        """A turn runner on these parts; `fold` lets its turns land a fold the request owes;
        `ask` lets its turns ask the user to approve a tool call."""
        return TurnRunner(settings=self.settings, store=self.store, llm=self.llm,
                          router=self.router, prompting=self.prompting, registry=self.registry,
                          index=self.index, records=self.records, notify=notify,
                          streaming=streaming, clock=self.clock,
                          folder=self.folder if fold else None, working=working,
                          facts=self.facts, approvals=self.approvals, ask=ask)


def _start_ratio(store: Store, settings: Settings, llm: ModelClient, chat_key: str) -> float:
    """A new chat's first token ratio: its model's card's, else 1.0 (bytes/4)."""
    return llm.habits_of(model_of(store, settings, chat_key)).start_ratio or 1.0
