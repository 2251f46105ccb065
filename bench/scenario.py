"""A scripted conversation for the context benchmarks, generated deterministically from a seed.

Each turn is one user message and the model's answer to it. The mix follows what a phone chat
with a small local model looks like: mostly short chat, some long answers (2-6 KB), and on some
turns a tool cycle: the user asks about a page, the model calls `web_fetch(url)`, the tool returns
a 10-40 KB web page, and the model answers from it. The text is pseudo-English built from a fixed
vocabulary and numbered per turn, so no two turns repeat each other by accident (a repeat would
flatter any prefix-reuse measurement).

`ScriptedModel` is the fake Ollama's model: for a tool turn's first call it returns a structured
`web_fetch` call, for the call after the tool result (or after the in-turn compaction's
continuation note) the turn's answer; it answers the in-turn compaction's state request with a
structured state and a fold prompt with a short summary. `web_capability` is the bench's `web`
capability whose `web_fetch` returns the scenario's pages, registered like any extra would be.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from daemon.context.compact import STATE_REQUEST
from daemon.context.fold import FOLD_SYSTEM, NOTES_HEADING, summary_cap_chars
from daemon.tools.registry import Capability, Tool
from tests.fakes.ollama import Reply

TOOL_SHARE = 0.15  # turns with a tool cycle
LONG_ANSWER_SHARE = 0.3  # turns answered with 2-6 KB
LONG_USER_SHARE = 0.1  # user messages of a paragraph rather than a line

WORDS = (
    "the a of to and in is it that for on with as was at by this be from or have an are not "
    "but had which they you were her his one all we can there been has more if will would "
    "about so up out what when who them some could time into only then other than do its "
    "also two first after new where most over years may these well should people like just "
    "because any how such made through our even back work much before great good little "
    "garden tomato basil compost watering schedule balcony seedlings trellis mulch frost "
    "server backup disk raid snapshot kernel update driver firmware router vlan dns cache "
    "train ticket booking hotel museum itinerary luggage passport visa station platform "
    "invoice budget receipt tax deadline pension insurance rent deposit contract renewal "
    "recipe flour yeast oven dough proofing knead butter sugar lemon pepper onion garlic "
    "python script function module test error trace log config socket thread queue retry "
    "meeting calendar reminder birthday dentist doctor appointment pharmacy refill dosage"
).split()
NAMES = ("Dana", "Yossi", "Maya", "Omer", "Noa", "Eitan", "Lior", "Tamar", "Avi", "Shira")
OPENERS = ("ok", "thanks", "hm", "right", "got it", "cool", "wait", "also", "one more thing",
           "quick question")
SITES = ("docs.example.org", "wiki.example.net", "news.example.com", "forum.example.io",
         "shop.example.de", "weather.example.co")


@dataclass(frozen=True)
class ToolCycle:
    """The web_fetch call the model makes to answer the turn's user message, and the page the
    tool returns."""

    url: str
    output: str


@dataclass(frozen=True)
class Turn:
    index: int
    user: str
    answer: str
    tool: ToolCycle | None = None

    @property
    def kind(self) -> str:
        if self.tool is not None:
            return "tool"
        return "long" if len(self.answer) >= 2000 else "chat"


def _sentence(rng: random.Random, low: int = 6, high: int = 18) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(low, high))]
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words)), rng.choice(NAMES))
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words)), str(rng.randint(2, 9999)))
    return " ".join(words).capitalize() + rng.choice((".", ".", ".", "?", "!"))


def _text(rng: random.Random, chars: int, paragraph: int = 5) -> str:
    """About `chars` characters of sentences, in paragraphs of `paragraph` sentences."""
    parts: list[str] = []
    size = 0
    while size < chars:
        sentences = [_sentence(rng) for _ in range(paragraph)]
        block = " ".join(sentences)
        parts.append(block)
        size += len(block) + 2
    return "\n\n".join(parts)[:chars].rstrip()


def _user(rng: random.Random, index: int) -> str:
    if rng.random() < LONG_USER_SHARE:
        return f"(turn {index}) " + _text(rng, rng.randint(300, 800), paragraph=3)
    opener = rng.choice(OPENERS)
    return f"{opener}, {_sentence(rng, 3, 24).lower()} (turn {index})"


def _answer(rng: random.Random, index: int) -> str:
    if rng.random() < LONG_ANSWER_SHARE:
        size = rng.randint(2000, 6000)
        body = _text(rng, size - 40)
        return f"Here is the long answer for turn {index}.\n\n{body}"
    return f"[{index}] " + _text(rng, rng.randint(40, 400), paragraph=2)


def _tool(rng: random.Random, index: int) -> ToolCycle:
    site = rng.choice(SITES)
    url = f"https://{site}/page/{index}-{rng.randint(1000, 9999)}"
    size = rng.randint(10_000, 40_000)
    lines = [f"# {url}", ""]
    section = 0
    while sum(len(line) + 1 for line in lines) < size:
        section += 1
        lines += [f"## Section {section}", _text(rng, rng.randint(400, 1600), paragraph=4), ""]
    return ToolCycle(url=url, output="\n".join(lines)[:size])


def script(turns: int, seed: int) -> list[Turn]:
    """The conversation: `turns` turns, the same for the same seed."""
    rng = random.Random(seed)
    result = []
    for index in range(turns):
        # The first turn is plain chat, as the first message of a conversation usually is.
        tool = _tool(rng, index) if index and rng.random() < TOOL_SHARE else None
        user = _user(rng, index)
        if tool is not None:
            user += f"\nCan you read {tool.url} and tell me what matters?"
        result.append(Turn(index=index, user=user, answer=_answer(rng, index), tool=tool))
    return result


WEB_FETCH = "web_fetch"


def web_fetch_call(url: str) -> dict[str, Any]:
    """A structured tool call as Ollama returns it."""
    return {"function": {"name": WEB_FETCH, "arguments": {"url": url}}}


def web_capability(turns: Sequence[Turn]) -> Capability:
    """The bench's `web` capability (core, so loaded in every conversation): `web_fetch(url)`
    returns the scenario's page at that address."""
    pages = {t.tool.url: t.tool.output for t in turns if t.tool is not None}

    async def web_fetch(context: object, url: str) -> str:
        page = pages.get(url)
        if page is None:
            return f"ERROR: {url} could not be fetched (404)."
        return page

    return Capability(
        name="web", core=True, group="web", description="fetch web pages as text",
        tools=(Tool(WEB_FETCH, "Fetch a web page and return its text.",
                    {"type": "object",
                     "properties": {"url": {"type": "string", "description": "the address"}},
                     "required": ["url"]}, web_fetch),))


def is_fold(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether chat messages are roost's fold prompt (its system message opens it)."""
    return bool(messages) and messages[0].get("role") == "system" and str(
        messages[0].get("content") or "").startswith(FOLD_SYSTEM)


def is_state_request(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether chat messages are the in-turn compaction's request for a written state."""
    return bool(messages) and messages[-1].get("role") == "user" and STATE_REQUEST in str(
        messages[-1].get("content") or "")


class ScriptedModel:
    """The fake's `default_reply` (set `turn` before each turn):

    * a fold prompt: a short summary, counted in `fold_calls`;
    * the in-turn compaction's state request: a structured state, counted in `state_calls`;
    * a tool turn's call whose last message is the turn's user message: a `web_fetch` call;
    * anything else (a plain turn, the call after a tool result or a continuation note): the
      turn's answer.

    Every request it answers is kept in `answered` with the reply it generated, so a benchmark
    can put what Ollama's prompt cache holds (the prompt and the generated tokens) next to the
    following request.
    """

    def __init__(self, window: int) -> None:
        self.window = window
        self.turn: Turn | None = None
        self.fold_calls = 0
        self.state_calls = 0
        self.answered: list[tuple[dict[str, Any], Reply]] = []

    def __call__(self, body: dict[str, Any]) -> Reply:
        reply = self.reply(body)
        self.answered.append((body, reply))
        return reply

    def reply(self, body: dict[str, Any]) -> Reply:
        messages = body.get("messages") or []
        if is_fold(messages):
            self.fold_calls += 1
            return Reply(content=self.summary(str(messages[-1].get("content") or "")))
        if is_state_request(messages):
            self.state_calls += 1
            return Reply(content=self.state())
        turn = self.turn
        if turn is None:
            return Reply(content="ok")
        last = messages[-1] if messages else {}
        if turn.tool is not None and last.get("role") == "user" and str(
                last.get("content") or "").startswith(turn.user):
            return Reply(tool_calls=[web_fetch_call(turn.tool.url)])
        return Reply(content=turn.answer)

    def state(self) -> str:
        """What a small model writes when the in-turn compaction asks for the task's state."""
        turn = self.turn
        asked = turn.user.splitlines()[0][:160] if turn else "the user's question"
        url = turn.tool.url if turn and turn.tool else "the page"
        return (f"TASK: {asked}\nPROGRESS: fetched {url} with web_fetch\nREMAINING: answer "
                f"the user from the page\nDATA: the page has "
                f"{len(turn.tool.output) if turn and turn.tool else 0:,} characters in "
                "sections\nDECISIONS: read the page once, do not fetch it again")

    def summary(self, prompt: str) -> str:
        """A summary a small model might write: one short line per new message, under the cap;
        when asked, the user notes condensed to their newer half."""
        new = prompt.partition("<new_messages>\n")[2].partition("\n</new_messages>")[0]
        lines = [line[:90] for line in new.splitlines() if line.startswith("[#")]
        # The count in letters: a number none of the folded messages holds is no summary
        # of them, and is not stored (fold_problem).
        count = "".join(chr(ord("a") + int(d)) for d in str(self.fold_calls))
        text = f"Fold {count}.\n" + "\n".join(lines[:12])
        text = text[: summary_cap_chars(self.window) - 1]
        if NOTES_HEADING in prompt and "<user_notes>\n" in prompt:
            notes = prompt.partition("<user_notes>\n")[2].partition("\n</user_notes>")[0]
            kept = notes.splitlines()
            text += f"\n{NOTES_HEADING}\n" + "\n".join(kept[len(kept) // 2:])
        return text
