"""`roost people list | set-role WHO ROLE | remove WHO`: the household (daemon/intake/household.py)
from the command line. `set-role` and `remove` change only senders approved by pairing, in the
pairing book under its lock, so a running daemon applies them from the next message; whom the
config names is changed in the config."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from zoneinfo import ZoneInfo

from daemon.cli.times import local
from daemon.core.config import OWNER, ROLES, Settings
from daemon.core.logs import outside
from daemon.intake.household import CONFIG, IDENTITIES, TERMINAL, Household, Person

EX_USAGE = 2  # as daemon/cli/main.py: a request roost will not carry out as asked

WHO_HELP = ("a name as `roost people list` shows it ([people] or [identities] name, or a paired "
            "sender's chat key), or one of their chats")


def add_people_parser(commands: argparse._SubParsersAction,  # type: ignore[type-arg]
                      common: argparse.ArgumentParser) -> None:
    """The `people` subcommand of `roost`."""
    people = commands.add_parser("people", parents=[common],
                                 help="who may talk and their roles; change a paired sender's")
    actions = people.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("list", parents=[common],
                       help="every person: name, role, where from, chats")
    set_role = actions.add_parser("set-role", parents=[common],
                                  help="make a sender approved by pairing a member or a guest")
    set_role.add_argument("who", metavar="WHO", help=WHO_HELP)
    set_role.add_argument("role", metavar="ROLE", choices=ROLES, help="member or guest")
    remove = actions.add_parser("remove", parents=[common],
                                help="take back a pairing approval (they must pair again)")
    remove.add_argument("who", metavar="WHO", help=WHO_HELP)


def people_command(args: argparse.Namespace, settings: Settings) -> int:
    """Run one `roost people` action: 0 done, 1 no such person, 2 not a change it makes."""
    household = Household.of(settings)
    if args.action == "list":
        return _list(household.everyone(), settings.daemon.tz)
    where = str(settings.source) if settings.source else "the config file"
    if args.action == "set-role" and args.role == OWNER:
        return _refuse(f'only the config names an owner: give them role = "owner" in their '
                       f"[people.NAME] table in {where}")
    person = household.roster().find(args.who)
    if person is None:
        print(f"roost: no person {args.who!r} (see `roost people list`)", file=sys.stderr)
        return 1
    if person.source == TERMINAL:
        return _refuse(f"{person.name} is the terminal: it is always the owner's")
    if person.source == CONFIG:
        change = f'set role = "{args.role}" in' if args.action == "set-role" else "remove"
        return _refuse(f"{person.name} is in the config: {change} [people.{person.name}] in "
                       f"{where}")
    if person.source == IDENTITIES:
        if args.action == "set-role":
            return _refuse(f"{person.name} is in [identities] in {where}, whose people are "
                           f"members: to give them a role, move them to [people.{person.name}] "
                           f'with their chats and role = "{args.role}"')
        return _refuse(f"{person.name} is in [identities]: take them out of it in {where}")
    channel, _, sender = person.chats[0].partition(":")
    if args.action == "set-role":
        changed = household.book.set_role(channel, sender, args.role)
        if changed is not None:
            print(f"{person.name} ({_called(person)}) is now a {args.role}; a running daemon "
                  "applies it from their next message")
    else:
        changed = household.book.revoke(channel, sender)
        if changed is not None:
            print(f"removed {person.name} ({_called(person)}); their next message gets a "
                  "pairing code")
    if changed is None:  # revoked meanwhile
        print(f"roost: {person.name!r} is no longer approved (see `roost people list`)",
              file=sys.stderr)
        return 1
    return 0


def _list(people: Sequence[Person], tz: ZoneInfo) -> int:
    """A header naming the zone of the times once, then a row per person: a guest with their
    model turns a day, a paired sender with when they were approved and the name they go by."""
    width = max([4, *(len(p.name) for p in people)])
    since_header = f"SINCE ({tz.key})"
    since_width = max(16, len(since_header))
    print(f"{'NAME':<{width}}  {'ROLE':<6}  {'PER DAY':>7}  {'FROM':<10}  "
          f"{since_header:<{since_width}}  CHATS")
    for p in people:
        daily = str(p.daily_messages) if p.daily_messages is not None else "-"
        since = local(p.since, tz) if p.since is not None else "-"
        chats = ", ".join(p.chats) + (f" ({_called(p)})" if p.called else "")
        print(f"{p.name:<{width}}  {p.role:<6}  {daily:>7}  {p.source:<10}  "
              f"{since:<{since_width}}  {chats}")
    return 0


def _called(person: Person) -> str:
    """A paired sender's name as they chose it, escaped (`logs.outside`) when it could fake a
    line of the output."""
    if not person.called:
        return "no name"
    return person.called if person.called.isprintable() else outside(person.called)


def _refuse(text: str) -> int:
    print(f"roost: {text}", file=sys.stderr)
    return EX_USAGE
