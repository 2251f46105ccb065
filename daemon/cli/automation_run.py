"""`roost automations run NAME`: one run now, by the daemon when it runs, else here, through
the same core as `roost chat` (daemon/app/assembly.py), so with the daemon's tools."""

from __future__ import annotations

import sys

from automations.commands import ask_the_daemon
from daemon.app.assembly import Runs, core
from daemon.core.config import Settings
from daemon.core.errors import StoreError
from daemon.llm.client import ModelClient
from daemon.store import Store


async def run_automation(settings: Settings, name: str) -> int:
    """Run one automation now against the configured Ollama and print the reply (it is
    recorded as a manual run, not delivered)."""
    automation = next((a for a in settings.automations if a.name == name), None)
    if automation is None:
        known = ", ".join(a.name for a in settings.automations) or "none configured"
        print(f"roost: no automation named {name!r} (known: {known})", file=sys.stderr)
        return 1
    try:
        store = Store.open(settings.daemon.state_dir)
    except StoreError as exc:
        if "another roost process" not in str(exc):
            raise
        result = await ask_the_daemon(settings, automation)
    else:
        llm = ModelClient(settings.model)
        try:
            async with core(settings, store, llm, {}, Runs.ONCE) as built:
                result = await built.automations.runner.run(automation, None, deliver=False)
        finally:
            await llm.close()
            store.close()
    if result.status == "failed":
        print(f"roost: the run failed: {result.error}", file=sys.stderr)
        return 1
    print(result.text)
    if result.status == "quiet":
        print(f"(the quiet token {automation.quiet!r}: a scheduled run delivers nothing)",
              file=sys.stderr)
    return 0
