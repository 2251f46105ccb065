"""Who is who (daemon/intake/household.py): roles from `[people]`, `[identities]` and the
pairing book, the terminal as the owner's, and a pairing file from before roles read as members,
so that an upgrade demotes nobody."""

from __future__ import annotations

import json
from pathlib import Path
from types import MappingProxyType

import pytest

from daemon.core.config import PersonSettings
from daemon.intake.household import Household
from daemon.intake.pairing import PairingBook

PEOPLE = MappingProxyType({
    "dana": PersonSettings(("telegram:1111111", "whatsapp:972544401243"), "owner"),
    "sam": PersonSettings(("telegram:3333333",), "guest", 30),
})
IDENTITIES = MappingProxyType({"lena": ("telegram:5555555", "whatsapp:491701234567")})

# pairing.json as roost wrote it before roles: no "role" in an approved entry.
BEFORE_ROLES = {
    "pending": [],
    "approved": [
        {"channel": "telegram", "sender": "4444444", "name": "Yusuf", "approved": 1.7e9},
        {"channel": "whatsapp", "sender": "4915112345678", "name": "Ines", "approved": 1.7e9},
    ],
}


def test_each_place_gives_its_people_their_roles(state_dir: Path) -> None:
    book = PairingBook(state_dir)
    book.admit("telegram", "5555555", "Lena", 1.0, role="guest")  # her identity covers it
    book.admit("telegram", "4444444", "Yusuf", 2.0, role="guest")
    household = Household(book, PEOPLE, IDENTITIES)
    assert household.role_of("telegram:1111111") == household.role_of(
        "whatsapp:972544401243") == "owner"
    assert household.role_of("telegram:3333333") == "guest"
    assert household.role_of("whatsapp:491701234567") == "member"
    assert household.role_of("telegram:5555555") == "member"  # the config wins over pairing
    assert household.role_of("telegram:4444444") == "guest"
    assert household.role_of("console:local") == "owner"  # the terminal, listed by nobody
    assert household.role_of("telegram:9999999") is None
    assert household.role_of("telegram:-100123") is None

    yusuf = household.person("telegram:4444444")
    assert yusuf is not None
    assert (yusuf.name, yusuf.chats, yusuf.source, yusuf.daily_messages, yusuf.called) == (
        "telegram:4444444", ("telegram:4444444",), "pairing", 30, "Yusuf")
    sam = household.person("telegram:3333333")
    assert sam is not None and (sam.name, sam.source, sam.daily_messages) == ("sam", "config", 30)
    assert [(p.name, p.role, p.source) for p in household.everyone()] == [
        ("console:local", "owner", "terminal"), ("dana", "owner", "config"),
        ("sam", "guest", "config"), ("lena", "member", "identities"),
        ("telegram:4444444", "guest", "pairing")]


def test_only_people_and_pairing_let_a_chat_in(state_dir: Path) -> None:
    book = PairingBook(state_dir)
    book.admit("telegram", "4444444", "Yusuf", 2.0)
    household = Household(book, PEOPLE, IDENTITIES)
    assert household.may_talk("telegram:3333333") and household.may_talk("telegram:4444444")
    assert not household.may_talk("telegram:5555555")  # [identities] names, it lets nobody in
    assert not household.may_talk("telegram:9999999")


def test_the_terminal_belongs_to_whoever_lists_it(state_dir: Path) -> None:
    book = PairingBook(state_dir)
    linked = Household(book, identities=MappingProxyType({"me": ("console:local",
                                                                 "telegram:1111111")}))
    me = linked.person("console:local")
    assert me is not None and (me.name, me.role, me.source) == ("me", "owner", "identities")
    assert [p.name for p in linked.everyone()] == ["me"]


def test_a_pairing_file_from_before_roles_reads_as_members(state_dir: Path) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "pairing.json").write_text(json.dumps(BEFORE_ROLES))
    book = PairingBook(state_dir)
    household = Household(book)
    assert household.role_of("telegram:4444444") == "member"
    assert household.role_of("whatsapp:4915112345678") == "member"
    assert book.is_approved("telegram", "4444444")
    # A change to one entry leaves the other as it was, still without a cap.
    assert book.set_role("telegram", "4444444", "guest") is not None
    assert household.role_of("telegram:4444444") == "guest"
    ines = household.person("whatsapp:4915112345678")
    assert ines is not None and (ines.role, ines.daily_messages, ines.called) == (
        "member", None, "Ines")


def test_a_role_pairing_cannot_give_is_never_stored_nor_believed(state_dir: Path) -> None:
    book = PairingBook(state_dir)
    with pytest.raises(ValueError, match="guest or member"):
        book.admit("telegram", "4444444", "Yusuf", 1.0, role="owner")
    book.admit("telegram", "4444444", "Yusuf", 1.0)
    data = json.loads((state_dir / "pairing.json").read_text())
    data["approved"][0]["role"] = "owner"  # edited by hand
    data["approved"][0]["colour"] = "blue"  # a key of a later version
    (state_dir / "pairing.json").write_text(json.dumps(data))
    assert Household(book).role_of("telegram:4444444") == "guest"
