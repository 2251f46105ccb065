"""`roost pairing list` shows each approved sender's role beside them (issue 45): what `pairing
approve --role` gave or `people set-role` changed, member for an entry older than roles; a code
still waiting has none yet. The rest of each row is as it was."""

from __future__ import annotations

import json
import time
from pathlib import Path

from daemon.intake.pairing import PairingBook
from tests.daemon.cli.test_times import roost


def test_the_list_shows_each_approved_senders_role(tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{state}"\ntimezone = "UTC"\n')
    book = PairingBook(state)
    now = time.time()
    for user, role in (("2222222", "guest"), ("3333333", "member"), ("4444444", "guest")):
        made = book.request("telegram", user, f"telegram:{user}", f"User {user}", now)
        assert made is not None and book.approve(made.code, now, role) is not None
    assert book.set_role("telegram", "4444444", "member") is not None  # roost people set-role
    # An entry written before roles existed: it reads as a member.
    data = json.loads(book.path.read_text())
    data["approved"].append({"channel": "telegram", "sender": "5555555", "name": "Old Timer",
                             "approved": now})
    book.path.write_text(json.dumps(data))
    waiting = book.request("telegram", "6666666", "telegram:6666666", "Zoe", now)
    assert waiting is not None

    listed = roost(config, "pairing", "list")
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["CODE", "SENDER", "NAME", "WHEN", "(UTC)", "ROLE"]
    roles = {row.split()[1]: row.split()[-1] for row in rows}
    assert roles == {"telegram:6666666": "-", "telegram:2222222": "guest",
                     "telegram:3333333": "member", "telegram:4444444": "member",
                     "telegram:5555555": "member"}
    (code_row,) = [row for row in rows if "6666666" in row]
    assert code_row.startswith(f"{waiting.code}  telegram:6666666") and "expires in" in code_row
    (old,) = [row for row in rows if "5555555" in row]
    assert old.startswith("approved  telegram:5555555") and " Old Timer " in old
    assert " since " in old
    # ROLE is one column: it starts at the same place on every row.
    assert {row.rindex(" ") for row in rows} == {header.rindex(" ")}
