"""Figures of issue 49, item 5: pdf_search on a PDF not yet read, against pdftotext on the same
file in the same run.

    python bench/pdf_search.py [PDF ...] [--query WORDS] [--repeat 5]

For each file (by default the tests' ca-warn-report.pdf, 16 pages of a table, and
senate-expenditures.pdf): the median time of `pdftotext FILE -` (poppler; its column is left
out, with one line saying so, where it is not installed), of roost's pdf_search through the
worker pool on a fresh copy of the file (a search of a file not yet read: the worker keeps
page texts by file, so each run gets a new file), and of the same search again (read from
the worker's memory). The pool is warmed first: the worker's start is not the search.
Goal: the first search within 3x of pdftotext.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from daemon.parsing.pool import WorkerPool

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "documents"
DEFAULT = [FIXTURES / "ca-warn-report.pdf", FIXTURES / "senate-expenditures.pdf"]


def _seconds(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def _first_search(pool: WorkerPool, source: Path, folder: Path, query: str) -> None:
    fresh = folder / f"{time.monotonic_ns()}-{source.name}"  # a file not yet read
    shutil.copyfile(source, fresh)
    pool.call("pdf_search", str(fresh), query, 1)


def _row(pool: WorkerPool, source: Path, folder: Path, query: str, repeat: int,
         pdftotext: str | None) -> str:
    """One file's figures; pdftotext and the first search take turns, so that a busy moment
    of the machine falls on both."""
    first: list[float] = []
    baseline: list[float] = []
    for _ in range(repeat):
        if pdftotext is not None:
            baseline.append(_seconds(partial(subprocess.run, [pdftotext, str(source), "-"],
                                             capture_output=True, check=True)))
        first.append(_seconds(partial(_first_search, pool, source, folder, query)))
    pages = pool.call("pdf_info", str(source))["pages"]
    pool.call("pdf_search", str(source), query, 1)
    again = statistics.median(_seconds(partial(pool.call, "pdf_search", str(source), query, 1))
                              for _ in range(repeat))
    searched = statistics.median(first)
    theirs = ratio = "-"
    if baseline:
        theirs = f"{statistics.median(baseline):.3f} s"
        ratio = f"{searched / statistics.median(baseline):.1f}x"
    return (f"{source.name[:28]:28} {pages:>5} {theirs:>10} {searched:>11.3f} s {ratio:>6} "
            f"{again:>6.3f} s")


def main(files: list[Path], query: str, repeat: int) -> None:
    pdftotext = shutil.which("pdftotext")
    if pdftotext is None:
        print("pdftotext is not installed (Debian: poppler-utils): its column is left out")
    pool = WorkerPool()
    pool.warm()
    print(f"{'file':28} {'pages':>5} {'pdftotext':>10} {'first search':>13} {'ratio':>6} "
          f"{'again':>8}")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for source in files:
                print(_row(pool, source.resolve(), Path(tmp), query, repeat, pdftotext),
                      flush=True)
    finally:
        pool.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, default=DEFAULT)
    parser.add_argument("--query", default="no such words anywhere")
    parser.add_argument("--repeat", type=int, default=5)
    arguments = parser.parse_args()
    main(arguments.files, arguments.query, arguments.repeat)
