"""[identities]: one person's chats on several channels."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from daemon.core.config.values import _TOML_TYPES, _array, _Bad, _like
from daemon.core.errors import ConfigError
from daemon.core.platforms import person_chat_pattern

_IDENTITY_NAME = re.compile("[a-z0-9][a-z0-9_-]{0,39}")


def _identities(raw: Any, fail: Callable[[str, str], ConfigError]
                ) -> Mapping[str, tuple[str, ...]]:
    """`[identities]`: name = [chat keys]; a chat belongs to one identity at most."""
    if not isinstance(raw, dict):
        raise fail("identities", "expected a table, got "
                   f"{_TOML_TYPES.get(type(raw), 'date/time')}")
    # A person's own chat on a platform, or the terminal. Groups and forum topics are nobody's,
    # so they cannot be linked.
    pattern, forms = person_chat_pattern()
    person_chat = _like(pattern, f"a person's chat ({forms})")
    identities: dict[str, tuple[str, ...]] = {}
    owner: dict[str, str] = {}
    for name, chats in raw.items():
        if not _IDENTITY_NAME.fullmatch(name):
            raise fail(f"identities.{name}", "the name must be lowercase letters, digits, '-' "
                       "and '_' (at most 40)")
        try:
            keys = _array(person_chat)(chats)
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
