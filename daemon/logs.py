"""The named loggers of roost, one per subsystem, defined in one place."""

from __future__ import annotations

import logging

root_log = logging.getLogger("roost")
store_log = logging.getLogger("roost.store")
llm_log = logging.getLogger("roost.llm")
turn_log = logging.getLogger("roost.turn")
fold_log = logging.getLogger("roost.fold")
app_log = logging.getLogger("roost.app")
telegram_log = logging.getLogger("roost.telegram")
automation_log = logging.getLogger("roost.automations")


def configure(level: int = logging.INFO) -> None:
    """Log to stderr in the one-line form journald shows well (it adds its own timestamp)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root_log.handlers[:] = [handler]
    root_log.setLevel(level)
    root_log.propagate = False
