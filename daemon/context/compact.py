"""The in-turn safety net: one monstrous turn cannot blow the window.

Inside a turn the model may call tools again and again, and their results pile up in memory.
Before each model call, if the larger of the calibrated estimate and Ollama's last
`prompt_eval_count` is above 75% of the budget, the turn's in-memory messages shrink to 50%:

1. images in tool results are dropped;
2. targets are cut to a head-and-tail excerpt with a `[TRUNCATED — ...]` label: the largest
   non-error tool results first, then older assistant messages, then older user messages;
3. never touched: the system message, the first user message, the last 3 messages of each role,
   and error results (the model needs to see what failed).

Then one model call writes a structured state (TASK / PROGRESS / REMAINING / DATA / DECISIONS),
and a continuation note tells the model to resume from REMAINING. Only the in-memory request
shrinks; the store keeps every byte. Pure functions; `daemon/turn/tool_loop.py` makes the calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from daemon.context.replay import ChatMessage, chat_tokens, excerpt, image_tokens

TRIGGER_SHARE = 0.75
TARGET_SHARE = 0.5
KEEP_LAST_PER_ROLE = 3
EXCERPT_CHARS = 600
ERROR_PREFIX = "ERROR: "

STATE_REQUEST = (
    "Pause here. The conversation is getting too long for your context window, so write the "
    "state of the task, in exactly these sections and nothing else:\n"
    "TASK: what the user asked for, in their terms\n"
    "PROGRESS: what is done so far\n"
    "REMAINING: the steps still to do, in order\n"
    "DATA: every fact, number, name and result gathered so far that is still needed\n"
    "DECISIONS: choices made and why"
)
CONTINUATION = (
    "The messages above were shortened to fit the context window; the state below is what you "
    "know. Resume from REMAINING. Do not redo steps listed under PROGRESS, and do not say the "
    "task is done while REMAINING still has steps.\n\n<state>\n{state}\n</state>"
)


@dataclass(frozen=True)
class Shrunk:
    messages: list[ChatMessage]
    targets: int
    images_dropped: int
    tokens_before: int


def request_tokens(messages: Sequence[ChatMessage], ratio: float) -> int:
    """Estimated tokens of in-memory messages, images included."""
    tokens = sum(chat_tokens(m, ratio) for m in messages)
    for message in messages:
        images = message.get("images")
        if isinstance(images, list):
            tokens += len(images) * image_tokens({})
    return tokens


def should_compact(estimate: int, last_prompt_eval: int | None, budget: int) -> bool:
    return max(estimate, last_prompt_eval or 0) > TRIGGER_SHARE * budget


def shrink(messages: Sequence[ChatMessage], ratio: float, budget: int) -> Shrunk:
    """The turn's messages cut down to half the budget (see the module docstring)."""
    out = [dict(m) for m in messages]
    before = request_tokens(out, ratio)
    target = TARGET_SHARE * budget
    protected = _protected(out)
    images_dropped = 0
    for message in out:
        if message.get("role") == "tool":
            images = message.pop("images", None)
            if isinstance(images, list):
                images_dropped += len(images)
    targets = _cut_down(out, _targets(out, protected), ratio, target)
    if request_tokens(out, ratio) > budget:
        # Still over the window itself: the protected tool results must give way too, since a
        # request over the budget is what makes Ollama cut silently. Errors stay whole.
        last_resort = sorted(
            (i for i in protected if out[i].get("role") == "tool"
             and not str(out[i].get("content", "")).startswith(ERROR_PREFIX)),
            key=lambda i: len(str(out[i].get("content") or "")), reverse=True)
        targets += _cut_down(out, last_resort, ratio, budget)
    return Shrunk(out, targets, images_dropped, before)


def _cut_down(out: list[ChatMessage], order: Sequence[int], ratio: float, goal: float) -> int:
    """Cut the messages at `order` to an excerpt, one by one, until the request fits `goal`."""
    cut = 0
    for index in order:
        if request_tokens(out, ratio) <= goal:
            break
        content = str(out[index].get("content") or "")
        if len(content) <= EXCERPT_CHARS + 100:
            continue
        out[index]["content"] = excerpt(
            content, EXCERPT_CHARS, "left out of this in-memory copy to fit the context "
            "window; the full text is saved")
        cut += 1
    return cut


def state_messages(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """The shrunk messages plus the request for a structured state (one model call)."""
    return [*messages, {"role": "user", "content": STATE_REQUEST}]


def continue_from(messages: Sequence[ChatMessage], state: str) -> list[ChatMessage]:
    """The shrunk messages plus the continuation note carrying the state."""
    return [*messages, {"role": "user", "content": CONTINUATION.format(state=state.strip())}]


def _protected(messages: Sequence[ChatMessage]) -> set[int]:
    keep = {0}
    first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
    if first_user is not None:
        keep.add(first_user)
    for role in ("user", "assistant", "tool"):
        indices = [i for i, m in enumerate(messages) if m.get("role") == role]
        keep.update(indices[-KEEP_LAST_PER_ROLE:])
    keep.update(i for i, m in enumerate(messages)
                if m.get("role") == "tool" and str(m.get("content", "")).startswith(ERROR_PREFIX))
    return keep


def _targets(messages: Sequence[ChatMessage], protected: set[int]) -> list[int]:
    """Cut order: largest tool results, then older assistant, then older user messages."""
    def size(i: int) -> int:
        return len(str(messages[i].get("content") or ""))

    open_ = [i for i in range(len(messages)) if i not in protected]
    tools = sorted((i for i in open_ if messages[i].get("role") == "tool"), key=size,
                   reverse=True)
    assistants = [i for i in open_ if messages[i].get("role") == "assistant"]
    users = [i for i in open_ if messages[i].get("role") == "user"]
    return [*tools, *assistants, *users]
