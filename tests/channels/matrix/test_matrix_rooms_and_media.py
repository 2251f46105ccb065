"""Groups answer when addressed; pictures and voice notes come in, a voice reply goes out;
a reply is shown as it is written by editing one message."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from nio import RoomEncryptedAudio, RoomMessageAudio, RoomMessageText
from PIL import Image

from daemon.core.messages import Inbound, Outbound
from tests.channels.matrix.conftest import Bot, EchoEngine
from tests.synapse.user import MatrixUser

Person = Callable[[str], Awaitable[MatrixUser]]


def text_is(body: str) -> Callable[[object], bool]:
    return lambda e: isinstance(e, RoomMessageText) and e.body == body


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (32, 24), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


async def test_a_group_is_answered_only_when_the_bot_is_mentioned(
        bot: Bot, person: Person) -> None:
    alice, bob = await person("alice"), await person("bob")
    matrix, engine = await bot.start(allow=(alice.user_id, bob.user_id))
    room = await alice.create_group([bot.user_id, bob.user_id])
    await bob.wait_until(lambda: room in bob.client.invited_rooms)
    await bob.join(room)
    await alice.wait_joined(room, bot.user_id)
    await alice.send_text(room, "just chatting with Bob")
    await alice.send_text(room, "what time is it?", mention=bot.user_id)

    reply = await bob.wait_for(lambda e: isinstance(e, RoomMessageText)
                               and e.body.startswith("echo:"), sender=bot.user_id)
    assert matrix.intake is not None
    await matrix.intake.idle()
    (inbound,) = engine.inbounds  # the chatter was not for the bot
    assert inbound.chat_key == f"matrix:{room}"
    assert inbound.text == f"[From Alice ({alice.user_id})]\nwhat time is it?"
    # The answer quotes the message it answers, so the room sees whom it is for.
    assert reply.source["content"]["m.relates_to"]["m.in_reply_to"]["event_id"] == \
        inbound.platform_id


async def test_a_picture_in_an_encrypted_room_reaches_the_engine(
        bot: Bot, person: Person) -> None:
    alice = await person("alice")
    _, engine = await bot.start(allow=(alice.user_id,))
    room = await alice.create_dm(bot.user_id, encrypted=True)
    await alice.wait_joined(room, bot.user_id)
    await alice.send_image(room, png(), width=32, height=24)

    await alice.wait_for(lambda e: isinstance(e, RoomMessageText), sender=bot.user_id)
    (inbound,) = engine.inbounds
    (attachment,) = inbound.attachments
    assert attachment["kind"] == "image"


class VoiceEngine(EchoEngine):
    """Answers a voice note with a voice note (the engine's voice replies, synthesised)."""

    audio: Path

    async def submit(self, inbound: Inbound) -> bool:
        self.inbounds.append(inbound)
        await self.deliver(Outbound(chat_key=inbound.chat_key, text="spoken words",
                                    created=time.time(), kind="voice", audio=str(self.audio),
                                    seconds=1.5))
        return True


async def test_a_voice_note_comes_in_and_a_voice_note_goes_out(
        bot: Bot, person: Person, tmp_path: Path) -> None:
    alice = await person("alice")
    VoiceEngine.audio = tmp_path / "reply.ogg"
    VoiceEngine.audio.write_bytes(b"OggS" + bytes(200))
    _, engine = await bot.start(VoiceEngine, allow=(alice.user_id,))
    room = await alice.create_dm(bot.user_id, encrypted=True)
    await alice.wait_joined(room, bot.user_id)
    await alice.send_audio(room, b"OggS" + bytes(100), duration_ms=1200)

    reply = await alice.wait_for(
        lambda e: isinstance(e, RoomEncryptedAudio | RoomMessageAudio), sender=bot.user_id)
    content = reply.source["content"]
    assert "org.matrix.msc3245.voice" in content
    assert content["info"]["duration"] == 1500
    (inbound,) = engine.inbounds
    assert inbound.attachments[0]["kind"] == "voice"


class StreamingEngine(EchoEngine):
    """Writes its answer in pieces, as a model does, into the channel's streaming sink."""

    async def submit(self, inbound: Inbound) -> bool:
        assert self.matrix is not None
        self.inbounds.append(inbound)
        words = ["The ", "answer ", "comes ", "in ", "pieces."]
        async with self.matrix.channel.streaming(inbound.chat_key) as sink:
            for word in words:
                sink.write(word)
                await asyncio.sleep(0.3)  # a model's pace: the preview is edited meanwhile
        await self.deliver(Outbound(chat_key=inbound.chat_key, text="".join(words),
                                    created=time.time()))
        return True


async def test_a_reply_is_shown_as_it_is_written_by_editing_one_message(
        bot: Bot, person: Person) -> None:
    alice = await person("alice")
    _, _engine = await bot.start(StreamingEngine, allow=(alice.user_id,))
    room = await alice.create_dm(bot.user_id)
    await alice.wait_joined(room, bot.user_id)
    await alice.send_text(room, "tell me")

    first = await alice.wait_for(lambda e: isinstance(e, RoomMessageText)
                                 and "m.new_content" not in e.source["content"],
                                 sender=bot.user_id)
    await alice.wait_until(lambda: any(
        e.source["content"].get("m.new_content", {}).get("body") == "The answer comes in pieces."
        for _, e in alice.events))
    # The edits as the room showed them (the synced timeline, not a later relations query,
    # which a loaded homeserver may answer before it has indexed the last one).
    edits = [e.source["content"]["m.new_content"] for _, e in alice.events
             if e.source["content"].get("m.relates_to", {}).get("event_id") == first.event_id
             and "m.new_content" in e.source["content"]]
    assert len(edits) >= 2  # it grew in the room, and ended as the reply
    assert edits[-1]["body"] == "The answer comes in pieces."
    # One message: no second copy of the reply was sent.
    assert [e for _, e in alice.events if isinstance(e, RoomMessageText)
            and e.sender == bot.user_id and "m.new_content" not in e.source["content"]] == [first]
