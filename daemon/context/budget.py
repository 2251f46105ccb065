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
