"""Attachments: the bytes a user sent from a phone, checked, cleaned and stored.

Layout: ``<attachments_dir>/<yyyy-mm>/<ulid>.<ext>``. A record (`StoredImage`, `StoredFile`) refers
to its file by a path relative to the attachments dir's parent (the state dir), e.g.
``attachments/2026-12/01J….jpg``, which is also the path the model's `file_read` tool takes.

Design:

* Synchronous; the daemon calls it through `asyncio.to_thread`.
* The pixel count is checked on the image header, before any pixel is decoded (decompression
  bombs), and only the formats phones send are let through, so exotic decoders (EPS runs
  Ghostscript) never see untrusted bytes.
* A stored image is a re-encoding, never the user's bytes: upright, downscaled, and without
  metadata (EXIF with GPS, XMP, comments), for privacy.
* Files are stored under a generated name; the user's file name is kept only in the record.
* Writes are atomic (`daemon.store.atomic_write`) and happen after every check has passed, so a
  refused attachment leaves nothing behind.
"""

from __future__ import annotations

import base64
import codecs
import functools
import hashlib
import math
import mimetypes
import re
import threading
import time
import unicodedata
import warnings
from dataclasses import dataclass
from datetime import UTC, datetime
from io import BytesIO
from pathlib import Path
from typing import Any

from PIL import Image, ImageOps, UnidentifiedImageError

from daemon.core.errors import AttachmentError
from daemon.core.ids import ID_PATTERN, id_time, new_id
from daemon.parsing.data import as_data
from daemon.parsing.note import describe, kind_of
from daemon.store import atomic_write
from daemon.store.png import without_bad_ancillary_chunks

FILE_KINDS = ("document", "voice", "audio", "video", "file")

# What a broken or hostile file makes Pillow's decoders raise; caught around decoding only.
# Pillow's bomb warning and error touch the process-wide warnings filters, which are not
# thread-safe; decodes run in worker threads, so the part that can warn is serialised.
_DECODE_LOCK = threading.Lock()
_SUFFIX = re.compile(r"\.[a-z0-9]{1,10}")
_MIME = re.compile(r"[a-z0-9][a-z0-9.+-]*/[a-z0-9][a-z0-9.+-]*")
_NAME_MAX = 200
# The only form of reference roost makes (`_write`, `_ref`): its folder, a month, an id.
_REF_FORM = re.compile(rf"attachments/\d{{4}}-\d{{2}}/({ID_PATTERN})(?:\.[a-z0-9]{{1,10}})?")
# Pillow's format names -> what the user is told ("" for MPO, which is how Pillow names the
# multi-picture JPEGs many phone cameras write).
_FORMAT_NAMES = {"JPEG": "JPEG", "MPO": "", "PNG": "PNG", "WEBP": "WebP", "GIF": "GIF",
                 "BMP": "BMP", "AVIF": "AVIF", "HEIF": "HEIC"}
_HEIC_BRANDS = (b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx")


@dataclass(frozen=True)
class AttachmentLimits:
    image_max_side: int = 1024  # downscale so the longer side is at most this
    image_max_pixels: int = 40_000_000  # decompression-bomb guard, checked on the header
    image_max_bytes: int = 20 * 1024 * 1024
    file_max_bytes: int = 50 * 1024 * 1024
    jpeg_quality: int = 85


@dataclass(frozen=True)
class StoredImage:
    path: Path
    width: int
    height: int
    mime: str  # image/jpeg or image/png
    size: int
    sha256: str
    name: str | None = None  # the cleaned original file name, when the platform gave one

    @property
    def ref(self) -> str:
        """The path relative to the state dir, e.g. `attachments/2026-12/01J….jpg`."""
        return _ref(self.path)

    def to_doc(self) -> dict[str, Any]:
        """A JSON-able entry for `Message.attachments`."""
        doc: dict[str, Any] = {"kind": "image", "path": self.ref, "mime": self.mime,
                               "width": self.width, "height": self.height, "size": self.size,
                               "sha256": self.sha256}
        if self.name is not None:
            doc["name"] = self.name
        return doc

    @classmethod
    def from_doc(cls, doc: dict[str, Any], attachments_dir: Path) -> StoredImage:
        return cls(path=_resolve(doc["path"], attachments_dir), width=doc["width"],
                   height=doc["height"], mime=doc["mime"], size=doc["size"],
                   sha256=doc["sha256"], name=doc.get("name"))


@dataclass(frozen=True)
class StoredFile:
    path: Path
    name: str  # the cleaned original file name; never used as a path
    mime: str
    size: int
    sha256: str
    line_count: int | None  # for UTF-8 / UTF-16 text, else None
    kind: str = "file"  # one of FILE_KINDS
    detail: str | None = None  # a PDF, DOCX or XLSX: what it holds and the tools that read it

    @property
    def ref(self) -> str:
        return _ref(self.path)

    def to_doc(self) -> dict[str, Any]:
        """A JSON-able entry for `Message.attachments`; `note` lets the pure request builder
        (daemon/context/replay.py) show the file to the model without touching the disk."""
        doc = {"kind": self.kind, "path": self.ref, "name": self.name, "mime": self.mime,
               "size": self.size, "sha256": self.sha256, "line_count": self.line_count,
               "note": self.reference_note()}
        if self.detail is not None:
            doc["detail"] = self.detail
        return doc

    @classmethod
    def from_doc(cls, doc: dict[str, Any], attachments_dir: Path) -> StoredFile:
        return cls(path=_resolve(doc["path"], attachments_dir), name=doc["name"],
                   mime=doc["mime"], size=doc["size"], sha256=doc["sha256"],
                   line_count=doc.get("line_count"), kind=doc["kind"],
                   detail=doc.get("detail"))

    def reference_note(self) -> str:
        """A compact note for the model. The content is never injected: the model reads it with
        `file_read` when it needs to, so a large file cannot flood the context window."""
        parts = [as_data(self.name), self.mime, _human_size(self.size)]
        if self.line_count is not None:
            parts.append(f"{self.line_count} line" + ("" if self.line_count == 1 else "s"))
        note = f"[{self.kind}: {', '.join(parts)}, stored at {self.ref}"
        if self.detail:
            return note + f"; {self.detail}]"
        if self.line_count:
            return note + f'; read it with file_read("{self.ref}", 1, {min(100, self.line_count)})]'
        if self.line_count == 0:
            return note + "; it is empty]"
        return note + "; binary, not readable as text]"


def store_image(data: bytes, attachments_dir: Path, *,
                limits: AttachmentLimits = AttachmentLimits(),
                name_hint: str | None = None) -> StoredImage:
    """Check, orient, downscale and re-encode an image, then store it; raise AttachmentError
    with a message for the user when the image cannot be used."""
    name = _clean_name(name_hint or "") or None
    subject = f'The image "{name}"' if name else "That image"
    if len(data) > limits.image_max_bytes:
        raise AttachmentError(
            f"{subject} is {_human_size(len(data))}, more than the"
            f" {_human_size(limits.image_max_bytes)} I can accept. Please send a smaller version"
            " (sending it as a photo rather than as a file usually compresses it).", "too_large")
    image = _decode(data, limits, subject)
    image = _prepare(image, limits.image_max_side)
    out = BytesIO()
    if image.mode == "RGBA":
        image.save(out, "PNG")
        mime, ext = "image/png", ".png"
    else:
        image.save(out, "JPEG", quality=limits.jpeg_quality, optimize=True)
        mime, ext = "image/jpeg", ".jpg"
    payload = out.getvalue()
    path = _write(attachments_dir, ext, payload)
    return StoredImage(path=path, width=image.width, height=image.height, mime=mime,
                       size=len(payload), sha256=hashlib.sha256(payload).hexdigest(), name=name)


def store_file(data: bytes, attachments_dir: Path, *, name: str, mime: str | None,
               kind: str = "file", limits: AttachmentLimits = AttachmentLimits()) -> StoredFile:
    """Store a document, voice note, audio or video file as sent, under a generated name; a
    PDF, DOCX or XLSX also gets what it holds in its note (`daemon.parsing.note`)."""
    if kind not in FILE_KINDS:
        raise ValueError(f"unknown attachment kind {kind!r}; expected one of {FILE_KINDS}")
    clean = _clean_name(name) or kind
    if len(data) > limits.file_max_bytes:
        raise AttachmentError(
            f'The file "{clean}" is {_human_size(len(data))}, more than the'
            f" {_human_size(limits.file_max_bytes)} I can accept. Please send a smaller file,"
            " or split it into parts.", "too_large")
    mime = _clean_mime(mime) or _clean_mime(mimetypes.guess_type(clean, strict=False)[0])
    suffix = Path(clean).suffix.lower()
    if not _SUFFIX.fullmatch(suffix):
        guessed = (mimetypes.guess_extension(mime, strict=False) if mime else None) or ""
        suffix = guessed if _SUFFIX.fullmatch(guessed) else ""
    mime = mime or "application/octet-stream"
    path = _write(attachments_dir, suffix, data)
    document = kind_of(clean, mime) if kind in ("document", "file") else None
    return StoredFile(path=path, name=clean, mime=mime, size=len(data),
                      sha256=hashlib.sha256(data).hexdigest(), line_count=_count_lines(data),
                      kind=kind, detail=describe(path, _ref(path), document) if document else None)


def is_ref(text: str) -> bool:
    """Whether `text` has the form of a reference roost makes, `attachments/2026-12/<id>.txt`:
    nothing with `..`, an absolute path or another folder passes."""
    return _REF_FORM.fullmatch(text) is not None


def ref_time(ref: str) -> float:
    """When the attachment of a reference (one that passes `is_ref`) was stored."""
    found = _REF_FORM.fullmatch(ref)
    if found is None:
        raise ValueError(f"not an attachment reference: {ref!r}")
    return id_time(found.group(1))


def stored_path(ref: str, attachments_dir: Path) -> Path:
    """The file of a stored reference, symlinks resolved; AttachmentError when it is not a
    file inside the attachments dir (gone, or a link pointing out of it)."""
    path = _resolve(ref, attachments_dir)
    if not path.is_file():
        raise AttachmentError("That attachment is no longer stored here.", "missing")
    return path


def read_image_base64(image_doc: dict[str, Any], attachments_dir: Path) -> str:
    """The stored image of an attachment entry, base64-encoded for Ollama's `images` field."""
    path = _resolve(image_doc["path"], attachments_dir)
    try:
        payload = path.read_bytes()
    except FileNotFoundError as exc:
        raise AttachmentError("That image is no longer stored here; please send it again.",
                              "missing") from exc
    return base64.b64encode(payload).decode("ascii")


# --- images ----------------------------------------------------------------------------------


@functools.cache
def _image_formats() -> tuple[str, ...]:
    """What phones send, plus AVIF/HEIF when this Pillow can read them (HEIF via pillow-heif)."""
    Image.init()
    return tuple(f for f in _FORMAT_NAMES if f in Image.OPEN)


def _format_list() -> str:
    shown = [_FORMAT_NAMES[f] for f in _image_formats() if _FORMAT_NAMES[f]]
    return ", ".join(shown[:-1]) + " or " + shown[-1]


def _decode(data: bytes, limits: AttachmentLimits, subject: str) -> Image.Image:
    """Open with the header checks first, verify the structure, then decode the pixels."""
    damaged = AttachmentError(f"{subject} could not be read as an image; it may be damaged —"
                              " please send it again.", "damaged")
    data = without_bad_ancillary_chunks(data)  # as browsers do: see daemon.store.png
    with _DECODE_LOCK, warnings.catch_warnings():
        # Pillow warns above its own limit (MAX_IMAGE_PIXELS, left alone: it is process-wide);
        # we refuse instead, and no warning escapes.
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            _open(data, limits, subject).verify()  # leaves that image object unusable
            image = _open(data, limits, subject)
            # JPEG can decode straight at 1/2, 1/4 or 1/8 scale: less memory and time.
            scale = limits.image_max_side / max(image.size)
            if scale < 1:
                image.draft(None, (math.ceil(image.width * scale), math.ceil(image.height * scale)))
            image.load()
            return image
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise _too_many_pixels(subject, limits, None) from exc
        except UnidentifiedImageError as exc:
            if not data or _looks_like_image(data):
                raise damaged from exc
            hint = ""
            if data[4:8] == b"ftyp" and data[8:12] in _HEIC_BRANDS:
                hint = " (iPhone HEIC photos are converted when sent as a photo, not as a file)"
            raise AttachmentError(f"{subject} is not in an image format I can read. Please send"
                                  f" it as {_format_list()}{hint}.", "unsupported") from exc
        except AttachmentError:
            raise
        except Exception as exc:
            # Untrusted bytes in the daemon's process: anything a parser raises (RecursionError,
            # MemoryError, a bug) means this file is unreadable, never that the message fails.
            raise damaged from exc


def _open(data: bytes, limits: AttachmentLimits, subject: str) -> Image.Image:
    """Parse the header only (Pillow decodes lazily) and refuse too many pixels right there."""
    image = Image.open(BytesIO(data), formats=_image_formats())
    if image.width * image.height > limits.image_max_pixels:
        raise _too_many_pixels(subject, limits, image.size)
    return image


def _too_many_pixels(subject: str, limits: AttachmentLimits,
                     size: tuple[int, int] | None) -> AttachmentError:
    dims = f" ({size[0]}x{size[1]})" if size else ""
    return AttachmentError(f"{subject}{dims} has too many pixels to process safely (the limit is"
                           f" {limits.image_max_pixels / 1e6:g} megapixels). Please send a"
                           " smaller version.", "too_many_pixels")


def _looks_like_image(data: bytes) -> bool:
    """Whether the first bytes claim a supported format (so a failure means damage)."""
    prefix = data[:64]
    return any(accept(prefix) for f in _image_formats() if (accept := Image.OPEN[f][1]))


def _prepare(image: Image.Image, max_side: int) -> Image.Image:
    """Upright, RGB or RGBA, longer side at most `max_side`, without metadata."""
    try:
        ImageOps.exif_transpose(image, in_place=True)  # in place: no full-size copy
    except Exception:
        pass  # unreadable EXIF: keep the pixels as they are rather than refuse the photo
    has_alpha = image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info
    if image.mode.startswith("I;16"):
        # 16-bit greyscale (PNG): scale to 8 bits, a plain convert would clip it to white.
        image = image.convert("I").point(lambda v: v / 256).convert("L")
    mode = "RGBA" if has_alpha else "RGB"
    if image.mode != mode:
        image = image.convert(mode)
    # An alpha channel that is opaque everywhere is common (screenshots); JPEG is smaller.
    if mode == "RGBA" and image.getchannel("A").getextrema() == (255, 255):
        image = image.convert("RGB")
    image.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    # Encoders copy some of `info` (comment, XMP, EXIF) into the file: drop it all, for privacy.
    # The colour profile goes too; vision models read the pixels as sRGB whatever it says.
    image.info.clear()
    return image


# --- files -----------------------------------------------------------------------------------


def _write(attachments_dir: Path, suffix: str, payload: bytes) -> Path:
    """Store `payload` atomically under `<attachments_dir>/<yyyy-mm>/<ulid><suffix>`."""
    now = time.time()
    folder = attachments_dir / datetime.fromtimestamp(now, UTC).strftime("%Y-%m")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{new_id(now)}{suffix}"
    atomic_write(path, payload)
    return path


def _ref(path: Path) -> str:
    # The layout is fixed (<attachments>/<yyyy-mm>/<file>), so the last three parts are the
    # path relative to the state dir.
    return "/".join(path.parts[-3:])


def _resolve(ref: str, attachments_dir: Path) -> Path:
    """The file a stored reference names; refuse one that points outside the attachments dir."""
    root = attachments_dir.resolve()
    path = (attachments_dir.parent / ref).resolve()
    if path == root or not path.is_relative_to(root):
        raise AttachmentError("That attachment reference is not valid.", "missing")
    return path


def _clean_name(name: str) -> str:
    """A display name: last path component, no control or format characters (such as the
    right-to-left override used to disguise `exe.txt`), bounded length. Never used as a path."""
    base = re.split(r"[/\\]", unicodedata.normalize("NFC", name))[-1]
    base = "".join(ch for ch in base if unicodedata.category(ch)[0] != "C").strip()
    if not base.strip("."):
        return ""
    if len(base) > _NAME_MAX:
        suffix = Path(base).suffix[:12]
        base = base[: _NAME_MAX - len(suffix)] + suffix
    return base


def _clean_mime(mime: str | None) -> str | None:
    value = (mime or "").split(";")[0].strip().lower()
    return value if _MIME.fullmatch(value) else None


def _count_lines(data: bytes) -> int | None:
    """Lines of a UTF-8 or UTF-16 (with BOM) text, or None for anything else."""
    utf16 = data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
    encoding = "utf-16" if utf16 else "utf-8-sig"
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError:
        return None
    if "\x00" in text:
        return None  # valid UTF-8, but NUL does not occur in text files
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def _human_size(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    value, unit = size / 1024, "KB"
    for bigger in ("MB", "GB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f}".removesuffix(".0") + f" {unit}"
