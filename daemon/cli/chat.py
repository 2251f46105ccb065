"""`roost chat`: a conversation in the terminal, the chat `console:local`.

While the daemon runs, the terminal talks to it over the socket in the state directory
(daemon/app/chat_socket.py says why a socket rather than sharing the store); otherwise it opens
the store and runs the same engine itself. Either way replies stream token by token, an
indicator shows (on a terminal) until the first one, a `/command` roost does not know is
answered here and never reaches the model, and the prompt comes back when the model is down:
the message is kept and answered once Ollama is back. Line editing and history come from
readline, the history in the state directory (0600). Ctrl-C while a reply is written stops it
(what it wrote is kept, marked "(stopped)"), like /stop; Ctrl-D or Ctrl-C at the prompt leaves.
Everything is on disk already, and a message interrupted mid-answer is answered at the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import readline  # imported for its effect: input() gets line editing, and its prompt on stdout
import signal
import socket
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TextIO

from channels.console import CHAT_KEY, ConsoleChannel, read_line
from daemon.app.assembly import Runs, core
from daemon.app.chat_socket import SOCKET_NAME
from daemon.core.config import Settings
from daemon.core.errors import LLMError, LLMUnavailable, StoreError
from daemon.core.messages import Inbound, Outbound, ReplySink
from daemon.core.redact import redact_url
from daemon.engine.chat_commands import Commands
from daemon.engine.facts_commands import FactsCommands
from daemon.llm.client import ModelClient
from daemon.store import Store

EX_CANTCREAT = 73  # sysexits.h: the state directory cannot be used
HISTORY_FILE = "chat_history"
HISTORY_LENGTH = 1000
# Send one line; return once the chat is idle or an answer was shown (so a model outage, told
# in a notice, gives the prompt back while the message waits).
Ask = Callable[[str], Awaitable[None]]
# Stop the reply being written; False when none is (then Ctrl-C leaves).
StopReply = Callable[[], bool]
COMMANDS = Commands.names | FactsCommands.names
COMMAND_WORD = re.compile(r"[a-z0-9_]{1,32}")


class _Shown:
    """The console channel, noting when an answer (a reply or a notice) was shown."""

    name = "console"

    def __init__(self, console: ConsoleChannel) -> None:
        self.console = console
        self.answered = asyncio.Event()

    def working(self, chat_key: str) -> contextlib.AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()

    def streaming(self, chat_key: str) -> contextlib.AbstractAsyncContextManager[ReplySink]:
        return self.console.streaming(chat_key)

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
        async with _ctrl_c_wakes_the_loop(), _session(settings, shown, err) as (ask, stop_reply):
            out.write(f"roost chat with {settings.model.name}. /help for commands, "
                      "Ctrl-D to leave.\n")
            out.flush()
            with _logs_above_the_prompt(shown.console, err, interactive):
                await _converse(ask, stop_reply, shown, out, interactive)
    except StoreError as exc:
        err.write(f"roost: {exc}\n")
        return EX_CANTCREAT
    finally:
        if interactive:
            _save_history(state_dir / HISTORY_FILE)
    out.write("Saved. Bye.\n")
    out.flush()
    return 0


async def _converse(ask: Ask, stop_reply: StopReply, shown: _Shown, out: TextIO,
                    interactive: bool) -> None:
    try:
        while (line := await _prompted(shown.console, interactive)) is not None:
            if not line.strip():
                continue
            command = Inbound(chat_key=CHAT_KEY, text=line, received=0).command
            # Only what reads as a command (`/bogus`, Telegram's syntax); "/etc/hosts?" is words.
            if command is not None and COMMAND_WORD.fullmatch(command) and command not in COMMANDS:
                out.write(f"[roost] /{command} is not a command; /help lists them. Nothing "
                          "was sent to the model.\n")
                out.flush()
                continue
            shown.answered.clear()
            shown.console.show_waiting()
            with _ctrl_c_stops_the_reply(stop_reply):
                await ask(line)
            shown.console.clear_waiting()  # nothing came (the daemon stopped, say)
    except asyncio.CancelledError:
        out.write("\n")  # Ctrl-C: leave as cleanly as Ctrl-D


PROMPT = "you> "


async def _prompted(console: ConsoleChannel, interactive: bool) -> str | None:
    """The next line; on a terminal, what arrives meanwhile is written above the prompt."""
    if not interactive:
        return await read_line(None)
    console.prompt = lambda: PROMPT + readline.get_line_buffer()
    try:
        return await read_line(PROMPT)
    finally:
        console.prompt = None


class _AbovePrompt(logging.Handler):
    """Log lines on a terminal go above the prompt (or the indicator), never onto it."""

    def __init__(self, console: ConsoleChannel, err: TextIO) -> None:
        super().__init__()
        self.console, self.err = console, err

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.console.interject(self.format(record), self.err)
        except Exception:  # logging's own rule: a log line never raises
            self.handleError(record)


@contextlib.contextmanager
def _logs_above_the_prompt(console: ConsoleChannel, err: TextIO,
                           interactive: bool) -> Iterator[None]:
    top = logging.getLogger()
    saved = top.handlers[:]
    if not interactive or not saved:
        yield
        return
    handler = _AbovePrompt(console, err)
    handler.setFormatter(saved[0].formatter)  # the same form and credential filter as before
    for kept in saved[0].filters:
        handler.addFilter(kept)
    top.handlers[:] = [handler]
    try:
        yield
    finally:
        top.handlers[:] = saved


@contextlib.asynccontextmanager
async def _session(settings: Settings, shown: _Shown,
                   err: TextIO) -> AsyncIterator[tuple[Ask, StopReply]]:
    path = settings.daemon.state_dir / SOCKET_NAME
    try:
        reader, writer = await asyncio.open_unix_connection(path, limit=1 << 20)
    except OSError:  # no daemon (no socket, or one left by a daemon that died): run it here
        async with _local(settings, shown, err) as session:
            yield session
        return
    async with _remote(reader, writer, shown) as session:
        yield session


@contextlib.asynccontextmanager
async def _remote(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  shown: _Shown) -> AsyncIterator[tuple[Ask, StopReply]]:
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
                shown.console.write(str(message["delta"]))
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

    def stop_reply() -> bool:
        # The daemon's engine acts on /stop the moment it arrives (and says nothing more when
        # it stopped a reply), so Ctrl-C is the same as typing /stop.
        if receiving.done():
            return False
        writer.write(json.dumps({"text": "/stop"}).encode() + b"\n")
        return True

    try:
        yield ask, stop_reply
    finally:
        receiving.cancel()
        writer.close()
        with contextlib.suppress(asyncio.CancelledError, OSError, StoreError, ValueError):
            await receiving


@contextlib.asynccontextmanager
async def _local(settings: Settings, shown: _Shown,
                 err: TextIO) -> AsyncIterator[tuple[Ask, StopReply]]:
    llm = ModelClient(settings.model)
    try:
        await _check_model(llm, settings, err)
        store = await asyncio.to_thread(Store.open, settings.daemon.state_dir)
    except StoreError:
        await llm.close()
        raise
    # The MCP servers start with the chat (waited for, bounded, so that the first message
    # finds their tools); one that does not come up is said once.
    try:
        async with core(settings, store, llm, {"console": shown}, Runs.CHAT) as built:
            engine = built.engine
            approvals = built.parts.approvals
            assert approvals is not None  # TurnParts.build makes them

            async def ask(line: str) -> None:
                # y, a or n while an approval question waits answers it (the daemon's chat
                # socket does the same); anything else is a message.
                if not await approvals.answer_typed(CHAT_KEY, line):
                    await engine.submit(Inbound(chat_key=CHAT_KEY, text=line,
                                                received=engine.clock()))
                await _first(engine.wait_idle(CHAT_KEY), shown.answered.wait())

            for down in built.servers.down():
                err.write(f"roost: MCP server {down.name} is not available: {down.error}\n")
            await engine.release(CHAT_KEY)  # what a daemon kept for a terminal is first
            await _first(engine.wait_idle(CHAT_KEY), shown.answered.wait())
            yield ask, lambda: engine.stop_reply(CHAT_KEY)
    finally:
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


@contextlib.asynccontextmanager
async def _ctrl_c_wakes_the_loop() -> AsyncIterator[None]:
    """The kernel may hand Ctrl-C to any thread, say the one blocked reading the prompt; Python
    runs its handler on the main thread, which sleeps in the loop until something wakes it.
    A wakeup fd the loop watches is that something (only the main thread may set one)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    woken, wake = socket.socketpair()
    woken.setblocking(False)
    wake.setblocking(False)
    loop.add_reader(woken, lambda: woken.recv(64))  # only drained: the handler does the rest
    previous = signal.set_wakeup_fd(wake.fileno(), warn_on_full_buffer=False)
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        loop.remove_reader(woken)
        woken.close()
        wake.close()


@contextlib.contextmanager
def _ctrl_c_stops_the_reply(stop_reply: StopReply) -> Iterator[None]:
    """While a reply is being written, Ctrl-C stops it instead of the program; otherwise
    asyncio.run's own handler runs (it cancels the chat: leave), and is put back after."""
    loop = asyncio.get_running_loop()
    previous = signal.getsignal(signal.SIGINT)

    def stop(signum: int, frame: FrameType | None) -> None:
        def stop_or_leave() -> None:
            # Nothing being written (the reply is out, or not begun): Ctrl-C leaves, as always.
            if not stop_reply() and callable(previous):
                previous(signum, frame)

        loop.call_soon_threadsafe(stop_or_leave)

    signal.signal(signal.SIGINT, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
