"""Times as the `roost` commands show them: in the daemon's zone (`[daemon] timezone`), the
zone the console, `/status` and the automations use, never the zone of the shell that runs the
command. Each output names the zone once (`zone_line`, or a column header), never per time."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

MINUTES = "%Y-%m-%d %H:%M"
SECONDS = "%Y-%m-%d %H:%M:%S"


def local(moment: float, tz: ZoneInfo, form: str = MINUTES) -> str:
    """A Unix time as a wall-clock time in `tz`."""
    return datetime.fromtimestamp(moment, tz).strftime(form)


def zone_line(tz: ZoneInfo) -> str:
    """The line that names the zone of an output's times."""
    return f"Times in {tz.key}."
