"""The in-turn safety net: one monstrous turn cannot blow the window.

Inside a turn the model may call tools again and again, and their results pile up in memory.
Before each model call, if the larger of the calibrated estimate and Ollama's last
`prompt_eval_count` is above 75% of the budget, the turn's in-memory messages shrink to 50%:

1. images in tool results the model has already answered to are dropped (one a tool has just
   returned stays: the model has not seen it yet); images count by their pixels, as in replay;
2. targets are cut to a head-and-tail excerpt labelled `[… N characters left out: ...]`: the
   largest non-error tool results first, then older assistant messages, then older user
   messages;
3. if that is not enough, the last 3 tool results shrink proportionally, so that one pass
   always reaches its target (a pass that stops short fires again a round later);
4. never touched: the system message, the first user message, the last 3 user and assistant
   messages, and error results (the model needs to see what failed).

Then one model call writes a structured state (TASK / PROGRESS / REMAINING / DATA / DECISIONS),
and a continuation note tells the model to resume from REMAINING. Only the in-memory request
shrinks; the store keeps every byte. Pure functions; `daemon/turn/tool_loop.py` makes the calls.
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from daemon.context.budget import Estimator, estimate_tokens
from daemon.context.replay import ChatMessage, chat_tokens, excerpt, image_tokens

TRIGGER_SHARE = 0.75
TARGET_SHARE = 0.5
KEEP_LAST_PER_ROLE = 3
EXCERPT_CHARS = 600
CUT_LABEL = "this copy, cut to fit the context window; the full text is saved"
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


def request_tokens(messages: Sequence[ChatMessage], ratio: float,
                   estimate: Estimator = estimate_tokens) -> int:
    """Estimated tokens of in-memory messages, images included."""
    tokens = sum(chat_tokens(m, ratio, estimate) for m in messages)
    for message in messages:
        images = message.get("images")
        if isinstance(images, list):
            tokens += sum(_pixel_tokens(str(i)) for i in images)
    return tokens


def _pixel_tokens(data: str) -> int:
    size = image_size(data)
    return image_tokens({"width": size[0], "height": size[1]} if size else {})


def image_size(data: str) -> tuple[int, int] | None:
    """Width and height of a base64 PNG or JPEG (what the store keeps), from its header."""
    try:
        raw = base64.b64decode(data[:1_400_000], validate=False)
    except (binascii.Error, ValueError):
        return None
    if raw.startswith(b"\x89PNG\r\n\x1a\n") and len(raw) >= 24:
        width, height = struct.unpack(">II", raw[16:24])
        return int(width), int(height)
    at = 2 if raw.startswith(b"\xff\xd8") else len(raw)
    while at + 9 <= len(raw) and raw[at] == 0xFF:
        marker, length = raw[at + 1], struct.unpack(">H", raw[at + 2:at + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # a start of frame
            height, width = struct.unpack(">HH", raw[at + 5:at + 9])
            return int(width), int(height)
        at += 2 + length
    return None


def should_compact(estimate: int, last_prompt_eval: int | None, budget: int) -> bool:
    return max(estimate, last_prompt_eval or 0) > TRIGGER_SHARE * budget


def shrink(messages: Sequence[ChatMessage], ratio: float, budget: int,
           estimate: Estimator = estimate_tokens) -> Shrunk:
    """The turn's messages cut down to half the budget (see the module docstring)."""
    out = [dict(m) for m in messages]
    before = request_tokens(out, ratio, estimate)
    target = TARGET_SHARE * budget
    protected = _protected(out)
    images_dropped = 0
    answered = max((i for i, m in enumerate(out) if m.get("role") == "assistant"), default=-1)
    for message in out[:answered]:
        if message.get("role") == "tool":
            images = message.pop("images", None)
            if isinstance(images, list):
                images_dropped += len(images)
    targets = _cut_down(out, _targets(out, protected), ratio, target, estimate)
    if request_tokens(out, ratio, estimate) > target:
        # The newest results alone are over: they give way together, each in proportion to
        # its size, so the pass ends at its target. Errors stay whole.
        last = [i for i in protected if out[i].get("role") == "tool"
                and not str(out[i].get("content", "")).startswith(ERROR_PREFIX)]
        targets += _shrink_evenly(out, last, ratio, target, estimate)
    return Shrunk(out, targets, images_dropped, before)


def _shrink_evenly(out: list[ChatMessage], indices: Sequence[int], ratio: float,
                   goal: float, estimate: Estimator) -> int:
    """Cut the messages at `indices` to the same share of their length, the largest share
    with which the request fits `goal` (down to a short excerpt each)."""
    originals = {i: str(out[i].get("content") or "") for i in indices}
    total = sum(len(c) for c in originals.values())
    if not total:
        return 0
    over = request_tokens(out, ratio, estimate) - goal
    share = max(0.0, 1 - over * 4 / ratio / total)  # tokens are bytes / 4 * ratio
    cut: set[int] = set()
    for _ in range(40):  # bounded: each round keeps 10% less
        for i, content in originals.items():
            keep = max(EXCERPT_CHARS // 3, int(len(content) * share) - 120)
            if keep < len(content) - 100:
                out[i]["content"] = excerpt(content, keep, CUT_LABEL)
                cut.add(i)
        if request_tokens(out, ratio, estimate) <= goal or share <= 0:
            break
        share = share * 0.9 - 0.01
    return len(cut)


def _cut_down(out: list[ChatMessage], order: Sequence[int], ratio: float, goal: float,
              estimate: Estimator) -> int:
    """Cut the messages at `order` to an excerpt, one by one, until the request fits `goal`."""
    cut = 0
    for index in order:
        if request_tokens(out, ratio, estimate) <= goal:
            break
        content = str(out[index].get("content") or "")
        if len(content) <= EXCERPT_CHARS + 100:
            continue
        out[index]["content"] = excerpt(content, EXCERPT_CHARS, CUT_LABEL)
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
