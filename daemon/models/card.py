"""A model's card: what `roost models` found it can do on this box, kept per Ollama version.

The cards live in `<state_dir>/models/cards.json`, one object per (model, Ollama version, host):
a new Ollama may parse tools or thinking differently, so a card speaks only for the version it
was probed on; and with several Ollama hosts (`[model] hosts`) each box has its own timings and
memory, so probing one keeps the other's card (what the model does is the same on both: the
chats act on the newest card of the version). The file is replaced atomically
(daemon.store.files.atomic_write) and, like the rest of the state, is 0600 in a 0700 folder (the
process umask, daemon.core.filemodes). A card is re-made by probing again, so a file that does
not parse is read as no cards (and logged) rather than stopping a chat that asks for one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from daemon.core.errors import StoreError
from daemon.core.logs import store_log as log
from daemon.store.files import atomic_write, dumps, read_json

ToolStyle = Literal["native", "text", "none"]
ThinkingStyle = Literal["none", "separate", "inline", "empty-with-tools"]
TruncateStyle = Literal["refuses", "cuts"]
CARDS_FILE = Path("models") / "cards.json"
FORMAT = 1  # the file's layout; a reader skips a file of a layout it does not know


@dataclass(frozen=True)
class Card:
    """One model on one Ollama version. Timings are seconds; `memory` and `memory_vram` are
    bytes as /api/ps said after the battery; None where the server did not say or the battery
    did not look. The fields with a default came later: a stored card without them reads as
    that default."""

    name: str
    ollama_version: str
    probed_at: str  # ISO 8601, UTC
    context: int | None  # the model's own context_length (/api/show)
    num_ctx: int  # the window the battery ran at: model.window capped at `context`
    tools: ToolStyle
    thinking: ThinkingStyle
    truncate: TruncateStyle
    estimate_error: float | None  # roost's estimate / prompt_eval_count - 1, on a mixed text
    load_s: float | None  # None as well when the model was loaded already (`already_loaded`)
    first_token_s: float | None
    tokens_per_s: float | None
    cached_share: float | None  # of a repeated prefix, the share read from Ollama's cache
    vision: bool | None  # None: no vision capability, or a quick card (not probed)
    memory: int | None
    memory_vram: int | None
    # /api/ps listed the model before the battery's first request: no cold load to time.
    already_loaded: bool = False
    # From the quick battery (daemon.models.probe): no cache, truncation or vision probe, so
    # `cached_share` and `vision` are None and `truncate` is what the Ollama version implies.
    quick: bool = False
    # The Ollama it was probed on, its URL without credentials ("" on a card from before).
    host: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Card | None:
        """The card, or None when `data` is not one (missing fields, a value of another kind)."""
        fields = dataclasses.fields(cls)
        required = {f.name for f in fields if f.default is dataclasses.MISSING}
        if not required <= data.keys():
            return None
        card = cls(**{f.name: data[f.name] for f in fields if f.name in data})
        if not all(isinstance(flag, bool) for flag in (card.already_loaded, card.quick)):
            return None
        if not isinstance(card.host, str):
            return None
        styles = ((card.tools, ToolStyle), (card.thinking, ThinkingStyle),
                  (card.truncate, TruncateStyle))
        if not all(value in get_args(kind) for value, kind in styles):
            return None
        if not isinstance(card.name, str) or not isinstance(card.ollama_version, str):
            return None
        return card


def all_cards(state_dir: Path) -> list[Card]:
    """Every stored card, in the order stored (by model name, then Ollama version)."""
    path = state_dir / CARDS_FILE
    try:
        data = read_json(path)
    except StoreError as exc:
        log.warning("model cards not read, probe again with `roost models`: %s", exc)
        return []
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return []
    cards = data.get("cards")
    found = (Card.from_json(c) for c in cards if isinstance(c, dict)) if isinstance(
        cards, list) else ()
    return [card for card in found if card is not None]


def load_card(state_dir: Path, model: str, ollama_version: str) -> Card | None:
    """The card of `model` probed on this Ollama version (of several hosts' cards, the newest),
    None when there is none."""
    return max((c for c in all_cards(state_dir)
                if c.name == model and c.ollama_version == ollama_version),
               key=lambda c: c.probed_at, default=None)


def store_cards(state_dir: Path, cards: Iterable[Card]) -> None:
    """Keep `cards`, each replacing the stored card of its model, Ollama version and host; the
    other stored cards stay (a card from before hosts were named is replaced by a new probe of
    its model and version). Blocking (fsync): call it off the event loop."""
    cards = list(cards)
    probed = {(c.name, c.ollama_version) for c in cards}
    merged = {(c.name, c.ollama_version, c.host): c for c in all_cards(state_dir)
              if c.host or (c.name, c.ollama_version) not in probed}
    merged |= {(c.name, c.ollama_version, c.host): c for c in cards}
    ordered = [merged[key] for key in sorted(merged)]
    folder = state_dir / CARDS_FILE.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create {folder}: {exc.strerror or exc}") from exc
    atomic_write(state_dir / CARDS_FILE,
                 dumps({"format": FORMAT, "cards": [c.to_json() for c in ordered]}))
