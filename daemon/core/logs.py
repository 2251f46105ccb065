"""The named loggers of roost, one per subsystem, defined in one place, and how a line is written.

Text from outside (a sender's name, an emoji, an error a payload caused) can hold line breaks
and bidi controls: written as it came, it forges lines in the journal, such as a fake "approve
with: roost pairing approve <code>" for the owner to copy. So every outside text goes into a log
line through `outside` (repr-style: quoted, one line, everything unprintable escaped), and the
handler `configure` installs is the net under whatever a call site forgets: each record's
message is written on one line, and the lines of its traceback are indented, so a line of the
journal that starts at the margin is always the start of a record roost wrote.
"""

from __future__ import annotations

import logging

from daemon.core.redact import RedactingFilter

root_log = logging.getLogger("roost")
store_log = logging.getLogger("roost.store")
llm_log = logging.getLogger("roost.llm")
turn_log = logging.getLogger("roost.turn")
fold_log = logging.getLogger("roost.fold")
app_log = logging.getLogger("roost.app")
intake_log = logging.getLogger("roost.intake")
http_log = logging.getLogger("roost.http")
mcp_log = logging.getLogger("roost.mcp")
pairing_log = logging.getLogger("roost.pairing")
automation_log = logging.getLogger("roost.automations")
voice_log = logging.getLogger("roost.voice")


def platform_log(name: str) -> logging.Logger:
    """A platform's own logger: `roost.<name>`."""
    return logging.getLogger(f"roost.{name}")

OUTSIDE_SHOWN = 200  # characters of an outside text kept in a log line: enough to know it by


def outside(text: object) -> str:
    """Text from outside as a log line shows it: its repr (quoted, on one line, with line
    breaks, bidi and every other unprintable character escaped), cut at OUTSIDE_SHOWN."""
    shown = repr(str(text))
    if len(shown) <= OUTSIDE_SHOWN:
        return shown
    return f"{shown[:OUTSIDE_SHOWN]}… ({len(shown) - OUTSIDE_SHOWN} more characters)"


def _printable(text: str) -> str:
    """`text` with every character `str.isprintable` refuses as its escape (backslashes and
    quotes left as they are: this is the net, not `outside`)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class OneLineFormatter(logging.Formatter):
    """The message of a record on one line; its traceback, if any, indented under it."""

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        shown = logging.makeLogRecord(record.__dict__)
        shown.message = _printable(record.message)
        text = self.formatMessage(shown)
        # Formatted here, not taken from record.exc_text: another handler may have cached it
        # unindented.
        below = [self.formatException(record.exc_info) if record.exc_info else "",
                 self.formatStack(record.stack_info) if record.stack_info else ""]
        for block in filter(None, below):
            text += "".join(f"\n    {_printable(line)}" for line in block.splitlines())
        return text


def configure(level: int = logging.INFO) -> None:
    """Log to stderr in the one-line form journald shows well (it adds its own timestamp).

    The handler sits on the root logger, so aiohttp's and asyncio's warnings get the same form
    and the same credential filter as roost's own lines; roost alone logs below WARNING."""
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter())
    top = logging.getLogger()
    top.handlers[:] = [handler]
    top.setLevel(logging.WARNING)
    root_log.handlers[:] = []
    root_log.setLevel(level)
    root_log.propagate = True
