"""The named loggers of roost, one per subsystem, defined in one place."""

from __future__ import annotations

import logging

from daemon.core.redact import RedactingFilter

root_log = logging.getLogger("roost")
store_log = logging.getLogger("roost.store")
llm_log = logging.getLogger("roost.llm")
turn_log = logging.getLogger("roost.turn")
fold_log = logging.getLogger("roost.fold")
app_log = logging.getLogger("roost.app")
telegram_log = logging.getLogger("roost.telegram")
intake_log = logging.getLogger("roost.intake")
whatsapp_log = logging.getLogger("roost.whatsapp")
http_log = logging.getLogger("roost.http")
mcp_log = logging.getLogger("roost.mcp")
pairing_log = logging.getLogger("roost.pairing")
automation_log = logging.getLogger("roost.automations")
voice_log = logging.getLogger("roost.voice")


def configure(level: int = logging.INFO) -> None:
    """Log to stderr in the one-line form journald shows well (it adds its own timestamp).

    The handler sits on the root logger, so aiohttp's and asyncio's warnings get the same form
    and the same credential filter as roost's own lines; roost alone logs below WARNING."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter())
    top = logging.getLogger()
    top.handlers[:] = [handler]
    top.setLevel(logging.WARNING)
    root_log.handlers[:] = []
    root_log.setLevel(level)
    root_log.propagate = True
