"""The model's words on their way to the channel's sink during one turn (see streaming.py)."""

from __future__ import annotations

from daemon.core.messages import ReplySink
from daemon.llm.client import ChatResult
from daemon.turn.streaming import THINKING
from daemon.turn.tool_loop import could_become_text_tool_call, looks_like_text_tool_call


class ReplyStream:
    """Reply pieces on their way to the channel's sink: the intro line goes first, once, and a
    reply that may be a tool call written as text is held back until it is clearly not one.
    Keeps what it showed: a stopped turn keeps that as its reply."""

    def __init__(self, sink: ReplySink, intro: str) -> None:
        self.sink = sink
        self.intro = intro
        self.held: list[str] = []
        self.passing = False
        self.thought = False
        self.written: list[str] = []  # what was shown of the model's words (not the intro)

    def _show(self, text: str) -> None:
        if self.intro:
            self.sink.write(self.intro)
            self.intro = ""
        self.written.append(text)
        self.sink.write(text)

    def begin(self) -> None:
        self.held, self.passing, self.thought = [], False, False

    def discard(self) -> None:
        """Forget the call's words (an answer to a prompt Ollama cut): a stopped turn does not
        keep them. The preview already shown is not a record; the reply replaces it."""
        self.written = []
        self.begin()

    def thinking(self, piece: str) -> None:
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
