"""Chat commands every channel understands: /new, /compact, /status, /help (and /start);
/stop, /model and /voice are answered by daemon/engine/answering.py (stopping, model_choice.py
and voice_replies.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime

from daemon.core.config import OWNER, Settings
from daemon.core.conversations import Conversation
from daemon.core.errors import DoesNotFit, LLMError
from daemon.core.messages import TEMPLATE_FLAG
from daemon.core.redact import redact_url
from daemon.engine.model_choice import FLAG as MODEL_FLAG
from daemon.intake.household import Household
from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.store.console_keys import OWNER as ALL_CHATS
from daemon.store.console_keys import ConsoleKeys, console_url
from daemon.tools.registry import Registry
from daemon.tools.scope import is_person_chat, person_chats
from daemon.turn.background_fold import BackgroundFold
from daemon.turn.prompting import Prompting
from daemon.turn.router import Router
from daemon.turn.routes import route_of
from daemon.voice.hearing import last_transcript

HELP = (
    "Talk to me in plain words. Commands:\n"
    "/new - start a fresh conversation (the old one is kept and searchable)\n"
    "/compact - fold the older part of this conversation into its summary now\n"
    "/status - model, window and the size of this conversation\n"
    "/transcript - what I heard in your last voice note or audio file\n"
    "/voice on|off|auto - answer with voice notes always, never, or when you send one\n"
    "/stop - stop the reply being written (what it wrote so far is kept)\n"
    "/model - list the models; /model NAME - switch this chat to another one\n"
    "/remember TEXT - keep a fact about you for every conversation\n"
    "/memory - the facts I keep, numbered; /forget N forgets one\n"
    "/memory household [TEXT] - the household's facts (or keep one for everyone in it)\n"
    "/console - a sign-in link to your conversations in a browser (an owner's: everyone's)\n"
    "/help - this list"
)
NO_CARD = "none yet (`roost models` probes it; roost also does it quietly on first use)"
GREETING = (
    "Hello! I am roost, an assistant running on your own computer with a local model. "
    "Send me a message to start. /help lists the commands."
)


class Commands:
    """Runs a command for a chat and returns the text to send back."""

    names = frozenset({"new", "compact", "status", "help", "start", "stop", "model",
                       "transcript", "console", "voice"})

    def __init__(
        self,
        *,
        settings: Settings,
        store: Store,
        router: Router,
        llm: ModelClient,
        prompting: Prompting,
        folder: BackgroundFold,
        clock: Callable[[], float],
        registry: Registry | None = None,
        card_line: Callable[[str], str | None] | None = None,
    ) -> None:
        self.registry = registry
        # Model name -> its card for the running Ollama in one line (daemon.models.strategy),
        # None without one. A line, not the card: the engine does not import the models layer.
        self.card_line = card_line
        self.settings = settings
        self.store = store
        self.router = router
        self.llm = llm
        self.prompting = prompting
        self.folder = folder
        self.clock = clock

    async def run(self, name: str, chat_key: str) -> str:
        if name == "new":
            await asyncio.to_thread(self.router.rotate, chat_key, self.clock())
            return "Started a new conversation. The previous one is kept and searchable."
        if name == "compact":
            return await self.compact(chat_key)
        if name == "status":
            return await self.status(chat_key)
        if name == "start":
            return GREETING
        if name == "transcript":
            return await asyncio.to_thread(last_transcript, self.store, chat_key)
        if name == "console":
            return await asyncio.to_thread(self.console_link, chat_key)
        return HELP

    def console_link(self, chat_key: str) -> str:
        """A sign-in link to the console: the owner's view (everyone's data, as `roost
        console` gives) for the household's owner, this person's own chats for anyone else.
        An owner's link also names their chats, so that the console can check, whenever it is
        used, that they are still the owner (daemon/console/signin.py)."""
        if not self.settings.console.enabled:
            return "The web console is off on this roost (console.enabled = false)."
        if not is_person_chat(chat_key):
            return ("A group shares this chat: ask for /console in a private chat with me, and "
                    "the link shows your own conversations.")
        scope = tuple(sorted(person_chats(chat_key, self.settings.linked)))
        owner = Household.of(self.settings).role_of(chat_key) == OWNER
        keys = ConsoleKeys(self.settings.daemon.state_dir)
        token = keys.issue_link((ALL_CHATS, *scope) if owner else scope, self.clock())
        what = ("The owner's console, everyone's conversations and people" if owner
                else "Your console")
        return (f"{what} (works once, for 10 minutes; do not forward it):\n"
                f"{console_url(self.settings)}/login?t={token}")

    async def compact(self, chat_key: str) -> str:
        conversation = await asyncio.to_thread(self.store.active_conversation, chat_key)
        if conversation is None:
            return "Nothing to compact: this chat has no conversation yet."
        outcome = await self.folder.fold_now(conversation.id)
        if not outcome.folded:
            return f"Nothing folded: {outcome.reason}."
        folds = f" in {outcome.folds} folds" if outcome.folds > 1 else ""
        said = f"Folded {outcome.folded} messages{folds} into the summary"
        if outcome.more:
            return (f"{said}, the most at once: /compact again folds the rest, if any is "
                    "left.")
        if outcome.reason:
            return f"{said}; then stopped: {outcome.reason}."
        return f"{said}; the last few stay word for word."

    def _mcp_log(self, name: str) -> str:
        """Where a stdio server's own words are (its traceback, often): the file its stderr
        goes to. An HTTP server's are on its own host."""
        server = next((s for s in self.settings.mcp.servers if s.name == name), None)
        if server is None or server.command is None:
            return f"; `roost mcp test {name}` shows why"
        return (f"; its messages are in {self.settings.daemon.state_dir}/logs/mcp-{name}.log, "
                f"and `roost mcp test {name}` tries it")

    def _local(self, moment: float) -> str:
        """A time in the daemon's zone, as every time roost shows (the console, the CLI)."""
        return datetime.fromtimestamp(moment, self.settings.daemon.tz).strftime("%Y-%m-%d %H:%M")

    async def status(self, chat_key: str) -> str:
        """The chat's model, window and conversation; its times in the daemon's zone, which
        the last line names when there is a time."""
        times: list[str] = []
        lines = await self._status_lines(chat_key, times)
        if times:
            lines.append(f"Times in {self.settings.daemon.tz.key}.")
        return "\n".join(lines)

    async def _status_lines(self, chat_key: str, times: list[str]) -> list[str]:
        """The lines of /status; each time shown is also put in `times`."""
        model = self.settings.model

        def shown(moment: float) -> str:
            times.append(self._local(moment))
            return times[-1]

        flags = await asyncio.to_thread(self.store.chat_flags, chat_key)
        name = flags.get(MODEL_FLAG) or model.name  # the chat's /model
        conversation = await asyncio.to_thread(self.store.active_conversation, chat_key)
        if self.llm.pool.several:
            where, hosts = await self._hosts(conversation, name, shown)
        else:
            where, hosts = f"at {redact_url(model.host)}", []
        lines = [f"Model: {name} {where}", *hosts]
        if self.card_line is not None:  # it may read the cards' file: off the loop
            lines.append(f"Card: {await asyncio.to_thread(self.card_line, name) or NO_CARD}")
        if templates := flags.get(TEMPLATE_FLAG, {}).get("count"):
            last = shown(flags[TEMPLATE_FLAG]["last"])
            lines.append(f"WhatsApp templates sent to reopen this chat: {templates} (last "
                         f"{last}); Meta bills each one")
        try:
            num_ctx = await self.llm.num_ctx(name)
        except LLMError as exc:
            lines.append(f"Window: unknown ({exc})")
            return lines
        lines.append(f"Window: {num_ctx:,} tokens")
        info = await self.llm.model_info(name)
        if not info.tools:
            lines.append(f"Tools: none ({name} has no tools capability, so no searches "
                         "or files)")
        if self.registry is not None:
            lines += [f"MCP server {name}: not working ({problem}){self._mcp_log(name)}"
                      for name, problem in sorted(self.registry.problems.items())]
        if info.thinks:
            lines.append("Thinking: " + ("on for replies (model.think)" if model.think
                                         else "off (model.think = false)"))
        if conversation is None:
            lines.append("Conversation: none yet; your next message starts one.")
            return lines
        return lines + await self._conversation_lines(conversation, name, shown)

    async def _hosts(self, conversation: Conversation | None, model: str,
                     shown: Callable[[float], str]) -> tuple[str, list[str]]:
        """Where the conversation's turns go, of several Ollama hosts (`[model] hosts`): the
        host it is pinned to, else the one its last reply came from (its route's hint, after
        a restart), and lines on a host that is down or that a failure moved it from."""
        pool = self.llm.pool
        host = pool.host_of(conversation.id) if conversation is not None else None
        if host is None and conversation is not None:
            history = await asyncio.to_thread(self.store.messages, conversation.id)
            hint = route_of(conversation, history).hint
            host = pool.named(hint) if hint is not None else None
        if host is None:
            names = ", ".join(h.name for h in pool.hosts)
            return (f"on {len(pool.hosts)} Ollama hosts ({names}): the next turn takes the "
                    "best one up", [])
        lines = []
        if not host.up:
            since = f" since {shown(host.down_since)}" if host.down_since else ""
            others = any(h.up for h in pool.hosts_with(model) if h is not host)
            lines.append(f"Host: {host.name} is down{since}; " + (
                "the next turn goes to another host that has the model" if others
                else "no other host with the model is up: the next turn waits for one"))
        home = pool.home_of(conversation.id) if conversation is not None else None
        if home is not None:
            if home.up:
                state = (f"{home.name} failed; it is back, and this conversation returns there "
                         "at its next fold (/compact folds now)")
            else:
                since = f" since {shown(home.down_since)}" if home.down_since else ""
                state = f"{home.name} down{since}"
            lines.append(f"Host: answered by {host.name} ({state})")
        return f"at {host.name}", lines

    async def _conversation_lines(self, conversation: Conversation, name: str,
                                  shown: Callable[[float], str]) -> list[str]:
        """/status on the chat's conversation: its size, the next request, the summary."""
        lines: list[str] = []
        history = await asyncio.to_thread(self.store.messages, conversation.id)
        started = shown(conversation.created)
        lines.append(f"Conversation: {conversation.id}, {len(history)} messages, since {started}")
        passes = sum(int(m.meta.get("safety_net") or 0) for m in history)
        if passes:
            lines.append(f"Safety net: {passes} passes in long turns (earlier tool results "
                         "condensed within a turn)")
        try:
            prepared = await self.prompting.prepare(conversation, history, model=name)
            lines.append(f"Next request: about {prepared.request.estimate:,} of "
                         f"{prepared.budget:,} tokens (calibration ratio "
                         f"{conversation.token_ratio:.2f})")
        except DoesNotFit as exc:
            lines.append(f"Next request: about {exc.needed:,} tokens, over the budget of "
                         f"{exc.budget:,}")
        summary = conversation.summary
        if summary.through_seq:
            folded_at = shown(summary.folded_at or 0)
            lines.append(f"Summary: {len(summary.summary):,} characters covering messages "
                         f"1-{summary.through_seq}; {len(summary.user_notes):,} characters of "
                         f"your own words; {summary.fold_count} folds, last {folded_at}")
        else:
            lines.append("Summary: none yet (everything is still word for word)")
        return lines
