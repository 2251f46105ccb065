"""Hostile files cost an error result, never a stuck turn: the parse runs in a worker process
with a memory bound and a time bound, is killed past it, and the next file is read by a fresh
worker. The event loop goes on meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.core.errors import DocumentError
from daemon.parsing.child import DAMAGED
from daemon.parsing.pool import Limits, WorkerPool
from daemon.store.attachments import store_file
from tests import documents

# Unpacks to 105 MB: under the declared-size check, so it reaches the parser, whose tree of
# three million paragraphs needs far more than 300 MB.
BOMB_PARAGRAPHS = 3_000_000


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hostile")
    made = {"bomb.docx": documents.word_bomb(BOMB_PARAGRAPHS),
            "huge.docx": documents.word_bomb(8_000_000),
            "loop.pdf": documents.looping_pdf(),
            "no-tree.pdf": documents.pdf_without_page_tree(),
            "fine.pdf": documents.pdf(["all is well"]),
            "not-a-pdf.pdf": b"GIF89a this is not a pdf"}
    for name, data in made.items():
        (root / name).write_bytes(data)
    return {name: root / name for name in made}


@pytest.fixture
def pool() -> Iterator[WorkerPool]:
    pool = WorkerPool(Limits(memory_mb=300, timeout=60))
    yield pool
    pool.close()


def test_a_zip_bomb_hits_the_memory_bound_and_the_next_file_is_read(
        pool: WorkerPool, files: dict[str, Path]) -> None:
    with pytest.raises(DocumentError, match="needs more memory than a file of its kind should"):
        pool.call("docx_info", str(files["bomb.docx"]))
    assert pool.call("pdf_info", str(files["fine.pdf"]))["text_layer"] is True
    assert pool.started == 2  # the child that ran out of memory was replaced


def test_a_new_workers_start_is_not_counted_against_the_job(
        files: dict[str, Path]) -> None:
    """Issue 48: on a loaded machine a cold worker's start (interpreter, confinement, the
    parsers' imports) used up the job's whole limit, and a 551-byte PDF 'took too long'. The
    limit here is far below any start, and well above the job itself."""
    pool = WorkerPool(Limits(memory_mb=300, timeout=0.5))
    try:
        assert pool.call("pdf_info", str(files["fine.pdf"]))["text_layer"] is True
    finally:
        pool.close()


def test_a_zip_bomb_that_declares_its_size_is_refused_unopened(
        pool: WorkerPool, files: dict[str, Path]) -> None:
    with pytest.raises(DocumentError,
                       match=r"unpacks to 2[0-9][0-9] MB in [0-9]+ parts, .* zip bomb"):
        pool.call("docx_info", str(files["huge.docx"]))


def test_a_parse_past_its_time_is_killed_with_a_clear_error(files: dict[str, Path]) -> None:
    slow = WorkerPool(Limits(memory_mb=4096, timeout=1.0))  # three million paragraphs: slower
    try:
        with pytest.raises(DocumentError, match=r"took longer than 1 s, so I stopped"):
            slow.call("docx_info", str(files["bomb.docx"]))
        assert slow.call("ping", timeout=30) == "pong"  # a fresh worker
        assert slow.started == 2
    finally:
        slow.close()


@pytest.mark.parametrize(("name", "problem"), [
    ("no-tree.pdf", DAMAGED),
    ("not-a-pdf.pdf", "it is not a PDF I can read (damaged, or not a PDF at all)"),
])
def test_a_pdf_without_pages_or_a_fake_is_an_error_and_the_worker_stays(
        pool: WorkerPool, files: dict[str, Path], name: str, problem: str) -> None:
    for job, args in (("pdf_info", ()), ("pdf_read", (1, 5, 1000)), ("pdf_search", ("x", 1))):
        with pytest.raises(DocumentError) as error:
            pool.call(job, str(files[name]), *args)
        assert str(error.value) == problem
    assert pool.started == 1


def test_a_page_tree_that_lists_itself_is_read_once(pool: WorkerPool,
                                                    files: dict[str, Path]) -> None:
    """PDFium follows each page once: the looping tree is the one blank page it holds."""
    assert pool.call("pdf_info", str(files["loop.pdf"]))["pages"] == 1
    assert pool.call("pdf_search", str(files["loop.pdf"]), "x", 1)["hits"] == []
    assert pool.started == 1


async def test_the_event_loop_runs_on_while_a_hostile_file_is_parsed(
        files: dict[str, Path]) -> None:
    slow = WorkerPool(Limits(memory_mb=4096, timeout=30))
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    try:
        with pytest.raises(DocumentError):
            # Three million paragraphs under a far bound: slow, then refused by python-docx or
            # the time bound; the loop ticks all along either way.
            started = time.monotonic()
            await asyncio.to_thread(slow.call, "docx_read", str(files["bomb.docx"]), 1, 1,
                                    1000, timeout=1.0)
        assert ticks >= 2, time.monotonic() - started
    finally:
        ticker.cancel()
        slow.close()


def test_an_attachment_that_breaks_its_reader_is_still_stored_with_a_note(
        files: dict[str, Path], tmp_path: Path) -> None:
    stored = store_file(files["no-tree.pdf"].read_bytes(), tmp_path / "attachments",
                        name="no-tree.pdf", mime="application/pdf", kind="document")
    assert stored.path.is_file()
    assert stored.to_doc()["note"].endswith(
        f"; a PDF I could not read: {DAMAGED}]")


def test_a_worker_does_not_get_the_daemons_secrets(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    monkeypatch.setenv("ROOST_TELEGRAM_TOKEN", "123:secret-token")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    pool = WorkerPool()
    try:
        assert pool.call("ping") == "pong"
        (pid,) = pool.idle_pids()
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    finally:
        pool.close()
    assert b"secret-token" not in environ and b"CREDENTIALS_DIRECTORY" not in environ
