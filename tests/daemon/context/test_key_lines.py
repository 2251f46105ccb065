"""The excerpt of a long first message: its opening and the lines with names and numbers."""

from __future__ import annotations

from daemon.context.key_lines import key_lines

CHATTER = "and then we talked about the weather for a while, nothing much came of it"


def test_a_text_within_keep_is_returned_whole() -> None:
    assert key_lines("My code is 4711.\nThanks!", 100, "label") == "My code is 4711.\nThanks!"


def test_lines_with_numbers_codes_and_names_are_kept_before_chatter() -> None:
    text = "\n".join([
        "Here is what I need you to keep.",
        *[CHATTER] * 10,
        "the gate code is 8812",
        *[CHATTER] * 10,
        "my landlord is Maria Jensen",
        *[CHATTER] * 10,
        "ref ABX-QQ for the claim",
    ])
    kept = key_lines(text, 130, "my first message")
    lines = kept.split("\n")
    assert lines[0] == "Here is what I need you to keep."
    assert lines[1].startswith("[… ") and "characters left out: my first message]" in lines[1]
    assert [line for line in lines[2:] if line != "…"] == [
        "the gate code is 8812", "my landlord is Maria Jensen", "ref ABX-QQ for the claim"]
    assert CHATTER not in kept


def test_the_first_ids_of_an_export_come_first_and_the_label_is_never_last() -> None:
    rows = [f"2026-02-{i + 1:02d};TX-{48213 + i};Coffee;-3.{i:02d}" for i in range(50)]
    text = "My locker code is 7316. My export:\n" + "\n".join(rows)
    kept = key_lines(text, 160, "my first message")
    assert "My locker code is 7316." in kept and "TX-48213" in kept and "TX-48262" not in kept
    assert not kept.split("\n")[-1].startswith("[")
    # The same text and size give the same bytes (the prompt cache keeps matching).
    assert key_lines(text, 160, "my first message") == kept


def test_one_long_line_is_taken_by_its_sentences() -> None:
    text = (" ".join([CHATTER + "."] * 20) + " The invoice number is 99-1043. "
            + " ".join([CHATTER + "."] * 20))
    kept = key_lines(text, 300, "x")
    assert "The invoice number is 99-1043." in kept
    assert len(kept) < 400


def test_an_opening_longer_than_keep_is_clipped_at_a_word() -> None:
    kept = key_lines("Please remember everything below " * 20, 40, "x")
    assert kept.startswith("Please remember everything below") and kept.split("\n")[0][-1] == "…"
    assert kept.split("\n")[0][-2] != " "
