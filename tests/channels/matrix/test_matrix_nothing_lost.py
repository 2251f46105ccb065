"""Nothing is lost: a burst while roost is down, and a homeserver that goes away and back."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from nio import RoomMessageText

from tests.channels.matrix.conftest import Bot
from tests.synapse.server import Homeserver
from tests.synapse.user import MatrixUser

Person = Callable[[str], Awaitable[MatrixUser]]


def echo(text: str) -> Callable[[object], bool]:
    return lambda e: isinstance(e, RoomMessageText) and e.body == f"echo: {text}"


def echoes(user: MatrixUser, bot: str) -> list[str]:
    return [e.body for _, e in user.events
            if isinstance(e, RoomMessageText) and e.sender == bot]


async def test_a_burst_sent_while_roost_is_down_is_answered_once_each(
        bot: Bot, person: Person) -> None:
    alice = await person("alice")
    matrix, engine = await bot.start(allow=(alice.user_id,))
    room = await alice.create_dm(bot.user_id, encrypted=True)
    await alice.wait_joined(room, bot.user_id)
    await alice.send_text(room, "before")
    await alice.wait_for(echo("before"), sender=bot.user_id)
    await bot.stop(matrix)

    burst = [f"message {n}" for n in range(15)]  # more than Synapse's default 10 a sync
    for text in burst:
        await alice.send_text(room, text)
    matrix, engine = await bot.start(allow=(alice.user_id,))
    for text in burst:
        await alice.wait_for(echo(text), sender=bot.user_id)
    assert matrix.intake is not None
    await matrix.intake.idle()
    assert [i.text for i in engine.inbounds] == burst  # in order, "before" not again
    assert echoes(alice, bot.user_id) == [f"echo: {t}" for t in ["before", *burst]]


async def test_the_channel_rides_out_a_homeserver_restart(
        bot: Bot, person: Person, synapse: Homeserver) -> None:
    alice = await person("alice")
    _, engine = await bot.start(allow=(alice.user_id,))
    room = await alice.create_dm(bot.user_id)
    await alice.wait_joined(room, bot.user_id)
    await alice.send_text(room, "one")
    await alice.wait_for(echo("one"), sender=bot.user_id)

    await synapse.astop()
    await synapse.astart()
    await alice.send_text(room, "two")
    await alice.wait_for(echo("two"), sender=bot.user_id, timeout=60)
    assert [i.text for i in engine.inbounds] == ["one", "two"]


async def test_a_restart_in_the_middle_of_a_burst_loses_nothing_and_answers_nothing_twice(
        bot: Bot, person: Person) -> None:
    """roost stops while a burst is arriving (some answered, some stored, some not yet synced)
    and starts again: every message is answered once, in the order it was sent."""
    alice = await person("alice")
    matrix, _ = await bot.start(allow=(alice.user_id,))
    room = await alice.create_dm(bot.user_id, encrypted=True)
    await alice.wait_joined(room, bot.user_id)
    burst = [f"burst {n}" for n in range(12)]
    for text in burst[:6]:
        await alice.send_text(room, text)
    await alice.wait_for(echo(burst[0]), sender=bot.user_id)  # roost is in the middle of it
    await bot.stop(matrix)
    for text in burst[6:]:
        await alice.send_text(room, text)
    matrix, _ = await bot.start(allow=(alice.user_id,))
    for text in burst[1:]:  # the first one's echo was waited for already
        await alice.wait_for(echo(text), sender=bot.user_id)
    assert matrix.intake is not None
    await matrix.intake.idle()
    await alice.sync()
    assert echoes(alice, bot.user_id) == [f"echo: {t}" for t in burst]
