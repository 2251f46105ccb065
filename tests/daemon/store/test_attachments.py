"""Attachments: images are checked, oriented, downscaled and stripped; files are stored safely.

Test images are made with Pillow here; the decompression bombs are hand-built PNG headers, so
no test ever holds a large image in memory.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
import warnings
import zlib
from io import BytesIO
from pathlib import Path

import pytest
from PIL import Image

from daemon.core.errors import RoostError
from daemon.store.attachments import (
    AttachmentError,
    AttachmentLimits,
    StoredFile,
    StoredImage,
    read_image_base64,
    store_file,
    store_image,
)


@pytest.fixture
def attachments(state_dir: Path) -> Path:
    return state_dir / "attachments"


def files_in(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()] if folder.exists() else []


def encode(image: Image.Image, fmt: str, **params: object) -> bytes:
    out = BytesIO()
    image.save(out, fmt, **params)
    return out.getvalue()


def band(image: Image.Image, name: str, xy: tuple[int, int]) -> int:
    """One channel of one pixel ("L" for the grey level)."""
    value = (image.convert("L") if name == "L" else image.getchannel(name)).getpixel(xy)
    assert isinstance(value, int)
    return value


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares `width` x `height` 1-bit pixels but carries almost no data: decoding
    it would fail as damaged, so a "too many pixels" refusal proves the header check came first."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))


def refused(data: bytes, attachments: Path, reason: str, **kwargs: object) -> str:
    """Store `data` as an image, expect a refusal for `reason`, and check nothing was left."""
    with pytest.raises(AttachmentError) as info:
        store_image(data, attachments, **kwargs)  # type: ignore[arg-type]
    assert info.value.reason == reason
    assert files_in(attachments) == []
    return str(info.value)


# --- images ----------------------------------------------------------------------------------


def test_photo_is_stored_upright_downscaled_and_without_metadata(attachments: Path) -> None:
    # A 4000x3000 landscape sensor image with a white block in its top-left corner, tagged
    # "rotate 90° clockwise to display" (EXIF orientation 6), as phones write portrait photos.
    photo = Image.new("L", (4000, 3000), 0)
    photo.paste(255, (0, 0, 1000, 750))
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation
    exif[0x010F] = "TestPhoneMaker"  # Make
    data = encode(photo, "JPEG", exif=exif.tobytes(), comment=b"secret comment", quality=60)

    stored = store_image(data, attachments, name_hint="IMG_0001.JPG")

    assert (stored.width, stored.height) == (768, 1024)
    assert stored.mime == "image/jpeg" and stored.path.suffix == ".jpg"
    assert stored.path.parent.parent == attachments
    assert re.fullmatch(r"\d{4}-\d{2}", stored.path.parent.name)
    payload = stored.path.read_bytes()
    assert stored.size == len(payload)
    assert stored.sha256 == hashlib.sha256(payload).hexdigest()
    assert b"TestPhoneMaker" not in payload and b"secret comment" not in payload
    with Image.open(stored.path) as back:
        assert back.size == (768, 1024)
        assert not back.getexif()
        assert "comment" not in back.info and "exif" not in back.info
        # Rotated clockwise, the original top-left corner is now the top-right one.
        assert band(back, "L", (700, 100)) > 200
        assert band(back, "L", (100, 100)) < 50
    assert files_in(attachments) == [stored.path]


def test_png_with_transparency_stays_png(attachments: Path) -> None:
    image = Image.new("RGBA", (64, 48), (255, 0, 0, 255))
    image.paste((0, 0, 255, 0), (0, 0, 32, 48))

    stored = store_image(encode(image, "PNG"), attachments)

    assert stored.mime == "image/png" and stored.path.suffix == ".png"
    assert (stored.width, stored.height) == (64, 48)  # small images are not enlarged
    with Image.open(stored.path) as back:
        assert back.mode == "RGBA"
        assert band(back, "A", (10, 10)) == 0 and band(back, "A", (50, 10)) == 255


def test_opaque_alpha_and_palette_images_are_converted_sensibly(attachments: Path) -> None:
    opaque = store_image(encode(Image.new("RGBA", (20, 20), (0, 128, 0, 255)), "PNG"), attachments)
    assert opaque.mime == "image/jpeg"

    gif = Image.new("P", (20, 20), 1)
    gif.putpalette([0, 0, 0, 255, 255, 255] + [0] * 762)
    see_through = store_image(encode(gif, "GIF", transparency=1), attachments)
    assert see_through.mime == "image/png"

    grey16 = Image.new("I;16", (20, 20), 32768)  # half grey in 16 bits
    stored = store_image(encode(grey16, "PNG"), attachments)
    with Image.open(stored.path) as back:
        assert 100 < band(back, "L", (5, 5)) < 156  # scaled, not clipped to white


@pytest.mark.parametrize(
    ("width", "height", "limits"),
    [
        (30_000, 30_000, AttachmentLimits()),  # Pillow's own hard limit
        (10_000, 10_000, AttachmentLimits()),  # Pillow only warns here; still refused
        (7_000, 7_000, AttachmentLimits()),  # under Pillow's limits, over ours (40 MP)
        (30_000, 30_000, AttachmentLimits(image_max_pixels=10**12)),  # ours raised: Pillow's
    ],
)
def test_decompression_bomb_is_refused_before_decoding(
    attachments: Path, width: int, height: int, limits: AttachmentLimits
) -> None:
    pillow_limit = Image.MAX_IMAGE_PIXELS
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        message = refused(png_header(width, height), attachments, "too_many_pixels", limits=limits)
    assert caught == []
    assert "too many pixels" in message and "smaller" in message
    assert Image.MAX_IMAGE_PIXELS == pillow_limit


def test_pixel_limit_is_a_setting(attachments: Path) -> None:
    data = encode(Image.new("RGB", (100, 100)), "PNG")
    message = refused(data, attachments, "too_many_pixels",
                      limits=AttachmentLimits(image_max_pixels=5000))
    assert "100x100" in message and "0.005 megapixels" in message


def test_truncated_jpeg_is_refused_as_damaged(attachments: Path) -> None:
    noise = Image.effect_noise((200, 150), 64).convert("RGB")
    data = encode(noise, "JPEG")
    message = refused(data[: len(data) // 2], attachments, "damaged", name_hint="beach.jpg")
    assert message == ('The image "beach.jpg" could not be read as an image; it may be damaged'
                       " — please send it again.")


def test_damaged_png_and_empty_data_are_refused_as_damaged(attachments: Path) -> None:
    data = bytearray(encode(Image.effect_noise((64, 64), 64), "PNG"))
    data[40] ^= 0xFF  # breaks a chunk checksum; verify() catches it
    refused(bytes(data), attachments, "damaged")
    refused(b"", attachments, "damaged")


def test_png_with_a_bad_checksum_in_an_ancillary_chunk_is_accepted(attachments: Path) -> None:
    # The PNG spec lets a decoder drop such a chunk; browsers and Telegram show the image.
    profile = b"\x00" * 128  # the chunk's content does not matter once its checksum is wrong
    data = bytearray(encode(Image.new("RGB", (40, 30), "red"), "PNG", icc_profile=profile))
    at = data.index(b"iCCP")
    data[at + 4 + 14] ^= 0xFF  # inside the compressed profile: its checksum no longer matches
    stored = store_image(bytes(data), attachments)
    assert (stored.width, stored.height) == (40, 30)


def test_text_renamed_png_is_refused_as_unsupported(attachments: Path) -> None:
    data = b"Shopping list\n- eggs\n- milk\n" * 20
    message = refused(data, attachments, "unsupported", name_hint="notes.png")
    assert message.startswith('The image "notes.png" is not in an image format I can read.')
    for fmt in ("JPEG", "PNG", "WebP", "GIF", "BMP"):
        assert fmt in message


def test_unsupported_image_format_is_refused(attachments: Path) -> None:
    # TIFF is an image Pillow can read, but not one phones send: not let through.
    refused(encode(Image.new("RGB", (8, 8)), "TIFF"), attachments, "unsupported")


def test_too_many_bytes_is_refused_before_decoding(attachments: Path) -> None:
    data = encode(Image.effect_noise((64, 64), 64), "PNG")
    message = refused(data, attachments, "too_large",
                      limits=AttachmentLimits(image_max_bytes=1024))
    assert "1 KB I can accept" in message and "smaller" in message


def test_attachment_error_is_a_roost_error() -> None:
    assert issubclass(AttachmentError, RoostError)


def test_image_doc_round_trips_and_reads_as_base64(attachments: Path) -> None:
    stored = store_image(encode(Image.new("RGB", (30, 20), "red"), "JPEG"), attachments,
                         name_hint="red.jpg")
    doc = json.loads(json.dumps(stored.to_doc()))

    assert doc["kind"] == "image" and doc["name"] == "red.jpg"
    assert doc["path"] == f"attachments/{stored.path.parent.name}/{stored.path.name}"
    assert StoredImage.from_doc(doc, attachments) == stored
    assert base64.b64decode(read_image_base64(doc, attachments)) == stored.path.read_bytes()


def test_read_image_refuses_a_reference_outside_the_attachments(attachments: Path) -> None:
    attachments.mkdir(parents=True)
    (attachments.parent / "index.json").write_text("{}")
    for path in ("index.json", "attachments/../index.json", "/etc/passwd", "attachments"):
        with pytest.raises(AttachmentError):
            read_image_base64({"kind": "image", "path": path}, attachments)
    with pytest.raises(AttachmentError) as info:
        read_image_base64({"kind": "image", "path": "attachments/2026-01/gone.jpg"}, attachments)
    assert "send it again" in str(info.value)


# --- files -----------------------------------------------------------------------------------


def test_csv_is_stored_with_line_count_and_reference_note(attachments: Path) -> None:
    data = ("id,amount\n" + "".join(f"{i},{i * 3}\n" for i in range(244))).encode()

    stored = store_file(data, attachments, name="report.csv", mime=None)

    assert stored.path.read_bytes() == data and stored.path.suffix == ".csv"
    assert stored.path.parent.parent == attachments
    assert (stored.name, stored.mime, stored.line_count) == ("report.csv", "text/csv", 245)
    assert stored.sha256 == hashlib.sha256(data).hexdigest()
    note = stored.reference_note()
    assert note == (f"[file: report.csv, text/csv, 1.8 KB, 245 lines, stored at {stored.ref};"
                    f' read it with file_read("{stored.ref}", 1, 100)]')
    assert re.fullmatch(r"attachments/\d{4}-\d{2}/[0-9A-Z]{26}\.csv", stored.ref)
    doc = json.loads(json.dumps(stored.to_doc()))
    assert doc["kind"] == "file" and doc["path"] == stored.ref and doc["note"] == note
    assert StoredFile.from_doc(doc, attachments) == stored


def test_binary_file_has_no_line_count(attachments: Path) -> None:
    data = bytes(range(256)) * 8
    stored = store_file(data, attachments, name="voice.ogg", mime="audio/ogg", kind="voice")
    assert stored.line_count is None
    assert stored.reference_note() == (f"[voice: voice.ogg, audio/ogg, 2 KB, stored at"
                                       f" {stored.ref}; binary, not readable as text]")


@pytest.mark.parametrize(
    ("data", "lines"),
    [
        (b"one\ntwo", 2),
        ("\ufeffone\r\ntwo\r\n".encode(), 2),
        ("one\nzwei\ndrei\n".encode("utf-16"), 3),
        (b"", 0),
        (b"text with a \x00 inside\n", None),
        ("caf\u00e9\n".encode("latin-1"), None),
    ],
)
def test_line_count(attachments: Path, data: bytes, lines: int | None) -> None:
    assert store_file(data, attachments, name="a.txt", mime=None).line_count == lines


@pytest.mark.parametrize(
    ("hostile", "shown", "suffix"),
    [
        ("../../etc/passwd", "passwd", ""),
        ("..\\..\\Windows\\evil.EXE", "evil.EXE", ".exe"),
        ("/abs/path/notes.txt", "notes.txt", ".txt"),
        ("in\u202egnp.exe", "ingnp.exe", ".exe"),  # right-to-left override removed
        ("a\x00b\nc.txt", "abc.txt", ".txt"),
        ("..", "document", ""),
        ("", "document", ""),
        ("x." + "y" * 40, "x." + "y" * 40, ""),  # too long to be a suffix
    ],
)
def test_hostile_names_are_never_used_as_paths(
    attachments: Path, hostile: str, shown: str, suffix: str
) -> None:
    stored = store_file(b"hello", attachments, name=hostile, mime=None, kind="document")
    assert stored.name == shown
    assert stored.path.resolve().is_relative_to(attachments.resolve())
    assert re.fullmatch(r"[0-9A-Z]{26}", stored.path.stem) and stored.path.suffix == suffix
    assert files_in(attachments) == [stored.path]


def test_long_names_are_bounded(attachments: Path) -> None:
    stored = store_file(b"x", attachments, name="n" * 1000 + ".pdf", mime=None)
    assert len(stored.name) == 200 and stored.name.endswith(".pdf")
    assert stored.mime == "application/pdf"


def test_mime_is_normalised_or_guessed(attachments: Path) -> None:
    given = store_file(b"x", attachments, name="a", mime="Text/Plain; charset=UTF-8")
    assert given.mime == "text/plain" and given.path.suffix == ".txt"  # suffix from the type
    unknown = store_file(b"x", attachments, name="blob", mime="not a type")
    assert unknown.mime == "application/octet-stream" and unknown.path.suffix == ""


def test_too_large_file_is_refused_naming_the_limit(attachments: Path) -> None:
    with pytest.raises(AttachmentError) as info:
        store_file(b"x" * 1536, attachments, name="movie.mp4", mime="video/mp4", kind="video",
                   limits=AttachmentLimits(file_max_bytes=1024))
    assert info.value.reason == "too_large"
    assert str(info.value) == ('The file "movie.mp4" is 1.5 KB, more than the 1 KB I can accept.'
                               " Please send a smaller file, or split it into parts.")
    assert files_in(attachments) == []


def test_unknown_kind_is_a_programming_error(attachments: Path) -> None:
    with pytest.raises(ValueError, match="unknown attachment kind"):
        store_file(b"x", attachments, name="a", mime=None, kind="sticker")
