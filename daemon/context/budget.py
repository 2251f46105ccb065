"""Token arithmetic: how much of the window a request may use, and what a text costs.

Estimates count a text's pieces the way BPE tokenizers split them (a token a digit, a word, a
punctuation run, a whitespace run; other scripts by the character), times a per-conversation
ratio that is calibrated against Ollama's real `prompt_eval_count`, so that the estimate tracks
the model's own tokenizer.
"""

from __future__ import annotations

import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

Estimator = Callable[[str, float], int]  # (text, ratio) -> tokens: `Vocabulary.estimate`
MESSAGE_OVERHEAD_TOKENS = 4  # role markers and separators the chat template adds per message
RATIO_MIN = 0.5
RATIO_MAX = 4.0


# Pre-tokenizers (Qwen, Llama 3, SmolLM2, Gemma) split a text into pieces before BPE: digits one
# by one, a word with the space before it, a punctuation run, a whitespace run; a space before a
# digit stays a piece of its own. Groups: digit, word, costly whitespace, lone space, punctuation;
# underscores join the word after them (`_count`).
_PIECES = re.compile(r"(\d)|([^\W\d_]+)|( (?=\d)|\s\s+|[^\S ])|( )|([^\w\s]+)|_+")
WORD_CHARS = 8  # an English word is a token up to about this length (measured on Qwen, SmolLM2)
PUNCT_CHARS = 3  # `):` or `->` is one token, longer runs split


@dataclass(frozen=True)
class Vocabulary:
    """Tokens a letter of another script costs in a model's vocabulary: `wide` for CJK and
    the other wide scripts from U+2E80 on, `narrow` for the two-byte ones (Cyrillic, Greek,
    Arabic...). Latin text, digits and code cost the same in every vocabulary measured."""

    wide: float
    narrow: float

    def estimate(self, text: str, ratio: float = 1.0) -> int:
        return estimate_tokens(text, ratio, self)


# A vocabulary of 64,000 tokens or more (Qwen's 151,936, Llama 3's 128,256, Gemma's 256,000) has
# tokens of its own for other scripts: measured on Qwen's.
MULTILINGUAL = Vocabulary(wide=0.65, narrow=0.42)
# A small one (SmolLM2's 49,152; Llama 2's and Mistral 7B's 32,000) spells them out in bytes,
# mostly: 1.75 a CJK character and 0.9 a Cyrillic or Greek letter, measured on SmolLM2's.
ENGLISH_CENTRED = Vocabulary(wide=1.75, narrow=0.9)
SMALL_VOCABULARY = 64_000


def vocabulary_of(size: int | None) -> Vocabulary:
    """The vocabulary a model's size says (`<arch>.vocab_size` in /api/show); unknown, the
    multilingual one, and the conversation's ratio learns the rest."""
    return ENGLISH_CENTRED if size is not None and size < SMALL_VOCABULARY else MULTILINGUAL


# A letter run longer than any word (a glued identifier, base64, a key) is not in the
# vocabulary: about a token per four letters, as bytes/4 counted it.
LONG_WORD = 12


_CASE_TURN = re.compile(r"[a-z][A-Z]")  # camelCase or base64: each hump is a piece of its own


def _word_tokens(word: str, vocabulary: Vocabulary) -> float:
    if word.isascii():
        humps = len(_CASE_TURN.findall(word))
        if len(word) > LONG_WORD:
            return len(word) / 4 + humps
        return 1 + (len(word) - 1) // WORD_CHARS + humps
    return max(1.0, sum(vocabulary.wide if ord(c) >= 0x2E80 else vocabulary.narrow
                        for c in word))


def estimate_tokens(text: str, ratio: float = 1.0,
                    vocabulary: Vocabulary = MULTILINGUAL) -> int:
    """Estimated tokens of `text`, scaled by the conversation's ratio, for a model with that
    `vocabulary`.

    Counted by piece, not by byte: bytes/4 fits English prose but undercounts digits (a token
    each: a date stamp is three times bytes/4) and code, so one ratio could not fit a digit-heavy
    paste and the prose after it (issue 30). Within 10% of Qwen's and SmolLM2's tokenizers on
    prose, code, digits and non-Latin text, each with its vocabulary
    (bench/real_tokenizer.py)."""
    return math.ceil(_COSTS.cost(text, vocabulary) * ratio)


def pieces_cost(text: str, vocabulary: Vocabulary) -> float:
    """The cost of `text` at ratio 1, before rounding, counted afresh."""
    n = 0.0
    for digit, word, space, _lone, punct in _PIECES.findall(text):
        if digit or space:
            n += 1
        elif word:
            n += _word_tokens(word, vocabulary)
        elif punct:
            n += 1 + (len(punct) - 1) // PUNCT_CHARS
    return n


class CostMemo:
    """Each text counted once: a request estimates the history the last one estimated, and a
    fold or a cut estimates the same messages again. Bounded by the characters it holds, not
    by a count of texts, so that a long unfolded history (hundreds of messages, pages of tens
    of KB) is held whole instead of evicted piece by piece ahead of its next use. Pure: the
    same text costs the same; a lock, since folds estimate in worker threads too."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._costs: OrderedDict[tuple[str, Vocabulary], float] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def cost(self, text: str, vocabulary: Vocabulary) -> float:
        key = (text, vocabulary)
        with self._lock:
            if (known := self._costs.get(key)) is not None:
                self._costs.move_to_end(key)
                return known
        counted = pieces_cost(text, vocabulary)
        if len(text) > self.max_chars:
            return counted
        with self._lock:
            if key not in self._costs:
                self._costs[key] = counted
                self._chars += len(text)
                while self._chars > self.max_chars:
                    (old, _), _cost = self._costs.popitem(last=False)
                    self._chars -= len(old)
        return counted

    @property
    def held_chars(self) -> int:
        return self._chars

    def clear(self) -> None:
        with self._lock:
            self._costs.clear()
            self._chars = 0


MEMO_CHARS = 4_000_000  # about 4-16 MB of text; a 300-turn history with its pages is 1.5 M
_COSTS = CostMemo(MEMO_CHARS)


def request_budget(num_ctx: int, response_reserve: int) -> int:
    """Tokens the prompt may use: the window less what the reply needs."""
    return max(num_ctx - response_reserve, 0)


def calibrated_ratio(prompt_eval_count: int, raw_estimate: int, overhead: int = 0) -> float:
    """New ratio from Ollama's real count against the ratio-1 estimate, clamped to 0.5-4.

    `overhead` is the part of both that the ratio does not scale (the per-message template
    tokens): leaving it in would pull the ratio towards 1 and underestimate long texts.
    """
    content = raw_estimate - overhead
    if content <= 0:
        return 1.0
    return min(max((prompt_eval_count - overhead) / content, RATIO_MIN), RATIO_MAX)


# A count below this share of the estimate means Ollama cut the prompt (dropping old messages),
# provided the prompt was not tiny and the count is below any tokenizer's; one that fills
# num_ctx to the brim was cut too.
SILENT_CUT_SHARE = 0.6
RATIO_DECAY = 0.2
RATIO_DECAY_FAR = 0.5  # for a count far below the estimate that is not a cut
# One reading moves the ratio up by at most this factor: a count can be wrong (a server that
# counts only the uncached part, a cut misread), and the ratio is kept with the conversation.
RATIO_STEP = 1.5
# A cut proves the request was over num_ctx, so the ratio is at least num_ctx / raw; this much
# above that bound, since the prompt was over by an unknown amount (the reply's reserve gives
# the rebuilt request room besides). The step cap does not apply: this is no noisy reading.
CUT_MARGIN = 1.5
# What is left of a prompt after a front cut fills the window but for the last message dropped,
# which replay keeps under a quarter of the budget: at least half of num_ctx.
CUT_FILL = 0.5


def recalibrate(ratio: float, *, count: int, raw: int, overhead: int, estimate: int,
                num_ctx: int, whole: bool, may_cut: bool = True) -> tuple[float, bool]:
    """The conversation's next ratio from Ollama's `count` of a request built at `ratio`, and
    whether Ollama cut that request silently.

    `raw` is the request's estimate at ratio 1 (`overhead` of it unscaled), `estimate` the one
    it was fitted with: both of what was sent (no tool schemas for a model that got none).
    No single reading moves the ratio up by more than `RATIO_STEP`, except a cut, which moves
    it as far as the request needs to fit (`CUT_MARGIN`). A count far below the estimate is a
    cut only when it is also below what any tokenizer makes of the text (`RATIO_MIN` per 4
    bytes), and when the server could have cut: one that `may_cut` (it predates `truncate`),
    or a count that fills most of `num_ctx`, as what is left after a front cut does; a server
    told `truncate: false` refuses instead. Otherwise the count is the truth, and the estimate
    was too high (taken for a cut, a 301-token prompt at a 2,048 window discarded an answer
    the user had seen: issue 43). Unless the count is `whole` (cached tokens included) it is a
    lower bound: it may raise the ratio, never mark a cut or lower it.
    """
    if count <= 0 or raw <= 0:
        return ratio, False
    measured = calibrated_ratio(count, raw, overhead)
    far_below = count < SILENT_CUT_SHARE * estimate and estimate >= num_ctx // 4
    brim = count >= num_ctx - 16
    if not whole and not brim:
        return min(max(measured, ratio), ratio * RATIO_STEP), False
    could_cut = may_cut or count >= num_ctx * CUT_FILL
    if (far_below and count < RATIO_MIN * raw and could_cut) or brim:
        # Ollama dropped part of the prompt: the real size was above num_ctx.
        return min(max(num_ctx / raw * CUT_MARGIN, ratio * 1.25), RATIO_MAX), True
    if count < RATIO_MIN * raw:
        return ratio, False  # a count too small for the text: not a reading to learn from
    # Up at once (within a step), down slowly: requests mix text whose tokens-per-character
    # differ, and an underestimate is what makes Ollama cut, while an overestimate only costs a
    # little room; far below, though, it costs most of the window: halfway down.
    if measured >= ratio:
        return min(measured, ratio * RATIO_STEP), False
    return ratio + (measured - ratio) * (RATIO_DECAY_FAR if far_below else RATIO_DECAY), False


def overflow_ratio(ratio: float, *, stated: int | None, raw: int, overhead: int,
                   num_ctx: int) -> float:
    """The ratio to refit a request at that Ollama refused as over the window: 5% over the
    size it `stated`; without one (its Go runners say no size), what a cut proves, since the
    prompt was over `num_ctx` by an unknown amount (`CUT_MARGIN`); always at least 5% up."""
    if stated:
        measured = calibrated_ratio(stated, raw, overhead) * 1.05
    else:
        measured = max(calibrated_ratio(num_ctx, raw, overhead) * CUT_MARGIN, ratio * 1.5)
    return min(max(measured, ratio * 1.05, RATIO_MIN), RATIO_MAX)
