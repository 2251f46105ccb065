"""`roost automations list | remind WHEN TEXT --to TARGET`, and `run NAME` while the daemon
runs (daemon/cli/automation_run.py runs it when none does)."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from automations.reminders import new_reminder
from automations.schedule import build_trigger, next_fire
from automations.state import SCAN_EVERY, AutomationState, RunResult, manual_run_id
from automations.when import split_when
from daemon.core.config import AutomationSettings, Settings, target_person
from daemon.core.ids import new_id
from daemon.core.platforms import ChatKey, chat_pattern, platform_of
from daemon.intake.pairing import PairingBook
from daemon.store import in_use

EX_USAGE = 2


def list_automations(settings: Settings) -> int:
    """Each automation with its next run, the last scheduled run's result, the slots not run
    (missed, skipped) among the records kept, and the last manual run; then the reminders."""
    tz = settings.daemon.tz
    now = datetime.now(tz)
    state = AutomationState(settings.daemon.state_dir, read_only=True)
    try:
        reminders = state.pending_reminders() if state.reminder_dir.exists() else []
        missed = [doc for doc in state.finished_reminders() if doc["status"] == "missed"]
        if settings.automations or reminders or missed:
            print(f"Times in {tz.key}.")
        for automation in settings.automations:
            upcoming = next_fire(build_trigger(automation.schedule, tz), now)
            nxt = (stamp(upcoming.timestamp(), tz) if upcoming and automation.enabled
                   else "disabled" if not automation.enabled else "never")
            runs = [r for r in state.runs(automation.name) if r["status"] != "running"]
            scheduled = [r for r in runs if not r.get("manual")]
            manual = [r for r in runs if r.get("manual")]
            line = (f"{automation.name}  [{automation.schedule}]  next: {nxt}  "
                    f"last: {outcome(scheduled[-1], tz) if scheduled else 'never run'}")
            not_run = [r for r in scheduled if r["status"] in ("missed", "skipped")]
            if not_run:
                counts = {status: sum(r.get("slots") or 1 for r in not_run
                                      if r["status"] == status)
                          for status in ("missed", "skipped")}
                line += "  not run: " + ", ".join(
                    f"{count:,} {status}" for status, count in counts.items() if count)
                line += f" (latest: {outcome(not_run[-1], tz)})"
            if manual:
                line += f"  manual: {outcome(manual[-1], tz)}"
            print(f"{line}  -> {', '.join(automation.deliver)}")
        for doc in reminders:
            print(f"reminder {doc['id']}  {stamp(doc['due'], tz)}  -> {doc['chat_key']}: "
                  f"{doc['text']}")
        for doc in missed:
            print(f"reminder {doc['id']}  MISSED (due {stamp(doc['due'], tz)}, roost "
                  f"was not running) -> {doc['chat_key']}: {doc['text']}")
    finally:
        state.close()
    return 0


def stamp(moment: float, tz: ZoneInfo) -> str:
    """A time as `list` shows it, in the daemon's zone, which the output names once. Only a
    wall-clock time that happens twice (the hour the clocks go back) carries the zone's
    abbreviation, which tells the two apart: 02:30 CEST, then 02:30 CET."""
    local = datetime.fromtimestamp(moment, tz)
    twice = local.replace(fold=1 - local.fold).utcoffset() != local.utcoffset()
    return local.strftime("%a %Y-%m-%d %H:%M %Z" if twice else "%a %Y-%m-%d %H:%M")


def outcome(run: dict[str, Any], tz: ZoneInfo) -> str:
    """A run record in a few words: status, scheduled time, prompt tokens, error."""
    text = f"{run['status']} {stamp(run['scheduled'], tz)}"
    if run.get("prompt_tokens"):
        text += f" ({run['prompt_tokens']:,} prompt tokens)"
    if run.get("error"):
        text += f": {run['error']}"
    return text


async def ask_the_daemon(settings: Settings, automation: AutomationSettings) -> RunResult:
    """The daemon owns the state directory: ask it to run the automation (it looks every
    SCAN_EVERY seconds) and wait for the run's record."""
    state = AutomationState(settings.daemon.state_dir, read_only=True)
    request = new_id()
    run_id = manual_run_id(automation.name, request)
    state.request_run({"id": request, "name": automation.name, "at": time.time()})
    print(f"roost is running; it runs {automation.name} now", file=sys.stderr)
    try:
        async with asyncio.timeout(automation.timeout + SCAN_EVERY + 30):
            while True:
                run = state.run(run_id)
                if run is not None and run["status"] != "running":
                    return RunResult(run_id, run["status"], text=run.get("text") or "",
                                     error=run.get("error") or "")
                if not in_use(settings.daemon.state_dir):
                    return RunResult(run_id, "failed", error=_gone(state, request, automation))
                await asyncio.sleep(0.5)
    except TimeoutError:
        return RunResult(run_id, "failed", error="the running daemon did not run it in time")
    finally:
        state.close()


def _gone(state: AutomationState, request: str, automation: AutomationSettings) -> str:
    """What happens to a run whose daemon went away (killed, stopped) while it was waited for."""
    if state.run_requested(request):  # not taken yet: the next start takes it
        return (f"roost stopped before it ran {automation.name}; it runs {automation.name} "
                "when it starts again")
    return (f"roost stopped during the run of {automation.name}; a run asked for by hand is "
            f"not run again by itself: `roost automations run {automation.name}` once roost "
            "is back")


def unserved(settings: Settings, target: str) -> str | None:
    """Why roost would not deliver to `target` (None: it would): its platform is off, or the
    chat is a person in neither `[people]`, the allow list nor the approved pairings. A group
    has no list of its own: roost answers there to allowed senders."""
    platform = platform_of(target)
    if platform is None:
        return None  # the terminal
    own = platform.of(settings.platforms)
    if not own.enabled:
        return f"{platform.title} is not enabled ({platform.name}.enabled)"
    chat = ChatKey.of(target).id
    if not platform.is_person(chat) or platform.allowed(own, chat) \
            or any(target in p.chats for p in settings.people.values()) \
            or PairingBook(settings.daemon.state_dir).is_approved(platform.name, chat):
        return None
    return (f"not a chat roost serves: add them to [people] or {platform.name}.allow, or "
            "approve them with `roost pairing approve`")


def remind(settings: Settings, words: list[str], target: str) -> int:
    """Add a reminder: `words` are the time, then the text (see `split_when`); the daemon
    arms it within SCAN_EVERY seconds if it runs, else at its start."""
    tz = settings.daemon.tz
    pattern, forms = chat_pattern()
    person = target_person(target)
    if person is not None and person not in settings.linked:
        print(f"roost: --to {target}: {person!r} is in neither [people] nor [identities]",
              file=sys.stderr)
        return EX_USAGE
    if person is None and not re.fullmatch(pattern, target):
        print(f"roost: --to {target!r}: expected {forms} or person:NAME", file=sys.stderr)
        return EX_USAGE
    if person is None and (refused := unserved(settings, target)) is not None:
        print(f"roost: --to {target}: {refused}", file=sys.stderr)
        return EX_USAGE
    now = datetime.now(tz)
    try:
        due, text = split_when(words, now)
    except ValueError as exc:
        print(f"roost: {exc}", file=sys.stderr)
        return EX_USAGE
    if due <= now or not text.strip():
        print("roost: " + ("the time is in the past" if due <= now else "the text is empty"),
              file=sys.stderr)
        return EX_USAGE
    settings.daemon.state_dir.mkdir(parents=True, exist_ok=True)
    state = AutomationState(settings.daemon.state_dir)
    try:
        doc = new_reminder(target, due.timestamp(), text, time.time(), by="command")
        state.add_reminder(doc)
    finally:
        state.close()
    print(f"reminder {doc['id']} for {stamp(doc['due'], tz)} ({tz.key}) to {target}")
    return 0
