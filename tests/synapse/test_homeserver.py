"""The harness itself, against the real Synapse: registration, a DM, an encrypted room, media,
edits, and a restart that keeps the users."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

nio = pytest.importorskip("nio", reason="no matrix-nio in roost's venv")

from nio import (  # noqa: E402
    AsyncClient,
    AsyncClientConfig,
    DownloadResponse,
    InviteMemberEvent,
    RoomEncryptedAudio,
    RoomEncryptedImage,
    RoomMessageText,
    SyncResponse,
)
from nio.crypto import decrypt_attachment  # noqa: E402

from tests.synapse.server import Homeserver  # noqa: E402
from tests.synapse.user import MatrixUser  # noqa: E402

PASSWORD = "correct horse battery staple"
PNG = bytes.fromhex(  # a 1x1 PNG
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8cfc0f01f0005000201c5d94b"
    "ec0000000049454e44ae426082"
)


def text(body: str) -> Callable[[object], bool]:
    return lambda event: isinstance(event, RoomMessageText) and event.body == body


async def test_dm_between_two_registered_users(
    synapse: Homeserver, matrix_localpart: Callable[[str], str], tmp_path: Path
) -> None:
    alice = await MatrixUser.connect(
        synapse.url, await synapse.aregister(matrix_localpart("alice"), PASSWORD), tmp_path / "a"
    )
    bob_id, bob_token, bob_device = await synapse.aregister(matrix_localpart("bob"), PASSWORD)
    # Bob is a plain nio client, as a bot without encryption would be.
    bob = AsyncClient(synapse.url, bob_id, config=AsyncClientConfig(encryption_enabled=False))
    bob.restore_login(bob_id, bob_device, bob_token)
    try:
        room_id = await alice.create_dm(bob_id)

        invite = None
        async with asyncio.timeout(30):
            while invite is None:  # each sync long-polls a second
                answer = await bob.sync(timeout=1000)
                assert isinstance(answer, SyncResponse)
                invite = answer.rooms.invite.get(room_id)
        member = next(
            e for e in invite.invite_state
            if isinstance(e, InviteMemberEvent) and e.state_key == bob_id
        )
        assert member.content["is_direct"] is True
        await bob.join(room_id)

        await alice.wait_joined(room_id, bob_id)
        sent = await alice.send_text(room_id, "hello bob")

        received: list[RoomMessageText] = []
        async with asyncio.timeout(30):
            while not received:
                answer = await bob.sync(timeout=1000)
                assert isinstance(answer, SyncResponse)
                room = answer.rooms.join.get(room_id)
                received += [
                    e for e in (room.timeline.events if room else [])
                    if isinstance(e, RoomMessageText) and e.sender == alice.user_id
                ]
        assert [(e.event_id, e.body) for e in received] == [(sent, "hello bob")]
    finally:
        await bob.close()
        await alice.close()


async def test_encrypted_room_is_encrypted_on_the_wire_and_decrypted(
    synapse: Homeserver, matrix_localpart: Callable[[str], str], tmp_path: Path
) -> None:
    bob_reg = await synapse.aregister(matrix_localpart("bob"), PASSWORD)
    alice = await MatrixUser.connect(
        synapse.url, await synapse.aregister(matrix_localpart("alice"), PASSWORD), tmp_path / "a"
    )
    bob = await MatrixUser.connect(synapse.url, bob_reg, tmp_path / "b")
    try:
        room_id = await alice.create_encrypted_room([bob.user_id])
        await bob.wait_until(lambda: room_id in bob.client.invited_rooms)
        await bob.join(room_id)
        await alice.wait_joined(room_id, bob.user_id)

        sent = await alice.send_text(room_id, "the secret is 42")
        got = await bob.wait_for(text("the secret is 42"), room_id=room_id, sender=alice.user_id)
        assert got.event_id == sent
        assert got.decrypted

        raw = synapse.request(
            "GET", f"/_matrix/client/v3/rooms/{room_id}/event/{sent}", token=bob_reg.access_token
        )
        assert raw["type"] == "m.room.encrypted"
        assert raw["content"]["algorithm"] == "m.megolm.v1.aes-sha2"
        assert "secret" not in json.dumps(raw)

        # And back: bob answers, alice decrypts.
        await bob.send_text(room_id, "noted", reply_to=sent)
        answer = await alice.wait_for(text("noted"), sender=bob.user_id)
        assert answer.source["content"]["m.relates_to"]["m.in_reply_to"]["event_id"] == sent
    finally:
        await alice.close()
        await bob.close()


async def test_media_reactions_and_edits_in_an_encrypted_room(
    synapse: Homeserver, matrix_localpart: Callable[[str], str], tmp_path: Path
) -> None:
    alice = await MatrixUser.connect(
        synapse.url, await synapse.aregister(matrix_localpart("alice"), PASSWORD), tmp_path / "a"
    )
    bob = await MatrixUser.connect(
        synapse.url, await synapse.aregister(matrix_localpart("bob"), PASSWORD), tmp_path / "b"
    )
    try:
        room_id = await alice.create_dm(bob.user_id, encrypted=True)
        await bob.wait_until(lambda: room_id in bob.client.invited_rooms)
        await bob.join(room_id)
        await alice.wait_joined(room_id, bob.user_id)

        await alice.send_image(room_id, PNG, width=1, height=1)
        voice = b"OggS" + bytes(200)
        await alice.send_audio(room_id, voice, duration_ms=1500)
        image = await bob.wait_for(lambda e: isinstance(e, RoomEncryptedImage))
        audio = await bob.wait_for(lambda e: isinstance(e, RoomEncryptedAudio))
        assert audio.source["content"]["org.matrix.msc3245.voice"] == {}
        assert audio.source["content"]["org.matrix.msc1767.audio"]["duration"] == 1500
        for event, data in ((image, PNG), (audio, voice)):
            download = await bob.client.download(event.url)
            assert isinstance(download, DownloadResponse)
            assert download.body != data  # what the homeserver holds is ciphertext
            plain = decrypt_attachment(download.body, event.key["k"], event.hashes["sha256"],
                                       event.iv)
            assert plain == data

        question = await alice.send_text(room_id, "are you there?", mention=bob.user_id)
        mention = await bob.wait_for(lambda e: e.event_id == question)
        assert mention.source["content"]["m.mentions"] == {"user_ids": [bob.user_id]}

        reply = await bob.send_text(room_id, "v1")
        for body in ("v2", "v3"):
            await bob.send(room_id, "m.room.message", {
                "msgtype": "m.text",
                "body": f"* {body}",
                "m.new_content": {"msgtype": "m.text", "body": body},
                "m.relates_to": {"rel_type": "m.replace", "event_id": reply},
            })
        await alice.react(room_id, reply, "👍")
        assert [c["body"] for c in await alice.edits(room_id, reply)] == ["v2", "v3"]
        reaction = await bob.wait_for(lambda e: e.source["type"] == "m.reaction")
        assert reaction.source["content"]["m.relates_to"]["key"] == "👍"
    finally:
        await alice.close()
        await bob.close()


async def test_restart_keeps_users(
    synapse: Homeserver, matrix_localpart: Callable[[str], str], tmp_path: Path
) -> None:
    name = matrix_localpart("carol")
    registered = await synapse.aregister(name, PASSWORD, admin=True)
    await synapse.astop()
    assert not synapse.running
    await synapse.astart()  # the same port and database

    assert (await synapse.alogin(name, PASSWORD)).user_id == registered.user_id
    carol = await MatrixUser.login(synapse.url, registered.user_id, PASSWORD, tmp_path / "c")
    try:
        assert carol.client.device_id != registered.device_id
        # The token issued before the restart still works.
        whoami = synapse.request(
            "GET", "/_matrix/client/v3/account/whoami", token=registered.access_token
        )
        assert whoami["user_id"] == registered.user_id
    finally:
        await carol.close()
