"""`roost memory list | add TEXT | remove N [--person WHO | --household]`: the facts roost
keeps about a person, or the household's (shared by its owners and members), from the command
line. Safe while the daemon runs: both take the facts folder's lock
and write each file atomically (see `daemon.store.facts`)."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime

from daemon.core.config import Settings
from daemon.core.platforms import person_chat_pattern
from daemon.store.facts import HOUSEHOLD, FactError, FactsBook, Person
from daemon.tools.scope import named_person, people_with_facts

HOUSEHOLD_HELP = "the household's facts, which every owner and member shares, not a person's"
PERSON_HELP = ("whose facts: a person's chat key or a [people] or [identities] name; default: "
               "the only named person when exactly one is configured, else console:local")


def add_memory_parser(commands: argparse._SubParsersAction,  # type: ignore[type-arg]
                      common: argparse.ArgumentParser) -> None:
    """The `memory` subcommand of `roost`."""
    memory = commands.add_parser("memory", parents=[common],
                                 help="list, add or remove the facts roost keeps about a person")
    actions = memory.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", parents=[common],
                                 help="a person's facts, numbered (without --person: everyone's)")
    _whose(listing)
    add = actions.add_parser("add", parents=[common], help="keep a fact")
    add.add_argument("words", nargs="+", metavar="TEXT", help="the fact, quoted or not")
    _whose(add)
    remove = actions.add_parser("remove", parents=[common], help="forget fact number N")
    remove.add_argument("number", type=int, metavar="N", help="as `roost memory list` numbers it")
    _whose(remove)


def _whose(parser: argparse.ArgumentParser) -> None:
    whose = parser.add_mutually_exclusive_group()
    whose.add_argument("--person", metavar="WHO", help=PERSON_HELP)
    whose.add_argument("--household", action="store_true", help=HOUSEHOLD_HELP)


def memory_command(args: argparse.Namespace, settings: Settings) -> int:
    """Run one `roost memory` action; 1 when the person or the fact is not there."""
    book = FactsBook.at(settings.daemon.state_dir)
    if args.action == "list" and args.person is None and not args.household:
        return _list_everyone(book, settings)
    person = HOUSEHOLD if args.household else _person(args.person, settings)
    if person is None:
        print(f"roost: {args.person!r} is not a person: give a private chat "
              f"({person_chat_pattern()[1]}) or a [people] or [identities] name (groups have "
              "no facts)",
              file=sys.stderr)
        return 1
    try:
        if args.action == "list":
            return _list(book, person)
        if args.action == "add":
            day = datetime.fromtimestamp(time.time(), settings.daemon.tz).date().isoformat()
            fact, new = book.add(person, " ".join(args.words), day)
            print(f"noted for {person.label()}: {fact.text}" if new
                  else f"already kept for {person.label()} since {fact.added}: {fact.text}")
            return 0
        gone = book.remove(person, args.number)
    except FactError as exc:
        print(f"roost: {exc}", file=sys.stderr)
        return 1
    print(f"forgotten for {person.label()}: {gone.text}")
    return 0


def _person(name: str | None, settings: Settings) -> Person | None:
    if name is None:
        only = list(settings.linked)
        name = only[0] if len(only) == 1 else "console:local"
    return named_person(name, settings)


def _list(book: FactsBook, person: Person) -> int:
    facts = book.facts(person)
    if not facts:
        print(f"no facts kept for {person.label()}")
    for number, fact in enumerate(facts, start=1):
        print(f"{number:>3}. {fact.added}  {fact.text}")
    return 0


def _list_everyone(book: FactsBook, settings: Settings) -> int:
    shown = False
    for person in (HOUSEHOLD, *people_with_facts(book.people(), settings)):
        facts = book.facts(person)
        if not facts:
            continue
        print(f"{person.label()}:")
        for number, fact in enumerate(facts, start=1):
            print(f"{number:>3}. {fact.added}  {fact.text}")
        shown = True
    if not shown:
        print("no facts kept for anyone yet")
    return 0
