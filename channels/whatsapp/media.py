"""WhatsApp media -> stored attachments, through the same pipeline as Telegram's.

A media message carries only an id: `GET /{version}/{media_id}` gives a short-lived URL, which is
downloaded with the bearer token. Images go through `daemon.store.attachments.store_image` (checked,
oriented, downscaled); audio, video, documents and stickers are stored as files and reach the
model as a reference it can read with `file_read`. What cannot be used becomes a message for the
user; it never stops the rest of the message.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from channels.whatsapp.api import Failure, GraphClient, GraphError
from channels.whatsapp.parse import Described
from channels.whatsapp.platform import log
from daemon.core.errors import AttachmentError, ChannelError
from daemon.store.attachments import AttachmentLimits, store_file, store_image

# Meta's own cap on media a user can send is 100 MB (documents); roost's file limits apply after.
DOWNLOAD_LIMIT = 100 * 1024 * 1024
DOWNLOAD_ATTEMPTS = 3
_KINDS = {"audio": ("audio", "audio message", "audio.ogg"),
          "video": ("video", "video", "video.mp4"),
          "document": ("document", "document", "document"),
          "sticker": ("document", "sticker", "sticker.webp")}


def _recorded(described: Described) -> bool:
    """A voice note, not an audio file: what the payload's `voice` says; where it says nothing
    (payloads before Meta added it), WhatsApp's recordings are OGG/Opus."""
    if described.voice is not None:
        return described.voice
    return (described.mime_type or "").replace(" ", "").lower() == "audio/ogg;codecs=opus"


@dataclass(frozen=True)
class Fetched:
    attachments: tuple[dict[str, Any], ...] = ()
    problems: tuple[str, ...] = ()


class WhatsAppMedia:
    """Fetches a message's media from the Graph API and stores it under the state directory."""

    def __init__(self, client: GraphClient, attachments_dir: Path, *,
                 limits: AttachmentLimits | None = None, backoff: float = 0.5) -> None:
        self.client = client
        self.attachments_dir = attachments_dir
        self.limits = limits or AttachmentLimits()
        self.backoff = backoff

    async def fetch(self, described: Described) -> Fetched:
        if described.media_id is None or described.media_kind is None:
            return Fetched()
        image = described.media_kind == "image"
        kind, what, default_name = _KINDS.get(described.media_kind, ("document", "file", "file"))
        if described.media_kind == "audio" and _recorded(described):
            kind, what, default_name = "voice", "voice note", "voice-note.ogg"
        what = "photo" if image else what
        try:
            data = await self._download(described.media_id, what)
        except _Failed as exc:
            return Fetched(problems=(str(exc),))
        try:
            if image:
                stored_image = await asyncio.to_thread(store_image, data, self.attachments_dir,
                                                       limits=self.limits)
                return Fetched(attachments=(stored_image.to_doc(),))
            stored = await asyncio.to_thread(
                store_file, data, self.attachments_dir, name=described.filename or default_name,
                mime=described.mime_type, kind=kind, limits=self.limits)
        except AttachmentError as exc:  # damaged, too large...: its message is for the user
            log.info("WhatsApp %s refused: %s", what, exc.reason)
            return Fetched(problems=(str(exc),))
        return Fetched(attachments=(stored.to_doc(),))

    async def _download(self, media_id: str, what: str) -> bytes:
        for attempt in range(DOWNLOAD_ATTEMPTS):
            try:
                url, _, size = await self.client.media_url(media_id)
                if size is not None and size > self._limit(what):
                    raise _Failed(f"That {what} is too large for me to download.")
                return await self.client.download(url, self._limit(what))
            except GraphError as exc:
                log.warning("downloading WhatsApp media %s failed (attempt %d of %d): %s",
                            media_id, attempt + 1, DOWNLOAD_ATTEMPTS, exc)
                if exc.kind is not Failure.RETRY:
                    break
                if attempt + 1 < DOWNLOAD_ATTEMPTS:
                    await asyncio.sleep(self.backoff * 2**attempt)
        raise _Failed(f"I could not download that {what} from WhatsApp; please send it again.")


    def _limit(self, what: str) -> int:
        """Never download more than roost would keep (a 413 from download says so)."""
        keep = self.limits.image_max_bytes if what == "photo" else self.limits.file_max_bytes
        return min(DOWNLOAD_LIMIT, keep)


class _Failed(ChannelError):
    """A download that failed; its message is for the user."""
