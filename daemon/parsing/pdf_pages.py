"""What a pdf_read answer says after the pages: which pages it holds and the call that reads
on. An answer holds what fits in its characters, so asking for pages 1-12 may give page 1
alone; then it says so and names the next call, and a page longer than a whole answer comes in
parts, each reachable. No parser here: the tools' side can word an answer without one."""

from __future__ import annotations


def parts(text: str, cap: int) -> list[str]:
    """`text` in pieces of at most `cap` characters, cut at a line end (or a space) in the
    second half of a piece where there is one: the same pieces on every call."""
    pieces: list[str] = []
    while len(text) > cap:
        cut = text.rfind("\n", cap // 2, cap)
        if cut < 0:
            cut = text.rfind(" ", cap // 2, cap)
        cut = cut + 1 if cut >= 0 else cap
        pieces.append(text[:cut].rstrip())
        text = text[cut:]
    return [*pieces, text]


def range_note(ref: str, first: int, shown: int, pages: int, wanted: int,
               cut: tuple[int, int, int] | None) -> str:
    """"Pages 3-5 of 16." and, when the model asked for more than it got (up to `wanted`), the
    call that reads on. `cut` is (page, part shown, parts) when a page came in part."""
    held = f"Page {first}" if shown == first else f"Pages {first}-{shown}"
    note = f"{held} of {pages}."
    if cut is not None:
        page, part, count = cut
        note += f" Page {page} is longer than one answer: this is part {part} of {count}."
        if part < count:
            return note + f' More: pdf_read("{ref}", {page}, {max(wanted, page)}, part={part + 1})'
    if shown >= wanted:
        return note
    rest = f"page {wanted}" if shown + 1 == wanted else f"pages {shown + 1}-{wanted}"
    return note + (f' More: pdf_read("{ref}", {shown + 1}, {wanted}) reads on ({rest} did not '
                   "fit in this answer).")
