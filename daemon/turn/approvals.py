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
one whose message started the turn. A tap by anyone else is refused and logged.

A tool of a server marked `shared` acts outside the asker's own data (the house's lights): in
any chat but an owner's own, only an owner approves it, whatever its policy (daemon.turn.owners
says where they are asked). The question, naming who asked, goes to the owners' chats, the
asker's chat is told it waits for them, and an owner's "Always" is for that person alone (an
owner's standing yes for them runs it unasked, unless the policy is "always"). The waiting
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
    ANSWERED_FOR,
    ASKED_OWNER,
    KEYS,
    NOT_AN_OWNER,
    NOT_WAITING,
    NOT_YOURS,
    WAITING,
    WAITING_OWNER,
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
from daemon.turn.owners import Owners

# One chat message with room to spare (Telegram and WhatsApp both take 4,096 characters of text;
# WhatsApp's buttons then follow under a short body of their own): a question is never split and
# never cut, so its buttons never approve a part the user did not see. Counted in UTF-16 units,
# as Telegram counts; the channels' rendering only removes characters (markers, escapes).
QUESTION_MAX = 3500
WRAP = 48  # characters per line of the arguments' block: a phone shows the line whole
DESCRIBED = 300  # characters of the tool's own description: the server's words, not the call's
TOO_LONG = ("{tool} was called with arguments too long to show in one message, so I could not "
            "ask {whom} about it; it was not run.")
CANNOT_ASK = (f"{ERROR_PREFIX}{{tool}} needs the user's approval, which cannot be asked here (a "
              "scheduled run); it was not run.")


class Ask(Protocol):
    """Send a notice with buttons to a chat (the engine's `notify`)."""

    async def __call__(self, chat_key: str, text: str, *,
                       buttons: tuple[Button, ...] = ()) -> None: ...


@dataclass
class _Waiting:
    chat_key: str  # the chat whose turn waits
    person: str  # who asked: whose calls an "Always" lets run
    tool: str
    asked_in: tuple[str, ...]  # where the question went: the chat, or the owners' chats
    owners: Owners | None = None  # a shared tool's question: only an owner answers it
    answered_by: str | None = None
    answer: asyncio.Future[Choice] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())
    nudged: asyncio.Event = field(default_factory=asyncio.Event)  # a message came meanwhile

    def may_answer(self, answer: Answer) -> bool:
        if answer.chat_key not in self.asked_in:
            return False
        if self.owners is None:
            return answer.person == self.person
        return self.owners.may_answer(answer.person)


class Approvals:
    """The questions waiting for an answer, and the standing yeses; see the module docstring."""

    def __init__(self, book: ApprovalBook, timeout: float, clock: Callable[[], float]) -> None:
        self.book = book
        self.timeout = timeout
        self.clock = clock
        self._waiting: dict[str, _Waiting] = {}
        self.changed = asyncio.Event()  # set whenever a question starts waiting (`roost chat`)

    def waiting_in(self, chat_key: str) -> list[str]:
        """The ids of the questions a chat's turn waits on, oldest first."""
        return [i for i, w in self._waiting.items()
                if w.chat_key == chat_key and not w.answer.done()]

    def asked_in(self, chat_key: str) -> list[str]:
        """The ids of the questions waiting for an answer in a chat, oldest first: its own,
        and a shared tool's asked of the owner whose chat it is."""
        return [i for i, w in self._waiting.items()
                if chat_key in w.asked_in and not w.answer.done()]

    def nudge(self, chat_key: str) -> bool:
        """A message came in a chat: if its turn waits on a question, the turn tells the chat
        at once that it waits (the message itself is answered after the turn). True if so."""
        waiting = [self._waiting[i] for i in self.waiting_in(chat_key)]
        for pending in waiting:
            pending.nudged.set()
        return bool(waiting)

    async def answer(self, answer: Answer) -> str:
        waiting = self._waiting.get(answer.approval_id)
        if waiting is None or waiting.answer.done():
            return NOT_WAITING
        if not await asyncio.to_thread(waiting.may_answer, answer):
            log.warning("approval %s in %s answered by %s in %s, who may not; refused",
                        answer.approval_id, waiting.chat_key, answer.person, answer.chat_key)
            return NOT_AN_OWNER if waiting.owners is not None else NOT_YOURS
        if waiting.answer.done():  # answered meanwhile (another owner, in another chat)
            return NOT_WAITING
        waiting.answered_by = answer.person
        waiting.answer.set_result(answer.choice)
        return (ANSWERED_FOR if waiting.owners is not None else ANSWERED)[answer.choice]

    async def answer_typed(self, chat_key: str, text: str) -> bool:
        """`roost chat`: y (allow once), a (always) or n (deny) typed while a question waits
        in the terminal's chat answers the oldest; False for anything else (a message)."""
        waiting = self.asked_in(chat_key)
        word = text.strip().lower()
        choice = KEYS.get({"yes": "y", "always": "a", "no": "n"}.get(word, word))
        if not waiting or choice is None:
            return False
        await self.answer(Answer(waiting[0], choice, chat_key, chat_key))
        return True

    async def check(self, tool: Tool, arguments: Mapping[str, Any], *, chat_key: str,
                    person: str | None, ask: Ask | None,
                    released: Callable[[], AbstractAsyncContextManager[None]],
                    owners: Owners | None = None) -> str | None:
        """None when the call may run; else the result the model gets instead. With `owners`,
        a shared tool called outside an owner's chat is asked of the owners instead."""
        if (tool.shared and owners is not None
                and await asyncio.to_thread(owners.needed, chat_key)):
            return await self._owners_yes(tool, arguments, chat_key, person, ask, released,
                                          owners)
        if tool.approve == "never":
            return None
        if (tool.approve == "ask" and person is not None
                and await asyncio.to_thread(self.book.allows, person, tool.name)):
            return None
        if ask is None or person is None:
            return CANNOT_ASK.format(tool=tool.name)
        asking = question(tool, arguments)
        if asking is None:
            return await self._too_long(tool, chat_key, ask, "the user")
        return await self._asked(tool, asking, _Waiting(chat_key, person, tool.name, (chat_key,)),
                                 ask, released)

    async def _owners_yes(self, tool: Tool, arguments: Mapping[str, Any], chat_key: str,
                          person: str | None, ask: Ask | None,
                          released: Callable[[], AbstractAsyncContextManager[None]],
                          owners: Owners) -> str | None:
        """A shared tool outside an owner's chat: it runs on an owner's standing "Always" for
        this person (unless its policy is "always"), else on an owner's answer."""
        if (tool.approve != "always" and person is not None
                and await asyncio.to_thread(self._owner_gave, owners, person, tool.name)):
            return None
        if ask is None or person is None:
            return CANNOT_ASK.format(tool=tool.name)
        chats = await asyncio.to_thread(owners.chats)
        if not chats:
            return (f"{ERROR_PREFIX}{tool.name} acts for the whole household, so it needs the "
                    "owner's approval and no owner is listed; it was not run.")
        asking = question(tool, arguments, asker=owners.asker(person, chat_key))
        if asking is None:
            return await self._too_long(tool, chat_key, ask, "the owner")
        return await self._asked(tool, asking,
                                 _Waiting(chat_key, person, tool.name, chats, owners),
                                 ask, released)

    def _owner_gave(self, owners: Owners, person: str, tool: str) -> bool:
        """Whether one who is an owner now gave `person` a standing yes to `tool`."""
        return any(owners.may_answer(by) for by in self.book.given(person, tool))

    @staticmethod
    async def _too_long(tool: Tool, chat_key: str, ask: Ask, whom: str) -> str:
        """Arguments too long to show: nobody is asked (`whom`: the user or the owner)."""
        await ask(chat_key, TOO_LONG.format(tool=tool.name,
                                            whom="you" if whom == "the user" else "an owner"))
        return (f"{ERROR_PREFIX}the arguments of this call of {tool.name} are too long to "
                f"show {whom} in one message for approval, so {whom} was not asked and it was "
                "not run. Call it with fewer or shorter arguments.")

    async def _asked(self, tool: Tool, asking: str, waiting: _Waiting, ask: Ask,
                     released: Callable[[], AbstractAsyncContextManager[None]]) -> str | None:
        """Ask where `waiting` says, wait for the answer with the model released, and say
        what it decided: None to run the call, else the result the model gets instead."""
        approval_id = secrets.token_hex(6)
        self._waiting[approval_id] = waiting
        self.changed.set()
        self.changed = asyncio.Event()
        try:
            for chat in waiting.asked_in:
                await ask(chat, asking,
                          buttons=buttons(approval_id, always=tool.approve != "always"))
            if waiting.owners is not None:  # the asker hears whom it waits for
                await ask(waiting.chat_key, ASKED_OWNER.format(tool=tool.name))
            log.info("asked %s to approve %s for %s (%s)", ", ".join(waiting.asked_in),
                     tool.name, waiting.chat_key, approval_id)
            async with released():
                choice = await self._answer_of(waiting, ask)
        finally:
            del self._waiting[approval_id]
        log.info("approval %s for %s in %s: %s", approval_id, tool.name, waiting.chat_key,
                 choice.value if choice is not None else "no answer (denied)")
        whose = "the user" if waiting.owners is None else "the owner"
        if choice is None:
            minutes = f"{self.timeout / 60:.0f} minutes" if self.timeout >= 60 \
                else f"{self.timeout:.0f} seconds"
            await ask(waiting.chat_key, f"No answer within {minutes}: {tool.name} was not run."
                      if waiting.owners is None else
                      f"No owner answered within {minutes}: {tool.name} was not run.")
            return (f"{ERROR_PREFIX}{whose} did not answer the approval request for "
                    f"{tool.name} within {minutes}, so it was not run.")
        if choice is Choice.DENY:
            return (f"{ERROR_PREFIX}{whose} denied this call of {tool.name}; it was not run. "
                    "Do not call it again unless the user asks.")
        if choice is Choice.ALWAYS:
            await asyncio.to_thread(self.book.grant, waiting.person, tool.name, self.clock(),
                                    waiting.answered_by if waiting.owners is not None else None)
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
                    await ask(waiting.chat_key, _waiting_line(waiting))
        except TimeoutError:
            return None


def _waiting_line(waiting: _Waiting) -> str:
    """What a message gets while its chat's turn waits on a question."""
    if waiting.owners is not None:
        return WAITING_OWNER.format(tool=waiting.tool)
    # Where there are no buttons to tap (the terminal, Matrix), it is typed.
    typed = "buttons" not in getattr(platform_of(waiting.chat_key), "sends", ())
    return WAITING_TYPED if typed else WAITING


def question(tool: Tool, arguments: Mapping[str, Any], *, asker: str | None = None
             ) -> str | None:
    """The question: every argument whole on lines of its own by name (nested ones by path),
    wrapped, in a code block; None when they do not fit one message (then nobody is asked).
    `asker` names who asked, for an owner asked about a shared tool."""
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
    ask = (f"May I run **{_escaped(tool.name)}**?" if asker is None else
           f"{_escaped(asker)} asks: may I run **{_escaped(tool.name)}**? It acts for the "
           "whole household.")
    text = f"{ask}\n{_escaped(about)}\n\n{fence}\n{shown}\n{fence}"
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
