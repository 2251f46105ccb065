"""Which model a conversation talks to, for every call made for it: its turns, its folds (the
notes they condense included) and its safety-net summaries, so one GPU never swaps models for
them and each call is sized for the window it runs in.

A chat's `/model` choice is a chat flag (`MODEL_FLAG`, set by `daemon.engine.model_choice`); an
automation's conversation uses the automation's own model; anything else `model.name`.
"""

from __future__ import annotations

from daemon.core.config import Settings
from daemon.core.platforms import automation_name
from daemon.store import Store

MODEL_FLAG = "model"


def model_of(store: Store, settings: Settings, chat_key: str) -> str:
    """The model the chat's calls go to (reads the store: call it off the event loop)."""
    if (name := automation_name(chat_key)) is not None:
        own = next((a.model for a in settings.automations if a.name == name), None)
        return own or settings.model.name
    chosen = store.chat_flags(chat_key).get(MODEL_FLAG)
    return chosen if isinstance(chosen, str) and chosen else settings.model.name
