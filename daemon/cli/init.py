"""`roost init`: from nothing to a bot that answers its owner, asking only what it must.

Each answer is checked where it is given: Ollama's address by listing the pulled models
(`/api/tags`, then `/api/show` for each one's context length and capabilities), the bot token by
`getMe`. The owner claims the bot by sending it /start: the daemon is not running yet, so init
reads that update itself with `getUpdates` (bounded by `--pair-timeout`) and approves the sender
in the pairing book, as `roost pairing approve` would; nobody needs a numeric user id.

`--non-interactive` asks nothing: every answer comes from a flag or the environment, and a
missing or refused one is an error with its exit status. systemctl is a parameter, so tests (and
`--no-service`) never touch a real service manager.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import httpx
import ollama
from telegram import Bot
from telegram.error import Conflict, InvalidToken, TelegramError

from channels.telegram.platform import BOT_TOKEN, MALFORMED_TOKEN
from channels.whatsapp.api import GraphClient, GraphError
from channels.whatsapp.platform import WhatsAppSettings
from daemon.cli import init_files as files
from daemon.core.checks import network_reason
from daemon.core.child_env import child_env
from daemon.core.config import Settings, credentials_dir, load_settings
from daemon.core.errors import ConfigError, RoostError
from daemon.intake.pairing import PairingBook

EX_NOTPAIRED = 1  # the config is written, but nobody sent /start in time
EX_UNAVAILABLE = 69  # sysexits.h: Ollama or the Bot API cannot be reached
EX_CANTCREAT = 73  # the config exists (and no --force)
EX_CONFIG = ConfigError.exit_status  # a token Telegram refuses, a model not pulled
TRIES = 3  # an interactive question asked again at most this often
POLL = 10.0  # seconds one getUpdates long poll may wait

Systemctl = Callable[[Sequence[str]], int]


class _Stop(RoostError):
    """A step that cannot go on (control flow inside init); carries the exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ModelChoice:
    name: str
    context_length: int | None
    capabilities: tuple[str, ...]


class Console:
    """The questions: on stdin/stdout, or answered by the flags alone (`--non-interactive`)."""

    def __init__(self, stdin: TextIO, stdout: TextIO, interactive: bool) -> None:
        self.stdin, self.stdout, self.interactive = stdin, stdout, interactive

    def say(self, text: str = "") -> None:
        print(text, file=self.stdout, flush=True)

    def ask(self, question: str, default: str = "", *, hidden: bool = False) -> str:
        shown = f"{question} [{default}]: " if default else f"{question}: "
        with _interruptible():
            if hidden and self.stdin.isatty():  # a token is not echoed to the screen
                answer = getpass.getpass(shown, stream=self.stdout)
            else:
                self.stdout.write(shown)
                self.stdout.flush()
                line = self.stdin.readline()
                if not line:
                    raise _Stop("no answer (end of input); nothing was written", 1)
                answer = line
        return answer.strip() or default

    def confirm(self, question: str, default: bool) -> bool:
        answer = self.ask(f"{question} [{'Y/n' if default else 'y/N'}]").lower()
        return default if not answer else answer.startswith("y")


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """Ctrl-C while a question waits raises KeyboardInterrupt at once (`roost` exits 130).
    asyncio.run's own handler only cancels the task, which a blocking read never notices: the
    next line typed would be taken as the answer."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def real_systemctl(argv: Sequence[str]) -> int:
    try:
        # `systemctl --user` finds the user's manager through the runtime folder and bus.
        env = child_env(keep=("DBUS_SESSION_BUS_ADDRESS",))
        return subprocess.run(list(argv), check=False, timeout=60, env=env).returncode
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"roost: {' '.join(argv)}: {exc}", file=sys.stderr)
        return 1


async def run_init(args: argparse.Namespace, *, stdin: TextIO = sys.stdin,
                   stdout: TextIO = sys.stdout, env: Mapping[str, str] | None = None,
                   systemctl: Systemctl = real_systemctl, root: bool | None = None) -> int:
    env = os.environ if env is None else env
    root = os.geteuid() == 0 if root is None else root
    console = Console(stdin, stdout, interactive=not args.non_interactive)
    try:
        return await _init(args, console, env, systemctl, root)
    except _Stop as failed:
        print(f"roost: {failed}", file=sys.stderr)
        return failed.status


async def _init(args: argparse.Namespace, console: Console, env: Mapping[str, str],
                systemctl: Systemctl, root: bool) -> int:
    config = args.config or files.default_config(env, root)
    if config.exists() and not args.force:
        raise _Stop(f"{config} exists; roost init leaves it alone (--force replaces it)",
                         EX_CANTCREAT)
    credentials = args.credentials_dir or files.default_credentials(env, root)
    ollama_url, models = await _find_ollama(args, console)
    model = _pick_model(args, console, models)
    bot, username = await _connect_bot(args, console, await _telegram_token(args, console, env))
    try:
        webhook_url = _webhook_url(args, console)
        wanted = {"ROOST_TELEGRAM_TOKEN": bot.token}
        if webhook_url:  # Telegram sends it back with every call; roost refuses calls without
            wanted["ROOST_TELEGRAM_SECRET"] = secrets.token_hex(32)
        phone_number_id = _whatsapp(args, console, env, wanted)
        owner = None
        if phone_number_id:
            owner = _whatsapp_owner(args, console)
            await _check_whatsapp(args, console, phone_number_id, wanted)
        answers = files.Answers(ollama_url, model, args.telegram_api_base, webhook_url,
                                phone_number_id, args.whatsapp_api_base, wanted, owner)
        files.write_credentials(credentials, wanted)
        settings = _write_config(config, files.render_config(answers),
                                 {**env, "CREDENTIALS_DIRECTORY": str(credentials)})
        console.say(f"wrote {config} (0600) and {', '.join(wanted)} in {credentials} (0600)")
        # The system unit's state is /var/lib/roost whatever root's own defaults say.
        system = root and config == files.SYSTEM_CONFIG
        state_dir = args.state_dir or (files.SYSTEM_STATE if system
                                       else settings.daemon.state_dir)
        paired = await _pair(bot, console, username, state_dir, args.pair_timeout)
    finally:
        await bot.shutdown()
    _service(args, console, env, config, credentials, list(wanted), systemctl, root)
    return 0 if paired or args.pair_timeout <= 0 else EX_NOTPAIRED


def _write_config(config: Path, text: str, env: Mapping[str, str]) -> Settings:
    """Put the config in place only once roost itself accepts it (as `roost run` would read
    it, with the credentials): a bad flag (`--webhook-url ftp://...`) leaves no broken file."""
    draft = config.with_name(f".{config.name}.init")
    files.write_private(draft, text)
    try:
        settings = load_settings(draft, env=env)
    except ConfigError as exc:
        draft.unlink()
        raise _Stop(f"config error: {exc}", EX_CONFIG) from None
    draft.replace(config)
    return settings


# ---- Ollama -----------------------------------------------------------------------------------

async def _find_ollama(args: argparse.Namespace,
                       console: Console) -> tuple[str, list[ModelChoice]]:
    url = args.ollama_url or files.DEFAULT_OLLAMA
    if console.interactive and not args.ollama_url:
        url = console.ask("Ollama's address", files.DEFAULT_OLLAMA)
    for attempt in range(TRIES):
        try:
            models = await list_models(url)
        except (httpx.HTTPError, ollama.ResponseError, OSError) as exc:
            problem = f"cannot reach Ollama at {url}: {exc or type(exc).__name__}"
            if not console.interactive or attempt == TRIES - 1:
                raise _Stop(f"{problem}; start it (ollama serve) or pass --ollama-url",
                                 EX_UNAVAILABLE) from None
            console.say(problem)
            url = console.ask("Ollama's address (start it with `ollama serve`)", url)
            continue
        if not models:
            raise _Stop(f"Ollama at {url} has no model pulled: `ollama pull qwen3:4b`, "
                             "then roost init again", EX_CONFIG)
        return url, models
    raise AssertionError("unreachable")


async def list_models(url: str) -> list[ModelChoice]:
    """The pulled models, each with its context length and capabilities (`/api/show`)."""
    client = ollama.AsyncClient(host=url, timeout=10)
    try:
        found = []
        for listed in (await client.list()).models:
            name = listed.model or ""
            shown = await client.show(name)
            info = shown.modelinfo or {}
            length = next((int(v) for k, v in info.items() if k.endswith(".context_length")),
                          None)
            found.append(ModelChoice(name, length, tuple(shown.capabilities or ())))
        return found
    finally:
        await client.close()


def _pick_model(args: argparse.Namespace, console: Console, models: list[ModelChoice]) -> str:
    names = [m.name for m in models]
    if args.model:
        if args.model not in names:
            raise _Stop(f"model {args.model!r} is not pulled (pulled: {', '.join(names)}); "
                             f"`ollama pull {args.model}` or pick one of those", EX_CONFIG)
        return str(args.model)
    best = next((m.name for m in models if "tools" in m.capabilities), names[0])
    if not console.interactive:
        return best
    console.say("Models pulled:")
    for number, m in enumerate(models, 1):
        length = f"context {m.context_length}" if m.context_length else "context unknown"
        console.say(f"  {number}. {m.name:<28} {length:<16} {', '.join(m.capabilities)}")
    for _ in range(TRIES):
        answer = console.ask("Which model (number or name)", str(names.index(best) + 1))
        if answer.isdigit() and 1 <= int(answer) <= len(names):
            return names[int(answer) - 1]
        if answer in names:
            return answer
        console.say(f"{answer!r} is not one of them")
    raise _Stop("no model chosen", 1)


# ---- Telegram ---------------------------------------------------------------------------------

async def _telegram_token(args: argparse.Namespace, console: Console,
                          env: Mapping[str, str]) -> str:
    if args.token_file:
        try:
            return str(args.token_file.read_text("utf-8").strip())
        except OSError as exc:
            raise _Stop(f"cannot read {args.token_file}: {exc.strerror}", EX_CONFIG) from None
    if env.get("ROOST_TELEGRAM_TOKEN"):
        return env["ROOST_TELEGRAM_TOKEN"].strip()
    if not console.interactive:
        raise _Stop("no bot token: set ROOST_TELEGRAM_TOKEN or pass --token-file "
                         "(from @BotFather)", EX_CONFIG)
    console.say("Make a bot with @BotFather in Telegram (/newbot); it gives you a token.")
    return console.ask("Bot token", hidden=True)


async def _connect_bot(args: argparse.Namespace, console: Console,
                       token: str) -> tuple[Bot, str]:
    """The bot and its @name from getMe; a refused token is asked again (interactive only)."""
    for attempt in range(TRIES):
        if not BOT_TOKEN.fullmatch(token):  # said here, not by the network as a refusal
            if not console.interactive or attempt == TRIES - 1:
                raise _Stop(f"the token {MALFORMED_TOKEN}", EX_CONFIG)
            console.say(f"That {MALFORMED_TOKEN}.")
            token = console.ask("Bot token", hidden=True)
            continue
        bot = Bot(token, base_url=args.telegram_api_base)
        try:
            await bot.initialize()  # getMe; and shutdown() then closes the connections
        except InvalidToken as exc:
            await bot.shutdown()
            answers = (exc, exc.__cause__, exc.__cause__ and exc.__cause__.__cause__)
            said = " ".join(e.message for e in answers if isinstance(e, TelegramError))
            if "not found" in said.lower():  # PTB calls a 404 a bad token too
                raise _Stop(f"the Bot API at {args.telegram_api_base} answered 404: it is "
                                 "not the address the token follows (--telegram-api-base)",
                                 EX_CONFIG) from None
            if not console.interactive or attempt == TRIES - 1:
                raise _Stop("Telegram refused the bot token; copy it again from "
                                 "@BotFather", EX_CONFIG) from None
            console.say("Telegram refused that token; copy it again from @BotFather.")
            token = console.ask("Bot token", hidden=True)
            continue
        except TelegramError as exc:
            await bot.shutdown()
            raise _Stop(f"cannot reach the Bot API at {args.telegram_api_base} "
                        f"({network_reason(exc)}): check this machine's network, or the "
                        "address (--telegram-api-base)", EX_UNAVAILABLE) from None
        console.say(f"Telegram: the token belongs to @{bot.bot.username}")
        return bot, str(bot.bot.username)
    raise AssertionError("unreachable")


def _webhook_url(args: argparse.Namespace, console: Console) -> str | None:
    if args.webhook_url or not console.interactive:
        return str(args.webhook_url) if args.webhook_url else None
    console.say("Polling needs no public address. A webhook needs a public HTTPS URL that "
                "reaches /webhooks/telegram (README: A public HTTPS address).")
    for _ in range(TRIES):
        url = console.ask("Public webhook URL (empty: polling)")
        if not url or url.startswith("https://"):
            return url or None
        console.say("Telegram sends webhooks to https:// addresses only")
    raise _Stop("no usable webhook URL", 1)


def _whatsapp(args: argparse.Namespace, console: Console, env: Mapping[str, str],
              wanted: dict[str, str]) -> str | None:
    names = ("ROOST_WHATSAPP_TOKEN", "ROOST_WHATSAPP_APP_SECRET", "ROOST_WHATSAPP_VERIFY_TOKEN")
    phone_number_id: str | None = args.whatsapp_phone_number_id
    if not console.interactive:
        if phone_number_id:
            missing = [name for name in names if not env.get(name)]
            if missing:
                raise _Stop(f"WhatsApp needs {', '.join(missing)} in the environment",
                                 EX_CONFIG)
            wanted.update({name: env[name].strip() for name in names})
        return phone_number_id
    if not phone_number_id and not console.confirm("Set up WhatsApp too (README: WhatsApp)?",
                                                    False):
        return None
    phone_number_id = phone_number_id or console.ask("Phone number id (Meta app dashboard)")
    wanted["ROOST_WHATSAPP_TOKEN"] = console.ask("Permanent access token", hidden=True)
    wanted["ROOST_WHATSAPP_APP_SECRET"] = console.ask("App secret", hidden=True)
    wanted["ROOST_WHATSAPP_VERIFY_TOKEN"] = console.ask(
        "Verify token (enter it in Meta's webhook settings)", secrets.token_hex(16))
    return phone_number_id


def _whatsapp_owner(args: argparse.Namespace, console: Console) -> str | None:
    """The owner's own WhatsApp number (a wa_id: digits with the country code), let in by
    whatsapp.allow so that their own bot does not answer them with a pairing code."""
    given: str | None = args.whatsapp_owner
    for _ in range(TRIES):
        if given is None and console.interactive:
            given = console.ask("Your own WhatsApp number, with its country code (roost "
                                "answers it without pairing; empty: pair later)")
        number = re.sub(r"[\s()+-]", "", given or "")
        if not number or number.isdigit():
            return number or None
        if not console.interactive:
            raise _Stop(f"--whatsapp-owner {given!r} is not a phone number (digits with the "
                        "country code, such as 972544401243)", EX_CONFIG)
        console.say("That is not a phone number: digits with the country code, such as "
                    "+972 54 440 1243")
        given = None
    raise _Stop("no usable WhatsApp number", 1)


async def _check_whatsapp(args: argparse.Namespace, console: Console, phone_number_id: str,
                          wanted: dict[str, str]) -> None:
    """The access token is valid for the number (`GET /{phone_number_id}`, as doctor asks); a
    refused one is asked again (interactive only)."""
    for attempt in range(TRIES):
        client = GraphClient(WhatsAppSettings(
            enabled=True, phone_number_id=phone_number_id, api_base=args.whatsapp_api_base,
            token=wanted["ROOST_WHATSAPP_TOKEN"]), timeout=10)
        await client.start()
        try:
            number = await client.phone_number()
        except GraphError as exc:
            if exc.status >= 500:
                raise _Stop(f"WhatsApp: {exc}", EX_UNAVAILABLE) from None
            if not console.interactive or attempt == TRIES - 1:
                raise _Stop(f"the Graph API refused the WhatsApp token for number id "
                            f"{phone_number_id}: {exc}", EX_CONFIG) from None
            console.say(f"The Graph API refused that token for {phone_number_id}: {exc}")
            wanted["ROOST_WHATSAPP_TOKEN"] = console.ask("Permanent access token", hidden=True)
            continue
        finally:
            await client.close()
        console.say(f"WhatsApp: number {number.get('display_phone_number', '?')} "
                    f"({number.get('verified_name', 'no verified name')})")
        return


async def _pair(bot: Bot, console: Console, username: str, state_dir: Path,
                timeout: float) -> bool:  # noqa: ASYNC109 (the owner's own bound)
    """Wait for /start in a private chat and approve its sender; False on timeout."""
    if timeout <= 0:
        return False
    console.say(f"Now send /start to @{username} in Telegram (https://t.me/{username}); "
                f"waiting up to {timeout:g} s.")
    deadline = time.monotonic() + timeout
    offset: int | None = None
    try:
        while (left := deadline - time.monotonic()) > 0:
            updates = await bot.get_updates(offset=offset, timeout=int(min(left, POLL)),
                                            allowed_updates=["message"])
            for update in updates:
                offset = update.update_id + 1
                message = update.message
                if (message is not None and message.from_user is not None
                        and message.chat.type == "private"
                        and (message.text or "").startswith("/start")):
                    await bot.get_updates(offset=offset, timeout=0)  # confirm what init read
                    user = message.from_user
                    PairingBook(state_dir).admit("telegram", str(user.id), user.full_name,
                                                 time.time())
                    await bot.send_message(message.chat.id, "You are paired: roost answers you "
                                           "here once it runs.")
                    console.say(f"approved telegram:{user.id} ({user.full_name}): roost "
                                "answers them")
                    return True
            await asyncio.sleep(0)
    except Conflict:
        console.say("A webhook is registered with Telegram, so init cannot read /start: once "
                    "roost runs, write to the bot and `roost pairing approve CODE`.")
        return False
    except TelegramError as exc:
        raise _Stop(f"reading /start from Telegram failed ({network_reason(exc)})",
                    EX_UNAVAILABLE) from None
    console.say(f"nobody sent /start within {timeout:g} s. Once roost runs, write to the bot "
                "and approve the code it gives you: `roost pairing approve CODE`.")
    return False


# ---- the service ------------------------------------------------------------------------------

def _service(args: argparse.Namespace, console: Console, env: Mapping[str, str], config: Path,
             credentials: Path, names: list[str], systemctl: Systemctl, root: bool) -> None:
    console.say("Run it in the foreground now (Ctrl-C stops it):")
    # Plain `roost run` reads the secrets from init's default folder; another one is named.
    where = ("" if credentials_dir(env, config) == credentials
             else f"CREDENTIALS_DIRECTORY={shlex.quote(str(credentials))} ")
    console.say(f"  {where}{files.roost_command(env)} run --config {shlex.quote(str(config))}")
    if root:
        console.say("As a system service (README: Run as a service), as root:")
        for line in files.system_unit_commands(config, credentials, names):
            console.say(f"  {line}")
        return
    template = files.unit_template()
    unit = files.config_home(env) / "systemd" / "user" / "roost.service"
    install = not args.no_service and template is not None and (
        not console.interactive or console.confirm("Install and start the user service now?",
                                                   True))
    if template is None:
        console.say("systemd/roost-user.service is not here (run init from the checkout to "
                    "install the user unit).")
    if not install or template is None:
        console.say(f"As a user service: install systemd/roost-user.service as {unit}, "
                    "uncomment its LoadCredential= lines, then:")
        console.say("  systemctl --user daemon-reload && systemctl --user enable --now roost")
    else:
        files.write_private(unit, files.render_user_unit(template.read_text("utf-8"), config,
                                                          credentials, names))
        for argv in (["systemctl", "--user", "daemon-reload"],
                     ["systemctl", "--user", "enable", "--now", "roost"]):
            if systemctl(argv) != 0:
                console.say(f"`{' '.join(argv)}` failed; the unit is at {unit}")
                break
        else:
            console.say(f"installed {unit} and started it: journalctl --user -u roost -f")
    console.say("A user service stops when you log out, unless: loginctl enable-linger "
                "\"$USER\" (it then starts at boot and keeps running).")
