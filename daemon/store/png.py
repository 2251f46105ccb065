"""PNG chunks with a wrong checksum that can be dropped (pure).

The PNG spec ("Error checking") lets a decoder that finds a CRC error in an ancillary chunk
(one whose type starts with a lowercase letter: iCCP, eXIf, tEXt, ...) drop that chunk and go
on, and browsers and Telegram do: the reference MCP server's `get-tiny-image` has such an iCCP
chunk. Pillow refuses the whole file instead unless its process-wide LOAD_TRUNCATED_IMAGES is
set, which would also let truncated pixel data through in every thread. So the bad ancillary
chunks go before Pillow sees the file; a bad checksum in a critical chunk (IHDR, PLTE, IDAT,
IEND) is left for Pillow to refuse as damage.
"""

from __future__ import annotations

import zlib

SIGNATURE = b"\x89PNG\r\n\x1a\n"
_ANCILLARY = 0x20  # bit 5 of a chunk type's first byte: lowercase


def without_bad_ancillary_chunks(data: bytes) -> bytes:
    """`data` without the ancillary chunks whose checksum is wrong; anything that is not a
    PNG, or has none, comes back as it was (the same object)."""
    if not data.startswith(SIGNATURE):
        return data
    kept, dropped, pos = [SIGNATURE], False, len(SIGNATURE)
    while pos + 12 <= len(data):
        end = pos + 12 + int.from_bytes(data[pos:pos + 4], "big")
        if end > len(data):
            break  # cut short: what is left stays for the decoder to judge
        kind = data[pos + 4:pos + 8]
        if kind[0] & _ANCILLARY and zlib.crc32(data[pos + 4:end - 4]) != int.from_bytes(
                data[end - 4:end], "big"):
            dropped = True
        else:
            kept.append(data[pos:end])
        pos = end
        if kind == b"IEND":
            break
    return b"".join([*kept, data[pos:]]) if dropped else data
