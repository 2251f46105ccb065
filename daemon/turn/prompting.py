"""Assembles the request of a turn from the pure context functions and the day's inputs.

The I/O-bound inputs are gathered here (the model's num_ctx, the memory map once per calendar day,
the clock in the configured timezone) and handed to `daemon/context/`, which decides the bytes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time
from typing import Any

from daemon.context.budget import (
    MESSAGE_OVERHEAD_TOKENS,
    MULTILINGUAL,
    Vocabulary,
    estimate_tokens,
    request_budget,
    vocabulary_of,
)
from daemon.context.facts import FactsBlock, facts_block, with_facts
from daemon.context.handles import as_handle
from daemon.context.prefix import Capability, MemoryMap, channel_note, system_prefix
from daemon.context.replay import Request, build_request, chat_tokens
from daemon.context.toolless import plain_lines
from daemon.core.config import Settings
from daemon.core.conversations import Conversation, Message
from daemon.core.errors import StoreError
from daemon.core.logs import turn_log as log
from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.store.facts import HOUSEHOLD, Fact, FactsBook, FrozenFacts, Person
from daemon.tools.registry import Registry
from daemon.tools.roles import NoRoles, Roles, shares_household
from daemon.tools.scope import person_of

BUDGET_MARGIN_SHARE = 50  # 2% of the budget
BUDGET_MARGIN_MIN = 16
CUTS_MARGIN_SHARE = 10  # 10% where the server cuts silently


@dataclass(frozen=True)
class Prepared:
    """A request ready to send, with the numbers it was fitted against."""

    request: Request
    budget: int
    num_ctx: int
    ratio: float
    tool_tokens: int
    tools: tuple[Mapping[str, Any], ...] = ()
    vocabulary: Vocabulary = MULTILINGUAL  # the model's: what another script costs
    model: str | None = None  # the model it goes to (None: model.name)

    def raw_estimate(self) -> int:
        """The request's estimate at ratio 1, what calibration divides Ollama's count by."""
        tools = (estimate_tokens(json.dumps(list(self.tools), separators=(",", ":")), 1.0)
                 if self.tools else 0)
        return sum(chat_tokens(m, 1.0, self.vocabulary.estimate)
                   for m in self.request.messages) + tools

    def overhead(self) -> int:
        """The per-message template tokens in the estimate, which the ratio does not scale."""
        return MESSAGE_OVERHEAD_TOKENS * len(self.request.messages)

    def accounting(self) -> dict[str, Any]:
        """Token counts per part against the budget, for the debug snapshots."""
        return {
            "num_ctx": self.num_ctx,
            "budget": self.budget,
            "ratio": round(self.ratio, 4),
            "estimate": self.request.estimate,
            "parts": {**self.request.parts, "tools": self.tool_tokens},
            "fit": {"stubbed": self.request.stubbed, "decayed": self.request.decayed,
                    "condensed": self.request.condensed, "omitted": self.request.omitted,
                    "cut": self.request.cut},
            "messages": self.request.messages,
        }


class Prompting:
    """Builds requests; caches the memory map for the calendar day it was made on."""

    def __init__(
        self, *, settings: Settings, store: Store, llm: ModelClient, registry: Registry,
        clock: Callable[[], float], facts: FactsBook | None = None,
        roles: Roles | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.llm = llm
        self.registry = registry
        self.clock = clock
        self.facts = facts
        self.roles = roles or NoRoles()
        self._memory: MemoryMap | None = None

    def today(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), self.settings.daemon.tz)

    async def memory_map(self, day: date) -> MemoryMap:
        """The memory map of `day`: what was stored before the day began, counted once that
        day. Counting what is stored now would give each process its own map (a restart, a
        command-line run) and the prompt cache would miss from the map on."""
        if self._memory is None or self._memory.day != day:
            tz = self.settings.daemon.tz
            began = datetime.combine(day, time.min, tzinfo=tz).timestamp()
            stats = await asyncio.to_thread(self.store.stats, began)
            self._memory = MemoryMap(
                day=day,
                conversations=stats.conversations,
                messages=stats.messages,
                summaries=stats.summaries,
                automations=len(self.settings.automations),
                first_day=datetime.fromtimestamp(stats.first, tz).date() if stats.first else None,
                last_day=datetime.fromtimestamp(stats.last, tz).date() if stats.last else None,
            )
        return self._memory

    async def prefix(self, capabilities: Sequence[Capability] = (), *,
                     tools: bool = True) -> str:
        """The system message: the same for every conversation (the channel's note goes in
        the first user message, see `daemon.context.prefix`)."""
        memory = await self.memory_map(self.today().date())
        return system_prefix(capabilities=capabilities, memory=memory,
                             variables=self.settings.variables, tools=tools)

    async def prepare(
        self, conversation: Conversation, history: Sequence[Message], *,
        ratio: float | None = None, model: str | None = None,
    ) -> Prepared:
        """The request for the conversation's next model call, fitted to the budget of `model`
        (default `model.name`: the one the request goes to), with the tools of its loaded
        capabilities. The messages in `conversation.handled` go as their handle.

        Raises `DoesNotFit` when the protected messages alone are larger than the budget.
        """
        ratio = conversation.token_ratio if ratio is None else ratio
        if conversation.handled:
            handled = set(conversation.handled)
            history = [as_handle(m) if m.seq in handled else m for m in history]
        # A model without the tools capability gets no tools and no word of them (Ollama
        # would answer 400 to the tools, and the model would promise searches it cannot do).
        info = await self.llm.model_info(model)
        with_tools = info.tools and not self.llm.habits_of(info.name).no_tools
        vocabulary = vocabulary_of(info.vocabulary_size)
        tools = self.registry.schemas(conversation.active_tools) if with_tools else []
        capabilities = self.registry.index(conversation.active_tools) if with_tools else []
        num_ctx = await self.llm.num_ctx(model)
        tool_tokens = (estimate_tokens(json.dumps(list(tools), separators=(",", ":")), ratio)
                       if tools else 0)
        budget = request_budget(num_ctx, self.settings.model.response_reserve) - tool_tokens
        # The estimate is calibrated, not exact: a margin keeps a request that is a few tokens
        # off still inside the window Ollama would otherwise cut silently.
        # A server seen cutting instead of refusing (its card) gets a wider one: a request a
        # little over its window is answered from a cut prompt, not refused and refitted.
        share = CUTS_MARGIN_SHARE if self.llm.habits_of(info.name).cuts else BUDGET_MARGIN_SHARE
        budget -= max(BUDGET_MARGIN_MIN, budget // share)
        frozen = await self.frozen_facts(conversation, num_ctx, vocabulary)
        request = build_request(
            conversation_id=conversation.id,
            prefix=with_facts(await self.prefix(capabilities, tools=with_tools),
                              _facts_for(frozen.blocks if frozen else "", with_tools)),
            opening=channel_note(conversation.kind),
            history=history,
            budget=budget,
            ratio=ratio,
            summary=conversation.summary,
            tz=self.settings.daemon.tz,
            tools=with_tools,
            estimate=vocabulary.estimate,
        )
        return Prepared(request=request, budget=budget, num_ctx=num_ctx, ratio=ratio,
                        tool_tokens=tool_tokens, tools=tuple(tools), vocabulary=vocabulary,
                        model=model)

    async def frozen_facts(self, conversation: Conversation, num_ctx: int,
                           vocabulary: Vocabulary = MULTILINGUAL) -> FrozenFacts | None:
        """The facts blocks of the conversation's system message: the household's (where it
        is shared, `daemon.tools.roles`) and the person's (none in a group); None for neither.

        Made from the facts when the conversation first needs them, and again after a fold
        (the request changes after the shared part then anyway) or when the household's role
        changed; kept with the conversation in between, so every turn, and a restart, sends
        the same bytes."""
        if self.facts is None:
            return None
        person = person_of(conversation.chat_key, self.settings)
        shares = shares_household(conversation.chat_key, self.settings, self.roles)
        if person is None and not shares:
            return None
        return await asyncio.to_thread(self._frozen, conversation, person, shares, num_ctx,
                                       vocabulary)

    def _frozen(self, conversation: Conversation, person: Person | None, shares: bool,
                num_ctx: int, vocabulary: Vocabulary) -> FrozenFacts | None:
        assert self.facts is not None
        frozen = self.facts.frozen(conversation.id)
        fold = conversation.summary.fold_count
        name = person.name if person is not None else ""
        if (frozen is not None and frozen.fold_count == fold and frozen.person == name
                and frozen.shares == shares):
            return frozen
        try:
            facts = self.facts.facts(person) if person is not None else []
            shared = self.facts.facts(HOUSEHOLD) if shares else []
        except StoreError as exc:  # the conversation goes on, with the blocks it had if any
            log.warning("facts of %s unreadable (%s)", name or "the household", exc)
            return frozen if frozen is not None and frozen.shares == shares else None
        block = self._block(facts, num_ctx, conversation, vocabulary)
        household = self._block(shared, num_ctx, conversation, vocabulary, household=True)
        frozen = FrozenFacts(block=block.text, known=tuple(f.text for f in facts),
                             fold_count=fold, person=name, shown=block.shown,
                             left_out=block.left_out, tokens=block.tokens, cap=block.cap,
                             household=household.text,
                             household_known=tuple(f.text for f in shared), shares=shares)
        try:
            self.facts.freeze(conversation.id, frozen)
        except StoreError as exc:  # a full disk: the block is sent all the same, and made
            # again from the same facts next turn, so the bytes hold unless the facts change
            log.warning("conversation %s: cannot keep its facts block (%s)", conversation.id,
                        exc)
        return frozen

    @staticmethod
    def _block(facts: Sequence[Fact], num_ctx: int, conversation: Conversation,
               vocabulary: Vocabulary, *, household: bool = False) -> FactsBlock:
        return facts_block([(f.added, f.text) for f in facts], num_ctx,
                           conversation.token_ratio, estimate=vocabulary.estimate,
                           household=household)


def _facts_for(block: str, tools: bool) -> str:
    """The facts block as a model without tools gets it: no word of memory_search."""
    return block if tools else plain_lines(block)
