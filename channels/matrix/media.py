"""Matrix media both ways: `mxc://` downloads into stored attachments, uploads for replies.

An image, file, audio or video message carries its file as `url` (an `mxc://` URI) or, in an
encrypted room, as `file` (the URI with the AES key, IV and SHA-256 that nio's
`decrypt_attachment` checks). Images go to the image pipeline of `daemon.store.attachments`,
the rest are stored as files the model reads with `file_read`; an m.audio flagged as a voice
message (MSC3245) is stored as a voice note, which the engine transcribes like Telegram's.
Anything that cannot be used becomes a line for the user (`Fetched.problems`).

Uploads for an encrypted room are encrypted first (nio's `upload(encrypt=True)`), and the
message then names the file with its keys, as the spec's `EncryptedFile`.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nio import AsyncClient, ErrorResponse, UploadResponse  # type: ignore[import-untyped]
from nio.crypto import decrypt_attachment  # type: ignore[import-untyped]
from nio.exceptions import EncryptionError  # type: ignore[import-untyped]

from channels.matrix.api import NETWORK_ERRORS, checked, network_errors
from channels.matrix.parse import is_voice
from daemon.core.errors import AttachmentError, ChannelError
from daemon.core.logs import outside
from daemon.store.attachments import AttachmentLimits, store_file, store_image

DOWNLOAD_LIMIT = 50 * 1024 * 1024  # Synapse's default max_upload_size
UNSUPPORTED = ("I can read text, pictures, files, voice notes, audio and video; that kind of "
               "message I cannot use. Please describe it in words.")

_KINDS = {"m.image": "image", "m.file": "document", "m.audio": "audio", "m.video": "video"}
_WHAT = {"image": "picture", "document": "file", "audio": "audio file", "video": "video",
         "voice": "voice note"}


@dataclass(frozen=True)
class Fetched:
    attachments: tuple[dict[str, Any], ...] = ()
    problems: tuple[str, ...] = ()


class MatrixMedia:
    """Downloads a message's file from the homeserver (decrypting it when it was encrypted)
    and stores it under the state dir."""

    def __init__(self, client: AsyncClient, attachments_dir: Path, *,
                 limits: AttachmentLimits | None = None,
                 download_limit: int = DOWNLOAD_LIMIT) -> None:
        self.client = client
        self.attachments_dir = attachments_dir
        self.limits = limits or AttachmentLimits()
        self.download_limit = download_limit

    async def fetch(self, content: Mapping[str, Any]) -> Fetched:
        """The attachment of one media message (an m.image, m.file, m.audio or m.video)."""
        kind = "voice" if is_voice(content) else _KINDS[str(content.get("msgtype"))]
        what = _WHAT[kind]
        info = content.get("info") if isinstance(content.get("info"), Mapping) else {}
        size = info.get("size")  # type: ignore[union-attr]
        if isinstance(size, int) and size > self.download_limit:
            return Fetched(problems=(self._too_large(what),))
        name = str(content.get("filename") or content.get("body") or what)
        mime = info.get("mimetype")  # type: ignore[union-attr]
        try:
            data = await self._download(content)
        except _Failed as exc:
            return Fetched(problems=(f"I could not download that {what}: {exc}. Please send "
                                     "it again.",))
        if len(data) > self.download_limit:
            return Fetched(problems=(self._too_large(what),))
        try:
            if kind == "image":
                image = await asyncio.to_thread(store_image, data, self.attachments_dir,
                                                limits=self.limits, name_hint=name)
                return Fetched(attachments=(image.to_doc(),))
            if kind == "voice":
                name = "voice-note.ogg"
            stored = await asyncio.to_thread(
                store_file, data, self.attachments_dir, name=name,
                mime=mime if isinstance(mime, str) else None, kind=kind, limits=self.limits)
        except AttachmentError as exc:  # damaged, too large...: its message is for the user
            return Fetched(problems=(str(exc),))
        return Fetched(attachments=(stored.to_doc(),))

    async def _download(self, content: Mapping[str, Any]) -> bytes:
        encrypted = content.get("file")
        url = encrypted.get("url") if isinstance(encrypted, Mapping) else content.get("url")
        if not isinstance(url, str) or not url.startswith("mxc://"):
            raise _Failed("it names no file")
        try:
            answer = await self.client.download(url)
        except NETWORK_ERRORS as exc:
            raise _Failed("the homeserver could not be reached") from exc
        if isinstance(answer, ErrorResponse):
            raise _Failed(f"the homeserver answered {answer.status_code or answer.message}")
        body = answer.body
        if not isinstance(body, bytes):
            raise _Failed("the homeserver sent no bytes")
        if not isinstance(encrypted, Mapping):
            return body
        try:
            return await asyncio.to_thread(
                decrypt_attachment, body, encrypted["key"]["k"], encrypted["hashes"]["sha256"],
                encrypted["iv"])
        except (EncryptionError, KeyError, TypeError, ValueError) as exc:
            raise _Failed(f"it could not be decrypted ({outside(str(exc))})") from exc

    def _too_large(self, what: str) -> str:
        limit = self.download_limit // (1024 * 1024)
        return (f"That {what} is too large for me: I take files of up to {limit} MB. Please "
                "send a smaller or compressed version.")


async def upload(client: AsyncClient, data: bytes, mime: str, name: str, *,
                 encrypt: bool) -> dict[str, Any]:
    """Upload a file; the content fields naming it: `url`, or `file` (with its keys) for an
    encrypted room. Raises DeliveryError."""
    with network_errors("a file"):
        answer, keys = await client.upload(io.BytesIO(data), content_type=mime, filename=name,
                                           encrypt=encrypt, filesize=len(data))
    uploaded = checked(answer, "the upload")
    assert isinstance(uploaded, UploadResponse)
    if encrypt and keys is not None:
        return {"file": {**keys, "url": uploaded.content_uri}}
    return {"url": uploaded.content_uri}


class _Failed(ChannelError):
    """A download that failed; the message says why, for the user."""
