"""The model's words on their way to the channel's sink during one turn (see streaming.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from daemon.core.messages import ReplySink
from daemon.llm.client import ChatResult
from daemon.llm.gate import ModelGate
from daemon.turn.silence import SilenceWatch, stall_line
from daemon.turn.streaming import THINKING
from daemon.turn.tool_loop import could_become_text_tool_call, looks_like_text_tool_call


class ReplyStream:
    """Reply pieces on their way to the channel's sink: the intro line goes first, once, and a
    reply that may be a tool call written as text is held back until it is clearly not one.
    Keeps what it showed: a stopped turn keeps that as its reply.

    With a `Silence`, a call that holds the model and goes quiet is said in the sink's status
    line; `tell` (a chat whose sink shows no status line) also gets it once as a notice."""

    def __init__(self, sink: ReplySink, intro: str, silence: Silence | None = None) -> None:
        self.sink = sink
        self.intro = intro
        self.held: list[str] = []
        self.passing = False
        self.thought = False
        self.written: list[str] = []  # what was shown of the model's words (not the intro)
        self.call_start = 0  # where the current call's words start in `written`
        self.retracted = False  # words the user saw were taken back (`retract`)
        self.retracted_for = ""  # why: "cut" (a prompt the server cut), "moved" (another host)
        self.tell = silence.tell if silence is not None else None
        self.watch = (SilenceWatch(silence.after, self._silent, silence.gate)
                      if silence is not None else None)

    @contextlib.asynccontextmanager
    async def watching(self, working: AbstractAsyncContextManager[None]
                       ) -> AsyncIterator[None]:
        """While a call holds the model: the channel's `working` ("typing…"), and the watch
        for silence (daemon/turn/silence.py)."""
        async with working:
            if self.watch is None:
                yield
                return
            async with self.watch.watching():
                yield

    async def _silent(self, seconds: float) -> None:
        line = stall_line(seconds)
        self.sink.status(line)
        self.thought = False  # thinking that comes after says so again
        if self.tell is not None:  # once a turn: a notice each 30 s would be noise
            tell, self.tell = self.tell, None
            await tell(line[:1].upper() + line[1:] + ".")

    def _heard(self) -> None:
        if self.watch is not None and self.watch.heard():
            self.sink.status("")  # the answer goes on: the line about the silence goes

    def _show(self, text: str) -> None:
        if self.intro:
            self.sink.write(self.intro)
            self.intro = ""
        self.written.append(text)
        self.sink.write(text)

    def begin(self) -> None:
        self.held, self.passing, self.thought = [], False, False
        self.call_start = len(self.written)

    def retract(self, why: str = "cut") -> None:
        """Forget the last call's words (an answer to a prompt Ollama cut, or one a host that
        failed mid-answer left unfinished: `why`): a stopped turn does not keep them, and where
        the user saw some, `retracted` says so, so that the reply that replaces them can tell
        the user why (text shown is never taken back in silence)."""
        if "".join(self.written[self.call_start:]).strip():
            self.retracted, self.retracted_for = True, why
        del self.written[self.call_start:]
        self.begin()

    def thinking(self, piece: str) -> None:
        self._heard()
        if not self.thought:  # one line for the whole thought, not one per piece
            self.thought = True
            self.sink.status(THINKING)

    def kept(self, tool_names: list[str]) -> str:
        """What the user saw written, and what was held back unless it is a tool call."""
        held = "".join(self.held)
        if not self.passing and held.strip() and not looks_like_text_tool_call(held, tool_names):
            return "".join(self.written) + held
        return "".join(self.written)

    def delta(self, piece: str) -> None:
        self._heard()
        if self.passing:
            self._show(piece)
            return
        self.held.append(piece)
        text = "".join(self.held)
        if not could_become_text_tool_call(text):
            self.passing = True
            self._show(text)

    def end(self, result: ChatResult, tool_names: list[str]) -> None:
        held = "".join(self.held)
        if not self.passing and held.strip() and not result.tool_calls \
                and not looks_like_text_tool_call(held, tool_names):
            self._show(held)


@dataclass(frozen=True)
class Silence:
    """What a turn's stream needs to say a silent model: after how long (`model.stall`), the
    gate that counts silent calls, and where a sink without a status line is told."""

    after: float
    gate: ModelGate
    tell: Callable[[str], Awaitable[None]] | None = None
