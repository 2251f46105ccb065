"""`roost chat`: a conversation in the terminal through the same engine and store as the daemon.

Replies stream token by token; Ctrl-C while one is written stops it (what it wrote is kept,
marked "(stopped)"), like /stop. Ctrl-D or Ctrl-C at the prompt leaves; everything is
already on disk, and a message interrupted mid-answer is answered at the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Iterator
from types import FrameType
from typing import TextIO

from channels.console import CHAT_KEY, ConsoleChannel, read_line
from daemon.core.config import Settings
from daemon.core.errors import LLMError, LLMUnavailable, StoreError
from daemon.core.messages import Inbound
from daemon.core.redact import redact_url
from daemon.engine.workers import Engine
from daemon.llm.client import ModelClient
from daemon.store import Store

EX_UNAVAILABLE = 69  # sysexits.h: a service this command needs is not available
EX_CANTCREAT = 73  # sysexits.h: the state directory cannot be used


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
            with _ctrl_c_stops_the_reply(engine):
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


@contextlib.contextmanager
def _ctrl_c_stops_the_reply(engine: Engine) -> Iterator[None]:
    """While a reply is being written, Ctrl-C stops it instead of the program; otherwise
    asyncio.run's own handler runs (it cancels the chat: leave), and is put back after."""
    loop = asyncio.get_running_loop()
    previous = signal.getsignal(signal.SIGINT)

    def stop(signum: int, frame: FrameType | None) -> None:
        def stop_or_leave() -> None:
            # Nothing being written (the reply is out, or not begun): Ctrl-C leaves, as always.
            if not engine.stop_reply(CHAT_KEY) and callable(previous):
                previous(signum, frame)

        loop.call_soon_threadsafe(stop_or_leave)

    signal.signal(signal.SIGINT, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _is_pulled(name: str, pulled: list[str]) -> bool:
    full = name if ":" in name else f"{name}:latest"
    return full in pulled or name in pulled
