"""What a person's role in the household lets their conversations reach (issue 45).

The household (`daemon.intake.household`) knows each person's role; the turn and the tools
see it only through `Roles`: the role of a chat's person, and the owners' chats.

* The household's facts ride in the prompt of an owner's or a member's own chats, of a group
  (the household's chat: a group is let in by the owner's allow list), and of an automation
  that reports to one of those alone. Never in a guest's, nor in the chat of a sender who is
  no listed person (let in by an allow list only): `[people]` or pairing says who belongs.
* Only an owner or a member keeps or forgets a household fact, in their own chat.
* Only an owner approves a shared tool's call outside an owner's own chat, asked in the
  owners' chats (daemon.turn.approvals).
"""

from __future__ import annotations

from typing import Protocol

from daemon.core.config import MEMBER, OWNER, Settings
from daemon.core.platforms import AUTOMATION_PREFIX, is_person_chat
from daemon.tools.scope import automation_owner

HOUSEHOLD_ROLES = frozenset({OWNER, MEMBER})


class Roles(Protocol):
    """The household's roles, as the turn asks them (`Household` answers)."""

    def role_of(self, chat_key: str) -> str | None:
        """owner, member or guest; None for a chat that is no listed person's."""
        ...

    def owner_chats(self) -> tuple[str, ...]:
        """Every owner's own chats, in the config's order, the terminal last: where a question
        only an owner may answer goes (daemon.turn.approvals)."""
        ...


class NoRoles:
    """Nobody listed: no conversation shares household facts, and no owner can be asked (a
    test, a bare core)."""

    def role_of(self, chat_key: str) -> str | None:
        return None

    def owner_chats(self) -> tuple[str, ...]:
        return ()


def shares_household(chat_key: str, settings: Settings, roles: Roles) -> bool:
    """Whether a conversation of `chat_key` carries the household's facts; see the module
    docstring."""
    if chat_key.startswith(AUTOMATION_PREFIX):
        owner = automation_owner(chat_key.removeprefix(AUTOMATION_PREFIX), settings.automations,
                                 settings.linked)
        return owner is not None and shares_household(owner, settings, roles)
    if not is_person_chat(chat_key):
        return True  # a group of the household
    return roles.role_of(chat_key) in HOUSEHOLD_ROLES


def keeps_household(chat_key: str, roles: Roles) -> bool:
    """Whether the person of this private chat may keep or forget household facts."""
    return is_person_chat(chat_key) and roles.role_of(chat_key) in HOUSEHOLD_ROLES
