"""A web page's main content with trafilatura: its title and its text as Markdown, links kept.
Runs in a worker child (`pool.py`): lxml on hostile HTML is bounded like any other parse."""

from __future__ import annotations

from typing import Any

import trafilatura


def extract(html: str, url: str) -> dict[str, Any]:
    """{"title", "text"}; the whole visible text when no main content stands out."""
    text = trafilatura.extract(html, url=url, output_format="markdown", include_links=True,
                               include_tables=True, with_metadata=True) or ""
    title = None
    if text.startswith("---\n"):  # the metadata comes as a front matter block
        front, _, text = text[4:].partition("\n---\n")
        for line in front.splitlines():
            if line.startswith("title: "):
                title = line.removeprefix("title: ").strip() or None
    if not text.strip():
        text = trafilatura.html2txt(html) or ""
    return {"title": title, "text": text.strip()}
