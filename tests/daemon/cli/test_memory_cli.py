"""`roost memory list | add | remove` as a user runs it, also while the daemon holds the state
directory: a person by chat or by `[identities]` name, clear errors, exit statuses."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from daemon.store import Store
from daemon.store.facts import HOUSEHOLD, FactsBook, Person


def roost(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "daemon", *args, "--config", str(config)],
                          capture_output=True, text=True, timeout=30)


def test_add_list_and_remove_a_persons_facts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{state}"\n'
                      '[identities]\nowner = ["telegram:1111111", "whatsapp:972544401243"]\n')
    store = Store.open(state)  # the daemon holds the state directory meanwhile
    try:
        added = roost(config, "memory", "add", "My", "locker", "code", "is", "4417")
        assert added.returncode == 0, added.stderr
        assert added.stdout == ("noted for owner (telegram:1111111, whatsapp:972544401243): "
                                "My locker code is 4417\n")
        assert roost(config, "memory", "add", "--person", "telegram:2222222",
                     "Bob likes tea").returncode == 0
        day = time.strftime("%Y-%m-%d")
        listed = roost(config, "memory", "list", "--person", "whatsapp:972544401243")
        assert listed.stdout == f"  1. {day}  My locker code is 4417\n"
        everyone = roost(config, "memory", "list")
        assert everyone.stdout == (
            "owner (telegram:1111111, whatsapp:972544401243):\n"
            f"  1. {day}  My locker code is 4417\n"
            f"telegram:2222222:\n  1. {day}  Bob likes tea\n")
        # What the daemon reads is what the command wrote.
        owner = Person("owner", ("telegram:1111111", "whatsapp:972544401243"))
        assert [f.text for f in FactsBook(store.files).facts(owner)] == ["My locker code is 4417"]

        missing = roost(config, "memory", "remove", "2", "--person", "owner")
        assert (missing.returncode, missing.stderr) == (
            1, "roost: there is no fact 2; the facts are numbered 1 to 1\n")
        removed = roost(config, "memory", "remove", "1", "--person", "owner")
        assert removed.stdout == ("forgotten for owner (telegram:1111111, "
                                  "whatsapp:972544401243): My locker code is 4417\n")
        assert roost(config, "memory", "list", "--person", "owner").stdout == (
            "no facts kept for owner (telegram:1111111, whatsapp:972544401243)\n")
    finally:
        store.close()


def test_a_group_or_an_unknown_name_is_not_a_person(tmp_path: Path) -> None:
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n')
    for who in ("telegram:-1001234567890", "nobody", "automation:brief"):
        result = roost(config, "memory", "add", "--person", who, "a fact")
        assert result.returncode == 1
        assert result.stderr.startswith(f"roost: {who!r} is not a person")
    too_long = roost(config, "memory", "add", "x" * 400)
    assert too_long.returncode == 1 and "at most 300 characters" in too_long.stderr
    assert not (tmp_path / "state" / "facts" / "console_local.md").exists()


def test_the_households_facts_from_the_command_line(tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{state}"\n'
                      '[people.dana]\nchats = ["telegram:1111111"]\nrole = "owner"\n')
    day = time.strftime("%Y-%m-%d")
    added = roost(config, "memory", "add", "--household", "The wifi password is plum-tree-42")
    assert added.returncode == 0, added.stderr
    assert added.stdout == "noted for the household: The wifi password is plum-tree-42\n"
    assert roost(config, "memory", "add", "I like tea").returncode == 0
    assert roost(config, "memory", "list", "--household").stdout == (
        f"  1. {day}  The wifi password is plum-tree-42\n")
    # Everyone's list starts with the household's; a person's own list is theirs alone.
    assert roost(config, "memory", "list").stdout == (
        f"the household:\n  1. {day}  The wifi password is plum-tree-42\n"
        f"dana (telegram:1111111):\n  1. {day}  I like tea\n")
    assert roost(config, "memory", "list", "--person", "dana").stdout == (
        f"  1. {day}  I like tea\n")
    assert FactsBook.at(state).facts(HOUSEHOLD)[0].text == "The wifi password is plum-tree-42"

    both = roost(config, "memory", "add", "--household", "--person", "dana", "x")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    removed = roost(config, "memory", "remove", "1", "--household")
    assert removed.stdout == "forgotten for the household: The wifi password is plum-tree-42\n"
    assert roost(config, "memory", "list", "--household").stdout == (
        "no facts kept for the household\n")
