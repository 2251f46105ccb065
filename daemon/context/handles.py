"""A message as its handle: what a request carries of a message that cost more tokens than its
estimate said, after Ollama refused the request as larger than the window (a dense paste: ids,
amounts, digits).

The handle is the message's first line and a label saying how much was left out; its file notes
(a message too long for the window is also stored as a file, `daemon/turn/journal.py`) ride
along as they always do, so a model with tools can read the rest. Pure: the same message makes
the same bytes, turn after turn.
"""

from __future__ import annotations

from dataclasses import replace

from daemon.core.conversations import Message

HANDLE_LINE_CHARS = 160  # the first line kept, at most


def as_handle(message: Message) -> Message:
    """`message` with its content cut to the first line and a label; a message that is one
    short line already is returned as it is."""
    text = message.content.strip()
    line = text.split("\n", 1)[0][:HANDLE_LINE_CHARS].rstrip()
    left = len(text) - len(line)
    if left <= 0:
        return message
    label = (f"[… {left:,} characters left out: my message was larger than the model's "
             "window allows]")
    return replace(message, content=f"{line}\n{label}")
