"""Asking the owner: what a shared tool's question needs from the household.

A tool of an MCP server marked `shared` acts outside the asker's own data (the house's lights, a
family calendar), so in any chat but an owner's own (a member's, a guest's, a sender no one
listed, a group) only an owner approves a call of it (daemon.turn.approvals). An automation's run
is the owner's own: its prompt is the config's, and its tools are decided as anywhere else.

The question goes to each owner's first chat that can be reached (its platform enabled, the chat
not marked undeliverable), in the config's order; the terminal only when no owner has another
chat that can be reached (nobody may be sitting at it, and what waits there is shown only when
a `roost chat` connects). It names who asked, and only an owner answers it.
"""

from __future__ import annotations

from dataclasses import dataclass

from daemon.core.config import OWNER, Settings
from daemon.core.platforms import CONSOLE_CHAT, automation_name, platform_of
from daemon.store import Store
from daemon.tools.roles import Roles

# The chat flag delivery sets when the platform refused a chat for good (the user blocked roost).
UNDELIVERABLE = "undeliverable"


@dataclass(frozen=True)
class Owners:
    """The household's owners, as a shared tool's question asks them; see the module
    docstring. The roles may read the pairing file (when it changed) and `chats` reads the
    store: each is called in a thread."""

    roles: Roles
    settings: Settings
    store: Store

    def needed(self, chat_key: str) -> bool:
        """Whether a shared tool called in this chat waits for an owner's yes."""
        return automation_name(chat_key) is None and self.roles.role_of(chat_key) != OWNER

    def may_answer(self, person: str) -> bool:
        """Whether the one who answers (`<platform>:<id>`, their own chat's key) is an owner,
        now: one no longer an owner cannot answer a question asked before."""
        return self.roles.role_of(person) == OWNER

    def chats(self) -> tuple[str, ...]:
        """Where to ask: each owner's first chat that can be reached; see the module
        docstring. Empty when no owner is listed."""
        first: dict[str, str] = {}
        for chat in self.roles.owner_chats():
            if self._enabled(chat) and UNDELIVERABLE not in self.store.chat_flags(chat):
                first.setdefault(self._whose(chat), chat)
        chosen = tuple(first.values())
        return tuple(c for c in chosen if c != CONSOLE_CHAT) or chosen

    def asker(self, person: str, chat_key: str) -> str:
        """Who asked, as the owner's question names them: `omar (telegram:2222222)`, with
        the chat when it is not their own (a group)."""
        name = self._whose(person)
        who = person if name == person else f"{name} ({person})"
        return who if chat_key == person else f"{who} in {chat_key}"

    def _whose(self, chat: str) -> str:
        """The config's name of the person whose chat this is; else the chat itself."""
        return next((name for name, chats in self.settings.linked.items() if chat in chats),
                    chat)

    def _enabled(self, chat: str) -> bool:
        if chat == CONSOLE_CHAT:
            return True
        platform = platform_of(chat)
        own = self.settings.platforms.get(platform.name) if platform is not None else None
        return bool(getattr(own, "enabled", False))
