"""A fold's answer is checked before it is stored: cut off at its limit, roost's own markup
echoed back, or an echo of the prompt instead of a summary (as SmolLM2-135M wrote them)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.store.event_log import Records
from daemon.turn.background_fold import BackgroundFold
from tests.conftest import SettingsFactory, wait_until
from tests.fakes.ollama import FakeModel, FakeOllama, Reply

CHAT = "telegram:1111111"
T0 = 1_796_112_000.0


@dataclass
class Rig:
    folder: BackgroundFold
    store: Store
    fake: FakeOllama

    def chat_of(self, pairs: int = 12) -> str:
        conversation = self.store.create_conversation(CHAT, T0)
        for n in range(pairs):
            self.store.append_message(conversation.id, "user",
                                      f"Question {n}: how do I prune the roses in bed {n}?",
                                      created=T0 + 2 * n)
            self.store.append_message(conversation.id, "assistant",
                                      f"Answer {n}: cut above an outward bud. " + "Then water. "
                                      * 8, created=T0 + 2 * n + 1)
        return conversation.id

    def summary(self, conversation_id: str) -> str:
        conversation = self.store.get_conversation(conversation_id)
        assert conversation is not None
        return conversation.summary.summary


@pytest.fixture
async def rig(make_settings: SettingsFactory) -> AsyncIterator[Rig]:
    fake = FakeOllama(models=[FakeModel(context_length=32768, capabilities=("completion",))])
    await fake.start()
    settings = make_settings(model={"host": fake.url, "window": 2048},
                             daemon={"timezone": "UTC"})
    store = Store.open(settings.daemon.state_dir)
    llm = ModelClient(settings.model)
    folder = BackgroundFold(settings=settings, store=store, llm=llm,
                    records=Records(store.state_dir, settings.daemon.tz),
                    clock=lambda: T0, retry_after_failure=30.0)
    try:
        yield Rig(folder, store, fake)
    finally:
        await folder.stop()
        await llm.close()
        store.close()
        await fake.stop()


async def test_a_fold_cut_at_its_limit_is_asked_once_more_with_more_room(rig: Rig) -> None:
    cid = rig.chat_of()
    rig.fake.script(Reply("The user prunes roses: cut above an outward bud, then",
                          done_reason="length"),
                    Reply("The user prunes roses: cut above an outward bud, then water."))
    outcome = await rig.folder.fold_now(cid)
    assert outcome.folded
    first, second = rig.fake.chat_requests
    assert second["options"]["num_predict"] > first["options"]["num_predict"]
    assert rig.summary(cid) == "The user prunes roses: cut above an outward bud, then water."


async def test_a_fold_cut_twice_keeps_its_whole_sentences_only(rig: Rig) -> None:
    cid = rig.chat_of()
    cut = Reply("Roses are pruned above an outward bud. Bed 3 needs wat", done_reason="length")
    rig.fake.script(cut, cut)
    await rig.folder.fold_now(cid)
    assert rig.summary(cid) == "Roses are pruned above an outward bud."


async def test_roosts_own_section_tags_are_removed_from_the_summary(rig: Rig) -> None:
    cid = rig.chat_of()
    rig.fake.script("(You're welcome, dude! Roses get cut above a bud.)\n</new_messages>\n"
                    "<user_notes>\n- The user has twelve rose beds.\n</user_notes>\n"
                    "[#14 user] Bed 7 gets the red ones.\n=== USER NOTES ===")
    await rig.folder.fold_now(cid)
    summary = rig.summary(cid)
    assert "Roses get cut above a bud." in summary and "twelve rose beds" in summary
    assert "Bed 7 gets the red ones." in summary
    assert not any(mark in summary for mark in ("<", ">", "[#", "==="))


async def test_an_echo_of_the_prompt_is_not_stored_and_the_fold_is_tried_later(
    rig: Rig,
) -> None:
    cid = rig.chat_of()

    def echo(body: dict[str, object]) -> Reply:
        messages = body["messages"]
        assert isinstance(messages, list)
        prompt = str(messages[-1]["content"])
        return Reply(prompt[prompt.index("<new_messages>"):][:600])

    rig.fake.default_reply = echo
    outcome = await rig.folder.fold_now(cid)
    assert not outcome.folded and "echo" in outcome.reason
    conversation = rig.store.get_conversation(cid)
    assert conversation is not None and conversation.summary.through_seq == 0
    assert rig.folder.retry_pending(cid)
    day = rig.folder.records.events("2026-12-01")
    assert any("fold-rejected" in e for e in day)


async def test_an_empty_summary_after_the_tags_are_removed_is_not_stored(rig: Rig) -> None:
    cid = rig.chat_of()
    rig.fake.script("<summary>\n</summary>")
    outcome = await rig.folder.fold_now(cid)
    assert not outcome.folded
    await wait_until(lambda: rig.folder.retry_pending(cid))
    assert rig.summary(cid) == ""


# --- issue 43: SmolLM2-135M's fold answers that echo roost's instructions ---------------------


def fold_ask(body: dict[str, object]) -> str:
    """The fold prompt's ask: the sentences after the messages (roost's own words)."""
    messages = body["messages"]
    assert isinstance(messages, list)
    return str(messages[-1]["content"]).rpartition("</new_messages>")[2].strip()


async def test_a_summary_that_repeats_the_fold_instructions_is_not_stored(rig: Rig) -> None:
    cid = rig.chat_of()
    # As stored and replayed before: "<summary>(sure!) - Please summarize the following
    # …Write the updated summary, at most 224 characters…</summary>".
    rig.fake.default_reply = lambda body: Reply(
        "(sure!) - Please summarize the following …" + fold_ask(body).split(".")[0] + "…")
    outcome = await rig.folder.fold_now(cid)
    assert not outcome.folded and "instructions" in outcome.reason
    assert rig.summary(cid) == ""
    await wait_until(lambda: rig.folder.retry_pending(cid))
    assert any("fold-rejected" in e and "instructions" in e
               for e in rig.folder.records.events("2026-12-01"))


async def test_a_summary_with_a_number_none_of_the_messages_hold_is_not_stored(rig: Rig) -> None:
    cid = rig.chat_of()
    rig.fake.script("The user prunes roses in 12 beds: 12 x 7 = 72 cuts above an outward bud.")
    outcome = await rig.folder.fold_now(cid)
    assert not outcome.folded and "72" in outcome.reason
    assert rig.summary(cid) == ""


async def test_condensed_notes_that_echo_the_instructions_are_not_the_users_words(
        rig: Rig) -> None:
    conversation = rig.store.create_conversation(CHAT, T0)
    cid = conversation.id
    for n in range(12):  # notes over their cap at 2,048: the fold is asked to condense them
        rig.store.append_message(cid, "user", f"Bed {n} has the old roses my grandmother Ilse "
                                 f"planted in {1960 + n}; how far back do I cut them this "
                                 "spring without losing the flowers?", created=T0 + 2 * n)
        rig.store.append_message(cid, "assistant", f"Answer {n}: cut above an outward bud.",
                                 created=T0 + 2 * n + 1)

    def answer(body: dict[str, object]) -> Reply:
        assert "=== USER NOTES ===" in fold_ask(body)
        return Reply("Ilse's old roses are cut above an outward bud each spring.\n"
                     "=== USER NOTES ===\n"
                     "- and below it a shorter version of the user notes. Keep every fact")

    rig.fake.default_reply = answer
    outcome = await rig.folder.fold_now(cid)
    assert outcome.folded and outcome.state is not None
    assert rig.summary(cid) == "Ilse's old roses are cut above an outward bud each spring."
    notes = outcome.state.user_notes
    # What goes under "What I said in that part, in my own words:" is what the user said.
    assert "shorter version" not in notes and "Keep every fact" not in notes
    assert notes.startswith("- Bed ") and "grandmother Ilse planted in" in notes
    assert any("notes-rejected" in e for e in rig.folder.records.events("2026-12-01"))
