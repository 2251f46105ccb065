"""How a message's circumstances read to the model, in the same words on every platform: who
it replies to, that it was edited. Pure; what a platform stores is a function of the message."""

from __future__ import annotations

QUOTE_CLIP = 200  # characters of a replied-to message the model sees; the rest is elsewhere


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def reply_line(author: str, quoted: str) -> str:
    """`[Replying to AUTHOR: "the words, clipped"]`, or without the words when there are none."""
    words = clip(" ".join(quoted.split()), QUOTE_CLIP)
    return f'[Replying to {author}: "{words}"]' if words else f"[Replying to {author}]"


def with_context(text: str, context: list[str]) -> str:
    """The text as the model reads it; a command stays a bare command so the engine sees it."""
    if not context or text.startswith("/"):
        return text
    return "\n".join([*context, text])


def edit_text(original_id: str | int, new_text: str) -> str:
    """An edited message as the model reads it: what changed, and the new words quoted, so that
    the earlier message is neither ignored nor silently contradicted."""
    quoted = "\n".join(f"> {line}" for line in new_text.splitlines()) or ">"
    return f"[The user edited their earlier message (id {original_id}); it now reads:]\n{quoted}"
