"""`roost init`: from nothing to a bot that answers its owner, asking only what it must.

Each answer is checked where it is given: Ollama's address by listing the pulled models
(`/api/tags`, then `/api/show` for each one's context length and capabilities), then each
chat platform's by the platform itself. init names no platform: it offers each installed one
(daemon/core/platforms.py), and a platform chosen is set up by its own runtime's `setup`
(daemon/core/setup.py), which asks its questions, checks them with its service, and gives back
its config table, its secrets and, where the owner claims the bot by writing to it, a pairing
step init runs once the config is written (it approves the sender in the pairing book, as
`roost pairing approve` would).

`--non-interactive` asks nothing: every answer comes from a flag or the environment, the
platforms set up are those whose flags or variables are given, and a missing or refused answer
is an error with its exit status. systemctl is a parameter, so tests (and `--no-service`) never
touch a real service manager.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx
import ollama

from daemon.app.platforms import runtime_of
from daemon.cli import init_files as files
from daemon.core.child_env import child_env
from daemon.core.config import Settings, credentials_dir, load_settings
from daemon.core.errors import ConfigError
from daemon.core.platforms import Platform, installed
from daemon.core.setup import (
    EX_CONFIG,
    EX_UNAVAILABLE,
    TRIES,
    Admit,
    SetUp,
    SetupRequest,
    SetupStop,
    given,
    how_to_select,
    selected,
)
from daemon.intake.pairing import PairingBook

EX_NOTPAIRED = 1  # the config is written, but the owner did not claim the bot in time
EX_CANTCREAT = 73  # the config exists (and no --force)

Systemctl = Callable[[Sequence[str]], int]


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
                    raise SetupStop("no answer (end of input); nothing was written", 1)
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
    except SetupStop as failed:
        print(f"roost: {failed}", file=sys.stderr)
        return failed.status


async def _init(args: argparse.Namespace, console: Console, env: Mapping[str, str],
                systemctl: Systemctl, root: bool) -> int:
    config = args.config or files.default_config(env, root)
    if config.exists() and not args.force:
        raise SetupStop(f"{config} exists; roost init leaves it alone (--force replaces it)",
                        EX_CANTCREAT)
    credentials = args.credentials_dir or files.default_credentials(env, root)
    ollama_url, models = await _find_ollama(args, console)
    model = _pick_model(args, console, models)
    chosen: list[tuple[Platform[Any], SetUp]] = []
    try:
        await _set_up_platforms(args, console, env, chosen)
        wanted = {name: value for _, done in chosen for name, value in done.secrets.items()}
        answers = files.Answers(ollama_url, model,
                                {platform.name: done.table for platform, done in chosen},
                                wanted)
        files.write_credentials(credentials, wanted)
        settings = _write_config(config, files.render_config(answers),
                                 {**env, "CREDENTIALS_DIRECTORY": str(credentials)})
        console.say(f"wrote {config} (0600) and {', '.join(wanted)} in {credentials} (0600)")
        # The system unit's state is /var/lib/roost whatever root's own defaults say.
        system = root and config == files.SYSTEM_CONFIG
        state_dir = args.state_dir or (files.SYSTEM_STATE if system
                                       else settings.daemon.state_dir)
        paired = await _pair(chosen, console, state_dir, args.pair_timeout)
    finally:
        for _, done in reversed(chosen):
            await done.close()
    _service(args, console, env, config, credentials, list(wanted), systemctl, root)
    return 0 if paired else EX_NOTPAIRED


def _write_config(config: Path, text: str, env: Mapping[str, str]) -> Settings:
    """Put the config in place only once roost itself accepts it (as `roost run` would read
    it, with the credentials): a bad flag (`--webhook-url ftp://...`) leaves no broken file."""
    draft = config.with_name(f".{config.name}.init")
    files.write_private(draft, text)
    try:
        settings = load_settings(draft, env=env)
    except ConfigError as exc:
        draft.unlink()
        raise SetupStop(f"config error: {exc}", EX_CONFIG) from None
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
                raise SetupStop(f"{problem}; start it (ollama serve) or pass --ollama-url",
                                 EX_UNAVAILABLE) from None
            console.say(problem)
            url = console.ask("Ollama's address (start it with `ollama serve`)", url)
            continue
        if not models:
            raise SetupStop(f"Ollama at {url} has no model pulled: `ollama pull qwen3:4b`, "
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
            raise SetupStop(f"model {args.model!r} is not pulled (pulled: {', '.join(names)}); "
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
    raise SetupStop("no model chosen", 1)


# ---- the platforms ---------------------------------------------------------------------------

async def _set_up_platforms(args: argparse.Namespace, console: Console, env: Mapping[str, str],
                            chosen: list[tuple[Platform[Any], SetUp]]) -> None:
    """Each installed platform asked for (by its flags or environment, or, interactive, by a
    yes), set up in turn into `chosen`; at least one."""
    for _ in range(TRIES):
        for platform in installed().values():
            options = {flag.dest: getattr(args, flag.dest) for flag in platform.init_flags}
            if not selected(platform.init_flags, options, env) and not (
                    console.interactive and console.confirm(f"Set up {platform.title}?",
                                                            not chosen)):
                _unused(console, platform, given(platform.init_flags, options))
                continue
            try:
                setup = runtime_of(platform).setup
            except ConfigError as exc:
                if not console.interactive:
                    raise SetupStop(str(exc), EX_CONFIG) from None
                console.say(f"{platform.title} cannot run here: {exc.problem}")
                continue
            if setup is None:
                console.say(f"roost init cannot set {platform.title} up; its table is in the "
                            "README's configuration reference")
                continue
            chosen.append((platform, await setup(SetupRequest(console, options, env))))
        if chosen:
            return
        if not console.interactive:
            ways = "; ".join(f"{p.title}: {how_to_select(p.init_flags)}"
                             for p in installed().values() if p.init_flags)
            raise SetupStop(f"no platform to set up: {ways}", EX_CONFIG)
        console.say("roost needs at least one platform to talk to you on.")
    raise SetupStop("no platform chosen", 1)


def _unused(console: Console, platform: Platform[Any], named: list[str]) -> None:
    """A flag of a platform not set up is a mistake a script should hear of (`--webhook-url`
    without the bot token); interactive, the owner just said no."""
    if named and not console.interactive:
        raise SetupStop(f"{', '.join(named)} given, but {platform.title} is not set up without "
                        f"{how_to_select(platform.init_flags)}", EX_CONFIG)


async def _pair(chosen: list[tuple[Platform[Any], SetUp]], console: Console, state_dir: Path,
                timeout: float) -> bool:  # noqa: ASYNC109 (the owner's own bound)
    """Each platform's pairing step, the owner approved in the pairing book; False when one
    waited in vain (True when there was none to run, or `--pair-timeout 0`)."""
    paired = True
    for platform, done in chosen:
        if done.pair is not None and timeout > 0:
            paired = await done.pair(_admitter(platform, console, state_dir), timeout) \
                and paired
    return paired


def _admitter(platform: Platform[Any], console: Console, state_dir: Path) -> Admit:
    def admit(sender: str, name: str) -> None:
        PairingBook(state_dir).admit(platform.name, sender, name, time.time())
        console.say(f"approved {platform.name}:{sender} ({name}): roost answers them")

    return admit


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
