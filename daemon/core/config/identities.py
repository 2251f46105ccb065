"""[identities]: one person's chats on several channels."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from daemon.core.config.values import _TOML_TYPES, _array, _Bad, _like
from daemon.core.errors import ConfigError

# A person's own chat: a Telegram private chat (its id is the user's, positive), a WhatsApp
# wa_id or the terminal. Groups and forum topics are nobody's, so they cannot be linked.
_PERSON_CHAT = _like("telegram:[1-9][0-9]*|whatsapp:[0-9]+|console:local",
                     "a person's chat ('telegram:<user id>', 'whatsapp:<wa_id>' or "
                     "'console:local')")
_IDENTITY_NAME = re.compile("[a-z0-9][a-z0-9_-]{0,39}")


def _identities(raw: Any, fail: Callable[[str, str], ConfigError]
                ) -> Mapping[str, tuple[str, ...]]:
    """`[identities]`: name = [chat keys]; a chat belongs to one identity at most."""
    if not isinstance(raw, dict):
        raise fail("identities", "expected a table, got "
                   f"{_TOML_TYPES.get(type(raw), 'date/time')}")
    identities: dict[str, tuple[str, ...]] = {}
    owner: dict[str, str] = {}
    for name, chats in raw.items():
        if not _IDENTITY_NAME.fullmatch(name):
            raise fail(f"identities.{name}", "the name must be lowercase letters, digits, '-' "
                       "and '_' (at most 40)")
        try:
            keys = _array(_PERSON_CHAT)(chats)
        except _Bad as bad:
            raise fail(f"identities.{name}{bad.where}", str(bad)) from None
        if not keys:
            raise fail(f"identities.{name}", "must name at least one chat")
        for key in keys:
            if key in owner:
                raise fail(f"identities.{name}", f"{key} is already in identity {owner[key]!r}")
            owner[key] = name
        identities[name] = tuple(dict.fromkeys(keys))
    return MappingProxyType(identities)
