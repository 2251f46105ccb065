"""Telegram media -> stored attachments: photos into the image pipeline, files as references.

A photo arrives in several sizes; roost takes the largest one under the Bot API's download
limit (20 MB), fetches it through `getFile` and hands the bytes to `daemon.store.attachments`, which
checks, downscales and re-encodes it. Documents, voice notes, audio and video are stored as they
are and reach the model as a reference it can read with `file_read`. Anything that cannot be
used becomes a message for the user (`Fetched.problems`); it never stops the rest of the message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from telegram import Bot, Message, PhotoSize
from telegram.error import BadRequest, NetworkError, TelegramError

from channels.telegram.platform import log
from daemon.core.capped_http import too_large
from daemon.core.errors import AttachmentError, ChannelError
from daemon.store.attachments import AttachmentLimits, store_file, store_image

BOT_API_DOWNLOAD_LIMIT = 20 * 1024 * 1024  # getFile refuses larger files on api.telegram.org
DOWNLOAD_ATTEMPTS = 3
DOWNLOAD_BACKOFF = 0.5  # seconds before the second attempt, doubled after

UNSUPPORTED = ("I can read text, photos, documents, voice notes, audio and video; that kind of "
               "message I cannot use. Please describe it in words.")


@dataclass(frozen=True)
class Fetched:
    """What a message's media became: attachment docs for `Inbound.attachments`, and messages
    for the user about what could not be used."""

    attachments: tuple[dict[str, Any], ...] = ()
    problems: tuple[str, ...] = ()
    unsupported: bool = False  # a sticker, location, poll...: nothing roost can pass on


@dataclass(frozen=True)
class _FileRef:
    kind: str  # one of daemon.store.attachments.FILE_KINDS
    file_id: str
    size: int | None
    name: str
    mime: str | None
    what: str = field(default="file")  # how the user is told about it


class _DownloadFailed(ChannelError):
    """A download that failed; its message is for the user."""

    def __init__(self, user_message: str) -> None:
        super().__init__(user_message)


def best_photo(sizes: Sequence[PhotoSize], limit: int) -> PhotoSize | None:
    """The largest size whose file is not over `limit` bytes (an unknown size is tried)."""
    fits = [s for s in sizes if s.file_size is None or s.file_size <= limit]
    return max(fits, key=lambda s: (s.width * s.height, s.file_size or 0), default=None)


def _file_of(message: Message) -> _FileRef | None:
    """The one file a message carries, if any. An animation (GIF) also comes with a `document`
    describing the same file, so it is looked at first."""
    if (a := message.animation) is not None:
        return _FileRef("video", a.file_id, a.file_size, a.file_name or "animation.mp4",
                        a.mime_type, "animation")
    if (d := message.document) is not None:
        return _FileRef("document", d.file_id, d.file_size, d.file_name or "document",
                        d.mime_type, "document")
    if (v := message.voice) is not None:
        return _FileRef("voice", v.file_id, v.file_size, "voice-note.ogg",
                        v.mime_type or "audio/ogg", "voice note")
    if (au := message.audio) is not None:
        return _FileRef("audio", au.file_id, au.file_size, au.file_name or "audio",
                        au.mime_type, "audio file")
    if (vi := message.video) is not None:
        return _FileRef("video", vi.file_id, vi.file_size, vi.file_name or "video.mp4",
                        vi.mime_type or "video/mp4", "video")
    if (vn := message.video_note) is not None:
        return _FileRef("video", vn.file_id, vn.file_size, "video-note.mp4", "video/mp4",
                        "video message")
    return None


def _unsupported(message: Message) -> bool:
    return any((message.sticker, message.location, message.venue, message.contact, message.poll,
                message.dice, message.game, message.story))


class MediaFetcher:
    """Downloads a message's media through the Bot API and stores it under the state dir."""

    def __init__(self, bot: Bot, attachments_dir: Path, *,
                 limits: AttachmentLimits | None = None,
                 download_limit: int = BOT_API_DOWNLOAD_LIMIT,
                 backoff: float = DOWNLOAD_BACKOFF) -> None:
        self.bot = bot
        self.attachments_dir = attachments_dir
        self.limits = limits or AttachmentLimits()
        self.download_limit = download_limit
        self.backoff = backoff

    async def fetch(self, message: Message) -> Fetched:
        if message.photo:
            return await self._photo(message.photo)
        ref = _file_of(message)
        if ref is not None:
            return await self._file(ref)
        return Fetched(unsupported=_unsupported(message))

    async def _photo(self, sizes: Sequence[PhotoSize]) -> Fetched:
        photo = best_photo(sizes, self.download_limit)
        if photo is None:
            return Fetched(problems=(self._too_large("That photo"),))
        try:
            data = await self._download(photo.file_id, "that photo")
            stored = await asyncio.to_thread(store_image, data, self.attachments_dir,
                                             limits=self.limits)
        except _DownloadFailed as exc:
            return Fetched(problems=(str(exc),))
        except AttachmentError as exc:  # damaged, too many pixels...: its message is for the user
            log.info("photo %s refused: %s", photo.file_unique_id, exc.reason)
            return Fetched(problems=(str(exc),))
        return Fetched(attachments=(stored.to_doc(),))

    async def _file(self, ref: _FileRef) -> Fetched:
        if ref.size is not None and ref.size > self.download_limit:
            return Fetched(problems=(self._too_large(f'The {ref.what} "{ref.name}"'),))
        try:
            data = await self._download(ref.file_id, f'the {ref.what} "{ref.name}"')
        except _DownloadFailed as exc:
            return Fetched(problems=(str(exc),))
        problems: tuple[str, ...] = ()
        if ref.kind == "document" and (ref.mime or "").startswith("image/"):
            # A picture sent "as a file" keeps its full size; the model still sees it as an
            # image. One the image pipeline cannot read is kept as a plain file instead, and
            # the user is told why the model will not see it as a picture.
            try:
                image = await asyncio.to_thread(store_image, data, self.attachments_dir,
                                                limits=self.limits, name_hint=ref.name)
                return Fetched(attachments=(image.to_doc(),))
            except AttachmentError as exc:
                log.info("image document stored as a file: %s", exc.reason)
                problems = (str(exc),)
        try:
            stored = await asyncio.to_thread(store_file, data, self.attachments_dir,
                                             name=ref.name, mime=ref.mime, kind=ref.kind,
                                             limits=self.limits)
        except AttachmentError as exc:
            return Fetched(problems=(*problems, str(exc)))
        return Fetched(attachments=(stored.to_doc(),), problems=problems)

    async def _download(self, file_id: str, what: str) -> bytes:
        """The file's bytes; network failures are retried, then reported to the user."""
        for attempt in range(DOWNLOAD_ATTEMPTS):
            try:
                file = await self.bot.get_file(file_id)
                # python-telegram-bot reads a download whole: a message that gave no size is
                # held to the limit by the size getFile gives, before a byte is fetched.
                if file.file_size is not None and file.file_size > self.download_limit:
                    raise _DownloadFailed(self._too_large(what[:1].upper() + what[1:]))
                return bytes(await file.download_as_bytearray())
            except BadRequest as exc:  # before NetworkError: PTB derives it from that
                if "too big" in exc.message.lower():
                    raise _DownloadFailed(self._too_large(what[:1].upper() + what[1:])) from exc
                log.warning("Telegram refused to hand over a file: %s", exc.message)
                raise _DownloadFailed(f"Telegram would not let me download {what}; please send "
                                      "it again.") from exc
            except NetworkError as exc:
                if too_large(exc):  # past the size getFile gave, or it gave none
                    raise _DownloadFailed(self._too_large(what[:1].upper() + what[1:])) from exc
                log.warning("downloading a file from Telegram failed (attempt %d of %d): %s",
                            attempt + 1, DOWNLOAD_ATTEMPTS, exc)
                if attempt + 1 < DOWNLOAD_ATTEMPTS:
                    await asyncio.sleep(self.backoff * 2**attempt)
            except TelegramError as exc:
                log.warning("downloading a file from Telegram failed: %s", exc)
                break
        raise _DownloadFailed(f"I could not download {what} from Telegram; please send it again.")

    def _too_large(self, subject: str) -> str:
        limit = self.download_limit // (1024 * 1024)
        return (f"{subject} is too large for me to download: Telegram lets bots fetch files of up "
                f"to {limit} MB. Please send a smaller or compressed version.")
