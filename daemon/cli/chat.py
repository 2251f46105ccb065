"""`roost chat`: a conversation in the terminal through the same engine and store as the daemon.

Replies stream token by token. Ctrl-D or Ctrl-C leaves; everything is already on disk, and a
message interrupted mid-answer is answered at the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import TextIO

from channels.console import CHAT_KEY, ConsoleChannel, read_line
from daemon.cli.approving import wait_answering
from daemon.core.config import Settings
from daemon.core.errors import LLMError, LLMUnavailable, StoreError
from daemon.core.messages import Inbound
from daemon.core.redact import redact_url
from daemon.engine.workers import Engine
from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.tools.mcp.servers import with_servers
from daemon.turn.parts import TurnParts

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
    registry, servers = await asyncio.to_thread(with_servers, settings.mcp,
                                                settings.daemon.state_dir)
    parts = TurnParts.build(settings=settings, store=store, llm=llm, registry=registry)
    engine = Engine(settings=settings, store=store, llm=llm, channels={"console": console},
                    parts=parts)
    interactive = sys.stdin.isatty()
    try:
        await servers.start()
        # A terminal chat starts its MCP servers itself: wait for them (bounded), so that the
        # first message finds their tools; one that does not come up is said once.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(servers.wait_started(), settings.mcp.start_timeout)
        for down in servers.down():
            err.write(f"roost: MCP server {down.name} is not available: {down.error}\n")
        await engine.start()
        await wait_answering(engine, CHAT_KEY, read_line, interactive)
        out.write(f"roost chat with {settings.model.name}. /help for commands, "
                  "Ctrl-D to leave.\n")
        out.flush()
        while (line := await read_line("you> " if interactive else None)) is not None:
            if not line.strip():
                continue
            await engine.submit(Inbound(chat_key=CHAT_KEY, text=line, received=engine.clock()))
            await wait_answering(engine, CHAT_KEY, read_line, interactive)
    except asyncio.CancelledError:
        out.write("\n")  # Ctrl-C: leave as cleanly as Ctrl-D
    finally:
        await engine.stop(grace=0)
        await servers.stop()
        await llm.close()
        store.close()
    out.write("Saved. Bye.\n")
    out.flush()
    return 0


def _is_pulled(name: str, pulled: list[str]) -> bool:
    full = name if ":" in name else f"{name}:latest"
    return full in pulled or name in pulled
