"""The scheduler: APScheduler 3.11's AsyncIOScheduler inside the daemon's loop.

* Zone: `daemon.timezone`. Jobs fire at the exact minute (no jitter, no stagger).
* Job ids are stable: `automation:<name>` and `reminder:<id>`, so a job is replaced, never
  added twice.
* `coalesce=True`: runs that piled up (the loop was blocked, the machine slept) run once.
  `max_instances=1`: a run still going when the next is due is not doubled; that slot is
  recorded as skipped (APScheduler only logs it: `_skipped` listens). `misfire_grace_time` is
  the automation's `grace` (5 minutes by default): a run APScheduler could not start within
  that of its time is dropped by APScheduler and recorded as missed (`_missed`).
* Runs missed while roost was down are not made up, except one whose slot is less than `grace`
  ago at start: it runs then. The others are recorded as missed, one record per outage with the
  number of slots: the daemon notes that it is alive every `ALIVE_EVERY` seconds (and at stop),
  and the slots between that note and the start, minus those on record, are the missed ones.
  Each slot runs at most once (`AutomationState.start_run`).
* A run cut off by a stop or crash of roost runs again once at the next start when its slot is
  still less than `grace` ago (and is the automation's current slot); a rerun cut off again,
  or an older slot, is recorded as failed.
* Reminders live in the state directory and are armed at start (late ones handled at once, see
  `automations/reminders.py`); a scan every `SCAN_EVERY` seconds arms those that
  `roost automations remind` added meanwhile, and starts the runs `roost automations run`
  asked for while the daemon owns the state directory.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection
from datetime import datetime, timedelta
from typing import Any

from apscheduler.events import (
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
    JobExecutionEvent,
    JobSubmissionEvent,
)
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from automations.commands import stamp
from automations.reminders import Reminders
from automations.runner import AutomationRunner, Outlet, slot_id
from automations.schedule import build_trigger, due_slot, fires_between
from automations.state import SCAN_EVERY
from daemon.core.config import AutomationSettings, target_person
from daemon.core.logs import automation_log as log
from daemon.core.platforms import automation_name
from daemon.engine.delivery import DeliveryHooks
from daemon.engine.workers import UNWIND
from daemon.turn.parts import TurnParts

ALIVE_EVERY = 60.0  # how often the daemon notes that it runs (the start of an outage)
MISSED_COUNTED = 10_000  # slots of one outage counted at most (an `every 1m` down for a week)


class Automations:
    """Owns the scheduler, the runner and the reminders; `start()`/`stop()` in the app."""

    def __init__(self, parts: TurnParts, outlet: Outlet, reminders: Reminders, *,
                 hooks: DeliveryHooks | None = None, channels: Collection[str] = (),
                 clock: Callable[[], float] = time.time,
                 on_run: Callable[[str, str], None] | None = None) -> None:
        """`parts` run the turns (shared with the chats), `outlet` queues what they deliver,
        `reminders` (whose state is the automations' too: closed by `stop`) are the ones the
        model's tools set; `hooks` are the outbox's, whose news of runs' reports this hears;
        `channels` name the running channels; `on_run` is told (automation, status) of each
        run's final status (/metrics)."""
        self.store = parts.store
        self.channels = set(channels)
        self.settings = parts.settings
        self.clock = clock
        self.tz = parts.settings.daemon.tz
        self.outlet = outlet
        self.state = reminders.state
        self.runner = AutomationRunner(parts, outlet, self.state, clock=clock, on_run=on_run)
        self.reminders = reminders
        if hooks is not None:  # subscribing, as to the scheduler's events below
            hooks.sent.append(self.runner.sent)
            hooks.refused.append(self.runner.refused)
        self.by_name = {a.name: a for a in self.settings.automations}
        self.scheduler = AsyncIOScheduler(timezone=self.tz, job_defaults={
            "coalesce": True, "max_instances": 1, "misfire_grace_time": 300})
        self._tasks: set[asyncio.Task[Any]] = set()  # runs and reminders in flight
        self._arming: asyncio.Task[None] | None = None
        self._alive_noted: float | None = None
        self.scheduler.add_listener(self._missed, EVENT_JOB_MISSED)
        self.scheduler.add_listener(self._skipped, EVENT_JOB_MAX_INSTANCES)

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), self.tz)

    async def start(self) -> None:
        """Add the jobs, start the scheduler, finish what a previous run left."""
        for automation in self.settings.automations:
            if not automation.enabled:
                continue
            for target in automation.deliver:
                person = target_person(target)
                kinds = {chat.partition(":")[0] for chat in (
                    self.settings.linked.get(person, ()) if person else (target,))}
                if target != "log" and not kinds & self.channels:
                    log.warning("automation %s delivers to %s, but the %s channel is not "
                                "running: its reports wait in the outbox", automation.name,
                                target, " or ".join(sorted(kinds)))
            self.scheduler.add_job(
                self.fire, build_trigger(automation.schedule, self.tz), args=[automation.name],
                id=f"automation:{automation.name}", name=automation.name,
                misfire_grace_time=max(1, round(automation.grace)), replace_existing=True)
        self.scheduler.add_job(self.scan, IntervalTrigger(seconds=SCAN_EVERY, timezone=self.tz),
                               id="reminders:scan", replace_existing=True)
        self.scheduler.start()
        self._arming = asyncio.create_task(self._arm_added(), name="roost-reminders")
        await self._recover()
        log.info("scheduler started: %d automations, %d reminders pending",
                 sum(a.enabled for a in self.settings.automations),
                 len(await self.reminders.pending()))

    async def stop(self, unwind: float = UNWIND) -> None:
        """Stop the scheduler and the runs in flight (a run cut off is run again or recorded
        as failed at the next start). Cancelled runs get `unwind` seconds to finish (a step of
        the shutdown budget); one that does not is logged and left, so that a stuck run (a
        tool that does not let go) cannot hold the stop past the budget."""
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
            # Only a daemon that scheduled notes it: a command's run says nothing about outages.
            await asyncio.to_thread(self.state.set_alive, self.clock())
        if self._arming is not None:
            self._arming.cancel()
            await asyncio.gather(self._arming, return_exceptions=True)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=max(unwind, 0.0))
            if pending:
                log.warning("%d automation runs or reminders did not stop within %.1fs of "
                            "being cancelled; leaving them", len(pending), unwind)
        await asyncio.to_thread(self.state.close)

    async def fire(self, name: str) -> None:
        """The job APScheduler runs: the automation's current slot (by its trigger)."""
        automation = self.by_name.get(name)
        if automation is None:
            return
        slot = due_slot(build_trigger(automation.schedule, self.tz), self.now(),
                        automation.grace)
        if slot is None:
            log.info("automation %s fired with no slot due; nothing to run", name)
            return
        await self._track(self.runner.run(automation, slot))

    async def run_now(self, name: str) -> None:
        await self._track(self.runner.run(self.by_name[name], None))

    async def scan(self) -> None:
        """Arm the reminders added meanwhile (by the command line); fire the overdue ones;
        start the runs `roost automations run` asked for; note that the daemon runs."""
        now = self.clock()
        if self._alive_noted is None or now - self._alive_noted >= ALIVE_EVERY:
            self._alive_noted = now
            await asyncio.to_thread(self.state.set_alive, now)
        for request in await asyncio.to_thread(self.state.take_run_requests):
            automation = self.by_name.get(str(request.get("name")))
            if automation is not None:
                log.info("automation %s: run asked for from the command line", automation.name)
                # Printed by the command, not delivered; in the background, like a job.
                self.scheduler.add_job(self._track_request, args=[automation, request["id"]])
        for doc in await self.reminders.pending():
            if doc["due"] <= self.clock():
                await self._track(self.reminders.fire(doc["id"], self.outlet))
            elif self.scheduler.get_job(f"reminder:{doc['id']}") is None:
                self._arm(doc)

    def next_run(self, automation: AutomationSettings) -> datetime | None:
        job = self.scheduler.get_job(f"automation:{automation.name}")
        when: datetime | None = job.next_run_time if job is not None else None
        return when

    def _missed(self, event: JobExecutionEvent) -> None:
        """APScheduler dropped a run it could not start within the grace (the loop was
        blocked, the machine slept): record the slot as missed, so `list` shows it."""
        name = str(event.job_id).removeprefix("automation:")
        automation = self.by_name.get(name)
        if automation is None or not str(event.job_id).startswith("automation:"):
            return
        slot = event.scheduled_run_time.astimezone(self.tz)
        log.warning("automation %s: the run due %s could not start within %.0fs; missed",
                    name, slot.strftime("%Y-%m-%d %H:%M %Z"), automation.grace)
        self._background(self.runner.record_missed(
            automation, slot, f"could not start within the grace ({automation.grace:g}s)"))

    def _skipped(self, event: JobSubmissionEvent) -> None:
        """APScheduler did not start a run because the previous one was still going
        (`max_instances`): record the slot as skipped, so `list` and /metrics show it."""
        name = str(event.job_id).removeprefix("automation:")
        automation = self.by_name.get(name)
        if automation is None or not str(event.job_id).startswith("automation:"):
            return
        slot = event.scheduled_run_times[-1].astimezone(self.tz)
        log.warning("automation %s: the run due %s is skipped: the previous run is still "
                    "going", name, slot.strftime("%Y-%m-%d %H:%M %Z"))
        self._background(self.runner.record_skipped(
            automation, slot, "the previous run was still going"))

    def _background(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _arm_added(self) -> None:
        """Put each reminder the model sets on its timer as it is set."""
        while True:
            self._arm(await self.reminders.added.get())

    def _arm(self, doc: dict[str, Any]) -> None:
        if not self.scheduler.running:
            return  # start() arms every pending one
        # APScheduler 3.11 times its jobs by the wall clock and takes no clock of ours: put the
        # timer as far from the wall clock's now as the reminder is from roost's, so a clock
        # other than the wall's (a test's, a skewed one) does not fire it early or late.
        due = datetime.now(self.tz) + timedelta(seconds=doc["due"] - self.clock())
        # No misfire limit: a reminder is never dropped; how late it is, fire() decides.
        self.scheduler.add_job(self.reminders.fire, DateTrigger(due, timezone=self.tz),
                               args=[doc["id"], self.outlet], id=f"reminder:{doc['id']}",
                               misfire_grace_time=None, replace_existing=True)

    async def _recover(self) -> None:
        alive = await asyncio.to_thread(self.state.alive)  # when roost last ran, if ever
        self._alive_noted = self.clock()  # noted below, once the outage is on record
        # Replies a crash left in an automation chat's outbox go to their targets now, for the
        # run that was going (its record then lists what they were delivered as).
        running = {r["name"]: r["id"] for r in await asyncio.to_thread(self.state.runs)
                   if r["status"] == "running"}
        for automation in self.settings.automations:
            run_id = running.get(automation.name)
            found = await self.runner.distribute(automation, run_id)
            if run_id is not None and found.replied:
                # The model answered before the crash: the run is done, even when its answer
                # was the quiet token (a rerun would be another model call, maybe a report).
                status = await asyncio.to_thread(
                    self.state.update_run, run_id, status="ok" if found.queued else "quiet",
                    ended=self.clock(), delivered=found.queued)
                self.runner.on_run(automation.name, status or "ok")
        stale = [d for d in await asyncio.to_thread(self.store.outbox_pending)
                 if automation_name(d["chat_key"]) not in (None, *self.by_name)]
        for doc in stale:  # an automation since removed from the config
            await asyncio.to_thread(self.store.outbox_done, doc["id"])
        due = {a.name: due_slot(build_trigger(a.schedule, self.tz), self.now(), a.grace)
               for a in self.settings.automations if a.enabled}
        reruns: set[str] = set()
        for run in await asyncio.to_thread(self.state.runs):
            if run["status"] != "running":
                continue
            cut = self.by_name.get(run["name"])
            slot = due.get(run["name"])
            if (cut is not None and slot is not None and not run.get("manual")
                    and not run.get("rerun") and run["id"] == slot_id(cut, slot)):
                # Cut off by a stop or crash, its slot still within the grace: once more.
                log.warning("automation %s: roost stopped during run %s; it runs again",
                            run["name"], run["id"])
                reruns.add(run["name"])
                continue
            error = ("roost stopped during the run, again after running it a second time; "
                     "not run again" if run.get("rerun") else "roost stopped during the run")
            await asyncio.to_thread(self.state.update_run, run["id"], status="failed",
                                    error=error)
            self.runner.on_run(run["name"], "failed")
        await self.scan()
        for automation in self.settings.automations:
            if alive is not None and automation.enabled:
                await self._record_outage(automation, alive)
        await asyncio.to_thread(self.state.set_alive, self._alive_noted)
        for automation in self.settings.automations:
            slot = due.get(automation.name)
            if slot is not None:
                # Its slot is less than the grace ago: run it now, in the background (a job
                # with no trigger runs at once), for that slot.
                self.scheduler.add_job(self._track_run,
                                       args=[automation, slot, automation.name in reruns],
                                       id=f"automation:{automation.name}:start")

    async def _record_outage(self, automation: AutomationSettings, alive: float) -> None:
        """Record the slots that came while roost was not running (after `alive`, when it
        last noted that it ran, and more than the grace ago) and have no record."""
        now = self.now()
        since = datetime.fromtimestamp(alive, self.tz)
        until = datetime.fromtimestamp(now.timestamp() - automation.grace, self.tz)
        if until <= since:
            return
        fires = await asyncio.to_thread(
            fires_between, build_trigger(automation.schedule, self.tz), since, until, self.tz,
            MISSED_COUNTED + 100)
        known = {r["id"] for r in await asyncio.to_thread(self.state.runs, automation.name)}
        missed = [f for f in fires if since.timestamp() < f.timestamp() < until.timestamp()
                  and slot_id(automation, f) not in known][:MISSED_COUNTED]
        if not missed:
            return
        first, last = missed[0], missed[-1]
        count = f"{len(missed):,}" + (" or more" if len(missed) == MISSED_COUNTED else "")
        # In the zone that `list` and the console name once around it: no zone here.
        span = stamp(first.timestamp(), self.tz)
        if last is not first:
            span += f" to {stamp(last.timestamp(), self.tz)}"
        reason = f"roost was not running: {count} slot{'s' * (len(missed) > 1)} not run ({span})"
        log.warning("automation %s: %s", automation.name, reason)
        await self.runner.record_missed(automation, first, reason, slots=len(missed),
                                        last=last)

    async def _track_request(self, automation: AutomationSettings, request: str) -> None:
        await self._track(self.runner.run(automation, None, deliver=False, request=request))

    async def _track_run(self, automation: AutomationSettings, slot: datetime,
                         rerun: bool = False) -> None:
        await self._track(self.runner.run(automation, slot, rerun=rerun))

    async def _track(self, work: Any) -> None:
        """Run `work` as a task that `stop()` can cancel. The boundary of a scheduled job:
        anything unexpected is logged here and the scheduler goes on."""
        task: asyncio.Task[Any] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            await task
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("a scheduled job failed")
