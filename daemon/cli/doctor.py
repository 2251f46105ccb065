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
import re
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import datetime
from typing import TextIO

import httpx
from telegram import Bot
from telegram.error import InvalidToken, TelegramError
from telegram.request import HTTPXRequest

from automations.schedule import build_trigger, next_fire
from channels.telegram.channel import check_settings
from channels.whatsapp.api import GraphClient, GraphError
from daemon.app.health import MIN_FREE_BYTES, disk_state
from daemon.cli.checks import Check
from daemon.cli.doctor_models import card_checks, ollama_checks
from daemon.cli.init_files import network_reason
from daemon.cli.mcp import doctor_checks as mcp_doctor_checks
from daemon.core.config import BOT_TOKEN, Settings, missing_secrets
from daemon.core.errors import ConfigError, StoreError
from daemon.core.filemodes import exposure
from daemon.core.redact import redact_url
from daemon.store import NoState, Store, quarantined_items
from daemon.voice.backends import build_backend
from daemon.voice.speaking import readiness as speech_readiness

log = logging.getLogger("roost.doctor")

PENDING_PILE_UP = 100  # updates waiting at Telegram: roost has not been taking them for a while

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
    if settings.telegram.enabled:
        for check in await _guarded("telegram", _telegram_checks(settings)):
            say(check)
    if settings.whatsapp.enabled and not missing_secrets(settings):
        for check in await _guarded("whatsapp", _whatsapp_checks(settings)):
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
    checks = [Check("config", True, str(settings.source or "none found; using defaults"))]
    refused: list[ConfigError] = list(missing_secrets(settings))
    if settings.telegram.enabled and settings.telegram.token:
        try:
            check_settings(settings.telegram)
        except ConfigError as error:
            refused.append(error)
    for refusal in refused:
        checks.append(Check(f"config {refusal.key}", False, refusal.problem,
                            _refusal_fix(refusal, settings)))
    channels, stuck = [], False
    for name, on in (("telegram", settings.telegram.enabled),
                     ("whatsapp", settings.whatsapp.enabled)):
        if not on:
            continue
        # A refused setting stops `roost run` altogether: the channel is not ready, whatever
        # the rest of its config says.
        blocked = [r.key for r in refused if name in r.key.lower()]
        stuck = stuck or bool(blocked)
        channels.append(f"{name} (cannot start until {', '.join(blocked)} is fixed)"
                        if blocked else name)
    checks.append(Check("channels", not stuck, ", ".join(channels) or "none (terminal chat only)",
                        "fix the config lines above" if stuck else ""))
    return checks


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
        f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(item['quarantined']))} "
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
        when = following.strftime("%Y-%m-%d %H:%M %Z") if following else "never"
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


async def _whatsapp_checks(settings: Settings) -> list[Check]:
    checks = [await _whatsapp_check(settings)]
    if settings.whatsapp.template:
        checks.append(await _template_check(settings))
    return checks


async def _template_check(settings: Settings) -> Check:
    """whatsapp.template exists in its language, is approved, and has the parameters roost
    fills: `GET /{business_account_id}/message_templates?name=`."""
    wa = settings.whatsapp
    name = f"whatsapp template {wa.template}"
    if not wa.business_account_id:
        return Check(name, False, "not checked: whatsapp.business_account_id is not set",
                     "set whatsapp.business_account_id (WhatsApp Manager, Account tools) so "
                     "that doctor can see the template")
    client = GraphClient(wa, timeout=10)
    await client.start()
    try:
        found = await client.templates(wa.business_account_id, wa.template or "")
    except GraphError as exc:
        return Check(name, False, f"the Graph API refused: {exc}",
                     "the token needs whatsapp_business_management to read templates")
    finally:
        await client.close()
    same = [t for t in found if t.get("name") == wa.template
            and t.get("language") == wa.template_language]
    if not same:
        languages = ", ".join(str(t.get("language")) for t in found) or "none"
        return Check(name, False, f"no such template in {wa.template_language} "
                     f"(languages found: {languages})",
                     "create it in WhatsApp Manager, or set whatsapp.template_language")
    template = same[0]
    parts = [c for c in template.get("components") or [] if isinstance(c, dict)]
    body = " ".join(str(c.get("text") or "") for c in parts if c.get("type") == "BODY")
    elsewhere = [c.get("type") for c in parts if c.get("type") != "BODY"
                 and re.search(r"\{\{[^}]+\}\}", str(c.get("text") or ""))]
    if template.get("parameter_format") == "NAMED" or elsewhere:
        return Check(name, False, "it has named parameters or parameters outside its body; "
                     "roost fills one numbered body parameter ({{1}}) at most",
                     "use a template whose body has no parameter or {{1}}")
    wanted, has = int(wa.template_parameter), len(re.findall(r"\{\{\d+\}\}", body))
    if template.get("status") != "APPROVED":
        return Check(name, False, f"status {template.get('status')}: Meta sends only approved "
                     "templates", "wait for Meta's review, or name an approved template")
    if has != wanted:
        return Check(name, False, f"its body has {has} parameters; roost fills {wanted}",
                     "set whatsapp.template_parameter = true for a template with one "
                     "parameter, false for one without" if has <= 1 else
                     "use a template with no parameter or one")
    return Check(name, True, f"approved, {wa.template_language}, {has} parameter(s)")


async def _whatsapp_check(settings: Settings) -> Check:
    """The token is valid for the phone number id: `GET /{phone_number_id}`."""
    client = GraphClient(settings.whatsapp, timeout=10)
    await client.start()
    try:
        number = await client.phone_number()
    except GraphError as exc:
        return Check("whatsapp", False, f"the Graph API refused: {exc}",
                     "check ROOST_WHATSAPP_TOKEN (a permanent system-user token with "
                     "whatsapp_business_messaging) and whatsapp.phone_number_id")
    finally:
        await client.close()
    return Check("whatsapp", True, f"number {number.get('display_phone_number', '?')} "
                 f"({number.get('verified_name', 'no verified name')})")


async def _telegram_checks(settings: Settings) -> list[Check]:
    tg = settings.telegram
    if not tg.token or not BOT_TOKEN.fullmatch(tg.token):
        return []  # reported with the config checks
    # Its own request object, closed below: Bot.shutdown() closes only what initialize() opened.
    request = HTTPXRequest()
    bot = Bot(tg.token, base_url=tg.api_base, base_file_url=tg.file_base, request=request)
    try:
        try:
            me = await bot.get_me()
        except InvalidToken as exc:
            answer = exc.__cause__ if isinstance(exc.__cause__, TelegramError) else exc
            if "not found" in answer.message.lower():
                # PTB reports a 404 as a bad token too; mostly the address is wrong (as `roost
                # run` says): Telegram answers 401 Unauthorized for a token it refuses.
                return [Check("telegram getMe", False, _not_found(tg.api_base),
                              _api_base_fix(tg.api_base))]
            return [Check("telegram getMe", False, "Telegram refused the bot token",
                          "check ROOST_TELEGRAM_TOKEN with @BotFather")]
        except TelegramError as exc:
            return [Check("telegram getMe", False, "cannot reach the Bot API at "
                          f"{redact_url(tg.api_base)} ({network_reason(exc)})",
                          "check the network, or telegram.api_base")]
        checks = [Check("telegram getMe", True, f"bot @{me.username}"),
                  await _files_check(tg.file_base, tg.token)]
        try:
            info = await bot.get_webhook_info()
        except TelegramError as exc:
            checks.append(Check("telegram webhook", False, f"getWebhookInfo failed: {exc}",
                                "check the network, or telegram.api_base"))
            return checks
        checks.extend(_webhook_checks(settings, info.url, info.last_error_message,
                                      info.pending_update_count))
        return checks
    finally:
        await request.shutdown()


async def _files_check(file_base: str, token: str) -> Check:
    """Photos, voice notes and documents are downloaded from file_base: something there must
    answer for this bot (a file that does not exist gets 404 from Telegram and a local Bot API
    server alike; 401 means the address serves another bot API)."""
    shown = redact_url(file_base)
    fix = ("set telegram.file_base to where the Bot API serves files (for api_base "
           "https://HOST/bot it is https://HOST/file/bot), or remove it to follow api_base")
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            answer = await client.get(f"{file_base}{token}/roost-doctor-check")
    except httpx.HTTPError as exc:
        reason = redact_url(str(exc).replace(token, "<token>")) or "no answer"
        return Check("telegram files", False, f"nothing answers at {shown} ({reason}): no "
                     "photo, voice note or document sent to the bot could be read", fix)
    if answer.status_code == 401:
        return Check("telegram files", False, f"{shown} refuses this bot's token: no photo, "
                     "voice note or document sent to the bot could be read", fix)
    return Check("telegram files", True, f"{shown} answers")


def _not_found(api_base: str) -> str:
    return (f"the Bot API answered 404 Not Found for getMe at {redact_url(api_base)}<token>"
            "/getMe: telegram.api_base is not the address the token follows")


def _api_base_fix(api_base: str) -> str:
    if api_base.endswith("/"):
        return f'remove the slash at the end: telegram.api_base = "{api_base.rstrip("/")}"'
    return ("set telegram.api_base to the address the token follows, such as "
            "https://api.telegram.org/bot (no slash at the end), or remove it")


def _fresh_install(settings: Settings) -> bool:
    """No store yet: `roost run` has never started with this state directory."""
    try:
        Store.open(settings.daemon.state_dir, read_only=True).close()
    except NoState:
        return True
    except StoreError:
        return False
    return False


def _webhook_checks(settings: Settings, url: str, last_error: str | None,
                    pending: int) -> list[Check]:
    tg = settings.telegram
    checks = []
    if tg.mode == "webhook":
        if url == tg.webhook_url:
            checks.append(Check("telegram webhook", True, f"registered at {url}"))
        elif not url and _fresh_install(settings):
            # roost registers the webhook when it starts: before the first start there is none.
            checks.append(Check("telegram webhook", True, f"none registered yet: `roost run` "
                                f"registers {tg.webhook_url} when it starts"))
        else:
            shown = url or "no webhook"
            checks.append(Check("telegram webhook", False,
                                f"Telegram has {shown}, the config says {tg.webhook_url}",
                                "start `roost run`, which registers telegram.webhook_url; "
                                "if another program uses this bot, give roost its own bot"))
    elif url:
        checks.append(Check("telegram webhook", False, f"a webhook is set ({url}) in polling "
                            "mode", "start `roost run`, which removes it before polling"))
    if last_error:
        checks.append(Check("telegram last error", False, last_error,
                            "make telegram.webhook_url reach roost's /webhooks/telegram "
                            "over HTTPS (see the Telegram section of the README)"))
    checks.append(Check("telegram pending updates", pending < PENDING_PILE_UP,
                        f"{pending} waiting at Telegram",
                        "" if pending < PENDING_PILE_UP else
                        "start roost (`roost run`, or its systemd unit); in webhook mode also "
                        "make telegram.webhook_url reach it (see `telegram last error`)"))
    return checks
