"""Reasoning a model writes into its answer (`<think>…</think>`), told apart while it streams.

Some templates put a model's reasoning in the content instead of Ollama's `thinking` field: a
`<think>` block first, or (where the template opened the block itself) the reasoning and then
only `</think>`. Neither is for the user, nor for the next request. Pure: pieces in, pieces out.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


class ReasoningSplitter:
    """Feed it the content's pieces in order; each call gives back (answer, reasoning) to pass
    on. A reply that begins with `<think>` has that block moved to the reasoning, always.
    With `unopened` (a model whose card says it reasons inline), everything before a lone
    `</think>` is reasoning too, so the answer is held until that tag or the end."""

    def __init__(self, *, unopened: bool = False) -> None:
        self.unopened = unopened
        self.state = "start"  # start | inside | unopened | answer
        self.buffer = ""

    def feed(self, piece: str) -> tuple[str, str]:
        if self.state == "answer":
            return piece, ""
        self.buffer += piece
        if self.state == "start":
            began = self.buffer.lstrip()
            if began.startswith(OPEN):
                self.state, self.buffer = "inside", began[len(OPEN):]
            elif OPEN.startswith(began):
                return "", ""  # nothing yet, or the tag's start
            elif self.unopened:
                self.state = "unopened"
            else:
                return self._answer_from(self.buffer), ""
        if CLOSE in self.buffer:
            reasoning, answer = self.buffer.split(CLOSE, 1)
            self.buffer = ""
            self.state = "answer"
            return answer.lstrip(), reasoning
        if self.state == "inside":  # pass the reasoning on, but not what may be the tag's start
            keep = _tag_start(self.buffer)
            reasoning, self.buffer = self.buffer[:len(self.buffer) - keep], self.buffer[
                len(self.buffer) - keep:]
            return "", reasoning
        return "", ""

    def end(self) -> tuple[str, str]:
        """What is held at the end: an unclosed block is all reasoning; held text that never
        met `</think>` was the answer after all."""
        held, self.buffer = self.buffer, ""
        if self.state == "inside":
            return "", held
        if self.state in ("start", "unopened"):
            self.state = "answer"
            return held, ""
        return "", ""

    def _answer_from(self, text: str) -> str:
        self.state, self.buffer = "answer", ""
        return text


def _tag_start(text: str) -> int:
    """How many characters at the end of `text` could begin `</think>`."""
    for size in range(min(len(CLOSE) - 1, len(text)), 0, -1):
        if CLOSE.startswith(text[-size:]):
            return size
    return 0
