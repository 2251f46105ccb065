"""`roost chat` while the daemon runs: the terminal talks to the daemon's engine over a Unix
socket in the state directory.

Why a socket and not a shared store: the store has one writer (it holds `roost.lock`) and serves
what it read from memory, so a second process writing the same files would be overwritten or
unseen. The daemon already owns the store, the engine and the model slot; the chat becomes one
more channel of it ("console"), and the terminal only shows what it sends. Who may connect is
who may read the state directory: the socket lives in it (0700, owner only) and is itself 0600.

The protocol is one JSON object a line. The terminal sends `{"text": ...}`; the daemon answers
`{"ready": true}` first (or `{"busy": ...}` and closes), then
`{"delta": ...}` for each piece of a streamed reply, `{"send": {"kind", "text"}}` for a finished
reply or a notice, and `{"idle": true}` once the chat has nothing pending. One terminal at a
time: a second one is told so and closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from pathlib import Path
from typing import Any

from channels.console import CHAT_KEY, keys_line
from daemon.core.errors import DeliveryError
from daemon.core.messages import Inbound, Outbound, ReplySink
from daemon.engine.workers import Engine

SOCKET_NAME = "chat.sock"
MAX_LINE = 1 << 20  # one message typed or pasted into the terminal
log = logging.getLogger("roost.chat")


class ChatSocket:
    """The console channel of a running daemon: replies go to the connected terminal."""

    name = "console"

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / SOCKET_NAME
        self.engine: Engine | None = None
        self._server: asyncio.Server | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # ---- the channel ------------------------------------------------------------------------

    def working(self, chat_key: str) -> contextlib.AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()

    def streaming(self, chat_key: str) -> contextlib.AbstractAsyncContextManager[ReplySink]:
        return contextlib.nullcontext(self)

    def write(self, delta: str) -> None:
        self._write({"delta": delta})

    def status(self, line: str) -> None:
        """Not shown: the terminal shows the words as they come, as `roost chat` alone does."""

    async def send(self, outbound: Outbound) -> None:
        if self._writer is None or self._writer.is_closing():
            # Nobody to show it to (an automation's report to console:local, say): it waits in
            # the outbox, across restarts too, and is shown when a terminal connects.
            raise DeliveryError("no roost chat is connected", window_closed=True)
        text = outbound.text
        if outbound.buttons:  # an approval question: y, a or n typed next answers it
            text += "\n" + keys_line(outbound.buttons)
        self._write({"send": {"kind": outbound.kind, "text": text}})

    # ---- the socket -------------------------------------------------------------------------

    async def start(self, engine: Engine) -> None:
        self.engine = engine
        self.path.unlink(missing_ok=True)  # left by a daemon that died: nobody listens there
        self._server = await asyncio.start_unix_server(self._serve, self.path, limit=MAX_LINE)
        self.path.chmod(0o600)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._writer is not None:
            self._writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.path.unlink(missing_ok=True)

    def _write(self, message: dict[str, Any]) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(json.dumps(message, ensure_ascii=False).encode() + b"\n")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._writer is not None:
            writer.write(json.dumps({"busy": "another roost chat is connected"}).encode() + b"\n")
            writer.close()
            return
        self._writer = writer
        self._write({"ready": True})
        assert self.engine is not None
        await self.engine.release(CHAT_KEY)  # what waited for a terminal is shown first
        try:
            while line := await reader.readline():
                try:
                    text = str(json.loads(line)["text"])
                except (ValueError, KeyError, TypeError):
                    log.warning("roost chat sent a line that is not {\"text\": ...}; ignored")
                    continue
                await self._submit(text)
        except (ConnectionError, asyncio.LimitOverrunError, ValueError) as exc:
            log.info("roost chat left: %s", exc)
        finally:
            self._writer = None
            writer.close()

    async def _submit(self, text: str) -> None:
        assert self.engine is not None
        engine = self.engine
        approvals = engine.parts.approvals
        if approvals is not None and await approvals.answer_typed(CHAT_KEY, text):
            pass  # y, a or n to the approval question waiting in this chat: not a message
        elif not await engine.submit(Inbound(chat_key=CHAT_KEY, text=text,
                                             received=engine.clock())):
            self._write({"send": {"kind": "notice", "text": "roost is stopping; try again "
                                                            "once it runs"}})
            self._write({"idle": True})
            return
        task = asyncio.create_task(self._report_idle(engine))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _report_idle(self, engine: Engine) -> None:
        await engine.wait_idle(CHAT_KEY)
        self._write({"idle": True})
