"""The automations as the web console shows them: schedule, next run, past runs, "run now".

Reads the run records beside the running scheduler (as `roost automations list` does) and asks
for a run the way `roost automations run` does, then wakes the scheduler's scan so that it takes
the request at once; the run is recorded like any manual one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from automations.commands import stamp
from automations.schedule import build_trigger, next_fire
from automations.state import AutomationState, manual_run_id
from daemon.console.board import AutomationView, RunView
from daemon.core.config import Settings
from daemon.core.ids import new_id
from daemon.store import Store

RUNS_SHOWN = 20


class Board:
    def __init__(self, settings: Settings, store: Store,
                 wake: Callable[[], Awaitable[None]] | None = None) -> None:
        self.settings = settings
        self.store = store
        self.wake = wake  # the scheduler's scan: takes the request now, not within SCAN_EVERY

    def overview(self) -> list[AutomationView]:
        tz = self.settings.daemon.tz
        state = AutomationState(self.settings.daemon.state_dir, read_only=True)
        try:
            shown = []
            for automation in self.settings.automations:
                upcoming = next_fire(build_trigger(automation.schedule, tz), datetime.now(tz))
                nxt = ("disabled" if not automation.enabled
                       else stamp(upcoming.timestamp(), tz) if upcoming else "never")
                runs = state.runs(automation.name)[-RUNS_SHOWN:]
                shown.append(AutomationView(
                    automation.name, automation.schedule, nxt, tuple(automation.deliver),
                    tuple(self._run(r) for r in reversed(runs))))
            return shown
        finally:
            state.close()

    async def run_now(self, name: str) -> str:
        if name not in {a.name for a in self.settings.automations}:
            return f"No automation is called {name}."
        request = new_id()
        await asyncio.to_thread(self._request, {"id": request, "name": name, "at": time.time()})
        if self.wake is not None:
            await self.wake()
        return (f"{name} runs now (run {manual_run_id(name, request)}); reload this page for "
                "its result. A run by hand is recorded, not delivered.")

    def _request(self, doc: dict[str, Any]) -> None:
        state = AutomationState(self.settings.daemon.state_dir, read_only=True)
        try:
            state.request_run(doc)
        finally:
            state.close()

    def _run(self, run: dict[str, Any]) -> RunView:
        ended, started = run.get("ended"), run.get("started")
        return RunView(
            run["status"], stamp(run["scheduled"], self.settings.daemon.tz),
            bool(run.get("manual")),
            # A missed or skipped slot did not run: its record starts and ends at once.
            round(ended - started, 1) if ended and started
            and run["status"] not in ("missed", "skipped") else None,
            run.get("prompt_tokens"), self._cached_share(run.get("conversation_id")),
            run.get("error") or "", run.get("conversation_id"))

    def _cached_share(self, conversation_id: str | None) -> float | None:
        """How much of the run's first request Ollama had cached, where it reports it."""
        if not conversation_id or self.store.get_conversation(conversation_id) is None:
            return None
        for message in self.store.messages(conversation_id):
            meta = message.meta
            if message.role == "assistant" and meta.get("prompt_eval_count"):
                cached = meta.get("prompt_eval_cached_count")
                return None if cached is None else cached / meta["prompt_eval_count"]
        return None
