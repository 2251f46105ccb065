"""The `roost` command (also `python -m daemon`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from automations import commands as automation_commands
from channels.console import chat
from daemon import __version__
from daemon.app import serve
from daemon.config import Settings, load_settings, missing_secrets
from daemon.errors import ConfigError, LLMError, ModelNotFound, StoreError
from daemon.llm import ModelClient
from daemon.logs import configure as configure_logging
from daemon.store import NoState, Store

EX_USAGE = 2  # argparse's status for a command line it cannot parse; roost uses it throughout
EX_CANTCREAT = 73  # sysexits.h: the state directory cannot be used

# Commands that only look at state or talk to the model: a missing channel secret must not stop
# them (doctor reports it as a failed check instead).
_READ_ONLY = frozenset({"chat", "doctor", "conversations", "automations"})


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
    commands.add_parser("run", parents=[common], help="run the daemon (HTTP server, channels)")
    commands.add_parser("chat", parents=[common], help="chat with the model in this terminal")
    commands.add_parser("doctor", parents=[common],
                        help="check the config, the state directory and Ollama")
    conversations = commands.add_parser("conversations", parents=[common],
                                        help="list, show or export stored conversations")
    actions = conversations.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("list", parents=[common], help="one line per conversation")
    show = actions.add_parser("show", parents=[common], help="print a conversation")
    show.add_argument("id", help="conversation id (a unique prefix is enough)")
    export = actions.add_parser("export", parents=[common],
                                help="a conversation as JSON, every message byte for byte")
    export.add_argument("id", help="conversation id (a unique prefix is enough)")
    automations = commands.add_parser("automations", parents=[common],
                                      help="list or run automations, add a reminder")
    jobs = automations.add_subparsers(dest="action", metavar="ACTION", required=True)
    jobs.add_parser("list", parents=[common], help="each automation, its next run, last result")
    run = jobs.add_parser("run", parents=[common], help="run one now and print the reply")
    run.add_argument("name", help="the automation's name")
    remind = jobs.add_parser("remind", parents=[common], help="send a reminder at a time")
    remind.add_argument("when", help="'in 20m', '15:30', 'tomorrow 09:00', '2026-12-24 18:00'")
    remind.add_argument("text", help="what to remind of")
    remind.add_argument("--to", required=True, metavar="TARGET",
                        help="telegram:<chat id>, whatsapp:<wa_id> or console:local")
    return parser


def _add_common(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    parser.add_argument("--config", type=Path, metavar="PATH",
                        default=argparse.SUPPRESS if suppress else None,
                        help="config file (default: $ROOST_CONFIG, ./roost.toml, "
                             "~/.config/roost/roost.toml, /etc/roost/roost.toml)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        default=argparse.SUPPRESS if suppress else False, help="debug logging")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EX_USAGE
    configure_logging(logging.DEBUG if args.verbose else logging.INFO)
    try:
        settings = load_settings(args.config, require_secrets=args.command not in _READ_ONLY)
    except ConfigError as exc:
        print(f"roost: config error: {exc}", file=sys.stderr)
        return ConfigError.exit_status
    try:
        return _dispatch(args, settings)
    except StoreError as exc:
        print(f"roost: {exc}", file=sys.stderr)
        return EX_CANTCREAT
    except KeyboardInterrupt:
        return 0


def _dispatch(args: argparse.Namespace, settings: Settings) -> int:
    if args.command == "run":
        return asyncio.run(serve(settings))
    if args.command == "chat":
        logging.getLogger("roost").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
        return asyncio.run(chat(settings))
    if args.command == "doctor":
        return asyncio.run(_doctor(settings))
    if args.command == "automations":
        return _automations(args, settings)
    return _conversations(args, settings)


def _automations(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "list":
        return automation_commands.list_automations(settings)
    if args.action == "run":
        return asyncio.run(automation_commands.run_automation(settings, args.name))
    return automation_commands.remind(settings, args.when, args.text, args.to)


async def _doctor(settings: Settings) -> int:
    problems = 0
    print(f"config: {settings.source or 'none found; using defaults'}")
    state_dir = settings.daemon.state_dir
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        probe = state_dir / ".doctor-probe"
        probe.write_text("ok")
        probe.unlink()
        print(f"state directory: {state_dir} (writable)")
    except OSError as exc:
        problems += 1
        print(f"state directory: {state_dir} NOT WRITABLE: {exc.strerror or exc}")
    llm = ModelClient(settings.model)
    try:
        await llm.pulled_models()
        print(f"ollama: reachable at {settings.model.host}")
        num_ctx = await llm.num_ctx()
        print(f"model: {settings.model.name} (num_ctx {num_ctx})")
        for automation in settings.automations:
            if automation.model and automation.model != settings.model.name:
                print(f"automation {automation.name}: uses the model {automation.model}; on "
                      "one GPU each of its runs unloads the chat model and loads that one")
    except ModelNotFound as exc:
        problems += 1
        print(f"model: {exc}; pull it with: ollama pull {exc.model}")
    except LLMError as exc:
        problems += 1
        print(f"ollama: {exc}; start it with `ollama serve`, or set [model] host in the config")
    finally:
        await llm.close()
    channels = [name for name, on in (("telegram", settings.telegram.enabled),
                                      ("whatsapp", settings.whatsapp.enabled)) if on]
    print(f"channels: {', '.join(channels) or 'none (terminal chat only)'}")
    for missing in missing_secrets(settings):
        problems += 1
        print(f"secret: {missing.key} {missing.problem}")
    return 1 if problems else 0


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
        if args.action == "list":
            for c in found:
                when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c.last_active))
                count = store.message_count(c.id)
                print(f"{c.id}  {c.chat_key:<24} {c.status:<8} {count:>6} messages  {when}")
            return 0
        matches = [c for c in found if c.id.startswith(args.id.upper())]
        if len(matches) != 1:
            print(f"roost: {'no' if not matches else 'more than one'} conversation matches "
                  f"{args.id!r}", file=sys.stderr)
            return 1
        conversation = matches[0]
        messages = store.messages(conversation.id)
        if args.action == "export":
            doc = {**conversation.to_doc(), "messages": [m.to_doc() for m in messages]}
            json.dump(doc, sys.stdout, ensure_ascii=False, indent=2)
            print()
            return 0
        for m in messages:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(m.created))
            print(f"--- #{m.seq} {m.role} {when}\n{m.content}")
        return 0
    finally:
        store.close()
