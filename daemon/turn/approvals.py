"""Asking the user before a tool that acts on the world runs.

A tool's `approve` policy (MCP tools: `approve` of its server, per tool `approve_tools`;
default "ask") decides: "never" runs it, "ask" asks unless the person said "Always for this
tool" before (remembered in `approvals.json`), "always" asks every time and offers no
"Always". The question goes to the chat as a notice with three buttons (Allow once / Always
for this tool / Deny); the turn waits for the answer with the model released (a fold may use
it meanwhile), at most `mcp.approve_timeout`: no answer counts as Deny. The model gets a result
that says what the user decided. A message that comes meanwhile waits in the inbox for the next
turn; the engine `nudge`s the question, whose turn tells the chat at once what it waits for.

Only the person the chat belongs to may answer: in a private chat its owner, in a group the
one whose message started the turn. A tap by anyone else is refused and logged. The waiting
questions live in this process only: after a restart the interrupted turn runs again (its
messages are still in the inbox), the model calls the tool again and the user is asked again;
a tap on the old question's buttons is answered "no longer waiting". Nothing runs unapproved.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from daemon.core.approval import (
    ANSWERED,
    KEYS,
    NOT_WAITING,
    NOT_YOURS,
    WAITING,
    WAITING_TYPED,
    Answer,
    Button,
    Choice,
    buttons,
)
from daemon.core.logs import turn_log as log
from daemon.core.platforms import platform_of
from daemon.store.approvals import ApprovalBook
from daemon.tools.registry import ERROR_PREFIX, Tool

# One chat message with room to spare (Telegram and WhatsApp both take 4,096 characters of text;
# WhatsApp's buttons then follow under a short body of their own): a question is never split and
# never cut, so its buttons never approve a part the user did not see. Counted in UTF-16 units,
# as Telegram counts; the channels' rendering only removes characters (markers, escapes).
QUESTION_MAX = 3500
WRAP = 48  # characters per line of the arguments' block: a phone shows the line whole
DESCRIBED = 300  # characters of the tool's own description: the server's words, not the call's
TOO_LONG = ("{tool} was called with arguments too long to show in one message, so I could not "
            "ask you about it; it was not run.")


class Ask(Protocol):
    """Send a notice with buttons to a chat (the engine's `notify`)."""

    async def __call__(self, chat_key: str, text: str, *,
                       buttons: tuple[Button, ...] = ()) -> None: ...


@dataclass
class _Waiting:
    chat_key: str
    person: str
    tool: str
    answer: asyncio.Future[Choice] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())
    nudged: asyncio.Event = field(default_factory=asyncio.Event)  # a message came meanwhile


class Approvals:
    """The questions waiting for an answer, and the standing yeses; see the module docstring."""

    def __init__(self, book: ApprovalBook, timeout: float, clock: Callable[[], float]) -> None:
        self.book = book
        self.timeout = timeout
        self.clock = clock
        self._waiting: dict[str, _Waiting] = {}
        self.changed = asyncio.Event()  # set whenever a question starts waiting (`roost chat`)

    def waiting_in(self, chat_key: str) -> list[str]:
        """The ids of the questions waiting for an answer in a chat, oldest first."""
        return [i for i, w in self._waiting.items()
                if w.chat_key == chat_key and not w.answer.done()]

    def nudge(self, chat_key: str) -> bool:
        """A message came in a chat: if a question waits there, its turn tells the chat at once
        that it waits (the message itself is answered after the turn). True if one waits."""
        waiting = [self._waiting[i] for i in self.waiting_in(chat_key)]
        for pending in waiting:
            pending.nudged.set()
        return bool(waiting)

    async def answer(self, answer: Answer) -> str:
        waiting = self._waiting.get(answer.approval_id)
        if waiting is None or waiting.answer.done():
            return NOT_WAITING
        if (answer.chat_key, answer.person) != (waiting.chat_key, waiting.person):
            log.warning("approval %s in %s answered by %s in %s, who may not; refused",
                        answer.approval_id, waiting.chat_key, answer.person, answer.chat_key)
            return NOT_YOURS
        waiting.answer.set_result(answer.choice)
        return ANSWERED[answer.choice]

    async def answer_typed(self, chat_key: str, text: str) -> bool:
        """`roost chat`: y (allow once), a (always) or n (deny) typed while a question waits
        in the terminal's chat answers the oldest; False for anything else (a message)."""
        waiting = self.waiting_in(chat_key)
        word = text.strip().lower()
        choice = KEYS.get({"yes": "y", "always": "a", "no": "n"}.get(word, word))
        if not waiting or choice is None:
            return False
        await self.answer(Answer(waiting[0], choice, chat_key, chat_key))
        return True

    async def check(self, tool: Tool, arguments: Mapping[str, Any], *, chat_key: str,
                    person: str | None, ask: Ask | None,
                    released: Callable[[], AbstractAsyncContextManager[None]]) -> str | None:
        """None when the call may run; else the result the model gets instead."""
        if tool.approve == "never":
            return None
        if (tool.approve == "ask" and person is not None
                and await asyncio.to_thread(self.book.allows, person, tool.name)):
            return None
        if ask is None or person is None:
            return (f"{ERROR_PREFIX}{tool.name} needs the user's approval, which cannot be "
                    "asked here (a scheduled run); it was not run.")
        asking = question(tool, arguments)
        if asking is None:
            await ask(chat_key, TOO_LONG.format(tool=tool.name))
            return (f"{ERROR_PREFIX}the arguments of this call of {tool.name} are too long to "
                    "show the user in one message for approval, so the user was not asked and it "
                    "was not run. Call it with fewer or shorter arguments.")
        approval_id = secrets.token_hex(6)
        waiting = _Waiting(chat_key, person, tool.name)
        self._waiting[approval_id] = waiting
        self.changed.set()
        self.changed = asyncio.Event()
        try:
            await ask(chat_key, asking,
                      buttons=buttons(approval_id, always=tool.approve == "ask"))
            log.info("asked %s to approve %s (%s)", chat_key, tool.name, approval_id)
            async with released():
                choice = await self._answer_of(waiting, ask)
        finally:
            del self._waiting[approval_id]
        log.info("approval %s for %s in %s: %s", approval_id, tool.name, chat_key,
                 choice.value if choice is not None else "no answer (denied)")
        if choice is None:
            minutes = f"{self.timeout / 60:.0f} minutes" if self.timeout >= 60 \
                else f"{self.timeout:.0f} seconds"
            await ask(chat_key, f"No answer within {minutes}: {tool.name} was not run.")
            return (f"{ERROR_PREFIX}the user did not answer the approval request for "
                    f"{tool.name} within {minutes}, so it was not run.")
        if choice is Choice.DENY:
            return (f"{ERROR_PREFIX}the user denied this call of {tool.name}; it was not run. "
                    "Do not call it again unless the user asks.")
        if choice is Choice.ALWAYS:
            await asyncio.to_thread(self.book.grant, person, tool.name, self.clock())
        return None

    async def _answer_of(self, waiting: _Waiting, ask: Ask) -> Choice | None:
        """The answer, None when none came in time; each message meanwhile is told at once
        what the chat waits for (from the turn, which owns the chat's outbox)."""
        try:
            async with asyncio.timeout(self.timeout):
                while True:
                    nudged = asyncio.ensure_future(waiting.nudged.wait())
                    try:
                        await asyncio.wait((waiting.answer, nudged),
                                           return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        nudged.cancel()
                    if waiting.answer.done():
                        return waiting.answer.result()
                    waiting.nudged.clear()
                    # Where there are no buttons to tap (the terminal, Matrix), it is typed.
                    typed = "buttons" not in getattr(platform_of(waiting.chat_key), "sends", ())
                    await ask(waiting.chat_key, WAITING_TYPED if typed else WAITING)
        except TimeoutError:
            return None


def question(tool: Tool, arguments: Mapping[str, Any]) -> str | None:
    """The question: every argument whole on lines of its own by name (nested ones by path),
    wrapped, in a code block; None when they do not fit one message (then nobody is asked)."""
    try:
        leaves = _leaves(arguments)
    except ValueError:  # more lines than fit: not showable
        return None
    lines = [line for path, value in leaves
             for line in _wrapped(f"{_path(path)}: {value}" if path else value)]
    shown = "\n".join(lines) if arguments else "(no arguments)"
    # A fence longer than any run of backticks inside: nothing in a value can close the block
    # early and have the rest read as Markdown (a link definition, say, shows nothing at all).
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall("`+", shown)), default=0))
    about = _clip(tool.description)
    text = (f"May I run **{_escaped(tool.name)}**?\n{_escaped(about)}\n\n"
            f"{fence}\n{shown}\n{fence}")
    return text if _units(text) <= QUESTION_MAX else None


def _leaves(arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(path, JSON value) for each scalar or empty container, in order; iterative, since the
    model's arguments may nest deeper than the stack."""
    found: list[tuple[str, str]] = []
    stack: list[tuple[str, Any]] = [("", dict(arguments))]
    while stack:
        path, value = stack.pop()
        if isinstance(value, Mapping) and value:
            stack.extend(reversed([(f"{path}.{k}" if path else str(k), v)
                                   for k, v in value.items()]))
        elif isinstance(value, list) and value and path:
            stack.extend(reversed([(f"{path}[{i}]", v) for i, v in enumerate(value)]))
        else:
            found.append((path, _shown(value)))
        if len(found) > QUESTION_MAX // 4:  # each line takes 4 or more: stop walking
            raise ValueError("too many arguments to show")
    return found


def _shown(value: Any) -> str:
    """A value as JSON, with every character that prints as nothing or turns the text around
    (controls, bidi overrides, zero-width ones: what `str.isprintable` refuses) as its escape."""
    return _visible(json.dumps(value, ensure_ascii=False))


def _visible(text: str) -> str:
    return "".join(c if c.isprintable() else
                   (f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}")
                   for c in text)


def _path(path: str) -> str:
    """A plain path as it is; any other key quoted like a value, so that no key can pass for
    the wrapping of the line before or for a second argument."""
    return path if _PLAIN_PATH.fullmatch(path) else _shown(path)


_PLAIN_PATH = re.compile(r"[\w\-]+(?:(?:\.[\w\-]+)|\[\d+\])*")


def _wrapped(line: str) -> list[str]:
    """`line` in pieces of WRAP characters, the later ones indented: an argument's line starts
    at the margin, its continuation never does (JSON has no line break of its own)."""
    pieces = [line[:WRAP]]
    pieces += ["  " + line[at:at + WRAP - 2] for at in range(WRAP, len(line), WRAP - 2)]
    return pieces


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= DESCRIBED else text[:DESCRIBED - 1] + "…"


def _escaped(text: str) -> str:
    """Text shown as it is in Markdown: every ASCII punctuation mark backslash-escaped, so the
    server's words cannot open a code block, a link or anything else."""
    return re.sub(r"([!-/:-@\[-`{-~])", r"\\\1", _visible(text))


def _units(text: str) -> int:
    """UTF-16 code units, as Telegram counts a message's length."""
    return len(text) + sum(1 for c in text if ord(c) > 0xFFFF)


Approve = Callable[[Tool, Mapping[str, Any]], Awaitable[str | None]]
