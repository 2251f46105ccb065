"""Figures of issue 23: what reading a document or a web page costs, against a baseline in
the same run.

    python bench/documents_web.py [--pages 1000] [--repeat 7]

* `pdf_info` and `pdf_read` (5 pages) through the real tools on a 1,000-page PDF written by
  pypdf (one line of text per page), in the bounded worker pool: the first call (which starts
  the worker) and the median of warm calls (what the model's call costs once the attachment
  note has started it), against the same pypdf work done in this process, without the pool
  (the ratio is the pool's overhead). Goal: pdf_info <= 0.5 s.
* `web_fetch` of a typical article (the Wikipedia page in tests/fixtures/web, served by the
  loopback site of the tests): the tokens of everything the model is shown (all pages of the
  result) against the tokens of the raw HTML, both by roost's estimate (UTF-8 bytes / 4).
  Goal: <= 0.15x.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests` is not installed

from pypdf import PdfReader

from daemon.context.budget import estimate_tokens
from daemon.core.config import Settings
from daemon.parsing.pool import WorkerPool
from daemon.store import Store
from daemon.store.attachments import store_file
from daemon.tools import documents as document_tools
from daemon.tools.builtin import ToolContext
from daemon.tools.registry import Registry, ToolCall
from daemon.tools.web import tools as web_tools
from tests import documents
from tests.fakes.website import ARTICLE, FakeSite


def _timed(fn: object, *args: object) -> float:
    started = time.perf_counter()
    fn(*args)  # type: ignore[operator]
    return time.perf_counter() - started


def _in_process_info(path: str) -> None:
    reader = PdfReader(path)
    _ = (len(reader.pages), reader.metadata, reader.pages[0].extract_text())


def _in_process_read(path: str) -> None:
    reader = PdfReader(path)
    _ = [reader.pages[i].extract_text() for i in range(499, 504)]


async def main(pages: int, repeat: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings.defaults(env={"STATE_DIRECTORY": tmp, "HOME": tmp})
        store = Store.open(Path(tmp))
        pool = WorkerPool()
        registry = Registry()
        document_tools.register(registry, pool)
        web_tools.register(registry, settings.web.__class__(allow_hosts=("127.0.0.1",)), pool=pool)
        conversation = store.create_conversation("telegram:1", time.time())
        ctx = ToolContext(store=store, settings=settings, registry=registry,
                          conversation_id=conversation.id, clock=time.time)

        data = documents.pdf([f"Page {n}: item {n * 7} of the manual." for n in
                              range(1, pages + 1)])
        # Stored as a channel stores it, without the note (it would start the worker).
        stored = store_file(data, Path(tmp) / "attachments", name="manual.txt", mime=None)
        store.append_message(conversation.id, "user", "here", created=time.time(),
                             attachments=(stored.to_doc(),))
        ref, path = stored.ref, str(stored.path)

        async def tool(name: str, **arguments: object) -> float:
            started = time.perf_counter()
            result = await registry.run(ToolCall(name, arguments), ctx, ["documents", "web"])
            assert not result.error and not result.content.startswith("ERROR"), result.content
            return time.perf_counter() - started

        cold_info = await tool("pdf_info", path=ref)
        warm_info = [await tool("pdf_info", path=ref) for _ in range(repeat)]
        warm_read = [await tool("pdf_read", path=ref, from_page=500, to_page=504)
                     for _ in range(repeat)]
        base_info = [_timed(_in_process_info, path) for _ in range(repeat)]
        base_read = [_timed(_in_process_read, path) for _ in range(repeat)]
        med = statistics.median
        print(f"PDF of {pages} pages, {len(data) / 1024:.0f} KB; medians of {repeat} runs")
        print(f"  pdf_info  first call (starts the worker): {cold_info:.3f} s")
        print(f"  pdf_info  warm: {med(warm_info):.3f} s   in-process pypdf: "
              f"{med(base_info):.3f} s   ratio {med(warm_info) / med(base_info):.2f}x   "
              f"(goal <= 0.5 s: {'met' if med(warm_info) <= 0.5 else 'NOT met'})")
        print(f"  pdf_read  pages 500-504 warm: {med(warm_read):.3f} s   in-process pypdf: "
              f"{med(base_read):.3f} s   ratio {med(warm_read) / med(base_read):.2f}x")

        async with FakeSite() as site:
            url = site.url + "/article"
            started = time.perf_counter()
            first = await registry.run(ToolCall("web_fetch", {"url": url}), ctx, ["web"])
            fetched = time.perf_counter() - started
            shown = [first.content]
            page = 2
            while f"page={page})" in shown[-1]:
                shown.append((await registry.run(ToolCall("web_fetch", {"url": url,
                                                                        "page": page}),
                                                 ctx, ["web"])).content)
                page += 1
        raw = estimate_tokens(ARTICLE.decode("utf-8"))
        text = estimate_tokens("\n".join(shown))
        print(f"web_fetch of a typical article ({len(ARTICLE) / 1024:.0f} KB of HTML, "
              f"{len(shown)} pages of result, first page in {fetched:.3f} s)")
        print(f"  tokens of the raw HTML: {raw:,}   tokens shown to the model: {text:,}   "
              f"ratio {text / raw:.3f}x   (goal <= 0.15x: "
              f"{'met' if text / raw <= 0.15 else 'NOT met'})")
        pool.close()
        store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(main(args.pages, args.repeat))
