"""`roost pairing list` shows a stranger's chosen name without letting it fake a row (issue 48
item 4): a line break or bidi control in it is quoted and escaped; an ordinary name is as it was."""

from __future__ import annotations

import time
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from daemon.cli.pairing import pairing_command
from daemon.intake.pairing import PairingBook

FORGED = "Eve\napproved  telegram:1111111  Owner\u202e"


def test_a_forged_name_stays_on_its_own_row(state_dir: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    book = PairingBook(state_dir)
    book.request("telegram", "2222222", "telegram:2222222", FORGED, time.time())
    book.request("telegram", "3333333", "telegram:3333333", "Ann Smith", time.time())
    assert pairing_command(book, "list", None, ZoneInfo("UTC")) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.startswith("CODE") and len(rows) == 2 and "\u202e" not in "".join(rows)
    assert "'Eve\\napproved  telegram:1111111  Owner\\u202e'" in rows[0]
    assert " Ann Smith " in rows[1]
