"""`roost people` and `roost pairing approve --role` as the owner runs them, and doctor's note
on `[identities]`."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path

from daemon.cli import doctor as doctor_module
from daemon.core.config import load_settings
from daemon.intake.pairing import PairingBook

CONFIG = """\
[daemon]
state_dir = "{state}"
timezone = "Europe/Berlin"

[model]
host = "http://127.0.0.1:9"

[identities]
lena = ["telegram:5555555", "whatsapp:491701234567"]

[people.dana]
chats = ["telegram:1111111", "console:local"]
role = "owner"

[people.omar]
chats = ["telegram:2222222"]
"""


def roost(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "daemon", *args, "--config", str(config)],
                          capture_output=True, text=True, timeout=30)


def setup(tmp_path: Path) -> tuple[Path, PairingBook]:
    state = tmp_path / "state"
    config = tmp_path / "roost.toml"
    config.write_text(CONFIG.format(state=state))
    return config, PairingBook(state)


def waiting(book: PairingBook, user: str, name: str) -> str:
    made = book.request("telegram", user, f"telegram:{user}", name, time.time())
    assert made is not None
    return made.code


def test_an_approved_guest_is_listed_with_thirty_messages_a_day(tmp_path: Path) -> None:
    config, book = setup(tmp_path)
    approved = roost(config, "pairing", "approve", waiting(book, "3333333", "Sam"), "--role",
                     "guest")
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout == ("approved telegram user 3333333 (Sam) as a guest; their next "
                               "message is answered\n")
    listed = roost(config, "people", "list")
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["NAME", "ROLE", "PER", "DAY", "FROM", "SINCE", "(Europe/Berlin)",
                              "CHATS"]  # the zone of the times, named once
    assert [row.split()[:4] for row in rows] == [
        ["dana", "owner", "-", "config"], ["omar", "member", "-", "config"],
        ["lena", "member", "-", "identities"], ["telegram:3333333", "guest", "30", "pairing"]]
    assert rows[-1].endswith("telegram:3333333 (Sam)")
    assert "telegram:5555555, whatsapp:491701234567" in rows[2]


def test_approve_makes_a_guest_unless_told_member(tmp_path: Path) -> None:
    config, book = setup(tmp_path)
    assert roost(config, "pairing", "approve", waiting(book, "3333333", "Sam")).returncode == 0
    member = roost(config, "pairing", "approve", waiting(book, "4444444", "Yusuf"), "--role",
                   "member")
    assert "as a member" in member.stdout
    assert {a.sender: a.role for a in book.approved()} == {"3333333": "guest",
                                                           "4444444": "member"}
    refused = roost(config, "pairing", "approve", waiting(book, "6666666", "Eve"), "--role",
                    "owner")
    assert refused.returncode == 2 and "invalid choice: 'owner'" in refused.stderr


def test_set_role_changes_a_paired_sender_and_refuses_what_the_config_says(
        tmp_path: Path) -> None:
    config, book = setup(tmp_path)
    book.admit("telegram", "4444444", "Yusuf", time.time(), role="guest")
    changed = roost(config, "people", "set-role", "telegram:4444444", "member")
    assert changed.returncode == 0, changed.stderr
    assert "telegram:4444444 (Yusuf) is now a member" in changed.stdout
    assert [a.role for a in book.approved()] == ["member"]

    for who, role, said in [
        ("telegram:4444444", "owner", 'only the config names an owner: give them role = '
                                      '"owner" in their [people.NAME] table'),
        ("omar", "guest", f'omar is in the config: set role = "guest" in [people.omar] in '
                          f"{config}"),
        ("telegram:2222222", "guest", "omar is in the config"),
        ("lena", "guest", 'move them to [people.lena] with their chats and role = "guest"'),
        ("console:local", "member", "dana is in the config"),
    ]:
        refused = roost(config, "people", "set-role", who, role)
        assert (refused.returncode, refused.stdout) == (2, ""), (who, refused)
        assert said in refused.stderr, (who, refused.stderr)
    assert [a.role for a in book.approved()] == ["member"]
    missing = roost(config, "people", "set-role", "telegram:9999999", "member")
    assert missing.returncode == 1 and "no person 'telegram:9999999'" in missing.stderr


def test_remove_takes_back_a_pairing_and_leaves_the_config_alone(tmp_path: Path) -> None:
    config, book = setup(tmp_path)
    book.admit("telegram", "4444444", "Yusuf", time.time())
    refused = roost(config, "people", "remove", "dana")
    assert refused.returncode == 2 and f"remove [people.dana] in {config}" in refused.stderr
    refused = roost(config, "people", "remove", "lena")
    assert refused.returncode == 2 and "lena is in [identities]" in refused.stderr
    removed = roost(config, "people", "remove", "telegram:4444444")
    assert removed.returncode == 0 and "their next message gets a pairing code" in removed.stdout
    assert book.approved() == []
    again = roost(config, "people", "remove", "telegram:4444444")
    assert again.returncode == 1 and "no person" in again.stderr
    config.write_text(CONFIG.format(state=tmp_path / "state").partition("[people.")[0])
    terminal = roost(config, "people", "remove", "console:local")  # the config lists it not
    assert terminal.returncode == 2 and "console:local is the terminal" in terminal.stderr


async def test_doctor_suggests_people_with_a_role_when_identities_are_configured(
        tmp_path: Path) -> None:
    config, _ = setup(tmp_path)
    out = io.StringIO()
    await doctor_module.run_doctor(load_settings(config, env={"HOME": str(tmp_path)}), out=out)
    (line,) = [line for line in out.getvalue().splitlines() if " identities:" in line]
    assert line.startswith("ok   identities: 1 in [identities] (lena): members")
    assert ("-> fix: to give a person a role and let them talk on their chats, list them as "
            '[people.NAME] with chats = [...] and role = "owner", "member" or "guest"') in line

    config.write_text(CONFIG.format(state=tmp_path / "state").partition("[identities]")[0])
    out = io.StringIO()
    await doctor_module.run_doctor(load_settings(config, env={"HOME": str(tmp_path)}), out=out)
    assert " identities:" not in out.getvalue()
