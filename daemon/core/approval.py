"""What the channels and the turn share about asking the user to approve a tool call.

A question goes out as an `Outbound` notice with three `Button`s; each button's id is
`approve:<approval id>:<choice>`, an id roost chose, so a channel recognises an answer (a
Telegram callback_query, a WhatsApp button reply) before anything reads it as a message, and
hands it to an `Approver` instead of the chat's queue. The approver decides (only the person
the chat belongs to may answer; a shared tool's question, asked in the owners' chats, only an
owner) and returns the line to show the one who tapped.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Protocol

PREFIX = "approve:"
_ID = re.compile(r"approve:([0-9a-f]{12}):(once|always|deny)")


class Choice(enum.Enum):
    ONCE = "once"
    ALWAYS = "always"
    DENY = "deny"


# WhatsApp allows 20 characters a button title; Telegram is roomier, the same words serve both.
LABELS = {Choice.ONCE: "Allow once", Choice.ALWAYS: "Always for this tool", Choice.DENY: "Deny"}
# The console's keys for the same three answers.
KEYS = {"y": Choice.ONCE, "a": Choice.ALWAYS, "n": Choice.DENY}


# What the one who tapped is told.
NOT_WAITING = ("This question is no longer waiting for an answer (answered, timed out or asked "
               "again after a restart).")
NOT_YOURS = "Only the person this chat belongs to can answer this."
NOT_AN_OWNER = "Only an owner of the household can answer this."
ANSWERED = {Choice.ONCE: "Allowed once.",
            Choice.ALWAYS: "Allowed. I will not ask again for this tool.",
            Choice.DENY: "Denied."}
# An owner's answer to a question asked for someone else (a shared tool): "Always" is for them.
ANSWERED_FOR = {**ANSWERED,
                Choice.ALWAYS: "Allowed. I will not ask again when they call this tool."}
ACCEPTED = frozenset([*ANSWERED.values(), *ANSWERED_FOR.values()])
# What a message gets while a question waits in its chat (the chat's queue waits behind it).
WAITING = ("I'm waiting for your answer to the question above; tap a button, or /stop. "
           "Your message is kept and answered after that.")
WAITING_TYPED = ("I'm waiting for your answer to the question above; type y, a or n, or /stop. "
                 "Your message is kept and answered after that.")
# The asker's chat, while a shared tool's question waits for an owner.
ASKED_OWNER = ("{tool} acts for the whole household, so an owner has to approve it: I asked "
               "them and am waiting for their answer.")
WAITING_OWNER = ("I'm waiting for an owner's answer about {tool}; send /stop to stop waiting. "
                 "Your message is kept and answered after that.")


@dataclass(frozen=True)
class Button:
    id: str
    label: str


def buttons(approval_id: str, *, always: bool = True) -> tuple[Button, ...]:
    """The buttons of one question; `always` False leaves out "Always for this tool"."""
    return tuple(Button(f"{PREFIX}{approval_id}:{choice.value}", LABELS[choice])
                 for choice in Choice if always or choice is not Choice.ALWAYS)


def parse(button_id: str) -> tuple[str, Choice] | None:
    """(approval id, choice) of a button id roost made; None for anything else."""
    match = _ID.fullmatch(button_id)
    return (match.group(1), Choice(match.group(2))) if match else None


@dataclass(frozen=True)
class Answer:
    """A tap on one of the buttons: which question, what, in which chat, by whom."""

    approval_id: str
    choice: Choice
    chat_key: str
    person: str  # "<channel>:<user id>": who tapped


class Approver(Protocol):
    """Where a channel hands an answer; returns the short line shown to whoever tapped."""

    async def answer(self, answer: Answer) -> str: ...
