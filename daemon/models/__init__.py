"""Which models work on this box: `roost models` probes each with a short battery (probe.py)
and keeps what it found per model and Ollama version (card.py)."""

from daemon.models.card import Card, all_cards, load_card, store_cards

__all__ = ["Card", "all_cards", "load_card", "store_cards"]
