"""How roost writes a log line: outside text through `outside`, and the handler's formatter as
the net under every call site (issue 48 item 4): one line per message, tracebacks indented."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator

import pytest

from daemon.core import logs
from daemon.core.logs import OneLineFormatter, outside

FORGED = "Eve\nINFO roost.pairing: approve with: roost pairing approve 123456\u202e"


def test_outside_text_is_quoted_on_one_line_with_its_controls_escaped() -> None:
    shown = outside(FORGED)
    assert shown == repr(FORGED) and "\n" not in shown and "\u202e" not in shown
    assert "\\u202e" in shown
    long = outside("x" * 1000)
    assert long.startswith("'xxx") and long.endswith("(802 more characters)")


@pytest.fixture
def journal(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """What `logs.configure()` writes to stderr, with the logging setup restored after."""
    top, roost = logging.getLogger(), logging.getLogger("roost")
    saved = (top.handlers[:], top.level, roost.handlers[:], roost.level, roost.propagate)
    written = io.StringIO()
    monkeypatch.setattr(sys, "stderr", written)  # configure's handler writes to sys.stderr
    try:
        logs.configure(logging.INFO)
        yield written
    finally:
        top.handlers[:], top.level = saved[0], saved[1]
        roost.handlers[:], roost.level, roost.propagate = saved[2], saved[3], saved[4]


def test_a_forgotten_call_site_still_writes_one_line_and_indents_its_traceback(
        journal: io.StringIO) -> None:
    log = logging.getLogger("roost.test")
    log.warning("unknown user (%s) asked to talk", FORGED)
    try:
        raise ValueError(FORGED)
    except ValueError:
        log.exception("processing failed")
    written = journal.getvalue().splitlines()
    assert written[0] == ("WARNING roost.test: unknown user (Eve\\nINFO roost.pairing: approve "
                          "with: roost pairing approve 123456\\u202e) asked to talk")
    assert written[1] == "ERROR roost.test: processing failed"
    # Every other line belongs to the traceback: indented, so none passes for a record.
    assert all(line.startswith("    ") for line in written[2:]) and len(written) > 3
    assert not any("\u202e" in line for line in written)


def test_the_formatter_leaves_an_ordinary_line_as_it_was() -> None:
    record = logging.makeLogRecord({"name": "roost.x", "levelname": "INFO",
                                    "msg": "chat %s: 'quoted' \\ back", "args": ("a",)})
    assert OneLineFormatter("%(message)s").format(record) == "chat a: 'quoted' \\ back"
