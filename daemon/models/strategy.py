"""What a card means for the chats: the `Habits` the client acts on, and the same in words for
`roost doctor`, `/status` and the console's Health page. Pure: a card in, values out.

Each line of `what_roost_does` says what the model did in the battery, then what roost does
about it; what roost does for every model (tools offered, `think` stated) goes unsaid.
"""

from __future__ import annotations

from collections.abc import Iterable

from daemon.context.budget import RATIO_MAX, RATIO_MIN
from daemon.llm.habits import Habits
from daemon.models.card import Card

TOOL_WORDS = {
    "native": "",
    "text": "writes its tool calls as JSON text: roost reads and runs them like native ones, "
            "and a malformed one goes back to the model as a tool error to fix",
    "none": "has no tools or called none when asked to: roost sends it no tools and no word "
            "of them, so it answers without searching its memory or files (probe again with "
            "`roost models` after an update of the model)",
}
THINKING_WORDS = {
    "none": "",
    "separate": "thinks apart from its answer: roost lets it think on chat replies only with "
                "model.think = true, and never shows or keeps the thinking as the reply",
    "inline": "reasons inside its answer: roost takes <think> blocks out of what is shown and "
              "kept (reasoning written without tags cannot be told apart)",
    "empty-with-tools": "answers nothing when it thinks with tools offered: roost turns "
                        "thinking off for every request that carries tools, also with "
                        "model.think = true",
}
TRUNCATE_WORDS = {
    "refuses": "",
    "cuts": "the server cut a prompt over the window instead of refusing it: roost keeps a "
            "wider margin and checks every count for a cut",
}
NOTHING_DIFFERENT = "nothing in its card asks roost to treat it differently"


def habits_of(card: Card) -> Habits:
    """What the client does for the card's model (daemon.llm.habits)."""
    return Habits(no_tools=card.tools == "none", text_tool_calls=card.tools == "text",
                  no_thinking_with_tools=card.thinking == "empty-with-tools",
                  inline_reasoning=card.thinking == "inline",
                  cuts=card.truncate == "cuts",
                  start_ratio=start_ratio(card.estimate_error))


def start_ratio(estimate_error: float | None) -> float | None:
    """The token ratio a new chat starts from: roost's estimate was `1 + error` times the
    server's count, so the count is the estimate over that (within the ratio's bounds)."""
    if estimate_error is None or estimate_error <= -1:
        return None
    return round(min(max(1 / (1 + estimate_error), RATIO_MIN), RATIO_MAX), 3)


def what_roost_does(card: Card) -> list[str]:
    """One line for each thing roost does differently for the model, in plain words; none for
    a model that needs nothing special (NOTHING_DIFFERENT says so in words)."""
    lines = [TOOL_WORDS[card.tools], THINKING_WORDS[card.thinking],
             TRUNCATE_WORDS[card.truncate]]
    ratio = start_ratio(card.estimate_error)
    # A ratio that reads 1.00 changes nothing a person could see: not worth a line.
    if ratio is not None and card.estimate_error is not None and f"{ratio:.2f}" != "1.00":
        lines.append(f"roost's token estimate was {card.estimate_error:+.1%} off the server's "
                     f"count: a new chat starts at calibration ratio {ratio:.2f}, not 1.00")
    if card.vision is False:
        lines.append("says it sees images but did not describe one: a photo may go unseen")
    return [line for line in lines if line]


def card_line(card: Card) -> str:
    """The card in one line, as `/status` and `roost doctor` say it."""
    parts = [f"tools {card.tools}", f"thinking {card.thinking}",
             f"over-window prompts {'cut' if card.truncate == 'cuts' else 'refused'}"]
    if card.estimate_error is not None:
        parts.append(f"estimate {card.estimate_error:+.1%}")
    if card.tokens_per_s is not None:
        parts.append(f"{card.tokens_per_s:.3g} tokens/s")
    if card.vision is not None:
        parts.append("describes images" if card.vision else "did not describe an image")
    quick = " (quick probe; `roost models` for all)" if card.quick else ""
    return f"{card.name}: " + ", ".join(parts) + f" — probed {card.probed_at[:10]}{quick}"


def same_model(name: str, other: str) -> bool:
    """Whether two names are one model: Ollama reads a name without a tag as ":latest", and
    `roost models` keeps a card under the name it was given."""
    return _tagged(name) == _tagged(other)


def card_of(cards: Iterable[Card], model: str, ollama_version: str) -> Card | None:
    """The card of `model` probed on this Ollama version, however its name was spelled (the
    newest probe where there are two spellings); None when there is none."""
    return latest_card(c for c in cards if c.ollama_version == ollama_version
                       and same_model(c.name, model))


def latest_card(cards: Iterable[Card], model: str | None = None) -> Card | None:
    """The newest probe among `cards` (of `model` only, when given), whatever the version."""
    found = [c for c in cards if model is None or same_model(c.name, model)]
    return max(found, key=lambda c: c.probed_at, default=None)


def _tagged(name: str) -> str:
    # The tag follows the last slash: a registry's "host:port/" before it is no tag.
    return name if ":" in name.rpartition("/")[2] else f"{name}:latest"
