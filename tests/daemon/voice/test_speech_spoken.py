"""What a voice reply reads aloud: the rendered words, never Markdown's symbols, and no more
than max_duration allows, cut where a sentence ends."""

from __future__ import annotations

from daemon.voice.spoken import REST_IS_WRITTEN, Spoken, spoken_text


def said(markdown: str, max_seconds: float = 60) -> str:
    return spoken_text(markdown, max_seconds=max_seconds).text


def test_emphasis_headings_and_lists_are_read_as_words() -> None:
    text = said("## Plan for **Monday**\n\n- buy *milk*\n- call ~~Bob~~ Anna\n\n1. done_it")
    assert text == "Plan for Monday. buy milk. call Bob Anna. done it."
    assert not any(mark in text for mark in "*#~_`")


def test_a_fenced_code_block_is_a_code_block() -> None:
    text = said("Run this:\n\n```python\nimport os\nprint(os.environ['HOME'])\n```\n\nThen wait.")
    assert text == "Run this: A code block. Then wait."


def test_inline_code_is_read_as_its_words() -> None:
    assert said("Use `git status` first.") == "Use git status first."


def test_a_table_is_a_table() -> None:
    text = said("Prices:\n\n| fruit | price |\n| --- | --- |\n| apple | 1 |\n\nCheap.")
    assert text == "Prices: A table. Cheap."


def test_a_long_url_is_a_link_and_a_link_with_words_says_its_words() -> None:
    text = said("See https://example.com/docs/2024/guide?section=voice#top and "
                "[the guide](https://example.com/a/very/long/path) or <https://x.org/q/r/s>.")
    assert text == "See a link and the guide or a link."
    assert "http" not in text


def test_a_bare_host_is_read_as_itself() -> None:
    assert said("It is on https://www.example.com today.") == "It is on example.com today."


def test_control_characters_are_not_read() -> None:
    assert said("Hello\x00\x07 the\u200bre.\x1b\x7f") == "Hello there."


def test_a_short_answer_is_whole() -> None:
    assert spoken_text("Yes. It is 5 pm.", max_seconds=60) == Spoken("Yes. It is 5 pm.", False)


def test_a_long_answer_is_cut_at_a_sentence_end_and_says_the_rest_is_written() -> None:
    sentence = "This sentence has exactly eight words in it."
    spoken = spoken_text(" ".join([sentence] * 20), max_seconds=10, words_per_second=2.5)
    assert spoken.cut
    assert len(spoken.text.split()) <= 25  # 10 s at 2.5 words a second
    assert spoken.text == " ".join([sentence] * 2 + [REST_IS_WRITTEN])


def test_a_first_sentence_longer_than_the_budget_is_cut_at_a_word() -> None:
    spoken = spoken_text("word " * 500, max_seconds=10)
    assert spoken.cut and spoken.text.endswith(REST_IS_WRITTEN)
    assert spoken.text.startswith("word word") and len(spoken.text.split()) <= 25


def test_nothing_to_say_is_empty() -> None:
    assert spoken_text("", max_seconds=60) == Spoken("", False)
    assert spoken_text("---\n\n<br>", max_seconds=60).text in ("", "br.")


def test_spoken_text_of_spoken_text_is_the_same() -> None:
    # Speaking.speak makes the spoken text itself: given spoken_text's result, it says the same.
    for markdown in ("## Plan\n\n- **milk**\n\n```\ncode\n```\n\nSee https://x.org/a/b/c.",
                     "Eight words are in this sentence right here. " * 40):
        once = spoken_text(markdown, max_seconds=20)
        assert spoken_text(once.text, max_seconds=20) == Spoken(once.text, False)
