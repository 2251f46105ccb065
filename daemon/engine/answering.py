"""What a chat's worker does with the messages pending in its inbox: run the leading chat
command, or answer the messages before the next command in one turn (their voice notes
transcribed first, `daemon.voice.hearing`), in the channel's
"working" context (typing...) and its streaming sink (the reply as it is written). /stop is
acted on when it arrives (`stop`, from the engine's submit), not in its place in the queue,
which the running turn holds; in its place it only says whether it found anything. A turn that
found the model unreachable parks the chat: the worker tries it again later, without telling
the user again."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Mapping
from typing import Any

from daemon.core.conversations import kind_of
from daemon.core.messages import Channel, Inbound, ReplySink
from daemon.engine.chat_commands import Commands
from daemon.engine.facts_commands import FactsCommands
from daemon.engine.guest_days import GuestDays, speakers_of
from daemon.engine.model_choice import ModelChoice
from daemon.engine.voice_replies import VoiceReplies
from daemon.intake.household import Household
from daemon.store.facts import FactsBook
from daemon.turn.approvals import Ask
from daemon.turn.parts import TurnParts
from daemon.turn.runner import MAX_BACKOFF, Outcome
from daemon.turn.streaming import not_streamed
from daemon.voice.hearing import Hearing

NOTHING_TO_STOP = "Nothing to stop: no reply is being written."


class Answering:
    """See the module docstring; `notify` sends a notice through the chat's outbox."""

    def __init__(self, parts: TurnParts, channels: Mapping[str, Channel],
                 notify: Ask, voice: Hearing | None = None,
                 speech: VoiceReplies | None = None) -> None:
        self.parts = parts
        self.speech = speech  # /voice
        self.voice = voice  # transcribes voice notes before their turn
        self.channels = channels
        self.notify = notify
        self.commands = Commands(settings=parts.settings, store=parts.store,
                                 router=parts.router, llm=parts.llm, prompting=parts.prompting,
                                 folder=parts.folder, clock=parts.clock,
                                 registry=parts.registry, card_line=parts.card_line)
        self.models = ModelChoice(settings=parts.settings, store=parts.store, llm=parts.llm,
                                  router=parts.router, clock=parts.clock)
        self.facts_commands = FactsCommands(settings=parts.settings,
                                     facts=parts.facts or FactsBook(parts.store.files),
                                     clock=parts.clock, roles=parts.prompting.roles)
        roles = parts.prompting.roles  # the daemon's Household: the guest days ask it too
        self.guests = GuestDays(parts.settings, parts.store, parts.clock,
                                roles if isinstance(roles, Household) else None)
        self.turns = parts.runner(notify=notify, streaming=self._streaming,
                                  working=self._working, ask=notify)
        self.parked: set[str] = set()
        self._stops: set[str] = set()  # ids of /stop messages that stopped a reply

    async def handle(self, items: list[Inbound],
                     doing: Callable[[list[dict[str, Any]]], None]) -> None:
        """Run the leading command, or one turn for the messages before the next command;
        `doing` is told which inbox items are being handled (quarantined if they fail)."""
        chat_key = items[0].chat_key
        command = items[0].command
        if command in self.commands.names or command in self.facts_commands.names:
            doing([items[0].to_doc()])
            reply = (await self.facts_commands.run(command, items[0].text, chat_key)
                     if command in self.facts_commands.names
                     else await self._command(command, items[0]))
            if reply:
                await self.notify(chat_key, reply)
            await asyncio.to_thread(self.parts.store.inbox_done, [items[0].id])
            return
        handled = list(itertools.takewhile(
            lambda i: i.command not in self.commands.names | self.facts_commands.names, items))
        doing([i.to_doc() for i in handled])
        if self.voice is not None:
            handled = await self.voice.hear(handled, self.notify, self._working)
        # The user is told about an outage once (by the turn's first failed try); while the
        # chat is parked, the retries are silent. An unexpected failure goes to the worker,
        # which tries the items once more and then quarantines them.
        speakers = speakers_of(chat_key, handled)
        if (capped := await self.guests.refusal(speakers)) is not None:
            await self.turns.keep(chat_key, handled, capped)
            return
        announce = chat_key not in self.parked
        result = await self.turns.run(chat_key, handled, announce_outage=announce,
                                      model=await self.models.model_of(chat_key))
        if result.outcome is Outcome.ANSWERED and result.conversation_id:
            await self.guests.count(speakers)
            self.parts.folder.schedule(result.conversation_id, urgent=result.crowded)
        if result.outcome is Outcome.PARKED:
            self.parked.add(chat_key)
        else:
            self.parked.discard(chat_key)

    def park_interval(self) -> float:
        """How long a parked chat waits before its turn is tried again."""
        model = self.parts.settings.model
        return min(model.retry_backoff * 2**model.retry_attempts, MAX_BACKOFF)

    def stop(self, inbound: Inbound) -> bool:
        """/stop arrived: stop the reply being written in its chat, now; False when none is."""
        if not self.turns.stops.stop(inbound.chat_key):
            return False
        self._stops.add(inbound.id)
        return True

    async def _command(self, command: str, inbound: Inbound) -> str:
        """The answer to a command; empty for a /stop that stopped a reply (the reply,
        marked stopped, says it)."""
        if command == "stop":
            if inbound.id in self._stops:
                self._stops.discard(inbound.id)
                return ""
            return NOTHING_TO_STOP
        if command == "model":
            return await self.models.run(inbound.chat_key, inbound.text)
        if command == "voice" and self.speech is not None:
            return await self.speech.command(inbound.chat_key, inbound.text)
        return await self.commands.run(command, inbound.chat_key)

    def _streaming(self, chat_key: str) -> contextlib.AbstractAsyncContextManager[ReplySink]:
        channel = self.channels.get(kind_of(chat_key))
        return channel.streaming(chat_key) if channel is not None else not_streamed(chat_key)

    def _working(self, chat_key: str) -> contextlib.AbstractAsyncContextManager[None]:
        channel = self.channels.get(kind_of(chat_key))
        return channel.working(chat_key) if channel is not None else contextlib.nullcontext()
