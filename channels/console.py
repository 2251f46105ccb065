"""`roost chat`: a conversation in the terminal through the same engine and store as the daemon.

Replies stream token by token. Ctrl-D or Ctrl-C leaves; everything is already on disk, and a
message interrupted mid-answer is answered at the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from typing import TextIO

from daemon.core.config import Settings
from daemon.core.errors import LLMError, LLMUnavailable, StoreError
from daemon.core.messages import Inbound, Outbound
from daemon.core.redact import redact_url
from daemon.engine.workers import Engine
from daemon.llm.client import ModelClient
from daemon.store import Store

CHAT_KEY = "console:local"
EX_UNAVAILABLE = 69  # sysexits.h: a service this command needs is not available
EX_CANTCREAT = 73  # sysexits.h: the state directory cannot be used


class ConsoleChannel:
    """Writes replies to a text stream; streamed pieces first, the finished reply closes them."""

    name = "console"

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self._streamed = ""  # what this reply showed so far, piece by piece

    def working(self, chat_key: str) -> contextlib.AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()

    def stream_delta(self, chat_key: str, delta: str) -> None:
        if not self._streamed:
            self.out.write("roost> ")
        self._streamed += delta
        self.out.write(delta)
        self.out.flush()

    async def send(self, outbound: Outbound) -> None:
        streamed, self._streamed = self._streamed, ""
        if streamed and outbound.kind == "reply":
            # Shown piece by piece already; what the turn added at the end (a note that the
            # answer was cut off, say) is still to show.
            rest = outbound.text[len(streamed):] if outbound.text.startswith(streamed) else ""
            self.out.write(f"{rest}\n")
            self.out.flush()
            return
        if streamed:
            self.out.write("\n")  # a notice in the middle of a streamed reply
        prefix = "[roost] " if outbound.kind == "notice" else "roost> "
        self.out.write(f"{prefix}{outbound.text}\n")
        self.out.flush()


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


async def chat(settings: Settings, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Run the terminal chat until end of input or Ctrl-C; returns the exit status."""
    llm = ModelClient(settings.model)
    try:
        pulled = await llm.pulled_models()
    except LLMUnavailable:
        await llm.close()
        err.write(f"roost: cannot reach Ollama at {redact_url(settings.model.host)}: start it with "
                  "`ollama serve`, or point [model] host in roost.toml at it\n")
        return EX_UNAVAILABLE
    except LLMError as exc:
        await llm.close()
        err.write(f"roost: Ollama at {redact_url(settings.model.host)} answered badly: {exc}\n")
        return EX_UNAVAILABLE
    if not _is_pulled(settings.model.name, pulled):
        err.write(f"roost: model {settings.model.name!r} is not on "
                  f"{redact_url(settings.model.host)}; "
                  f"pull it with `ollama pull {settings.model.name}`\n")
    try:
        store = await asyncio.to_thread(Store.open, settings.daemon.state_dir)
    except StoreError as exc:
        await llm.close()
        err.write(f"roost: {exc}\n")
        return EX_CANTCREAT
    console = ConsoleChannel(out)
    engine = Engine(settings=settings, store=store, llm=llm, channels={"console": console})
    interactive = sys.stdin.isatty()
    try:
        await engine.start()
        await engine.wait_idle(CHAT_KEY)
        out.write(f"roost chat with {settings.model.name}. /help for commands, "
                  "Ctrl-D to leave.\n")
        out.flush()
        while (line := await read_line("you> " if interactive else None)) is not None:
            if not line.strip():
                continue
            await engine.submit(Inbound(chat_key=CHAT_KEY, text=line, received=engine.clock()))
            await engine.wait_idle(CHAT_KEY)
    except asyncio.CancelledError:
        out.write("\n")  # Ctrl-C: leave as cleanly as Ctrl-D
    finally:
        await engine.stop(grace=0)
        await llm.close()
        store.close()
    out.write("Saved. Bye.\n")
    out.flush()
    return 0


def _is_pulled(name: str, pulled: list[str]) -> bool:
    full = name if ":" in name else f"{name}:latest"
    return full in pulled or name in pulled
