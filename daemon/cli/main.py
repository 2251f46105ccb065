"""The `roost` command (also `python -m daemon`)."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import channels.installed  # noqa: F401 (installs the platforms in the core's registry)
from daemon import __version__
from daemon.cli import init_files
from daemon.cli.approvals import approvals_command
from daemon.cli.console import console_command
from daemon.cli.memory import add_memory_parser, memory_command
from daemon.cli.pairing import pairing_command
from daemon.cli.people import add_people_parser, people_command
from daemon.cli.times import SECONDS, local, zone_line
from daemon.core import confine
from daemon.core.config import GUEST, MEMBER, Settings, load_settings
from daemon.core.errors import ConfigError, StoreError
from daemon.core.filemodes import make_private
from daemon.core.logs import configure as configure_logging
from daemon.core.platforms import chat_pattern, person_chat_pattern
from daemon.intake.pairing import PairingBook
from daemon.store import NoState, Store
from daemon.store.approvals import ApprovalBook

EX_USAGE = 2  # argparse's status for a command line it cannot parse; roost uses it throughout
EX_CANTCREAT = 73  # sysexits.h: the state directory cannot be used
# A reader that went away (`roost conversations list | head -1`): the status a shell reports for
# a command SIGPIPE ended (128 + 13), as for `cat` or `grep` in the same place. Not 1, which
# roost uses for "not found" and "something to fix".
EX_PIPE_CLOSED = 141

# Commands that only look at state or talk to the model: a missing channel secret must not stop
# them (doctor reports it as a failed check instead).
_READ_ONLY = frozenset({"chat", "doctor", "conversations", "pairing", "automations", "memory",
                        "mcp", "approvals", "console", "models", "people"})

# The modules behind the commands that need the heavy libraries (aiohttp, python-telegram-bot,
# ollama, the engine: over a second to import). They are loaded in `_load` only, so that
# `--version`, `--help`, `pairing` and `conversations` answer at once; tests/test_import_rules.py
# allows this one dynamic import and tests/daemon/cli/test_startup.py checks what is imported.
_HEAVY = {
    "run": "daemon.app.serve",
    "chat": "daemon.cli.chat",
    "doctor": "daemon.cli.doctor",
    "automations": "automations.commands",
    "automations run": "daemon.cli.automation_run",
    "init": "daemon.cli.init",
    "mcp": "daemon.cli.mcp",
    "models": "daemon.cli.models",
}


def _load(command: str) -> ModuleType:
    return importlib.import_module(_HEAVY[command])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="roost",
        description="Talk to the LLM on your own GPU box from your phone or terminal.",
    )
    parser.add_argument("--version", action="version", version=f"roost {__version__}")
    _add_common(parser, suppress=False)
    # --config and -v are accepted before or after any subcommand. A subparser's own copy
    # defaults to SUPPRESS, so an option given earlier is not overwritten by its default.
    common = argparse.ArgumentParser(add_help=False)
    _add_common(common, suppress=True)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser(
        "run", parents=[common], help="run the daemon (HTTP server, channels)",
        description="Run the daemon in the foreground: the HTTP server (webhooks, /healthz, "
                    "/metrics), the enabled channels, the automations. Stop it with Ctrl-C or "
                    "SIGTERM; systemd runs this command.")
    init = commands.add_parser(
        "init", parents=[common],
        help="set roost up: Ollama, the model, the chat platforms, pairing",
        description="Set roost up: find Ollama and pick a pulled model, set up each chat "
                    "platform you choose (its credentials checked with its service), write the "
                    "config (0600) and the secrets (credential files), let you in as the owner "
                    "(paired when you write to the bot, or named by a flag), and install the "
                    "user service. --non-interactive takes every answer from the flags and "
                    "environment, and sets up the platforms whose flags are given.")
    init_files.add_arguments(init)
    commands.add_parser(
        "chat", parents=[common], help="chat with the model in this terminal",
        description="Talk to the model in this terminal, as the chat console:local, with the "
                    "same conversations, tools and chat commands (/new, /help) as a phone. "
                    "Ctrl-D ends it.")
    doctor = commands.add_parser(
        "doctor", parents=[common],
        help="check the config, the state directory, Ollama and each platform; exit 1 on a problem")
    doctor.add_argument("--json", action="store_true", help="the checks as JSON, for scripts")
    _add_conversations(commands, common)
    _add_pairing(commands, common)
    add_people_parser(commands, common)
    _add_automations(commands, common)
    add_memory_parser(commands, common)
    _add_mcp(commands, common)
    _add_console_and_approvals(commands, common)
    _add_models(commands, common)
    return parser


def _add_conversations(commands: argparse._SubParsersAction[argparse.ArgumentParser],
                       common: argparse.ArgumentParser) -> None:
    """`roost conversations list|show|export`."""
    conversations = commands.add_parser("conversations", parents=[common],
                                        help="list, show or export stored conversations")
    actions = conversations.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("list", parents=[common], help="one line per conversation")
    show = actions.add_parser("show", parents=[common], help="print a conversation")
    show.add_argument("id", help="conversation id (a unique prefix is enough) or a chat key "
                                 "(as `conversations list` shows it): its active conversation")
    export = actions.add_parser("export", parents=[common],
                                help="a conversation as JSON, every message byte for byte")
    export.add_argument("id", help="conversation id (a unique prefix is enough) or a chat key "
                                   "(as `conversations list` shows it): its active conversation")


def _add_pairing(commands: argparse._SubParsersAction[argparse.ArgumentParser],
                 common: argparse.ArgumentParser) -> None:
    """`roost pairing list|approve|deny|revoke`."""
    pairing = commands.add_parser("pairing", parents=[common],
                                  help="list, approve or deny senders waiting with a code; "
                                       "revoke an approved one")
    steps = pairing.add_subparsers(dest="action", metavar="ACTION", required=True)
    steps.add_parser("list", parents=[common], help="codes waiting, then approved senders")
    approve = steps.add_parser("approve", parents=[common], help="let the code's sender in")
    approve.add_argument("code", help="the 8-character code the sender was given")
    approve.add_argument("--role", choices=(GUEST, MEMBER), default=GUEST,
                         help="what they are in the household (default: guest)")
    deny = steps.add_parser("deny", parents=[common], help="drop the code")
    deny.add_argument("code", help="the 8-character code the sender was given")
    revoke = steps.add_parser("revoke", parents=[common],
                              help="remove an approved sender (they must pair again)")
    revoke.add_argument("sender", metavar="CHANNEL:SENDER",
                        help=f"as `pairing list` shows it: {person_chat_pattern()[1]}")


def _add_automations(commands: argparse._SubParsersAction[argparse.ArgumentParser],
                     common: argparse.ArgumentParser) -> None:
    """`roost automations list|run|remind`."""
    automations = commands.add_parser("automations", parents=[common],
                                      help="list or run automations, add a reminder")
    jobs = automations.add_subparsers(dest="action", metavar="ACTION", required=True)
    jobs.add_parser("list", parents=[common], help="each automation, its next run, last result")
    run = jobs.add_parser("run", parents=[common], help="run one now and print the reply")
    run.add_argument("name", help="the automation's name")
    remind = jobs.add_parser("remind", parents=[common], help="send a reminder at a time")
    remind.add_argument("words", nargs="+", metavar="WHEN TEXT",
                        help="the time ('in 20m', 'in 2 hours', 'tomorrow 9am', "
                             "'next monday 8:00', '2026-12-24 18:00'), then the reminder's "
                             "text, quoted or not")
    remind.add_argument("--to", required=True, metavar="TARGET",
                        help=f"{chat_pattern()[1]}, or person:NAME ([people] or [identities])")


def _add_mcp(commands: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    """`roost mcp list|test`."""
    mcp = commands.add_parser("mcp", parents=[common], help="the configured MCP servers")
    servers = mcp.add_subparsers(dest="action", metavar="ACTION", required=True)
    servers.add_parser("list", parents=[common],
                       help="start each server, show its state and tools, stop it")
    test = servers.add_parser("test", parents=[common],
                              help="start one server and list its tools; calls nothing")
    test.add_argument("name", help="the server's name, as in [mcp.servers.NAME]")


def _add_console_and_approvals(commands: argparse._SubParsersAction[argparse.ArgumentParser],
                               common: argparse.ArgumentParser) -> None:
    """`roost console` and `roost approvals list|revoke`."""
    console = commands.add_parser("console", parents=[common],
                                  help="print a sign-in link to the web console")
    console.add_argument("--revoke-all", action="store_true",
                         help="sign every browser out and void unused links")
    approvals = commands.add_parser("approvals", parents=[common],
                                    help="tools people allowed for good (Always for this tool)")
    standing = approvals.add_subparsers(dest="action", metavar="ACTION", required=True)
    standing.add_parser("list", parents=[common], help="one line per person and tool")
    revoke_always = standing.add_parser("revoke", parents=[common],
                                        help="ask again: for one person, one tool, or both")
    revoke_always.add_argument("person", nargs="?", default=None,
                               help="a person's chat key, as `approvals list` shows it")
    revoke_always.add_argument("--tool", default=None, help="only this tool (server__tool)")


def _add_models(commands: argparse._SubParsersAction[argparse.ArgumentParser],
                common: argparse.ArgumentParser) -> None:
    """`roost models [--json] [--model NAME ...] [--yes] [--host URL]`."""
    models = commands.add_parser(
        "models", parents=[common], help="probe which pulled models work with roost here",
        description="Send each model a few short requests (tools, thinking, a prompt over the "
                    "window, speed, cache, vision), print a card per model and keep it in the "
                    "state directory. Never pulls anything. Without --model every pulled model "
                    "is loaded in turn, which unloads what is loaded now: it asks first.")
    models.add_argument("--json", action="store_true", help="the cards as JSON, for scripts")
    models.add_argument("--model", action="append", default=[], metavar="NAME", dest="models",
                        help="probe this model only (repeat for more)")
    models.add_argument("--yes", action="store_true",
                        help="probe every pulled model without asking")
    models.add_argument("--host", default=None, metavar="URL",
                        help="probe the Ollama at URL (default: model.host; of several "
                             "model.hosts, the first up)")


def _add_common(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    parser.add_argument("--config", type=Path, metavar="PATH",
                        default=argparse.SUPPRESS if suppress else None,
                        help="config file (default: $ROOST_CONFIG, ./roost.toml, "
                             "~/.config/roost/roost.toml, /etc/roost/roost.toml)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        default=argparse.SUPPRESS if suppress else False, help="debug logging")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `roost` command; its exit status."""
    try:
        status = _main(argv)
        sys.stdout.flush()  # here, so that a closed pipe is met below, not at the exit's flush
        return status
    except BrokenPipeError:
        # The reader of stdout is gone. Python's own flush at exit would meet the closed pipe
        # again and print a traceback: stdout points at /dev/null from here on (Python's
        # documentation, "Note on SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EX_PIPE_CLOSED


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EX_USAGE
    make_private()  # before anything is written: files 0600, folders 0700, whatever the umask
    configure_logging(logging.DEBUG if args.verbose else logging.INFO)
    if args.command == "init":  # it writes the config, so it cannot start by reading one
        logging.getLogger("roost").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
        try:
            return int(asyncio.run(_load("init").run_init(args)))
        except KeyboardInterrupt:
            print("\nroost: init stopped (Ctrl-C)", file=sys.stderr)
            return 130
    try:
        settings = load_settings(args.config, require_secrets=args.command not in _READ_ONLY)
    except ConfigError as exc:
        if args.command == "doctor" and args.json:  # a script reads stdout as JSON, always
            print(_load("doctor").config_error_report(exc))
        else:
            print(f"roost: config error: {exc}", file=sys.stderr)
        return ConfigError.exit_status
    # The processes roost starts (stdio MCP servers, document workers) run as this user: they
    # must not read its tokens from /proc/<pid>/environ, nor the credentials folder.
    confine.undumpable()
    confine.hide(settings.credentials)
    try:
        return _dispatch(args, settings)
    except StoreError as exc:
        print(f"roost: {exc}", file=sys.stderr)
        return EX_CANTCREAT
    except KeyboardInterrupt:
        return 0


def _dispatch(args: argparse.Namespace, settings: Settings) -> int:
    if args.command == "run":
        return int(asyncio.run(_load("run").serve(settings)))
    if args.command == "chat":
        logging.getLogger("roost").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
        if not args.verbose:  # a server that stays down is said once, not at every retry
            logging.getLogger("roost.mcp").setLevel(logging.ERROR)
        return int(asyncio.run(_load("chat").chat(settings)))
    if args.command == "doctor":  # its report is the output; log lines only with -v
        logging.getLogger("roost").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
        return int(asyncio.run(_load("doctor").run_doctor(settings, as_json=args.json)))
    if args.command == "pairing":
        return pairing_command(PairingBook(settings.daemon.state_dir), args.action,
                               getattr(args, "code", None) or getattr(args, "sender", None),
                               settings.daemon.tz, getattr(args, "role", GUEST))
    if args.command == "people":
        return people_command(args, settings)
    if args.command == "automations":
        return _automations(args, settings)
    if args.command == "memory":
        return memory_command(args, settings)
    if args.command == "mcp":  # its report is the output; the servers' log lines only with -v
        logging.getLogger("roost").setLevel(logging.DEBUG if args.verbose else logging.ERROR)
        commands = _load("mcp")
        if args.action == "list":
            return int(asyncio.run(commands.mcp_list(settings)))
        return int(asyncio.run(commands.mcp_test(settings, args.name)))
    if args.command == "models":  # its cards are the output; log lines only with -v
        logging.getLogger("roost").setLevel(logging.DEBUG if args.verbose else logging.ERROR)
        return int(asyncio.run(_load("models").run_models(
            settings, args.models, as_json=args.json, yes=args.yes, host=args.host)))
    if args.command == "console":
        return console_command(settings, args.revoke_all)
    if args.command == "approvals":
        if args.action == "revoke" and args.person is None and args.tool is None:
            print("roost: name a person, --tool, or both", file=sys.stderr)
            return EX_USAGE
        return approvals_command(ApprovalBook(settings.daemon.state_dir), args.action,
                                 getattr(args, "person", None), getattr(args, "tool", None),
                                 tz=settings.daemon.tz)
    return _conversations(args, settings)


def _automations(args: argparse.Namespace, settings: Settings) -> int:
    automation_commands = _load("automations")
    if args.action == "list":
        return int(automation_commands.list_automations(settings))
    if args.action == "run":
        run = _load("automations run").run_automation
        return int(asyncio.run(run(settings, args.name)))
    return int(automation_commands.remind(settings, args.words, args.to))


def _conversations(args: argparse.Namespace, settings: Settings) -> int:
    try:
        store = Store.open(settings.daemon.state_dir, read_only=True)
    except NoState:  # a fresh install: nothing stored yet
        if args.action == "list":
            return 0
        print(f"roost: no conversation matches {args.id!r}", file=sys.stderr)
        return 1
    try:
        found = store.list_conversations()
        tz = settings.daemon.tz
        if args.action == "list":
            if found:
                print(f"{'ID':<26}  {'CHAT':<24} {'STATUS':<8} {'MESSAGES':>15}  "
                      f"LAST ACTIVE ({tz.key})")
            for c in found:
                when = local(c.last_active, tz)
                count = store.message_count(c.id)
                print(f"{c.id}  {c.chat_key:<24} {c.status:<8} {count:>6} messages  {when}")
            return 0
        if ":" in args.id:  # a chat (ids have no colon): the conversation it talks in now
            matches = [c for c in found if c.chat_key == args.id and c.status == "active"]
        else:
            matches = [c for c in found if c.id.startswith(args.id.upper())]
        if len(matches) != 1:
            print(f"roost: {'no' if not matches else 'more than one'} conversation matches "
                  f"{args.id!r}", file=sys.stderr)
            return 1
        # The list holds records only; the summary (with its fold count) has its own file.
        conversation = store.get_conversation(matches[0].id) or matches[0]
        messages = store.messages(conversation.id)
        if args.action == "export":
            doc = {**conversation.to_doc(), "messages": [m.to_doc() for m in messages]}
            json.dump(doc, sys.stdout, ensure_ascii=False, indent=2)
            print()
            return 0
        held = {doc.get("message_id"): doc["held"]
                for doc in store.outbox_pending(conversation.chat_key) if doc.get("held")}
        print(zone_line(tz))
        for m in messages:
            when = local(m.created, tz, SECONDS)
            mark = f" (not delivered yet: {held[m.id]})" if m.id in held else ""
            print(f"--- #{m.seq} {m.role} {when}{mark}\n{m.content}")
        return 0
    finally:
        store.close()
