"""PDFs, Word documents and spreadsheets sent through WhatsApp as a user sends them (a signed
document webhook, the media fetched from the Graph API): the note names what the file holds and
the tools that read it, and a model that reads it answers from the file."""

from __future__ import annotations

import pytest

from tests.channels.reading import Reader, Sent, last_user_content, sent_files
from tests.channels.whatsapp.test_whatsapp import USER, Start, graph, start  # noqa: F401
from tests.fakes.graph import FakeGraph, sent_now, webhook
from tests.fakes.ollama import FakeOllama


@pytest.mark.parametrize("sent", sent_files(), ids=lambda s: s.name)
async def test_a_document_sent_on_whatsapp_is_noted_and_read(
        start: Start, graph: FakeGraph, fake_ollama: FakeOllama,  # noqa: F811
        sent: Sent) -> None:
    daemon = await start()
    reader = Reader(sent)
    fake_ollama.default_reply = reader
    graph.add_media("m-doc", sent.data, sent.mime)
    document = {"from": USER, "id": "wamid.doc1", "timestamp": sent_now(), "type": "document",
                "document": {"id": "m-doc", "mime_type": sent.mime, "filename": sent.name,
                             "caption": "what is in it?"}}
    assert await daemon.post(webhook(document)) == 200
    # The first document starts a worker (an interpreter and the parsers' imports): seconds on
    # a loaded machine, before the file is read at all.
    await graph.wait_sent(1, timeout=90)
    await daemon.settle()
    (user,) = daemon.user_messages()
    (doc,) = user.attachments
    assert (doc["name"], doc["kind"]) == (sent.name, "document")
    assert sent.note in doc["note"]
    first_request = fake_ollama.chat_requests[0]
    assert sent.note in last_user_content(first_request)
    assert sent.note not in first_request["messages"][0]["content"]
    expected = f"From the file: {sent.finds}" if sent.tool else "noted"
    assert graph.texts() == [expected]
    if sent.tool:
        assert "untrusted content" in reader.results[-1]
