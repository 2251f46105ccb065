"""A tool approval on Matrix, against the real Synapse: the question goes out with how to
answer (Matrix has no buttons for a bot), and a reaction to it, a reply to it or a bare typed
answer reaches the approver as the person's answer (a typed one gets the approver's line back;
a reaction shows itself)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from nio import RoomMessageNotice, RoomMessageText

from channels.matrix.channel import Matrix
from daemon.core.approval import Answer, Choice, buttons
from daemon.core.messages import Outbound
from daemon.store import Store
from tests.channels.matrix.conftest import TUNING, Bot, EchoEngine
from tests.conftest import wait_until
from tests.synapse.user import MatrixUser

Person = Callable[[str], Awaitable[MatrixUser]]


class Approver:
    def __init__(self) -> None:
        self.answers: list[Answer] = []

    async def answer(self, answer: Answer) -> str:
        self.answers.append(answer)
        return {Choice.ONCE: "Allowed once.", Choice.DENY: "Denied."}.get(answer.choice, "Ok.")


@pytest.fixture
async def running(bot: Bot, person: Person
                  ) -> AsyncIterator[tuple[Matrix, EchoEngine, Approver, MatrixUser, str]]:
    alice = await person("alice")
    store = Store.open(bot.state_dir)
    matrix = Matrix(bot.settings(allow=(alice.user_id,)), store, tuning=TUNING)
    engine, approver = EchoEngine(store), Approver()
    engine.matrix = matrix
    await matrix.open()
    await matrix.start(engine, approver)
    room = await alice.create_dm(bot.user_id, encrypted=True)
    await alice.wait_joined(room, bot.user_id)
    # A question comes in a turn, after the person wrote: the bot knows their room by then.
    await alice.send_text(room, "fetch example.org for me")
    await alice.wait_for(lambda e: isinstance(e, RoomMessageText) and e.body.startswith("echo:"))
    engine.inbounds.clear()
    try:
        yield matrix, engine, approver, alice, room
    finally:
        await matrix.stop()
        await matrix.close()
        store.close()


def said(text: str) -> Callable[[object], bool]:
    """A message or notice from the bot reading `text`."""
    return lambda e: isinstance(e, RoomMessageText | RoomMessageNotice) and e.body == text


async def ask(engine: EchoEngine, alice: MatrixUser, approval: str) -> RoomMessageNotice:
    await engine.deliver(Outbound(chat_key=f"matrix:{alice.user_id}", created=time.time(),
                                  text="May I run `web_fetch` on example.org?", kind="notice",
                                  buttons=buttons(approval)))
    question: RoomMessageNotice = await alice.wait_for(
        lambda e: isinstance(e, RoomMessageNotice) and "web_fetch" in e.body)
    assert "react 👍 or 👎" in question.body and "yes, always or no" in question.body
    return question


async def test_a_reaction_answers_the_question(running: tuple[Matrix, EchoEngine, Approver,
                                                              MatrixUser, str]) -> None:
    _, engine, approver, alice, room = running
    question = await ask(engine, alice, "00000000000a")
    await alice.react(room, question.event_id, "👍")
    # The reaction itself shows the answer in the room: no line follows it.
    await wait_until(lambda: bool(approver.answers), 30)
    assert [(a.approval_id, a.choice, a.person) for a in approver.answers] == [
        ("00000000000a", Choice.ONCE, f"matrix:{alice.user_id}")]
    assert engine.inbounds == []  # an answer is not a message to the model


async def test_a_reply_or_a_typed_no_answers_it(running: tuple[Matrix, EchoEngine, Approver,
                                                               MatrixUser, str]) -> None:
    _, engine, approver, alice, room = running
    question = await ask(engine, alice, "00000000000b")
    await alice.send_text(room, "no", reply_to=question.event_id)
    await alice.wait_for(said("Denied."))
    await ask(engine, alice, "00000000000c")
    await alice.send_text(room, "yes")
    await alice.wait_for(said("Allowed once."))
    assert [(a.approval_id, a.choice) for a in approver.answers] == [
        ("00000000000b", Choice.DENY), ("00000000000c", Choice.ONCE)]
    assert engine.inbounds == []
