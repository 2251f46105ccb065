"""A person's own chat with the bot, plain and end-to-end encrypted, against a real Synapse."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from nio import RoomMessageNotice, RoomMessageText

from tests.channels.matrix.conftest import Bot
from tests.synapse.user import MatrixUser

Person = Callable[[str], Awaitable[MatrixUser]]


def says(text: str) -> Callable[[object], bool]:
    return lambda e: isinstance(e, RoomMessageText | RoomMessageNotice) and e.body == text


async def test_a_direct_message_is_answered_in_the_same_room(bot: Bot, person: Person) -> None:
    alice = await person("alice")
    _, engine = await bot.start(allow=(alice.user_id,))
    room = await alice.create_dm(bot.user_id)
    await alice.wait_joined(room, bot.user_id)
    await alice.send_text(room, "hello **there**")

    reply = await alice.wait_for(says("echo: hello there"), room_id=room, sender=bot.user_id)
    assert reply.source["content"]["formatted_body"] == "echo: hello <strong>there</strong>"
    (inbound,) = engine.inbounds
    assert inbound.chat_key == f"matrix:{alice.user_id}"
    assert inbound.sender == alice.user_id


async def test_an_encrypted_direct_room_works_both_ways(bot: Bot, person: Person) -> None:
    alice = await person("alice")
    _, engine = await bot.start(allow=(alice.user_id,))
    room = await alice.create_dm(bot.user_id, encrypted=True)
    await alice.wait_joined(room, bot.user_id)
    await alice.send_text(room, "a secret")

    reply = await alice.wait_for(says("echo: a secret"), room_id=room, sender=bot.user_id)
    assert reply.decrypted  # it came encrypted, and Alice's device could read it
    assert engine.inbounds[0].text == "a secret"

