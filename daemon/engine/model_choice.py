"""/model: which model a chat talks to.

`/model` lists what the Ollama server has (`/api/tags`), each with its context length and
capabilities (`/api/show`); `/model NAME` switches the chat. The choice is a chat flag
(`model`, in the store's chats.json), so it outlives a restart; a chat without one uses
`model.name`. A switch asks `/api/show` anew (the window, tools and thinking follow the new
model) and starts a new conversation: the prefix the old model cached is of no use to the new
one, and the conversation's token ratio was learned on another tokenizer. Automations name
their own model and never read this flag.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from daemon.core.config import Settings
from daemon.core.errors import LLMError
from daemon.core.redact import redact_url
from daemon.llm.client import ModelClient, ModelInfo
from daemon.store import Store
from daemon.turn.models import MODEL_FLAG, model_of
from daemon.turn.router import Router

FLAG = MODEL_FLAG  # every call of the chat's conversations reads it (daemon.turn.models)


def _same(a: str, b: str) -> bool:
    """Ollama's rule: a name without a tag means ":latest"."""
    return (a if ":" in a else f"{a}:latest") == (b if ":" in b else f"{b}:latest")


class ModelChoice:
    """See the module docstring."""

    def __init__(self, *, settings: Settings, store: Store, llm: ModelClient, router: Router,
                 clock: Callable[[], float]) -> None:
        self.settings = settings
        self.store = store
        self.llm = llm
        self.router = router
        self.clock = clock

    async def model_of(self, chat_key: str) -> str:
        """The model the chat's turns go to (the one rule: daemon/turn/models.py)."""
        return await asyncio.to_thread(model_of, self.store, self.settings, chat_key)

    async def run(self, chat_key: str, text: str) -> str:
        """`/model` or `/model NAME` (the message's text); the answer for the user."""
        wanted = text.split(maxsplit=1)[1].strip() if len(text.split(maxsplit=1)) > 1 else ""
        current = await self.model_of(chat_key)
        try:
            pulled = await self.llm.pulled_models()
        except LLMError as exc:
            return (f"I cannot ask the Ollama server at {redact_url(self.settings.model.host)} "
                    f"which models it has: {exc}")
        if not wanted:
            return await self._listing(pulled, current)
        name = next((p for p in pulled if _same(p, wanted)), None)
        if name is None:
            return (f"The Ollama server has no model called {wanted!r}.\n\n"
                    + await self._listing(pulled, current))
        if _same(name, current):
            return f"This chat already talks to {current}."
        try:
            info = await self.llm.model_info_anew(name)
            window = await self.llm.num_ctx(name)
        except LLMError as exc:
            return f"I could not switch to {name}: the Ollama server answered {exc}"
        default = _same(name, self.settings.model.name)
        await asyncio.to_thread(self.store.set_chat_flag, chat_key, FLAG,
                                None if default else name)
        await asyncio.to_thread(self.router.rotate, chat_key, self.clock())
        return (f"This chat now talks to {name} ({_abilities(info, window)}). A new "
                "conversation starts; the previous one is kept and searchable.")

    async def _listing(self, pulled: list[str], current: str) -> str:
        if not pulled:
            return ("The Ollama server has no models yet: pull one there, e.g. "
                    f"ollama pull {self.settings.model.name}")
        lines = [f"Models on the Ollama server (this chat: {current}):"]
        for name in sorted(pulled):
            try:
                info = await self.llm.model_info(name)
                window = await self.llm.num_ctx(name)
            except LLMError:
                lines.append(f"• {name}")
                continue
            mark = " ← this chat" if _same(name, current) else ""
            lines.append(f"• {name}: {_abilities(info, window)}{mark}")
        lines.append("Switch this chat with /model NAME.")
        return "\n".join(lines)


def _abilities(info: ModelInfo, window: int) -> str:
    length = (f"context {info.context_length:,} tokens, window {window:,}"
              if info.context_length else f"window {window:,} tokens")
    shown = [c for c in info.capabilities if c != "completion"]
    return f"{length}; {', '.join(shown) if shown else 'text only'}"
