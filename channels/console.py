"""The terminal as a channel: replies written to a text stream, lines read from stdin.

It only translates; `roost chat` (daemon/cli/chat.py) builds the engine, store and model client
around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TextIO

from channels.formatting import to_plain
from daemon.core.approval import KEYS, Button, parse
from daemon.core.messages import Outbound, ReplySink

CHAT_KEY = "console:local"
WAITING = "roost is thinking…"


class ConsoleChannel:
    """Writes replies to a text stream; streamed pieces first, the finished reply closes them."""

    name = "console"

    def __init__(self, out: TextIO, *, indicator: bool = False) -> None:
        self.out = out
        self.indicator = indicator  # on a terminal: show that roost is at work until it answers
        self._streamed = ""  # what this reply showed so far, piece by piece
        self._waiting = False  # the indicator is on screen
        # While a prompt waits for a line: what its line shows now (prompt and typed text), so
        # that a late answer or a log line is written above it and the line drawn again.
        self.prompt: Callable[[], str] | None = None

    def show_waiting(self) -> None:
        """Until the first piece of the answer: a line saying roost is at it (terminal only)."""
        if self.indicator:
            self.out.write(WAITING)
            self.out.flush()
            self._waiting = True

    def interject(self, text: str, stream: TextIO | None = None) -> None:
        """A whole line (a log line, on `stream`) above what the current line shows, the
        indicator or the prompt with what was typed, which is then drawn again."""
        current = WAITING if self._waiting else self.prompt() if self.prompt else ""
        if current:
            self.out.write("\r\x1b[K")
            self.out.flush()
        elif self._streamed:
            self.out.write("\n")  # in the middle of a streamed reply: on a line of its own
            self.out.flush()
        target = stream or self.out
        target.write(text.rstrip("\n") + "\n")
        target.flush()
        self.out.write(current)
        self.out.flush()

    def _leave_prompt(self) -> None:
        """An answer comes while the prompt waits (it came late): it goes on a clean line."""
        if self.prompt and not self._streamed:
            self.out.write("\r\x1b[K")

    def clear_waiting(self) -> None:
        if self._waiting:
            self.out.write("\r\x1b[K")  # back to the line's start, erase it
            self._waiting = False

    def working(self, chat_key: str) -> contextlib.AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()

    def streaming(self, chat_key: str) -> contextlib.AbstractAsyncContextManager[ReplySink]:
        return contextlib.nullcontext(self)

    def status(self, line: str) -> None:
        """Not shown: the terminal shows the words as they come."""

    def write(self, delta: str) -> None:
        self.clear_waiting()
        self._leave_prompt()
        if not self._streamed:
            self.out.write("roost> ")
        self._streamed += delta
        self.out.write(delta)
        self.out.flush()

    async def send(self, outbound: Outbound) -> None:
        self.clear_waiting()
        self._leave_prompt()
        streamed, self._streamed = self._streamed, ""
        if streamed and outbound.kind == "reply":
            # Shown piece by piece already; what the turn added at the end (a note that the
            # answer was cut off, say) is still to show.
            # (A stopped reply ends where it was stopped, less trailing spaces, then its mark.)
            shown = streamed.rstrip()
            rest = outbound.text[len(shown):] if outbound.text.startswith(shown) else ""
            self.out.write(f"{rest}\n")
        else:
            if streamed:
                self.out.write("\n")  # a notice in the middle of a streamed reply
            prefix = "[roost] " if outbound.kind == "notice" else "roost> "
            # An approval question is Markdown with every character of the call escaped (so
            # that nothing in it can format the rest): the terminal shows it as plain text.
            text = to_plain(outbound.text) if outbound.buttons else outbound.text
            self.out.write(f"{prefix}{text}\n")
            if outbound.buttons:  # an approval question: answered on the next line
                self.out.write(keys_line(outbound.buttons) + "\n")
        if self.prompt:  # a late answer: the prompt, and what was typed, drawn again
            self.out.write(self.prompt())
        self.out.flush()


def keys_line(buttons: Sequence[Button]) -> str:
    """An approval question's buttons as the terminal offers them: `[y] Allow once  ...`."""
    keys = {choice: key for key, choice in KEYS.items()}
    return "  ".join(f"[{keys[parsed[1]]}] {b.label}" for b in buttons
                     if (parsed := parse(b.id)) is not None)


async def read_line(prompt: str | None) -> str | None:
    """One line from stdin without blocking the loop; None at end of input (Ctrl-D).

    A daemon thread rather than the default executor: a read still blocked at exit must not
    keep the process alive.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[str | None] = loop.create_future()

    def read() -> None:
        try:
            line: str | None = input(prompt) if prompt is not None else sys.stdin.readline()
            if prompt is None and line == "":
                line = None
            elif line is not None:
                line = line.rstrip("\n")
        except EOFError:
            line = None
        def deliver() -> None:
            if not future.done():  # the chat may have been left (Ctrl-C) while we waited
                future.set_result(line)

        loop.call_soon_threadsafe(deliver)

    threading.Thread(target=read, name="roost-console-input", daemon=True).start()
    return await future
