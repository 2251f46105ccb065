"""The fold: when to fold, what the one fold call asks, and the user's own words kept verbatim."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

from daemon.context.budget import ENGLISH_CENTRED, estimate_tokens
from daemon.context.fold import (
    NOTES_HEADING,
    FoldPlan,
    excerpt_caps,
    fold_mark,
    fold_messages,
    fold_problem,
    fold_threshold,
    folded_state,
    low_water,
    merge_user_notes,
    notes_cap_tokens,
    notes_need_condensing,
    notes_problem,
    parse_fold_reply,
    plan_fold,
    summary_cap_chars,
    trim_notes,
)
from daemon.core.conversations import Message, Role, SummaryState

FACT = "My daughter Ilse is allergic to peanuts and her school is St. Georg, room 14."


def message(seq: int, role: Role, content: str, **extra: Any) -> Message:
    return Message(id=f"ID{seq:05d}", seq=seq, role=role, content=content,
                   created=1_772_000_000.0 + seq, **extra)


def conversation(roles: str, size: int = 20, start: int = 1) -> list[Message]:
    """Messages from a role pattern: u = user, a = assistant, c = assistant calling, t = tool."""
    names: dict[str, Role] = {"u": "user", "a": "assistant", "c": "assistant", "t": "tool"}
    out = []
    for offset, code in enumerate(roles):
        seq = start + offset
        extra: dict[str, Any] = {}
        if code == "c":
            extra["tool_calls"] = ({"function": {"name": "x", "arguments": {"q": seq}}},)
        if code == "t":
            extra["tool_name"] = "x"
        # padded so that the body's estimate is size/4 tokens, as a letter run's is
        prefix = f"#{seq} "
        body = prefix + "w" * max(size - 4 * estimate_tokens(prefix), 13)
        out.append(message(seq, names[code], body, **extra))
    return out


def chat_tokens(messages: Sequence[dict[str, str]], ratio: float = 1.0) -> int:
    return sum(4 + estimate_tokens(m["content"], ratio) for m in messages)


# --- the mark -------------------------------------------------------------------------------


@pytest.mark.parametrize("roles", ["", "a", "u", "ua", "uaaa"])
def test_nothing_to_fold_before_the_newest_exchange(roles: str) -> None:
    assert fold_mark(conversation(roles), keep_tokens=0) is None


def test_mark_keeps_what_fits_the_low_water_mark_from_a_user_message() -> None:
    tail = conversation("ua" * 10, size=400)  # 100 tokens each
    assert fold_mark(tail, keep_tokens=400) == 16  # two exchanges: 400 tokens
    assert fold_mark(tail, keep_tokens=399) == 18  # only the newest exchange fits
    assert tail[16].role == "user"


def test_mark_always_keeps_the_newest_exchange_even_over_the_low_water_mark() -> None:
    tail = conversation("ua" * 4, size=4_000)
    assert fold_mark(tail, keep_tokens=10) == 6


def test_mark_never_splits_a_tool_cycle() -> None:
    roles = "ua" * 4 + "u" + "ctttta" + "uaua"  # index 8 user, then a call and 4 results
    tail = conversation(roles)
    # From index 8 (the user before the cycle) the tail is `from_8` tokens.
    from_8 = sum(estimate_tokens(m.content) for m in tail[8:])
    assert fold_mark(tail, keep_tokens=from_8) == 8
    assert fold_mark(tail, keep_tokens=from_8 - 1) == 15


def test_no_mark_when_the_only_user_message_is_the_first() -> None:
    assert fold_mark(conversation("u" + "a" * 12), keep_tokens=0) is None


# --- the plan -------------------------------------------------------------------------------


def history_of(chars: int, pairs: int = 10) -> list[Message]:
    return conversation("ua" * pairs, size=chars)


def test_high_water_is_five_eighths_and_low_water_a_twelfth_of_the_window() -> None:
    assert fold_threshold(8192) == 5120
    assert low_water(8192) == 682


def test_no_plan_under_the_high_water_mark() -> None:
    # 20 x 1,024 characters = 20 x 256 tokens = 5,120 <= 5,120.
    assert plan_fold(history_of(1_024), SummaryState(), 8192, 1.0) is None


def test_plan_over_the_high_water_mark_folds_down_to_the_low_water_mark() -> None:
    history = history_of(1_100)  # 20 x 275 = 5,500 tokens
    plan = plan_fold(history, SummaryState(), 8192, 1.0)
    assert plan is not None
    # 682 tokens keep two messages (550): the newest exchange; everything else is folded.
    assert [m.seq for m in plan.messages] == list(range(1, 19))
    assert plan.through_id == "ID00018"
    assert history[18].role == "user"  # the verbatim tail starts on what the user said


def test_the_ratio_scales_the_high_water_check() -> None:
    history = history_of(1_024)
    assert plan_fold(history, SummaryState(), 8192, 1.0) is None
    assert plan_fold(history, SummaryState(), 8192, 1.2) is not None


def test_over_120000_characters_folds_even_with_a_huge_window() -> None:
    window = 10_000_000
    assert plan_fold(history_of(5_900), SummaryState(), window, 1.0) is None
    plan = plan_fold(history_of(6_100), SummaryState(), window, 1.0)  # 122,000 characters
    # The low-water mark is capped too (7,500 tokens): two exchanges of 3,050 stay.
    assert plan is not None and plan.through_seq == 16


def test_force_skips_the_high_water_mark_and_keep_zero_folds_all_but_the_newest_exchange(
) -> None:
    history = history_of(30)
    assert plan_fold(history, SummaryState(), 8192, 1.0) is None
    plan = plan_fold(history, SummaryState(), 8192, 1.0, force=True, keep_tokens=0)
    assert plan is not None and plan.through_seq == 18
    assert plan_fold(history[:2], SummaryState(), 8192, 1.0, force=True) is None


def test_only_the_unsummarized_part_is_planned() -> None:
    history = conversation("ua" * 20, size=1_200)  # seqs 1..40, 300 tokens each
    summary = SummaryState(summary="s", through_seq=14, through_id="ID00014")
    plan = plan_fold(history, summary, 8192, 1.0)
    assert plan is not None
    # Tail is 15..40 (26 messages, 7,800 tokens); the newest exchange (39, 40) stays.
    assert plan.messages[0].seq == 15
    assert plan.through_seq == 38


def test_notes_over_their_cap_lose_the_oldest_lines_first() -> None:
    notes = "\n".join(f"- note {i} " + "n" * 200 for i in range(20))  # 20 x ~52 tokens
    kept, dropped = trim_notes(notes, 8192, 1.0)
    assert estimate_tokens(kept, 1.0) <= 512
    assert dropped > 0 and kept.splitlines()[-1] == notes.splitlines()[-1]
    assert kept.splitlines()[0] == notes.splitlines()[dropped]
    assert trim_notes("- short", 8192, 1.0) == ("- short", 0)


# --- the user's own words -------------------------------------------------------------------


def test_user_messages_are_copied_verbatim_and_previous_notes_come_first() -> None:
    folded = [
        message(1, "user", "Book a table for  four\n at  Lucia's,\t8 pm Friday."),
        message(2, "assistant", "Done, booked."),
        message(3, "tool", "reservation id 991", tool_name="book"),
        message(4, "user", "   \n "),
        message(5, "user", "Also: my wife's name is Mira."),
    ]
    notes = merge_user_notes("- earlier: I live in Leipzig", folded)
    assert notes.splitlines() == [
        "- earlier: I live in Leipzig",
        "- Book a table for four at Lucia's, 8 pm Friday.",
        "- Also: my wife's name is Mira.",
    ]


def test_first_notes_have_no_leading_blank() -> None:
    assert merge_user_notes("", [message(1, "user", "hello")]) == "- hello"
    assert merge_user_notes("", [message(1, "assistant", "hello")]) == ""


def test_user_notes_are_clipped_to_300_characters() -> None:
    long = " ".join(f"word{i}" for i in range(200))  # about 1,300 characters
    (line,) = merge_user_notes("", [message(1, "user", long)]).splitlines()
    text = line.removeprefix("- ")
    assert len(text) <= 300
    assert len(text) >= 290  # clipped, not emptied
    assert long.startswith(text.rstrip("…"))


def test_a_fact_from_turn_one_survives_three_folds_word_for_word() -> None:
    history = [message(1, "user", FACT), message(2, "assistant", "Noted.")]
    state = SummaryState()
    for fold in range(3):
        for _ in range(10):
            seq = len(history) + 1
            history.append(message(seq, "user", f"fold {fold} question {seq} " + "q" * 1_200))
            history.append(message(seq + 1, "assistant", "answer " + "a" * 1_200))
        plan = plan_fold(history, state, 8192, 1.0)
        assert plan is not None
        notes = merge_user_notes(state.user_notes, plan.messages)
        state = folded_state(state, plan, f"summary after fold {fold + 1}", notes, now=1.0)
        assert FACT in state.user_notes
    assert state.fold_count == 3
    assert state.user_notes.count(FACT) == 1


def test_notes_need_condensing_past_a_sixteenth_of_the_window() -> None:
    window = 8192  # 512 tokens = 2,048 characters at ratio 1
    assert not notes_need_condensing("n" * 2_048, window, 1.0)
    assert notes_need_condensing("n" * 2_049, window, 1.0)
    assert notes_need_condensing("n" * 1_500, window, 2.0)


# --- excerpts -------------------------------------------------------------------------------


def test_short_messages_stay_whole() -> None:
    assert excerpt_caps([10, 200, 30], 1_000) == [10, 200, 30]


def test_long_messages_share_what_short_ones_leave() -> None:
    # Share 1,000 each; 100 and 50 stay whole, the two long ones split the other 3,850.
    assert excerpt_caps([100, 50, 10_000, 10_000], 4_000) == [100, 50, 1_925, 1_925]


def test_caps_fit_the_budget_and_are_fair() -> None:
    rng = random.Random(3)
    for _ in range(200):
        lengths = [rng.choice([20, 150, 400, 2_000, 40_000]) for _ in range(rng.randint(1, 40))]
        budget = rng.randint(160 * len(lengths), 60_000)
        caps = excerpt_caps(lengths, budget)
        assert sum(caps) <= budget
        whole = [n for n, c in zip(lengths, caps, strict=True) if c >= n]
        clipped = [c for n, c in zip(lengths, caps, strict=True) if c < n]
        if clipped:
            assert len(set(clipped)) == 1  # long messages share alike
            assert clipped[0] >= max(whole, default=0)  # and get at least any short one
        else:
            assert caps == lengths


# --- the fold call --------------------------------------------------------------------------


def plan_of(messages: Sequence[Message]) -> FoldPlan:
    return FoldPlan(messages=tuple(messages), through_seq=messages[-1].seq,
                    through_id=messages[-1].id)


def test_fold_prompt_carries_the_previous_summary_and_asks_for_one_summary() -> None:
    previous = SummaryState(summary="The user is moving to Porto in June.", through_seq=4)
    folded = conversation("ucta" + "ua", size=200, start=5)
    system, user = fold_messages(previous, plan_of(folded), notes="- a note", window=8192,
                                 condense_notes=False, prompt_budget=7_000, ratio=1.0)
    assert system["role"] == "system" and user["role"] == "user"
    assert "The user is moving to Porto in June." in user["content"]
    assert "ONE updated summary" in system["content"]
    assert "Merge the previous summary" in system["content"]
    assert "at most 1,024 characters" in user["content"]  # min(6000, 8192/32*4)
    for m in folded:
        assert f"#{m.seq}" in user["content"]
    # Notes are not rewritten unless they must be condensed.
    assert NOTES_HEADING not in user["content"]
    assert "- a note" not in user["content"]


def test_fold_prompt_asks_to_condense_notes_only_when_told() -> None:
    folded = conversation("uaua", size=100)
    _, user = fold_messages(SummaryState(), plan_of(folded), notes="- I am vegetarian",
                            condense_notes=True, window=8192, prompt_budget=7_000, ratio=1.0)
    content = user["content"]
    assert "- I am vegetarian" in content
    assert NOTES_HEADING in content
    assert "Keep every fact, name, number and instruction" in content
    assert "(none yet)" in content  # no previous summary


@pytest.mark.parametrize("ratio", [0.7, 1.0, 1.8, 4.0])
@pytest.mark.parametrize("window", [4096, 8192, 32768])
def test_fold_prompt_fits_its_budget_with_huge_messages(ratio: float, window: int) -> None:
    folded = conversation("u" + "ct" * 4 + "a", size=40_000)
    prompt_budget = window - (summary_cap_chars(window) // 4 + 64)
    messages = fold_messages(SummaryState(summary="s" * 1_000), plan_of(folded),
                             notes="- n" * 100, condense_notes=True, window=window,
                             prompt_budget=prompt_budget, ratio=ratio)
    assert chat_tokens(messages, ratio) <= prompt_budget
    for m in folded:  # every message is represented by an excerpt
        assert f"#{m.seq}" in messages[1]["content"]


def test_notes_that_fill_the_fold_budget_alone_leave_the_new_messages_clipped() -> None:
    # At a 2K window the fold prompt has 512 tokens; digit-heavy notes (a token a digit) to
    # condense took all of them, and the new messages went whole: 4,073 tokens, refused.
    window, export = 2048, "2026-12-01 14:01,36019,4793.11\n" * 130
    notes = "\n".join(["- " + export[:300]] * 3)
    folded = [message(1, "user", export), message(2, "assistant", "Noted the export."),
              message(3, "user", export), message(4, "assistant", "And the second one.")]
    messages = fold_messages(SummaryState(summary="the story so far"), plan_of(folded),
                             notes=notes, condense_notes=True, window=window,
                             prompt_budget=512, ratio=1.0)
    answer = summary_cap_chars(window) // 4 + notes_cap_tokens(window) + 64
    assert chat_tokens(messages) <= window - answer
    assert notes in messages[1]["content"]  # whole, for the model to condense


def test_fold_prompt_fits_its_budget_with_many_messages() -> None:
    window = 8192
    folded = conversation("ua" * 100, size=800)
    prompt_budget = window - (summary_cap_chars(window) // 4 + 64)
    messages = fold_messages(SummaryState(summary="the story so far"), plan_of(folded),
                             notes="", condense_notes=False, window=window,
                             prompt_budget=prompt_budget, ratio=1.0)
    assert chat_tokens(messages) <= prompt_budget


# --- the reply ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "cap"),
    [(4096, 512), (8192, 1024), (32768, 4096), (49152, 6000), (131072, 6000)],
)
def test_summary_cap_is_the_smaller_of_6000_chars_and_window_over_32_tokens(
    window: int, cap: int
) -> None:
    assert summary_cap_chars(window) == cap


def test_reply_splits_at_the_notes_heading() -> None:
    reply = f"Moving to Porto in June.\nNeeds a vet.\n{NOTES_HEADING}\n- vegetarian\n- Mira\n"
    summary, notes = parse_fold_reply(reply, 8192, condense_notes=True)
    assert summary == "Moving to Porto in June.\nNeeds a vet."
    assert notes == "- vegetarian\n- Mira"


def test_reply_without_condensing_is_all_summary() -> None:
    summary, notes = parse_fold_reply("  Just the summary.  \n", 8192, condense_notes=False)
    assert (summary, notes) == ("Just the summary.", None)


def test_missing_notes_section_gives_no_condensed_notes() -> None:
    summary, notes = parse_fold_reply("only a summary", 8192, condense_notes=True)
    assert (summary, notes) == ("only a summary", None)


@pytest.mark.parametrize("window", [4096, 8192, 1_000_000])
def test_summary_is_capped(window: int) -> None:
    reply = "fact " * 3_000 + f"\n{NOTES_HEADING}\n- keep me"
    summary, notes = parse_fold_reply(reply, window, condense_notes=True)
    assert len(summary) <= summary_cap_chars(window)
    assert summary.startswith("fact fact")
    assert notes == "- keep me"  # the notes are not eaten by the summary cap


def test_folded_state_pins_the_boundary_and_counts() -> None:
    previous = SummaryState(summary="old", user_notes="- a", through_seq=4, through_id="ID00004",
                            fold_count=2, folded_at=5.0)
    plan = plan_of(conversation("uaua", start=5))
    state = folded_state(previous, plan, "new", "- a\n- b", now=99.0)
    assert state == SummaryState(summary="new", user_notes="- a\n- b", through_seq=8,
                                 through_id="ID00008", fold_count=3, folded_at=99.0,
                                 first_folded_at=5.0)  # a legacy summary: its last fold


def test_notes_lose_trivia_before_names_numbers_and_instructions() -> None:
    facts = ["- My cat is called Pickle and I live in Lisbon.",
             "- Remember: never book flights before 9 am.",
             "- my flat is number 31"]
    trivia = [f"- tell me a short joke about {thing}, thanks" for thing in
              ("dogs", "ducks", "rain", "tea", "socks", "boats", "clouds", "bread", "maps",
               "moss", "fog", "ink", "sand", "hats", "eels", "wool", "owls", "jam")]
    notes = "\n".join([facts[0], *trivia[:9], facts[1], *trivia[9:], facts[2]])
    kept, dropped = trim_notes(notes, 2048, 1.0)
    assert dropped > 0
    assert all(fact in kept.splitlines() for fact in facts)
    assert estimate_tokens(kept, 1.0) <= notes_cap_tokens(2048)


@pytest.mark.parametrize("ratio", [1.0, 1.3])
def test_one_note_in_a_dense_script_is_clipped_to_the_cap_in_that_models_tokens(
        ratio: float) -> None:
    # A 300-character note of Chinese and Russian cost SmolLM2 about three times the notes'
    # cap; clipped at four characters a token it stayed whole, and every fold added an "…".
    note = "- " + ("今日は天気が良いので公園に行きます Привет как дела " * 20)[:298]
    kept, _ = trim_notes(note, 2048, ratio, ENGLISH_CENTRED)
    assert kept.startswith("- 今日は天気")
    assert estimate_tokens(kept, ratio, ENGLISH_CENTRED) <= notes_cap_tokens(2048)
    again, _ = trim_notes(kept, 2048, ratio, ENGLISH_CENTRED)
    assert again == kept


def test_a_summary_that_repeats_a_fact_is_not_taken_for_an_echo() -> None:
    prompt = [{"role": "system", "content": "You maintain the rolling summary."},
              {"role": "user", "content": "<new_messages>\n[#1 user] My name is Dana, my cat is "
                                          "Pickle, I live in Lisbon.\n[#2 assistant] Hi Dana! "
                                          "Pickle is a lovely name for a cat.\n</new_messages>"}]
    summary = ("Dana lives in Lisbon with her cat Pickle; she asked for jokes and got two. "
               "She wants short answers.")
    assert fold_problem(summary, prompt, "") == ""
    echoed = "[#1 user] My name is Dana, my cat is Pickle, I live in Lisbon. [#2 assistant] Hi"
    assert "echo" in fold_problem(echoed, prompt, "")
    # Repeating the previous summary is a merge with nothing new, not an echo.
    previous = "Dana lives in Lisbon with her cat Pickle and likes jokes about numbers."
    with_previous = [prompt[0], {"role": "user", "content": f"<previous_summary>\n{previous}\n"
                                                            "</previous_summary>"}]
    assert fold_problem(previous, with_previous, previous) == ""


# --- a fold answer is a summary of what it was given (issue 43) -------------------------------


def times_table_prompt(condense_notes: bool = False) -> list[dict[str, str]]:
    """The fold prompt of a short English chat about times tables and a trip to Lisbon."""
    folded = [message(1, "user", "What is 12 x 7? I need it for my daughter Ilse's homework."),
              message(2, "assistant", "12 x 7 = 84."),
              message(3, "user", "We fly to Lisbon on 14 May, flight TP 1301, gate opens 06:40."),
              message(4, "assistant", "Have a good trip to Lisbon!")]
    plan = FoldPlan(messages=tuple(folded), through_seq=4, through_id="ID00004")
    notes = merge_user_notes("", folded)
    return fold_messages(SummaryState(), plan, notes=notes, condense_notes=condense_notes,
                         window=2048, prompt_budget=512, ratio=1.0)


GOOD_SUMMARY = ("Ilse's homework: 12 x 7 = 84. The family flies to Lisbon on 14 May, flight "
                "TP 1301; the gate opens at 06:40.")


def test_a_summary_of_the_messages_is_stored() -> None:
    assert fold_problem(GOOD_SUMMARY, times_table_prompt(), "") == ""
    # A short one, and one that paraphrases with small counts of its own, too.
    assert fold_problem("Homework and a trip.", times_table_prompt(), "") == ""
    assert fold_problem("Two questions: Ilse's times table and the Lisbon flight on 14 May.",
                        times_table_prompt(), "") == ""


def test_a_summary_that_repeats_the_fold_instructions_is_not_stored() -> None:
    # What SmolLM2-135M answered, stored and replayed as the summary (issue 43).
    prompt = times_table_prompt(condense_notes=True)
    cap = summary_cap_chars(2048)
    echoed = (f"(sure!) - Please summarize the following …Write the updated summary, at most "
              f"{cap} characters…")
    assert "repeats roost's instructions" in fold_problem(echoed, prompt, "")
    notes_echo = ("Ilse's homework was 12 x 7 = 84, and the family flies to Lisbon on 14 May. "
                  "and below it a shorter version of the user notes.")
    assert "instructions" in fold_problem(notes_echo, prompt, "")
    system_echo = ("Ilse: 12 x 7 = 84; the flight TP 1301 to Lisbon leaves on 14 May. Merge the "
                   "previous summary and the new messages.")
    assert "instructions" in fold_problem(system_echo, prompt, "")


def test_a_summary_with_numbers_none_of_the_messages_hold_is_not_stored() -> None:
    problem = fold_problem("Ilse asked about times tables: 12 x 7 = 72.", times_table_prompt(),
                           "")
    assert "numbers found in none of its messages (72)" in problem


def test_a_summary_that_shares_no_words_with_the_messages_is_not_stored() -> None:
    spanish = ("El usuario pregunta sobre la configuración del servidor y quiere cambiar la "
               "contraseña de la cuenta principal.")
    assert "shares almost no words" in fold_problem(spanish, times_table_prompt(), "")


def test_a_summary_of_a_chat_in_spanish_may_be_in_spanish() -> None:
    folded = [message(1, "user", "Quiero cambiar la contraseña de mi cuenta del servidor."),
              message(2, "assistant", "Abre la configuración y elige la cuenta principal.")]
    plan = FoldPlan(messages=tuple(folded), through_seq=2, through_id="ID00002")
    prompt = fold_messages(SummaryState(), plan, notes="", condense_notes=False, window=2048,
                           prompt_budget=512, ratio=1.0)
    summary = ("El usuario quiere cambiar la contraseña de su cuenta; se abre la configuración "
               "del servidor.")
    assert fold_problem(summary, prompt, "") == ""


def test_condensed_notes_are_the_users_own_words_or_not_used() -> None:
    prompt = times_table_prompt(condense_notes=True)
    notes = prompt[-1]["content"].split("<user_notes>\n")[1].split("\n</user_notes>")[0]
    assert notes_problem("- 12 x 7 for Ilse's homework\n- fly to Lisbon 14 May, TP 1301",
                         notes, prompt) == ""
    # The fold prompt's own sentence, stored under "in my own words" (issue 43).
    echoed = "- and below it a shorter version of the user notes. Keep every fact"
    assert "instructions" in notes_problem(echoed, notes, prompt)
    assert "numbers" in notes_problem("- fly to Lisbon on 15 May", notes, prompt)
    assert "shares almost no words" in notes_problem(
        "- the assistant recommended a cheaper hotel near the beach", notes, prompt)
