"""Token arithmetic: how much of the window a request may use, and what a text costs.

Estimates are UTF-8 bytes/4 times a per-conversation ratio that is calibrated against Ollama's
real `prompt_eval_count`, so that the estimate tracks the model's own tokenizer.
"""

from __future__ import annotations

import math

MESSAGE_OVERHEAD_TOKENS = 4  # role markers and separators the chat template adds per message
RATIO_MIN = 0.5
RATIO_MAX = 4.0


def estimate_tokens(text: str, ratio: float = 1.0) -> int:
    """Estimated tokens of `text`: UTF-8 bytes/4, scaled by the conversation's ratio.

    Bytes, not characters: tokenizers spend about a token on four letters of English but on
    one or two CJK characters (three bytes each), so one conversation's ratio, learned on
    either, holds for a paste in the other script as well."""
    return math.ceil(len(text.encode("utf-8", "surrogatepass")) / 4 * ratio)


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


def recalibrate(ratio: float, *, count: int, raw: int, overhead: int, estimate: int,
                num_ctx: int, whole: bool) -> tuple[float, bool]:
    """The conversation's next ratio from Ollama's `count` of a request built at `ratio`, and
    whether Ollama cut that request silently.

    `raw` is the request's estimate at ratio 1 (`overhead` of it unscaled), `estimate` the one
    it was fitted with. No single reading moves the ratio up by more than `RATIO_STEP`, except
    a cut, which moves it as far as the request needs to fit (`CUT_MARGIN`). A count
    far below the estimate is a cut only when it is also below what any tokenizer makes of the
    text (`RATIO_MIN` per 4 bytes): otherwise it is the truth, and the ratio was too high (taken
    for a cut, it raised an overestimate further, to the cap). Unless the count is `whole`
    (cached tokens included) it is a lower bound: it may raise the ratio, never mark a cut or
    lower it.
    """
    if count <= 0 or raw <= 0:
        return ratio, False
    measured = calibrated_ratio(count, raw, overhead)
    far_below = count < SILENT_CUT_SHARE * estimate and estimate >= num_ctx // 4
    brim = count >= num_ctx - 16
    if not whole and not brim:
        return min(max(measured, ratio), ratio * RATIO_STEP), False
    if (far_below and count < RATIO_MIN * raw) or brim:
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
