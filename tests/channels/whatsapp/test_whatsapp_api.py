"""roost's Graph API client against the fake: sends, read receipts, media, and what each error
means for delivery."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from io import BytesIO
from pathlib import Path

import pytest
from PIL import Image

from channels.whatsapp.api import Failure, GraphClient, GraphError
from channels.whatsapp.media import WhatsAppMedia
from channels.whatsapp.parse import Described, describe, parse_webhook
from channels.whatsapp.platform import WhatsAppSettings
from tests.conftest import FIXTURES, wait_until
from tests.fakes.flood import Flood
from tests.fakes.graph import API_VERSION, PHONE_NUMBER_ID, FakeGraph


@pytest.fixture
async def graph() -> AsyncIterator[FakeGraph]:
    async with FakeGraph() as fake:
        yield fake


@pytest.fixture
async def client(graph: FakeGraph) -> AsyncIterator[GraphClient]:
    settings = WhatsAppSettings(enabled=True, phone_number_id=PHONE_NUMBER_ID,
                                api_base=graph.url, api_version=API_VERSION, token=graph.token)
    client = GraphClient(settings, timeout=5)
    await client.start()
    yield client
    await client.close()


async def test_a_text_is_sent_with_the_bearer_token_and_gets_a_wamid(
        graph: FakeGraph, client: GraphClient) -> None:
    wamid = await client.send_text("972544401243", "Grüße *bold*", reply_to="wamid.asked")
    assert wamid.startswith("wamid.")
    (call,) = graph.sent
    assert call.path == f"/{API_VERSION}/{PHONE_NUMBER_ID}/messages"
    assert call.authorization == f"Bearer {graph.token}"
    assert call.body == {"messaging_product": "whatsapp", "recipient_type": "individual",
                         "to": "972544401243", "type": "text",
                         "text": {"preview_url": False, "body": "Grüße *bold*"},
                         "context": {"message_id": "wamid.asked"}}


async def test_read_receipt_with_typing(graph: FakeGraph, client: GraphClient) -> None:
    await client.mark_read("wamid.abc", typing=True)
    (call,) = graph.calls_of("read")
    assert call.body == {"messaging_product": "whatsapp", "status": "read",
                         "message_id": "wamid.abc", "typing_indicator": {"type": "text"}}


@pytest.mark.parametrize(("code", "kind"), [
    (131047, Failure.REENGAGE), (131056, Failure.RETRY), (130429, Failure.RETRY),
    (131000, Failure.RETRY), (2, Failure.RETRY), (131026, Failure.REFUSED)])
async def test_each_error_code_says_what_to_do(graph: FakeGraph, client: GraphClient,
                                               code: int, kind: Failure) -> None:
    graph.fail_next("send", code)
    with pytest.raises(GraphError) as caught:
        await client.send_text("111", "hi")
    assert caught.value.code == code and caught.value.kind is kind


async def test_http_429_a_dropped_connection_and_a_bad_token_are_retried(
        graph: FakeGraph, client: GraphClient) -> None:
    graph.fail_next("send", 80007, status=429)
    graph.drop_next("send")
    for _ in range(2):
        with pytest.raises(GraphError) as caught:
            await client.send_text("111", "hi")
        assert caught.value.kind is Failure.RETRY
    graph.token = "rotated"
    with pytest.raises(GraphError) as caught:
        await client.send_text("111", "hi")
    assert caught.value.code == 190 and caught.value.kind is Failure.RETRY


async def test_media_is_found_and_downloaded_with_the_token(
        graph: FakeGraph, client: GraphClient) -> None:
    graph.add_media("65463453", b"\xff\xd8jpeg bytes", "image/jpeg")
    url, mime, size = await client.media_url("65463453")
    assert (mime, size) == ("image/jpeg", 12)
    assert await client.download(url, limit=1024) == b"\xff\xd8jpeg bytes"
    assert all(c.authorization == f"Bearer {graph.token}" for c in graph.calls)
    with pytest.raises(GraphError):
        await client.download(url, limit=4)
    with pytest.raises(GraphError) as caught:
        await client.media_url("404404")
    assert caught.value.kind is Failure.REFUSED


async def test_the_image_fixture_goes_through_media_download_into_the_image_pipeline(
        graph: FakeGraph, client: GraphClient, tmp_path: Path) -> None:
    (message,) = parse_webhook(json.loads((FIXTURES / "whatsapp" / "image_message.json")
                                          .read_bytes())).messages
    out = BytesIO()
    Image.new("RGB", (3000, 2000), "teal").save(out, "JPEG")
    graph.add_media("65463453", out.getvalue(), "image/jpeg")
    fetched = await WhatsAppMedia(client, tmp_path).fetch(describe(message))
    assert fetched.problems == ()
    (image,) = fetched.attachments
    assert image["kind"] == "image" and max(image["width"], image["height"]) < 3000
    assert [c.kind for c in graph.calls] == ["media", "download"]


async def test_a_broken_image_and_a_lost_file_get_a_message_for_the_user(
        graph: FakeGraph, client: GraphClient, tmp_path: Path) -> None:
    graph.add_media("m-broken", b"\xff\xd8 not really a jpeg", "image/jpeg")
    media = WhatsAppMedia(client, tmp_path, backoff=0.01)
    broken = await media.fetch(Described("", media_id="m-broken", media_kind="image"))
    assert broken.attachments == () and broken.problems
    lost = await media.fetch(Described("", media_id="m-gone", media_kind="document",
                                       filename="plan.pdf"))
    assert lost.problems == ("I could not download that document from WhatsApp; please send "
                             "it again.",)
    graph.add_media("m-voice", b"OggS voice", "audio/ogg")
    graph.fail_next("download", 131000)  # a 500 from Meta: tried again
    voice = await media.fetch(Described("", media_id="m-voice", media_kind="audio",
                                        mime_type="audio/ogg"))
    (stored,) = voice.attachments
    assert stored["kind"] == "audio" and voice.problems == ()


@pytest.mark.parametrize(("status", "kind"), [
    (404, Failure.REFUSED), (413, Failure.REFUSED), (400, Failure.REFUSED),
    (401, Failure.RETRY), (429, Failure.RETRY), (502, Failure.RETRY), (504, Failure.RETRY)])
def test_an_answer_without_metas_error_body_is_retried_only_when_waiting_helps(
        status: int, kind: Failure) -> None:
    # A proxy's HTML page or a wrong api_version has no Graph error code: a 4xx there would
    # fail the same way for ever, and retrying it would stall the chat.
    assert GraphError(status, 0, "unexpected answer").kind is kind


@pytest.mark.parametrize("declared", [False, True])
async def test_a_graph_answer_past_its_cap_is_an_error_read_no_further(
        graph: FakeGraph, client: GraphClient, declared: bool) -> None:
    graph.number_flood = flood = Flood(50 * 1024 * 1024, declared, "application/json")
    with pytest.raises(GraphError) as raised:
        await client.phone_number()
    assert "the Graph API sent an answer larger than 4 MB" in str(raised.value)
    await wait_until(lambda: flood.done, 10)
    assert flood.cut and flood.sent < 20 * 1024 * 1024, flood  # roost hung up at its cap
    assert (await client.phone_number())["id"] == PHONE_NUMBER_ID  # the next is read as ever
