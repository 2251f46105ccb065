"""`roost chat`: a conversation in the terminal, the chat `console:local`.

While the daemon runs, the terminal talks to it over the socket in the state directory
(daemon/app/chat_socket.py says why a socket rather than sharing the store); otherwise it opens
the store and runs the same engine itself. Either way replies stream token by token, an
indicator shows (on a terminal) until the first one, a `/command` roost does not know is
answered here and never reaches the model, and the prompt comes back when the model is down:
the message is kept and answered once Ollama is back. Line editing and history come from
readline, the history in the state directory (0600). Ctrl-D or Ctrl-C leaves; everything is on
disk already.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import readline  # imported for its effect: input() gets line editing, and its prompt on stdout
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TextIO

from channels.console import CHAT_KEY, ConsoleChannel, read_line
from daemon.app.chat_socket import SOCKET_NAME
from daemon.core.config import Settings
from daemon.core.errors import LLMError, LLMUnavailable, StoreError
from daemon.core.messages import Inbound, Outbound
from daemon.core.redact import redact_url
from daemon.engine.chat_commands import Commands
from daemon.engine.workers import Engine
from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.tools.mcp.servers import with_servers
from daemon.turn.parts import TurnParts, builtin_registry

EX_CANTCREAT = 73  # sysexits.h: the state directory cannot be used
HISTORY_FILE = "chat_history"
HISTORY_LENGTH = 1000
# Send one line; return once the chat is idle or an answer was shown (so a model outage, told
# in a notice, gives the prompt back while the message waits).
Ask = Callable[[str], Awaitable[None]]


class _Shown:
    """The console channel, noting when an answer (a reply or a notice) was shown."""

    name = "console"

    def __init__(self, console: ConsoleChannel) -> None:
        self.console = console
        self.answered = asyncio.Event()

    def working(self, chat_key: str) -> contextlib.AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()

    def stream_delta(self, chat_key: str, delta: str) -> None:
        self.console.stream_delta(chat_key, delta)

    async def send(self, outbound: Outbound) -> None:
        await self.console.send(outbound)
        self.answered.set()


async def chat(settings: Settings, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Run the terminal chat until end of input or Ctrl-C; returns the exit status."""
    interactive = sys.stdin.isatty()
    shown = _Shown(ConsoleChannel(out, indicator=interactive))
    state_dir = settings.daemon.state_dir
    if interactive:  # before anything can fail: the history saved at the end includes it
        _load_history(state_dir / HISTORY_FILE)
    try:
        async with _session(settings, shown, err) as ask:
            out.write(f"roost chat with {settings.model.name}. /help for commands, "
                      "Ctrl-D to leave.\n")
            out.flush()
            await _converse(ask, shown, out, interactive)
    except StoreError as exc:
        err.write(f"roost: {exc}\n")
        return EX_CANTCREAT
    finally:
        if interactive:
            _save_history(state_dir / HISTORY_FILE)
    out.write("Saved. Bye.\n")
    out.flush()
    return 0


async def _converse(ask: Ask, shown: _Shown, out: TextIO, interactive: bool) -> None:
    try:
        while (line := await read_line("you> " if interactive else None)) is not None:
            if not line.strip():
                continue
            command = Inbound(chat_key=CHAT_KEY, text=line, received=0).command
            if command is not None and command not in Commands.names:
                out.write(f"[roost] /{command} is not a command; /help lists them. Nothing "
                          "was sent to the model.\n")
                out.flush()
                continue
            shown.answered.clear()
            shown.console.show_waiting()
            await ask(line)
            shown.console.clear_waiting()  # nothing came (the daemon stopped, say)
    except asyncio.CancelledError:
        out.write("\n")  # Ctrl-C: leave as cleanly as Ctrl-D


@contextlib.asynccontextmanager
async def _session(settings: Settings, shown: _Shown, err: TextIO) -> AsyncIterator[Ask]:
    path = settings.daemon.state_dir / SOCKET_NAME
    try:
        reader, writer = await asyncio.open_unix_connection(path, limit=1 << 20)
    except OSError:  # no daemon (no socket, or one left by a daemon that died): run it here
        async with _local(settings, shown, err) as ask:
            yield ask
        return
    async with _remote(reader, writer, shown) as ask:
        yield ask


@contextlib.asynccontextmanager
async def _remote(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  shown: _Shown) -> AsyncIterator[Ask]:
    try:
        hello = json.loads(await asyncio.wait_for(reader.readline(), 10) or b"{}")
    except (TimeoutError, ValueError, OSError):
        hello = {}
    if not hello.get("ready"):
        writer.close()
        raise StoreError(f"the running roost does not take a chat now: "
                         f"{hello.get('busy', 'it did not answer')}")
    idle = asyncio.Event()

    async def receive() -> None:
        while line := await reader.readline():
            message = json.loads(line)
            if "delta" in message:
                shown.stream_delta(CHAT_KEY, str(message["delta"]))
            elif "send" in message:
                sent = message["send"]
                await shown.send(Outbound(chat_key=CHAT_KEY, text=str(sent["text"]), created=0,
                                          kind=sent["kind"]))
            elif message.get("idle"):
                idle.set()
        idle.set()  # the daemon stopped: nothing more comes

    receiving = asyncio.create_task(receive())

    async def ask(line: str) -> None:
        if receiving.done():
            raise StoreError("the daemon closed the chat (it stopped); run roost chat again")
        idle.clear()
        writer.write(json.dumps({"text": line}, ensure_ascii=False).encode() + b"\n")
        await writer.drain()
        await _first(idle.wait(), shown.answered.wait(), receiving)

    try:
        yield ask
    finally:
        receiving.cancel()
        writer.close()
        with contextlib.suppress(asyncio.CancelledError, OSError, StoreError, ValueError):
            await receiving


@contextlib.asynccontextmanager
async def _local(settings: Settings, shown: _Shown, err: TextIO) -> AsyncIterator[Ask]:
    llm = ModelClient(settings.model)
    try:
        await _check_model(llm, settings, err)
        store = await asyncio.to_thread(Store.open, settings.daemon.state_dir)
    except StoreError:
        await llm.close()
        raise
    # The MCP servers start with the chat (waited for, bounded, so that the first message
    # finds their tools); one that does not come up is said once.
    registry, servers = await asyncio.to_thread(with_servers, settings.mcp,
                                                settings.daemon.state_dir,
                                                builtin_registry(settings))
    parts = TurnParts.build(settings=settings, store=store, llm=llm, registry=registry)
    engine = Engine(settings=settings, store=store, llm=llm, channels={"console": shown},
                    parts=parts)
    approvals = parts.approvals
    assert approvals is not None  # TurnParts.build makes them

    async def ask(line: str) -> None:
        # y, a or n while an approval question waits answers it (the daemon's chat socket
        # does the same); anything else is a message.
        if not await approvals.answer_typed(CHAT_KEY, line):
            await engine.submit(Inbound(chat_key=CHAT_KEY, text=line, received=engine.clock()))
        await _first(engine.wait_idle(CHAT_KEY), shown.answered.wait())

    try:
        await servers.start()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(servers.wait_started(), settings.mcp.start_timeout)
        for down in servers.down():
            err.write(f"roost: MCP server {down.name} is not available: {down.error}\n")
        await engine.start()
        await _first(engine.wait_idle(CHAT_KEY), shown.answered.wait())
        yield ask
    finally:
        await engine.stop(grace=0)
        await servers.stop()
        await llm.close()
        store.close()


async def _check_model(llm: ModelClient, settings: Settings, err: TextIO) -> None:
    """Say what is wrong with the model before the first prompt; never stop for it."""
    where = redact_url(settings.model.host)
    try:
        pulled = await llm.pulled_models()
    except LLMUnavailable:
        err.write(f"roost: cannot reach Ollama at {where} (start it with `ollama serve`, or "
                  "point [model] host at it); what you write is kept and answered once it "
                  "is back\n")
        return
    except LLMError as exc:
        err.write(f"roost: Ollama at {where} answered badly: {exc}\n")
        return
    name = settings.model.name
    if (name if ":" in name else f"{name}:latest") not in pulled and name not in pulled:
        err.write(f"roost: model {name!r} is not on {where}; pull it with "
                  f"`ollama pull {name}`\n")


async def _first(*waits: Awaitable[object]) -> None:
    """Return when the first of these finishes; cancel the others (but not a task given)."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task, wait in zip(tasks, waits, strict=True):
            if task is not wait:
                task.cancel()


def _load_history(path: Path) -> None:
    readline.set_history_length(HISTORY_LENGTH)
    with contextlib.suppress(OSError):  # none yet, or unreadable: start without it
        readline.read_history_file(path)


def _save_history(path: Path) -> None:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        readline.write_history_file(path)  # the CLI's umask (077) makes it 0600
        path.chmod(0o600)
    except OSError as exc:
        print(f"roost: cannot save the chat history to {path}: {exc.strerror}", file=sys.stderr)
