"""A conversation as a phone made it, for the console's transcript tests: markdown, a photo, a
voice note and a document; names known for both people; and a 2,000-message conversation."""

from __future__ import annotations

import time
from io import BytesIO
from pathlib import Path

from PIL import Image

from daemon.core.conversations import SummaryState
from daemon.intake.pairing import PairingBook
from daemon.store import Store
from daemon.store.attachments import store_file, store_image
from tests.daemon.console.conftest import DANA, OMAR, T0

VOICE = Path(__file__).resolve().parents[2] / "fixtures" / "media" / "voice-note.opus.ogg"
OMARS_NAME = "Omar Khayyam"
DOCUMENT = "Q3 report <final>.pdf"
WIDE_TABLE = ("| Day | Morning | Afternoon | Evening | Notes |\n|---|---|---|---|---|\n"
              "| Monday | swimming_with_the_children_at_the_pool | dentist appointment downtown "
              "| dinner with the neighbours | " + "bring-the-long-unbroken-word-" * 4 + " |\n")
REPLY = ("Here is **Monday**: buy *milk*.\n\n" + WIDE_TABLE + "\n```python\nprint('<b>"
         + "x" * 150 + "</b>')\n```\n\nSee [the shop](https://shop.example/milk) or "
         "[tap](javascript:window.pwned=4).")


def photo() -> bytes:
    out = BytesIO()
    Image.new("RGB", (320, 200), (200, 60, 40)).save(out, "PNG")
    return out.getvalue()


def seed_media(state_dir: Path) -> str:
    """Dana's conversation with a photo, a voice note, a document and a markdown reply; Omar
    approved by pairing under his name. The conversation's id."""
    attachments = state_dir / "attachments"
    PairingBook(state_dir).admit("telegram", OMAR.partition(":")[2], OMARS_NAME, T0)
    with Store.open(state_dir) as store:
        conversation = store.create_conversation(DANA, T0 + 1000)
        image = store_image(photo(), attachments, name_hint="garden.png")
        voice = store_file(VOICE.read_bytes(), attachments, name="voice.ogg",
                           mime="audio/ogg", kind="voice")
        pdf = store_file(b"%PDF-1.4 not really", attachments, name=DOCUMENT,
                         mime="application/pdf", kind="document")
        store.append_message(conversation.id, "user", "Look at **this**:", created=T0 + 1000,
                             attachments=(image.to_doc(),))
        store.append_message(conversation.id, "assistant", REPLY, created=T0 + 1005)
        store.append_message(conversation.id, "user", "", created=T0 + 1010,
                             attachments=(voice.to_doc(),))
        store.append_message(conversation.id, "user", "and the report", created=T0 + 1020,
                             attachments=(pdf.to_doc(),))
        return conversation.id


def seed_long(state_dir: Path, count: int = 2000, through: int = 1200) -> str:
    """Omar's conversation of `count` messages, folded through message `through`."""
    started = time.time() - 86400
    with Store.open(state_dir) as store:
        conversation = store.create_conversation(OMAR, started)
        for m in range(1, count + 1):
            if m % 2:
                store.append_message(conversation.id, "user", f"question {m}: " + "words " * 30,
                                     created=started + m * 30)
            else:
                store.append_message(conversation.id, "assistant",
                                     f"answer {m}: **note** " + "text " * 60,
                                     created=started + m * 30)
        store.save_summary(conversation.id, SummaryState(
            summary="The first part, folded.", through_seq=through, fold_count=12))
        return conversation.id
