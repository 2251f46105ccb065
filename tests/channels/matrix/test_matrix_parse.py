"""The pure reading of Matrix events: chat keys, mentions, replies, edits, approval answers."""

from __future__ import annotations

import pytest

from channels.matrix.parse import (
    Address,
    address_of,
    addressed,
    direct_partner,
    message_text,
    reaction_choice,
    read_event,
    typed_choice,
)
from channels.wording import edit_text
from daemon.core.approval import Choice

BOT = "@roost:example.org"


@pytest.mark.parametrize(("key", "address"), [
    ("matrix:@alice:example.org", Address(user="@alice:example.org")),
    ("matrix:!abc:example.org", Address(room="!abc:example.org")),
    ("matrix:!opaqueV12", Address(room="!opaqueV12")),
])
def test_chat_keys_name_a_person_or_a_room(key: str, address: Address) -> None:
    assert address_of(key) == address


@pytest.mark.parametrize("key", ["telegram:1", "matrix:", "matrix:alice", "matrix:!"])
def test_other_keys_are_refused(key: str) -> None:
    with pytest.raises(ValueError):
        address_of(key)


def test_a_room_of_the_bot_and_one_person_is_that_persons_chat() -> None:
    assert direct_partner({BOT, "@alice:x"}, BOT) == "@alice:x"
    assert direct_partner({BOT, "@alice:x", "@bob:x"}, BOT) is None


def test_an_edit_is_read_with_its_new_content() -> None:
    incoming = read_event({"type": "m.room.message", "event_id": "$2", "sender": "@a:x",
                           "content": {"msgtype": "m.text", "body": "* fixed",
                                       "m.new_content": {"msgtype": "m.text", "body": "fixed"},
                                       "m.relates_to": {"rel_type": "m.replace",
                                                        "event_id": "$1"}}})
    assert incoming is not None and incoming.kind == "edit" and incoming.target == "$1"
    assert incoming.body == "fixed"
    assert edit_text("$1", "fixed").endswith("\n> fixed")


def test_state_events_are_not_handled() -> None:
    assert read_event({"type": "m.room.topic", "event_id": "$1", "sender": "@a:x",
                       "content": {"topic": "t"}}) is None


@pytest.mark.parametrize(("content", "expected"), [
    ({"body": "hello all"}, False),
    ({"body": "roost: hi"}, True),  # the display name
    ({"body": "hi", "m.mentions": {"user_ids": [BOT]}}, True),
    ({"body": "x", "formatted_body": f'<a href="https://matrix.to/#/{BOT}">roost</a>'}, True),
    ({"body": "> <@roost:example.org> earlier\n\nand roost?"}, True),
    ({"body": "> <@bob:x> roost said\n\nok"}, False),  # the name only in the quote
])
def test_a_group_message_is_for_the_bot_when_it_mentions_it(content: dict[str, object],
                                                            expected: bool) -> None:
    assert addressed(content, BOT, "roost", replied_to_bot=False) is expected


def test_the_mention_and_the_quoted_fallback_are_not_part_of_the_words() -> None:
    assert message_text({"body": "roost: /new"}, BOT, "roost") == "/new"
    assert message_text({"body": "> <@bob:x> hi\n\nthanks"}, BOT, "roost") == "thanks"


def test_approval_answers_typed_or_reacted() -> None:
    assert typed_choice("Yes!") is Choice.ONCE
    assert typed_choice("always") is Choice.ALWAYS
    assert typed_choice("no.") is Choice.DENY
    assert typed_choice("yes please do") is None
    assert reaction_choice("👍️") is Choice.ONCE
    assert reaction_choice("👎") is Choice.DENY
    assert reaction_choice("🎉") is None
