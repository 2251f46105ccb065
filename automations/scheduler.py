"""The scheduler: APScheduler 3.11's AsyncIOScheduler inside the daemon's loop.

* Zone: `daemon.timezone`. Jobs fire at the exact minute (no jitter, no stagger).
* Job ids are stable: `automation:<name>` and `reminder:<id>`, so a job is replaced, never
  added twice.
* `coalesce=True`: runs that piled up (the loop was blocked, the machine slept) run once.
  `max_instances=1`: a run still going when the next is due is not doubled (the runner also
  records that slot as skipped). `misfire_grace_time` is the automation's `grace` (5 minutes by
  default): a run APScheduler could not start within that of its time is dropped by APScheduler.
* Runs missed while roost was down are not made up, except one whose slot is less than `grace`
  ago at start: it runs then. Each slot runs at most once (`AutomationState.start_run`).
* Reminders live in the state directory and are armed at start (late ones handled at once, see
  `automations/reminders.py`); a scan every `SCAN_EVERY` seconds arms those that
  `roost automations remind` added meanwhile, and starts the runs `roost automations run`
  asked for while the daemon owns the state directory.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from apscheduler.events import EVENT_JOB_MISSED, JobExecutionEvent
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from automations.reminders import Reminders, register_reminder_tools
from automations.runner import CHAT_PREFIX, AutomationRunner
from automations.schedule import build_trigger, due_slot
from automations.state import AutomationState
from daemon.config import AutomationSettings
from daemon.engine import Engine
from daemon.logs import automation_log as log

SCAN_EVERY = 10.0


class Automations:
    """Owns the scheduler, the runner and the reminders; `start()`/`stop()` in the app."""

    def __init__(self, engine: Engine, *, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.settings = engine.settings
        self.clock = clock
        self.tz = engine.settings.daemon.tz
        self.state = AutomationState(engine.store.state_dir)
        self.runner = AutomationRunner(engine, self.state, clock=clock)
        self.reminders = Reminders(engine, self.state, clock=clock)
        self.reminders.arm = self._arm
        engine.on_sent = self.runner.sent
        engine.on_refused = self.runner.refused
        self.by_name = {a.name: a for a in self.settings.automations}
        self.scheduler = AsyncIOScheduler(timezone=self.tz, job_defaults={
            "coalesce": True, "max_instances": 1, "misfire_grace_time": 300})
        self._tasks: set[asyncio.Task[Any]] = set()
        self.scheduler.add_listener(self._missed, EVENT_JOB_MISSED)
        # Registered before the engine takes work: every turn's prefix lists the capability.
        register_reminder_tools(engine.registry, self.reminders)

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), self.tz)

    async def start(self) -> None:
        """Add the jobs, start the scheduler, finish what a previous run left."""
        for automation in self.settings.automations:
            if not automation.enabled:
                continue
            for target in automation.deliver:
                kind = target.partition(":")[0]
                if target != "log" and kind not in self.engine.channels:
                    log.warning("automation %s delivers to %s, but the %s channel is not "
                                "running: its reports wait in the outbox", automation.name,
                                target, kind)
            self.scheduler.add_job(
                self.fire, build_trigger(automation.schedule, self.tz), args=[automation.name],
                id=f"automation:{automation.name}", name=automation.name,
                misfire_grace_time=max(1, round(automation.grace)), replace_existing=True)
        self.scheduler.add_job(self.scan, IntervalTrigger(seconds=SCAN_EVERY, timezone=self.tz),
                               id="reminders:scan", replace_existing=True)
        self.scheduler.start()
        await self._recover()
        log.info("scheduler started: %d automations, %d reminders pending",
                 sum(a.enabled for a in self.settings.automations),
                 len(await self.reminders.pending()))

    async def stop(self) -> None:
        """Stop the scheduler and the runs in flight (a run cut off is recorded as failed)."""
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
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
        start the runs `roost automations run` asked for."""
        for request in await asyncio.to_thread(self.state.take_run_requests):
            automation = self.by_name.get(str(request.get("name")))
            if automation is not None:
                log.info("automation %s: run asked for from the command line", automation.name)
                # Printed by the command, not delivered; in the background, like a job.
                self.scheduler.add_job(self._track_request, args=[automation, request["id"]])
        for doc in await self.reminders.pending():
            if doc["due"] <= self.clock():
                await self._track(self.reminders.fire(doc["id"]))
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
                    name, slot.strftime("%Y-%m-%d %H:%M"), automation.grace)
        task = asyncio.ensure_future(self.runner.record_missed(automation, slot))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _arm(self, doc: dict[str, Any]) -> None:
        if not self.scheduler.running:
            return  # start() arms every pending one
        due = datetime.fromtimestamp(doc["due"], self.tz)
        # No misfire limit: a reminder is never dropped; how late it is, fire() decides.
        self.scheduler.add_job(self.reminders.fire, DateTrigger(due, timezone=self.tz),
                               args=[doc["id"]], id=f"reminder:{doc['id']}",
                               misfire_grace_time=None, replace_existing=True)

    async def _recover(self) -> None:
        # Replies a crash left in an automation chat's outbox go to their targets now, for the
        # run that was going (its record then lists what they were delivered as).
        running = {r["name"]: r["id"] for r in await asyncio.to_thread(self.state.runs)
                   if r["status"] == "running"}
        for automation in self.settings.automations:
            run_id = running.get(automation.name)
            queued = await self.runner.distribute(automation, run_id)
            if run_id is not None and queued:
                await asyncio.to_thread(self.state.update_run, run_id, status="ok",
                                        ended=self.clock(), delivered=queued)
                self.runner.on_run(automation.name, "ok")
        stale = [d for d in await asyncio.to_thread(self.engine.store.outbox_pending)
                 if d["chat_key"].startswith(CHAT_PREFIX)
                 and d["chat_key"].removeprefix(CHAT_PREFIX) not in self.by_name]
        for doc in stale:  # an automation since removed from the config
            await asyncio.to_thread(self.engine.store.outbox_done, doc["id"])
        for run in await asyncio.to_thread(self.state.runs):
            if run["status"] == "running":
                await asyncio.to_thread(self.state.update_run, run["id"], status="failed",
                                        error="roost stopped during the run")
                self.runner.on_run(run["name"], "failed")
        await self.scan()
        for automation in self.settings.automations:
            slot = due_slot(build_trigger(automation.schedule, self.tz), self.now(),
                            automation.grace)
            if automation.enabled and slot is not None:
                # Its slot is less than the grace ago: run it now, in the background (a job
                # with no trigger runs at once), for that slot.
                self.scheduler.add_job(self._track_run, args=[automation, slot],
                                       id=f"automation:{automation.name}:start")

    async def _track_request(self, automation: AutomationSettings, request: str) -> None:
        await self._track(self.runner.run(automation, None, deliver=False, request=request))

    async def _track_run(self, automation: AutomationSettings, slot: datetime) -> None:
        await self._track(self.runner.run(automation, slot))

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
