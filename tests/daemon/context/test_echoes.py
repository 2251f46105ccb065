"""A reply that copies roost's framing is stored without the copy (issue 30's strings)."""

from __future__ import annotations

from daemon.context.echoes import without_framing


def test_a_copied_stamp_after_the_answer_is_taken_off() -> None:
    assert without_framing("Pickle is your cat.\n[Sender] - Wed 2026-12-02 at 30:52 UTC by Dana"
                           ) == "Pickle is your cat."
    assert without_framing("Sure!\n\n[sent Wed 2 Dec 2026 17:48]\n") == "Sure!"


def test_a_copied_truncation_label_is_taken_off() -> None:
    assert without_framing("The total is 412.\n[SENDED — 9,480 characters too long to send "
                           "whole; this is its start and end]") == "The total is 412."
    assert without_framing("Done.\n[TRUNCATED — 300 characters of a long message left out]\n"
                           "[sent Thu 3 Dec 2026 09:00]") == "Done."
    # The label as roost writes it now.
    assert without_framing("All set.\n[… 1,200 characters left out: a long earlier "
                           "message]") == "All set."


def test_the_models_own_words_stay() -> None:
    for reply in ("[sent] is how roost marks the time, in brackets.\nThat is all.",
                  "Use [Sender] as a placeholder:\n" + "[Sender] " + ("word " * 60).strip(),
                  "[sent Wed 2 Dec 2026 17:48]"):  # nothing else: never an empty answer
        assert without_framing(reply) == reply
