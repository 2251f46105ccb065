"""A file stays one call away for as long as it is stored: after the conversation it came in
is folded and rotated, its name, kind, date and reference are in what recall returns
(memory_search, conversation_read, the fold's notes) and files_list names the person's own
files, newest first; pdf_read opens page 40 from the new conversation."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from io import BytesIO
from pathlib import Path

import pytest
from PIL import Image

from daemon.context.fold import merge_user_notes
from daemon.core.config import Settings
from daemon.store import Store
from daemon.store.attachments import StoredFile, store_file, store_image
from daemon.store.search_index import SearchIndex
from daemon.tools import builtin
from daemon.tools import documents as document_tools
from daemon.tools.builtin import ToolContext
from daemon.tools.registry import Registry, ToolCall, ToolResult
from tests import documents
from tests.conftest import SettingsFactory

ALICE = "telegram:1111111"
BOB = "telegram:2222222"
MORNING = time.time() - 3 * 3600
PAGES = [f"Page {n}: the part numbers of section {n} are P-{n * 11}." for n in range(1, 61)]


@dataclasses.dataclass
class Desk:
    store: Store
    index: SearchIndex
    settings: Settings
    registry: Registry

    def send(self, cid: str, data: bytes, name: str, created: float) -> StoredFile:
        stored = store_file(data, self.store.state_dir / "attachments", name=name, mime=None,
                            kind="document")
        self.store.append_message(cid, "user", "", created=created,
                                  attachments=(stored.to_doc(),))
        return stored

    async def call(self, cid: str, tool: str, **arguments: object) -> str:
        return (await self.call_result(cid, tool, **arguments)).content

    async def call_result(self, cid: str, tool: str, **arguments: object) -> ToolResult:
        ctx = ToolContext(store=self.store, settings=self.settings, registry=self.registry,
                          conversation_id=cid, clock=time.time, index=self.index)
        self.index.sync(self.store)
        return await self.registry.run(ToolCall(tool, dict(arguments)), ctx,
                                       ["documents", "files"])


@pytest.fixture
def desk(make_settings: SettingsFactory) -> Iterator[Desk]:
    settings = make_settings()
    store = Store.open(settings.daemon.state_dir)
    index = SearchIndex.open(settings.daemon.state_dir / "memory.sqlite3")
    registry = Registry()
    builtin.register(registry)
    document_tools.register(registry)
    yield Desk(store, index, settings, registry)
    index.close()
    store.close()


def _rotate(store: Store, chat_key: str, cid: str, now: float) -> str:
    """What /new and the idle rotation leave: the old conversation archived, a new one."""
    old = store.get_conversation(cid)
    assert old is not None
    store.save_conversation(dataclasses.replace(old, status="archived"))
    return store.create_conversation(chat_key, now).id


async def test_a_pdf_sent_this_morning_is_reachable_after_a_fold_and_a_rotation(
        desk: Desk) -> None:
    morning = desk.store.create_conversation(ALICE, MORNING).id
    pdf = desk.send(morning, documents.pdf(PAGES), "parts catalogue.pdf", MORNING + 60)
    for n in range(30):  # the file's own message scrolls far out of view
        desk.store.append_message(morning, "user", f"chat line {n}", created=MORNING + 100 + n)
    notes = merge_user_notes("", desk.store.messages(morning))
    day = datetime.fromtimestamp(MORNING + 60, UTC).strftime("%Y-%m-%d")
    assert f'- (a file I sent on {day}: document "parts catalogue.pdf", {pdf.ref})' in notes
    now = _rotate(desk.store, ALICE, morning, time.time())
    bobs = desk.store.create_conversation(BOB, MORNING).id
    desk.send(bobs, documents.pdf(["not Alice's"]), "bob secrets.pdf", MORNING + 90)

    local = datetime.fromtimestamp(MORNING + 60, desk.settings.daemon.tz).strftime("%Y-%m-%d")
    listed = await desk.call(now, "files_list")
    assert listed.startswith("1 file you sent, newest first")
    assert f'- {local} document "parts catalogue.pdf" (PDF): {pdf.ref}' in listed, listed
    assert "bob secrets" not in listed
    found = await desk.call(now, "memory_search", query="catalogue")
    assert pdf.ref in found
    read = await desk.call(now, "conversation_read", conversation_id=morning, from_seq=1,
                           to_seq=1)
    assert f"stored at {pdf.ref}" in read
    page = await desk.call(now, "pdf_read", path=pdf.ref, from_page=40, to_page=40)
    assert "Page 40: the part numbers of section 40 are P-440." in page


def _photo(color: str) -> bytes:
    out = BytesIO()
    Image.new("RGB", (64, 48), color).save(out, "JPEG")
    return out.getvalue()


async def test_image_view_shows_an_earlier_photo_of_ones_own_and_nothing_else(
        desk: Desk, tmp_path: Path) -> None:
    attachments = desk.store.state_dir / "attachments"
    morning = desk.store.create_conversation(ALICE, MORNING).id
    photo = store_image(_photo("red"), attachments)
    desk.store.append_message(morning, "user", "my new bike", created=MORNING + 60,
                              attachments=(photo.to_doc(),))
    day = datetime.fromtimestamp(MORNING + 60, UTC).strftime("%Y-%m-%d")
    notes = merge_user_notes("", desk.store.messages(morning))
    assert f"- (a file I sent on {day}: image, {photo.ref})\n- my new bike" == notes
    now = _rotate(desk.store, ALICE, morning, time.time())
    listed = await desk.call(now, "files_list")
    assert f"image (image/jpeg): {photo.ref}" in listed, listed
    shown = await desk.call_result(now, "image_view", ref=photo.ref)
    assert shown.images == (photo.path.read_bytes(),) and not shown.error
    assert "64x48" in shown.content

    bobs = desk.store.create_conversation(BOB, MORNING).id
    bob_photo = store_image(_photo("blue"), attachments)
    desk.store.append_message(bobs, "user", "", created=MORNING + 90,
                              attachments=(bob_photo.to_doc(),))
    pdf = desk.send(now, documents.pdf(["a page"]), "a.pdf", time.time())
    outside = tmp_path / "x.jpg"
    outside.write_bytes(_photo("green"))
    for ref in (bob_photo.ref, str(outside), "../../etc/passwd",
                f"attachments/2026-12/../{outside.name}", pdf.ref):
        refused = await desk.call_result(now, "image_view", ref=ref)
        assert refused.images == () and refused.content.startswith("ERROR: "), ref
        assert "is not an image the user sent" in refused.content
