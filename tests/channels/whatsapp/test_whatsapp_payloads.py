"""WhatsApp webhooks as Meta sends them: the signature over the raw bytes, the envelope, what
the model reads of each kind of message."""

from __future__ import annotations

import json

import pytest

from channels.whatsapp.parse import (
    Described,
    NotAWebhook,
    Signature,
    check_signature,
    describe,
    parse_webhook,
)
from tests.conftest import FIXTURES
from tests.fakes.graph import sign, text_message, webhook

WA = FIXTURES / "whatsapp"
# From fixtures/README.md: the real signature of signed_text_message.body (a reset secret).
FIXTURE_SECRET = "1222e786b144d0e85b9f365372d93676"
FIXTURE_SIGNATURE = "sha256=54edfa1d7259e0eb13c677cc7d73d1b5c86cfa12433d19156e058ab9251bc441"


def test_the_real_signed_fixture_verifies_over_its_raw_bytes() -> None:
    body = (WA / "signed_text_message.body").read_bytes()
    assert check_signature(FIXTURE_SECRET, body, FIXTURE_SIGNATURE) is Signature.OK
    reserialised = json.dumps(json.loads(body), ensure_ascii=False).encode()
    assert check_signature(FIXTURE_SECRET, reserialised, FIXTURE_SIGNATURE) is Signature.MISMATCH
    assert check_signature("another secret", body, FIXTURE_SIGNATURE) is Signature.MISMATCH
    assert check_signature(FIXTURE_SECRET, body, None) is Signature.MISSING
    assert check_signature(FIXTURE_SECRET, body, "") is Signature.MISSING
    assert check_signature(FIXTURE_SECRET, body, "sha1=abc") is Signature.MISMATCH


def test_non_ascii_text_signed_over_its_raw_bytes_passes() -> None:
    body = '{"object":"whatsapp_business_account","entry":[],"x":"Grüße 🦜 日本"}'.encode()
    assert check_signature("s3cret", body, sign("s3cret", body)) is Signature.OK
    escaped = json.dumps(json.loads(body)).encode()  # \\u escapes: other bytes, same JSON
    assert check_signature("s3cret", escaped, sign("s3cret", body)) is Signature.MISMATCH


def test_the_fixtures_parse_into_messages_and_statuses() -> None:
    text = parse_webhook(json.loads((WA / "signed_text_message.body").read_bytes()))
    (message,) = text.messages
    assert message.sender == "972544401243" and message.profile_name == "PyWa Tests"
    assert message.chat_key == "whatsapp:972544401243"
    assert describe(message).text == "Hey there! I am using PyWa."
    image = parse_webhook(json.loads((WA / "image_message.json").read_bytes()))
    described = describe(image.messages[0])
    assert (described.media_id, described.media_kind, described.mime_type) == (
        "65463453", "image", "image/jpeg")
    assert described.text == ""
    status = parse_webhook(json.loads((WA / "status_delivered.json").read_bytes()))
    assert status.messages == ()
    assert [(s.id, s.status, s.recipient) for s in status.statuses] == [
        ("wamid.xyzxyz", "delivered", "972987654321")]


def test_many_entries_and_changes_keep_their_order_and_unknown_parts_are_skipped() -> None:
    first = json.loads(webhook(text_message("wamid.1", "111", "one"),
                               text_message("wamid.2", "222", "two")))
    second = json.loads(webhook(text_message("wamid.3", "111", "three")))
    first["entry"].append(second["entry"][0])
    first["entry"][0]["changes"].insert(0, {"field": "account_update", "value": {"x": 1}})
    first["entry"][0]["changes"][1]["value"]["brand_new_field"] = {"anything": True}
    first["entry"][0]["changes"][1]["value"]["messages"].append({"id": "wamid.broken"})
    parsed = parse_webhook(first)
    assert [m.id for m in parsed.messages] == ["wamid.1", "wamid.2", "wamid.3"]


@pytest.mark.parametrize("payload", [[], {"object": "page", "entry": []},
                                     {"object": "whatsapp_business_account"}, "text"])
def test_a_body_that_is_not_a_webhook_is_refused(payload: object) -> None:
    with pytest.raises(NotAWebhook):
        parse_webhook(payload)


def one(raw: dict[str, object]) -> Described:
    (message,) = parse_webhook(json.loads(webhook(raw))).messages
    return describe(message)


def test_what_the_model_reads_of_each_kind() -> None:
    base = {"from": "111", "id": "wamid.k", "timestamp": "1"}
    location = one({**base, "type": "location", "location": {
        "latitude": 52.52, "longitude": 13.405, "name": "Alexanderplatz", "address": "Berlin"}})
    assert location.text == "[Location: Alexanderplatz, Berlin at 52.52, 13.405]"
    contacts = one({**base, "type": "contacts", "contacts": [
        {"name": {"formatted_name": "Ada Lovelace"}, "phones": [{"phone": "+44 20 1234"}]}]})
    assert contacts.text == "[Shared contact: Ada Lovelace (+44 20 1234)]"
    reaction = one({**base, "type": "reaction", "reaction": {"message_id": "wamid.r",
                                                             "emoji": "👍"}})
    assert (reaction.reaction, reaction.reacted_to, reaction.text) == ("👍", "wamid.r", "")
    reply = one({**text_message("wamid.q", "111", "and this?"),
                 "context": {"from": "15550953877", "id": "wamid.ours"}})
    assert reply.text == "[Replying to your earlier message]\nand this?"
    forwarded = one({**text_message("wamid.f", "111", "look"), "context": {"forwarded": True}})
    assert forwarded.text == "[Forwarded message]\nlook"
    document = one({**base, "type": "document", "document": {
        "id": "m1", "mime_type": "application/pdf", "filename": "plan.pdf", "caption": "read"}})
    assert (document.media_kind, document.filename, document.text) == (
        "document", "plan.pdf", "read")
    unknown = one({**base, "type": "hologram", "hologram": {}})
    assert unknown.unsupported


def test_an_interactive_reply_is_never_an_empty_turn() -> None:
    # A button or list reply always answers one of the bot's messages (`context`), so an empty
    # title used to reach the model as "[Replying to your earlier message]" and nothing else.
    base = {"from": "111", "id": "wamid.i", "timestamp": "1",
            "context": {"from": "15550953877", "id": "wamid.ours"}, "type": "interactive"}
    button = one({**base, "interactive": {"type": "button_reply",
                                          "button_reply": {"id": "confirm-yes"}}})
    assert button.text == '[Replying to your earlier message]\n[Pressed the button "confirm-yes"]'
    titled = one({**base, "interactive": {"type": "button_reply",
                                          "button_reply": {"id": "y", "title": "Yes"}}})
    assert titled.text == '[Replying to your earlier message]\n[Pressed the button "Yes"]'
    listed = one({**base, "interactive": {"type": "list_reply", "list_reply": {
        "id": "row-2", "title": "Tuesday", "description": "after 5 pm"}}})
    assert listed.text == ('[Replying to your earlier message]\n'
                           '[Chose "Tuesday" (after 5 pm) from the list]')
    flow = one({**base, "interactive": {"type": "nfm_reply", "nfm_reply": {
        "name": "flow", "response_json": '{"date": "2026-12-02"}'}}})
    assert '{"date": "2026-12-02"}' in flow.text and not flow.unsupported
    empty = one({**base, "interactive": {"type": "button_reply", "button_reply": {}}})
    assert empty.unsupported and empty.text == ""
    blank_button = one({**base, "type": "button", "button": {"payload": "", "text": ""}})
    assert blank_button.unsupported
