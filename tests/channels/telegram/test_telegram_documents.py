"""PDFs, Word documents and spreadsheets sent through Telegram as a user sends them (a document
message with a caption): the note the model gets names what the file holds and the tools that
read it, and a model that reads it answers from the file."""

from __future__ import annotations

import pytest

from tests.channels.reading import Reader, Sent, last_user_content, sent_files
from tests.channels.telegram.test_telegram import Start, message, start, texts  # noqa: F401
from tests.fakes.ollama import FakeOllama
from tests.fakes.telegram import FakeTelegram


@pytest.mark.parametrize("sent", sent_files(), ids=lambda s: s.name)
async def test_a_document_sent_on_telegram_is_noted_and_read(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama,  # noqa: F811
        sent: Sent) -> None:
    daemon = await start()
    reader = Reader(sent)
    fake_ollama.default_reply = reader
    fake_telegram.add_file("doc-1", sent.data, f"documents/{sent.name}")
    document = {"file_id": "doc-1", "file_unique_id": "d1", "file_name": sent.name,
                "mime_type": sent.mime, "file_size": len(sent.data)}
    assert await daemon.post(message(1, None, document=document, caption="what is in it?")) \
        == 200
    # The first document starts a worker (an interpreter and the parsers' imports): seconds on
    # a loaded machine, before the file is read at all.
    await fake_telegram.wait_for("sendMessage", timeout=90)
    await daemon.settle()
    (user,) = daemon.user_messages()
    (doc,) = user.attachments
    assert (doc["name"], doc["kind"]) == (sent.name, "document")
    assert sent.note in doc["note"]
    first_request = fake_ollama.chat_requests[0]
    assert sent.note in last_user_content(first_request)
    assert sent.note not in first_request["messages"][0]["content"]  # never the system message
    if sent.tool:
        assert texts(fake_telegram) == [f"From the file: {sent.finds}"]
        assert reader.results[-1].startswith("[")  # the labelled result
        assert "untrusted content" in reader.results[-1]
    else:
        assert texts(fake_telegram) == ["noted"]
