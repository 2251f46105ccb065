"""Chat commands every channel understands: /new, /status, /help (and /start on Telegram)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from daemon.config import Settings
from daemon.context.budget import estimate_messages, request_budget
from daemon.context.prefix import system_prefix
from daemon.context.replay import as_chat
from daemon.errors import LLMError
from daemon.llm import ModelClient
from daemon.router import Router
from daemon.store import Store

HELP = (
    "Talk to me in plain words. Commands:\n"
    "/new - start a fresh conversation (the old one is kept)\n"
    "/status - model, window and the size of this conversation\n"
    "/help - this list"
)
GREETING = (
    "Hello! I am roost, an assistant running on your own computer with a local model. "
    "Send me a message to start. /help lists the commands."
)


class Commands:
    """Runs a command for a chat and returns the text to send back."""

    names = frozenset({"new", "status", "help", "start"})

    def __init__(
        self,
        *,
        settings: Settings,
        store: Store,
        router: Router,
        llm: ModelClient,
        clock: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.store = store
        self.router = router
        self.llm = llm
        self.clock = clock

    async def run(self, name: str, chat_key: str) -> str:
        if name == "new":
            await asyncio.to_thread(self.router.rotate, chat_key, self.clock())
            return "Started a new conversation. The previous one is kept."
        if name == "status":
            return await self.status(chat_key)
        if name == "start":
            return GREETING
        return HELP

    async def status(self, chat_key: str) -> str:
        model = self.settings.model
        lines = [f"Model: {model.name} at {model.host}"]
        try:
            num_ctx = await self.llm.num_ctx()
            budget = request_budget(num_ctx, model.response_reserve)
            lines.append(f"Window: {num_ctx:,} tokens ({budget:,} for the prompt)")
        except LLMError as exc:
            budget = None
            lines.append(f"Window: unknown ({exc})")
        conversation = await asyncio.to_thread(self.store.active_conversation, chat_key)
        if conversation is None:
            lines.append("Conversation: none yet; your next message starts one.")
            return "\n".join(lines)
        history = await asyncio.to_thread(self.store.messages, conversation.id)
        prefix = {"role": "system", "content": system_prefix(conversation.kind)}
        estimate = estimate_messages([prefix, *map(as_chat, history)], conversation.token_ratio)
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(conversation.created))
        lines.append(f"Conversation: {conversation.id}, {len(history)} messages, since {started}")
        against = f" of {budget:,}" if budget is not None else ""
        lines.append(f"Next request: about {estimate:,}{against} tokens "
                     f"(calibration ratio {conversation.token_ratio:.2f})")
        return "\n".join(lines)
