"""`roost doctor`: one line per check, each failure with how to fix it; exit 1 on any failure.

Checks what `roost run` would refuse (config, secrets), the state directory (writable, private,
not full, its files readable), the model server and each configured model's card
(daemon/cli/doctor_models.py), the quarantine, Telegram (getMe, and getWebhookInfo against
`telegram.webhook_url`), WhatsApp (the token is valid for the phone number id) and the voice
backend (a test transcription, or its model loaded). Nothing here prints a secret or a URL's
credentials.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import datetime
from typing import TextIO

from automations.schedule import build_trigger, next_fire
from daemon.app.health import MIN_FREE_BYTES, disk_state
from daemon.app.platforms import runtime_of
from daemon.cli.doctor_models import card_checks, ollama_checks
from daemon.cli.mcp import doctor_checks as mcp_doctor_checks
from daemon.cli.times import local
from daemon.core.checks import Check
from daemon.core.config import Settings, missing_secrets
from daemon.core.errors import ConfigError, StoreError
from daemon.core.filemodes import exposure
from daemon.core.platforms import installed
from daemon.core.redact import redact_url
from daemon.store import NoState, Store, quarantined_items
from daemon.voice.backends import build_backend
from daemon.voice.speaking import readiness as speech_readiness

log = logging.getLogger("roost.doctor")


async def run_doctor(settings: Settings, *, as_json: bool = False,
                     out: TextIO | None = None) -> int:
    """Run every check, print them (to stdout unless `out`), return 0 when all pass and 1
    otherwise."""
    out = out or sys.stdout  # looked up now: stdout may have been redirected since import
    checks: list[Check] = []
    say: Callable[[Check], None] = checks.append if as_json else _printer(out, checks)
    for check in _config_checks(settings):
        say(check)
    for check in await _guarded("state directory", asyncio.to_thread(_state_checks, settings)):
        say(check)
    for check in await _guarded("ollama", ollama_checks(settings)):
        say(check)
    for check in await _guarded("model cards", card_checks(settings)):
        say(check)
    missing = {error.key for error in missing_secrets(settings)}
    for name, platform in installed().items():
        if platform.of(settings.platforms).enabled and f"{name}.enabled" not in missing:
            for check in await _guarded(name, runtime_of(platform).doctor(settings)):
                say(check)
    for check in await _guarded("automations", asyncio.to_thread(_automation_checks, settings)):
        say(check)
    for check in await _guarded("voice", _voice_checks(settings)):
        say(check)
    for check in await _guarded("speech", _speech_checks(settings)):
        say(check)
    for check in await _guarded("mcp", _mcp_checks(settings)):
        say(check)
    if as_json:
        json.dump({"ok": all(c.ok for c in checks), "checks": [asdict(c) for c in checks]},
                  out, indent=2)
        out.write("\n")
    return 0 if all(c.ok for c in checks) else 1


async def _mcp_checks(settings: Settings) -> list[Check]:
    return [Check(*c) for c in await mcp_doctor_checks(settings)]


async def _guarded(name: str, checks: Awaitable[list[Check]]) -> list[Check]:
    """The boundary of each group of checks: a bug in doctor is one FAIL line, never a
    traceback in the report (it is logged, shown with -v)."""
    try:
        return await checks
    except Exception as exc:
        log.debug("doctor: the %s checks failed", name, exc_info=True)
        return [Check(name, False, f"the check itself failed: {type(exc).__name__}: "
                      f"{redact_url(str(exc))}",
                      "run `roost doctor -v` to see where, and report it as a bug in roost")]


def _printer(out: TextIO, checks: list[Check]) -> Callable[[Check], None]:
    def say(check: Check) -> None:
        checks.append(check)
        fix = f" -> fix: {check.fix}" if check.fix else ""
        out.write(f"{'ok  ' if check.ok else 'FAIL'} {check.name}: {check.detail}{fix}\n")
        out.flush()

    return say


def _config_checks(settings: Settings) -> list[Check]:
    checks = [Check("config", True, str(settings.source or "none found; using defaults")),
              Check("timezone", True, f"{settings.daemon.tz.key} (daemon.timezone): every time "
                    "roost shows, here too, and the automations' schedules")]
    refused: list[ConfigError] = list(missing_secrets(settings))
    unset = {error.key for error in refused}
    for name, platform in installed().items():
        if platform.of(settings.platforms).enabled and f"{name}.enabled" not in unset:
            try:
                runtime_of(platform).check(settings)
            except ConfigError as error:
                refused.append(error)
    for refusal in refused:
        checks.append(Check(f"config {refusal.key}", False, refusal.problem,
                            _refusal_fix(refusal, settings)))
    channels, stuck = [], False
    for name, platform in installed().items():
        if not platform.of(settings.platforms).enabled:
            continue
        # A refused setting stops `roost run` altogether: the channel is not ready, whatever
        # the rest of its config says.
        blocked = [r.key for r in refused if name in r.key.lower()]
        stuck = stuck or bool(blocked)
        channels.append(f"{name} (cannot start until {', '.join(blocked)} is fixed)"
                        if blocked else name)
    checks.append(Check("channels", not stuck, ", ".join(channels) or "none (terminal chat only)",
                        "fix the config lines above" if stuck else ""))
    if settings.identities:
        checks.append(_identities_check(settings))
    return checks


def _identities_check(settings: Settings) -> Check:
    """[identities] still works (its people are members); the note names the form that gives a
    person a role."""
    names = ", ".join(settings.identities)
    return Check("identities", True, f"{len(settings.identities)} in [identities] ({names}): "
                 "members; they talk by an allow list or pairing",
                 'to give a person a role and let them talk on their chats, list them as '
                 '[people.NAME] with chats = [...] and role = "owner", "member" or "guest" '
                 "instead")


def _refusal_fix(refusal: ConfigError, settings: Settings) -> str:
    where = str(settings.source) if settings.source else "the config file"
    if refusal.key.endswith(".enabled"):  # a secret is missing: its problem says which
        return (f"provide it as said (`roost run` refuses to start until then), or set "
                f"{refusal.key} = false in {where}")
    return f"correct {refusal.key} in {where} (`roost run` refuses to start until then)"


def config_error_report(error: ConfigError) -> str:
    """`doctor --json` when the config cannot be loaded at all: the same shape as a report."""
    where = error.source or "the config file"
    check = Check(f"config {error.key}", False, str(error),
                  f"correct {error.key} in {where}; `roost run` refuses to start until then")
    return json.dumps({"ok": False, "checks": [asdict(check)]}, indent=2)


def _state_checks(settings: Settings) -> list[Check]:
    state_dir = settings.daemon.state_dir
    name = "state directory"
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        return [Check(name, False, f"{state_dir} cannot be created: {exc.strerror or exc}",
                      "create it, owned by the user roost runs as, or set daemon.state_dir")]
    full, broken = disk_state(state_dir)
    checks = []
    if broken:
        checks.append(Check(name, False, f"{state_dir} is not writable",
                            f"chown it to the user roost runs as: chown -R $USER {state_dir}"))
    elif full:
        checks.append(Check(name, False, f"the disk holding {state_dir} is full (under "
                            f"{MIN_FREE_BYTES // 2**20} MiB free)", "free some space on it"))
    else:
        free = shutil.disk_usage(state_dir).free / 2**30
        checks.append(Check(name, True, f"{state_dir} (writable), {free:.1f} GiB free"))
    problem = exposure(state_dir)
    checks.append(Check("state directory privacy", problem is None,
                        f"{state_dir} is private" if problem is None
                        else f"{state_dir} is {problem.split('; fix with: ')[0]}",
                        f"chmod 700 {state_dir}" if problem else ""))
    checks.append(_store_check(settings))
    checks.append(_quarantine_check(settings))
    return checks


def _quarantine_check(settings: Settings) -> Check:
    """Items that failed twice and were set aside so their chat could carry on."""
    folder = settings.daemon.state_dir / "quarantine"
    try:
        items = quarantined_items(settings.daemon.state_dir)
    except StoreError as exc:
        return Check("quarantine", False, f"cannot be read: {exc}", f"look at {folder}")
    if not items:
        return Check("quarantine", True, "empty")
    listed = "; ".join(
        f"{local(item['quarantined'], settings.daemon.tz)} "
        f"{item['kind']} {item['key']} ({item['chat_key'] or 'no chat'}): {item['error']}"
        for item in items)
    return Check("quarantine", False, f"{len(items)} items set aside after failing twice: "
                 f"{listed}", f"read them in {folder}; delete each file once dealt with")


def _store_check(settings: Settings) -> Check:
    try:
        store = Store.open(settings.daemon.state_dir, read_only=True)
    except NoState:
        return Check("store files", True, "none yet (a fresh install)")
    except StoreError as exc:
        # Read-only, the only refusal is a state from an earlier version, which run converts.
        return Check("store files", False, str(exc), "start `roost run` once: it converts the "
                     "state when it starts")
    try:
        conversations = store.list_conversations()
        messages = sum(len(store.messages(c.id)) for c in conversations)
    except StoreError as exc:
        return Check("store files", False, str(exc),
                     "stop roost and start it again: it moves an unreadable file aside")
    finally:
        store.close()
    return Check("store files", True, f"{len(conversations)} conversations, {messages} messages "
                 "readable")


def _automation_checks(settings: Settings) -> list[Check]:
    """Each automation's next run; a second model means a reload on a one-GPU box."""
    checks = []
    now = datetime.now(settings.daemon.tz)
    for automation in settings.automations:
        name = f"automation {automation.name}"
        if not automation.enabled:
            checks.append(Check(name, True, "disabled"))
            continue
        following = next_fire(build_trigger(automation.schedule, settings.daemon.tz), now)
        when = following.strftime("%Y-%m-%d %H:%M") if following else "never"
        checks.append(Check(name, True, f"next run {when}"))
        if automation.model and automation.model != settings.model.name:
            checks.append(Check(f"{name} model", True, (
                f"uses {automation.model}, not {settings.model.name}: on one GPU each run "
                "unloads the chat model and loads that one (slow, and the chat's cache is lost)")))
    return checks


async def _speech_checks(settings: Settings) -> list[Check]:
    """The speech backend speaks a short test sentence, encoded as a voice note."""
    ready = await speech_readiness(settings.speech)
    if ready is None:
        return [Check("speech", True, "off: replies are text only")]
    return [Check(f"speech ({settings.speech.backend})", ready.ok, ready.detail, ready.fix)]


async def _voice_checks(settings: Settings) -> list[Check]:
    """The transcription backend transcribes a short test recording, or loads its model."""
    backend = build_backend(settings.voice)
    if backend is None:
        return [Check("voice", True, "transcription off: voice notes reach the model as "
                                     "attachment notes (README, \"Voice notes\")")]
    ready = await backend.check()
    return [Check(f"voice ({settings.voice.backend})", ready.ok, ready.detail, ready.fix)]


