"""One automation run: a fresh conversation, the turn path, delivery to every target, a record.

A run takes the same turn path as a chat message (`TurnRunner`), so it gets the same prefix
rules, tools, `model.max_calls`, calibration and overflow handling:

* The chat key is `automation:<name>`; each run starts a fresh conversation there (the previous
  one is archived and stays searchable).
* The request is the system message every conversation shares (the core prompt, the
  capability index and the day's memory map: the same bytes all day, for chats too) + the
  automation's prompt with the automation's channel note + the run's scheduled date and time,
  which the replay stamps at the very end of that message. Two runs on one day therefore send
  identical bytes up to that stamp.
* Its model calls run inside `ModelClient.scheduled`: they queue behind interactive turns.
* The reply lands in the automation chat's outbox (crash-safe, as for any turn) and is moved
  from there to each target's outbox, with ids derived from the reply's, so doing it again after
  a crash sends nothing twice. The target's channel formats and splits it.
* The record lists the outbox items queued (`delivered`) at once, and the platform's ids of the
  messages they became (`message_ids`, per target) as each target's chat worker sends them: the
  engine tells `sent()` while the item is still in the outbox, a crash included.
* Ollama down: the turn path retries with backoff; then the run is tried again until `grace`
  after its slot, then recorded as failed. Two failures in a row alert the targets, at most once
  an hour per automation. A run is stopped after `timeout` and recorded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from automations.schedule import every_occurrence, slot_key
from automations.state import AutomationState, RunResult, manual_run_id
from daemon.core.config import AutomationSettings
from daemon.core.errors import RoostError, StoreError
from daemon.core.ids import new_id
from daemon.core.logs import automation_log as log
from daemon.core.messages import Inbound, Outbound
from daemon.core.platforms import automation_key
from daemon.turn.parts import TurnParts
from daemon.turn.runner import Outcome

ALERT_EVERY = 3600.0
RETRY_PAUSE = 30.0


# How a run ends up recorded (`status` of its record; "running" meanwhile). "undelivered" is a
# run with a report that a target refused (the refusal may come in after the run was recorded
# and counted "ok": /metrics then counts it under both). A run stopped by its timeout is
# "failed" with that reason; "missed" is a slot the scheduler could not start in time
# or that came while roost was not running (one record for an outage, with its count in
# `slots`); "skipped" a slot that came while the previous run was still going.
RUN_STATUSES = ("ok", "undelivered", "quiet", "failed", "skipped", "missed")


@dataclass(frozen=True)
class Distributed:
    """What `distribute` found in an automation chat's outbox."""

    queued: list[str]  # the target outbox ids queued ("log" for the journal)
    replied: bool  # a reply was there (a quiet one queues nothing)


class Outlet(Protocol):
    """What automations need of the engine: queue messages that answer nothing a chat sent
    (for a chat, or for `person:NAME`: the engine's delivery finds a chat of theirs)."""

    async def deliver(self, outbound: Outbound) -> bool: ...


class AutomationRunner:
    """Runs automations on the turn parts the chats use; see the module docstring."""

    def __init__(self, parts: TurnParts, outlet: Outlet, state: AutomationState, *,
                 clock: Callable[[], float] = time.time,
                 on_run: Callable[[str, str], None] | None = None) -> None:
        self.parts = parts
        self.store = parts.store
        self.outlet = outlet
        self.state = state
        self.clock = clock
        self.settings = parts.settings
        self._notices: dict[str, list[str]] = {}
        self._running: set[str] = set()
        # Told (automation, status) each time a run's record gets its final status (/metrics).
        self.on_run: Callable[[str, str], None] = on_run or (lambda name, status: None)
        # Its own runner: the run's notices are collected (not sent), nothing streams, and a
        # run does not land folds (the engine's folder serves the chats).
        self.turns = parts.runner(notify=self._notice, fold=False)

    def running(self, name: str) -> bool:
        return name in self._running

    async def run(self, automation: AutomationSettings, slot: datetime | None, *,
                  deliver: bool = True, request: str | None = None,
                  rerun: bool = False) -> RunResult:
        """Run `automation` for `slot` (None: now, by hand; `request` names the run then). A
        slot already run, or a run of the same automation still going, is not run again, except
        with `rerun`: the slot's run was cut off by a stop of roost, and runs once more."""
        name = automation.name
        now = self.clock()
        scheduled = slot.timestamp() if slot is not None else now
        run_id = (slot_id(automation, slot) if slot is not None
                  else manual_run_id(name, request or new_id(now)))
        doc = {"id": run_id, "name": name, "scheduled": scheduled, "started": now,
               "ended": None, "status": "running", "manual": slot is None,
               "prompt_tokens": None, "eval_tokens": None, "delivered": [], "message_ids": {},
               "error": None}
        if name in self._running:
            # APScheduler's max_instances=1 stops most of these; a manual run can still meet one.
            log.warning("automation %s: the previous run is still going; slot %s skipped",
                        name, run_id)
            reason = "the previous run was still going"
            skipped = {**doc, "status": "skipped", "ended": now, "error": reason}
            await asyncio.to_thread(self.state.start_run, skipped)
            self.on_run(name, "skipped")
            return RunResult(run_id, "skipped", error=reason)
        if rerun:
            # Marked, so that a second stop during this run does not start a third.
            await asyncio.to_thread(self.state.update_run, run_id, **doc, rerun=True)
        elif not await asyncio.to_thread(self.state.start_run, doc):
            log.info("automation %s: %s has run already; not again", name, run_id)
            return RunResult(run_id, "skipped", error="this slot has run already")
        self._running.add(name)
        try:
            result = await self._run(automation, run_id, scheduled, deliver)
        finally:
            self._running.discard(name)
        self.on_run(name, result.status)
        if result.status == "failed" and deliver:
            await self._maybe_alert(automation, result.error)
        return result

    async def record_missed(self, automation: AutomationSettings, slot: datetime,
                            reason: str, *, slots: int = 1,
                            last: datetime | None = None) -> None:
        """Slots that were not run (`slots` of them, from `slot` to `last`): one record, and
        `slots` in the count of missed runs."""
        await self._record_not_run(automation, slot, "missed", reason,
                                   slots=slots, last=last)

    async def record_skipped(self, automation: AutomationSettings, slot: datetime,
                             reason: str) -> None:
        """A slot not run because the previous run was still going."""
        await self._record_not_run(automation, slot, "skipped", reason)

    async def _record_not_run(self, automation: AutomationSettings, slot: datetime,
                              status: str, reason: str, *, slots: int = 1,
                              last: datetime | None = None) -> None:
        now = self.clock()
        doc = {"id": slot_id(automation, slot), "name": automation.name,
               "scheduled": slot.timestamp(), "started": now, "ended": now, "status": status,
               "manual": False, "prompt_tokens": None, "eval_tokens": None, "delivered": [],
               "message_ids": {}, "error": reason, "slots": slots,
               "last_scheduled": (last or slot).timestamp()}
        if await asyncio.to_thread(self.state.start_run, doc):
            for _ in range(slots):
                self.on_run(automation.name, status)

    async def _run(self, automation: AutomationSettings, run_id: str, scheduled: float,
                   deliver: bool) -> RunResult:
        log.info("automation %s: run %s starts", automation.name, run_id)
        try:
            async with asyncio.timeout(automation.timeout):
                text, tokens = await self._answer(automation, scheduled)
        except TimeoutError:
            return await self._failed(run_id, f"stopped after the run timeout "
                                              f"({automation.timeout:g}s)")
        except _RunFailed as exc:
            return await self._failed(run_id, str(exc))
        except Exception as exc:  # the boundary of a scheduled job: record it, keep the daemon
            log.exception("automation %s: run %s failed unexpectedly", automation.name, run_id)
            return await self._failed(run_id, f"internal error: {exc!r}")
        quiet = is_quiet(automation, text)
        delivered: list[str] = []
        if not quiet and deliver:
            delivered = (await self.distribute(automation, run_id)).queued
        else:
            await self._drop_outbox(automation.name)
        # "undelivered" when a target refused the report before this write.
        status = await asyncio.to_thread(
            self.state.update_run, run_id, status="quiet" if quiet else "ok",
            ended=self.clock(), text=text, delivered=delivered, **tokens) or "ok"
        log.info("automation %s: run %s %s (%s prompt tokens)", automation.name, run_id,
                 "quiet: nothing delivered" if quiet else f"delivered to {len(delivered)}",
                 tokens.get("prompt_tokens"))
        return RunResult(run_id, status, text=text)

    async def _answer(self, automation: AutomationSettings,
                      scheduled: float) -> tuple[str, dict[str, Any]]:
        """The reply of a fresh conversation, retried while Ollama is down, until the grace."""
        chat_key = automation_key(automation.name)
        await asyncio.to_thread(self.parts.router.rotate, chat_key, self.clock())
        # The prompt is the user message; the replay stamps it with `received`, the slot's time.
        item = Inbound(chat_key=chat_key, text=prompt_text(automation), received=scheduled,
                       id=new_id(scheduled))
        # Measured on the monotonic clock: the wall clock may jump (NTP, a test's clock).
        deadline = time.monotonic() + max(scheduled + automation.grace - self.clock(), 0.0)
        model = automation.model or self.settings.model.name
        while True:
            self._notices[chat_key] = []
            with self.parts.llm.scheduled():
                result = await self.turns.run(chat_key, [item], announce_outage=False,
                                              model=model)
            notices = self._notices.pop(chat_key, [])
            if result.outcome is Outcome.ANSWERED:
                return await asyncio.to_thread(self._reply, chat_key)
            if result.outcome is Outcome.FAILED:
                raise _RunFailed(notices[-1] if notices else "the model call failed")
            pause = min(RETRY_PAUSE, deadline - time.monotonic())
            if pause <= 0:
                raise _RunFailed(f"the model server at {self.parts.llm.host} was unreachable "
                                 f"until the grace time ({automation.grace:g}s) ran out")
            log.warning("automation %s: Ollama unreachable; trying again in %.0fs",
                        automation.name, pause)
            await asyncio.sleep(pause)

    def _reply(self, chat_key: str) -> tuple[str, dict[str, Any]]:
        """The run's reply text (from the automation chat's outbox) and Ollama's counts."""
        docs = [d for d in self.store.outbox_pending(chat_key) if d.get("kind") == "reply"]
        text = docs[-1]["text"] if docs else ""
        conversation = self.store.active_conversation(chat_key)
        tokens: dict[str, Any] = {}
        if conversation is not None:
            answers = [m for m in self.store.messages(conversation.id)
                       if m.role == "assistant"]
            if answers:
                # A turn's reply carries the sum over its model calls (`prompt_tokens`);
                # older records only the first call's count.
                prompt = [m.meta.get("prompt_tokens") or m.meta.get("prompt_eval_count")
                          for m in answers]
                tokens = {"prompt_tokens": sum(p or 0 for p in prompt),
                          "eval_tokens": answers[-1].meta.get("eval_count"),
                          "conversation_id": conversation.id}
        return text, tokens

    async def distribute(self, automation: AutomationSettings,
                         run_id: str | None = None) -> Distributed:
        """Move the automation chat's replies to each target's outbox: the outbox ids queued,
        and whether a reply was found at all (a quiet one queues nothing). Each item names
        `run_id`, whose record then gets the platform's message ids.

        Safe to repeat (after a crash): a target's item id is the reply's id plus the target,
        and `Engine.deliver` queues an id once.
        """
        chat_key = automation_key(automation.name)
        docs = await asyncio.to_thread(self.store.outbox_pending, chat_key)
        queued: list[str] = []
        replied = False
        for doc in docs:
            replied = replied or doc.get("kind") == "reply"
            # A quiet reply left by a crash (before it was dropped) is not delivered either.
            if doc.get("kind") == "reply" and not is_quiet(automation, doc["text"]):
                for target in automation.deliver:
                    if target == "log":
                        log.info("automation %s reported:\n%s", automation.name, doc["text"])
                        await asyncio.to_thread(
                            self.parts.records.event, self.clock(), "automation",
                            doc.get("conversation_id") or chat_key, doc["text"])
                        queued.append("log")
                        continue
                    outbound = Outbound(
                        chat_key=target, text=doc["text"], created=doc["created"],
                        kind="reply", id=f"{doc['id']}.{target}",
                        conversation_id=doc.get("conversation_id"),
                        message_id=doc.get("message_id"), origin=run_id)
                    await self.outlet.deliver(outbound)
                    queued.append(outbound.id)
            await asyncio.to_thread(self.store.outbox_done, doc["id"])
        return Distributed(queued, replied)

    async def sent(self, outbound: Outbound) -> None:
        """The delivery's `sent` hook: a run's report reached a target; record the platform's ids
        of its messages (the channel noted them on the outbox item, still there now)."""
        run_id = outbound.origin
        if run_id is None:
            return  # not a run's report: a chat reply, a notice, a reminder

        def record() -> None:
            docs = self.store.outbox_pending(outbound.chat_key)
            stored = next((d for d in docs if d["id"] == outbound.id), None)
            ids = (stored or {}).get("platform_ids") or list(outbound.platform_ids)
            self.state.record_sent(run_id, outbound.chat_key, [str(i) for i in ids])

        await asyncio.to_thread(record)

    async def refused(self, outbound: Outbound, reason: str) -> None:
        """The delivery's `refused` hook: a target gave up a run's report (the user blocked the
        bot, the platform refused it, it was held too long). On the run's record; the second
        such run in a row is alerted."""
        run_id = outbound.origin
        if run_id is None:
            return  # not a run's report
        known = await asyncio.to_thread(self.state.record_refused, run_id, outbound.chat_key,
                                        reason)
        if known is None:
            return
        name, turned = known
        if turned:  # recorded (and counted) "ok" a moment ago
            self.on_run(name, "undelivered")
        log.warning("automation %s: run %s was not delivered to %s: %s", name, run_id,
                    outbound.chat_key, reason)
        automation = next((a for a in self.settings.automations if a.name == name), None)
        if automation is not None:
            await self._maybe_alert_refused(automation, run_id)

    async def _maybe_alert_refused(self, automation: AutomationSettings, run_id: str) -> None:
        """After two runs in a row refused, say so in the journal (an error) and through the
        targets that still take reports, at most once an hour: telling the target that
        refuses would be refused too."""
        name = automation.name
        refusals = await asyncio.to_thread(self.state.consecutive_refusals, name, run_id)
        key = f"refused:{name}"
        last = await asyncio.to_thread(self.state.last_alert, key)
        now = self.clock()
        if refusals < 2 or (last is not None and now - last < ALERT_EVERY):
            return
        await asyncio.to_thread(self.state.set_alert, key, now)
        run = await asyncio.to_thread(self.state.run, run_id) or {}
        refused: dict[str, str] = run.get("refused") or {}
        which = "; ".join(f"{target} ({why})" for target, why in sorted(refused.items()))
        others = [t for t in automation.deliver if t != "log" and t not in refused]
        log.error("automation %s: its reports were refused %d runs in a row by %s; alerting %s",
                  name, refusals, which, ", ".join(others) or "nobody else (no other target)")
        text = (f"The automation {name!r} could not deliver its last {refusals} reports to "
                f"{which}. roost keeps running it; fix that target (or unblock the bot) to get "
                "them there again.")
        for target in others:
            await self.outlet.deliver(Outbound(target, text, now, kind="notice"))

    async def _drop_outbox(self, name: str) -> None:
        chat_key = automation_key(name)
        for doc in await asyncio.to_thread(self.store.outbox_pending, chat_key):
            await asyncio.to_thread(self.store.outbox_done, doc["id"])

    async def _failed(self, run_id: str, reason: str) -> RunResult:
        log.warning("run %s failed: %s", run_id, reason)
        await asyncio.to_thread(self.state.update_run, run_id, status="failed",
                                ended=self.clock(), error=reason)
        return RunResult(run_id, "failed", error=reason)

    async def _maybe_alert(self, automation: AutomationSettings, reason: str) -> None:
        """After two failures in a row, tell the targets, at most once an hour."""
        name = automation.name
        failures = await asyncio.to_thread(self.state.consecutive_failures, name)
        last = await asyncio.to_thread(self.state.last_alert, name)
        now = self.clock()
        if failures < 2 or (last is not None and now - last < ALERT_EVERY):
            return
        await asyncio.to_thread(self.state.set_alert, name, now)
        text = (f"The automation {name!r} failed {failures} times in a row. The last error: "
                f"{reason}. roost tries again at its next scheduled time.")
        # A chat that refuses roost (the user blocked the bot) would drop the alert unseen.
        targets = [t for t in automation.deliver if t != "log"]
        refusing = [t for t in targets if "undeliverable" in await asyncio.to_thread(
            self.store.chat_flags, t)]
        others = [t for t in targets if t not in refusing]
        log.error("automation %s failed %d times in a row (%s); alerting %s%s", name, failures,
                  reason, ", ".join(others) or "nobody else (no target takes messages)",
                  f"; {', '.join(refusing)} refuses roost's messages" if refusing else "")
        for target in others:
            try:
                await self.outlet.deliver(Outbound(target, text, now, kind="notice"))
            except StoreError:  # queued in the outbox: the state directory refused it
                log.error("automation %s: cannot queue the failure alert for %s", name, target,
                          exc_info=True)

    async def _notice(self, chat_key: str, text: str) -> None:
        """What the turn path would tell a user (an outage, an error) becomes the run's error
        reason instead: nobody reads the automation chat."""
        self._notices.setdefault(chat_key, []).append(text)


def prompt_text(automation: AutomationSettings) -> str:
    """The automation's prompt, with how to say "nothing to report" when it has a quiet token
    (the same bytes every run: the run's time is stamped after it)."""
    if automation.quiet is None:
        return automation.prompt
    return (f"{automation.prompt}\n\nIf there is nothing to report, answer exactly "
            f"{automation.quiet} and nothing else.")


def is_quiet(automation: AutomationSettings, text: str) -> bool:
    """Whether a reply is the automation's quiet token: nothing to deliver."""
    return automation.quiet is not None and text.strip() == automation.quiet


def slot_id(automation: AutomationSettings, slot: datetime) -> str:
    """The record id of a scheduled run: the automation and its slot (see `slot_key`)."""
    return f"{automation.name}@{slot_key(slot, every_occurrence(automation.schedule))}"


class _RunFailed(RoostError):
    """A run ended without a reply; the message is the reason recorded."""
