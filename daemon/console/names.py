"""The name a person knows a chat by, for a page that would otherwise show `telegram:1111111`.

Two places know names: `[identities]` (the owner's own word for a person, across channels)
and the pairing book (what the platform called a sender the owner approved). An identity wins:
the owner chose it. A chat neither knows keeps its key. The key stays on the page in small
print, since two chats may carry one name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from daemon.intake.pairing import PairingBook


@dataclass(frozen=True)
class ChatName:
    key: str  # the chat key, e.g. telegram:1111111
    name: str  # what to call it: a name, or the key when none is known

    @property
    def named(self) -> bool:
        return self.name != self.key


def chat_names(identities: Mapping[str, tuple[str, ...]],
               pairing: PairingBook) -> dict[str, str]:
    """Chat key -> name, from the approved senders and then the identities (which win).
    Synchronous: reads the pairing book's file."""
    names = {f"{a.channel}:{a.sender}": a.name for a in pairing.approved() if a.name.strip()}
    names.update({chat: name for name, chats in identities.items() for chat in chats})
    return names


def name_of(key: str, names: Mapping[str, str]) -> ChatName:
    return ChatName(key, names.get(key, key))
