"""A model that has gone quiet mid-answer, said to the chat at once.

A model server can stop answering without closing the connection (a stopped process, a hung
GPU runner): the request then fails only at `model.timeout` (300 s by default), and until then
the chat would see nothing at all. So while a call of the turn holds the model, its stream is
watched: once it has brought nothing (no content, no piece of thinking) for `model.stall`, the
watch says so (`said`), and again after each further `stall` while the silence lasts, so a
preview that the platform lets expire is renewed with the time grown. The first piece that
comes ends the silence (`heard`). The request itself is untouched: it goes on, and fails at
`model.timeout` as before.

The gate counts the calls that are silent now (`ModelGate.silent_calls`): /healthz says
"model silent" for as long as a chat is being told so.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from daemon.llm.gate import ModelGate

STALL_LINE = "the model has not said anything for {seconds} s; still waiting, /stop to give up"


def stall_line(seconds: float) -> str:
    """The line about a silence of `seconds`, as the chat shows it."""
    return STALL_LINE.format(seconds=f"{seconds:.0f}" if seconds >= 10 else f"{seconds:g}")


class SilenceWatch:
    """Watches one turn's calls for silence (see the module docstring); `said(seconds)` is
    awaited each time the silence has lasted another `after` seconds."""

    def __init__(self, after: float, said: Callable[[float], Awaitable[None]],
                 gate: ModelGate) -> None:
        self.after = after
        self.said = said
        self.gate = gate
        self._last = 0.0  # loop time of the last piece, or of the call's start
        self._told = 0  # how often this silence was said

    def heard(self) -> bool:
        """A piece came; True when it ends a silence that was said."""
        self._last = asyncio.get_running_loop().time()
        was = self._told > 0
        if was:
            self._told = 0
            self.gate.silence_ended()
        return was

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        """Watch while the block runs (one call holding the model)."""
        self._last = asyncio.get_running_loop().time()
        task = asyncio.create_task(self._watch(), name="roost-silence")
        try:
            yield
        finally:
            task.cancel()
            await asyncio.wait([task])
            if self._told:
                self._told = 0
                self.gate.silence_ended()

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = self._last + self.after * (self._told + 1)
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
                continue  # look again: a piece may have come meanwhile
            if not self._told:
                self.gate.silence_began()
            self._told += 1
            await self.said(self.after * self._told)
