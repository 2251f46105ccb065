"""Every time a `roost` command shows is in the daemon's zone (`[daemon] timezone`), not the
host's, and each output names that zone once. The host here is in UTC (TZ=UTC) and the daemon in
Europe/Berlin, as on the box where `conversations list` said 20:35 and the console 21:35."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import channels.installed  # noqa: F401 (installs the platforms in the core's registry)
from daemon.intake.pairing import PairingBook
from daemon.store import Store
from daemon.store.approvals import ApprovalBook

ZONE = "Europe/Berlin"
# 20:35 in UTC is 21:35 in Berlin (CET, winter).
EVENING = datetime(2026, 1, 15, 20, 35, tzinfo=UTC).timestamp()


def roost(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`roost ARGS` on a host whose own zone is UTC."""
    env = {**os.environ, "TZ": "UTC"}
    return subprocess.run([sys.executable, "-m", "daemon", *args, "--config", str(config)],
                          capture_output=True, text=True, timeout=30, env=env)


def berlin_config(tmp_path: Path) -> tuple[Path, Path]:
    state = tmp_path / "state"
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{state}"\ntimezone = "{ZONE}"\n')
    return config, state


def test_conversations_list_and_show_are_in_the_daemons_zone_and_say_it_once(
        tmp_path: Path) -> None:
    config, state = berlin_config(tmp_path)
    with Store.open(state) as store:
        conversation = store.create_conversation("telegram:1111111", EVENING)
        store.append_message(conversation.id, "user", "what's on tonight?", created=EVENING)
    listed = roost(config, "conversations", "list")
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.endswith(f"LAST ACTIVE ({ZONE})")
    assert row.endswith("2026-01-15 21:35")  # the host's own zone would say 20:35
    shown = roost(config, "conversations", "show", conversation.id)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == f"Times in {ZONE}."
    assert "--- #1 user 2026-01-15 21:35:00\nwhat's on tonight?" in shown.stdout
    assert shown.stdout.count(ZONE) == 1


def test_pairing_and_approvals_lists_are_in_the_daemons_zone(tmp_path: Path) -> None:
    config, state = berlin_config(tmp_path)
    book = PairingBook(state)
    request = book.request("telegram", "2222222", "telegram:2222222", "Ana", EVENING)
    assert request is not None and book.approve(request.code, EVENING) is not None
    ApprovalBook(state).grant("telegram:2222222", "files__read", EVENING)
    paired = roost(config, "pairing", "list")
    assert paired.returncode == 0, paired.stderr
    header, row = paired.stdout.splitlines()
    assert header.split()[-3:] == ["WHEN", f"({ZONE})", "ROLE"]
    assert row.split()[-3:] == ["2026-01-15", "21:35", "guest"]  # since ..., then the role
    standing = roost(config, "approvals", "list")
    assert standing.returncode == 0, standing.stderr
    assert standing.stdout.splitlines() == [
        f"Times in {ZONE}.", "telegram:2222222 files__read (since 2026-01-15 21:35)"]


def test_automations_list_names_the_zone_once_not_at_every_time(tmp_path: Path) -> None:
    config, _ = berlin_config(tmp_path)
    config.write_text(config.read_text() + '\n[[automations]]\nname = "morning"\n'
                      'schedule = "0 7 * * *"\nprompt = "the weather"\n'
                      'deliver = ["console:local"]\n')
    listed = roost(config, "automations", "list")
    assert listed.returncode == 0, listed.stderr
    first, line = listed.stdout.splitlines()
    assert first == f"Times in {ZONE}."
    assert " 07:00  last: never run" in line
    assert "CET" not in line and "CEST" not in line


def test_a_time_that_happens_twice_in_the_zone_says_which(tmp_path: Path) -> None:
    """On the night the clocks go back, 02:30 happens twice in Berlin: there, and only there,
    the abbreviation tells the two apart."""
    from zoneinfo import ZoneInfo

    from automations.commands import stamp

    berlin = ZoneInfo(ZONE)
    first = datetime(2026, 10, 25, 0, 30, tzinfo=UTC).timestamp()  # 02:30 CEST
    second = first + 3600  # 02:30 CET
    assert stamp(first, berlin) == "Sun 2026-10-25 02:30 CEST"
    assert stamp(second, berlin) == "Sun 2026-10-25 02:30 CET"
    assert stamp(second + 3600, berlin) == "Sun 2026-10-25 03:30"


def test_a_closed_pipe_ends_the_list_quietly(tmp_path: Path) -> None:
    """`roost conversations list | head -1`: the reader takes one line and goes; roost stops
    without a traceback, with the status a shell gives a command SIGPIPE ended (141)."""
    import fcntl

    config, state = berlin_config(tmp_path)
    with Store.open(state) as store:
        for n in range(120):  # about 11 KB of lines: more than the pipe and stdout's buffer
            store.create_conversation(f"telegram:{3000000 + n}", time.time())
    reading, writing = os.pipe()
    # The smallest pipe (one page), so that the lines do not all fit in it: roost is still
    # writing when the reader goes, as with a big state directory and a 64 KB pipe.
    fcntl.fcntl(writing, fcntl.F_SETPIPE_SZ, 4096)
    env = {**os.environ, "TZ": "UTC"}
    process = subprocess.Popen(
        [sys.executable, "-m", "daemon", "conversations", "list", "--config", str(config)],
        stdout=writing, stderr=subprocess.PIPE, env=env)
    os.close(writing)
    line = b""
    while not line.endswith(b"\n"):  # one line, as head -1 reads it, then close
        chunk = os.read(reading, 1)
        assert chunk, "roost wrote no line"
        line += chunk
    os.close(reading)
    _, stderr = process.communicate(timeout=30)
    assert line.startswith(b"ID ")
    assert stderr == b""
    assert process.returncode == 141


async def test_doctor_names_the_zone_once_and_its_times_are_in_it(tmp_path: Path) -> None:
    from tests.daemon.cli.test_doctor import doctor

    config, _ = berlin_config(tmp_path)
    config.write_text(config.read_text() + '[model]\nhost = "http://127.0.0.1:9"\n'
                      '[[automations]]\nname = "morning"\nschedule = "0 7 * * *"\n'
                      'prompt = "the weather"\ndeliver = ["log"]\n')
    report = (await doctor(config))[1]
    assert f"ok   timezone: {ZONE} (daemon.timezone)" in report
    assert report.count(ZONE) == 1
    (line,) = [line for line in report.splitlines() if "automation morning:" in line]
    assert line.endswith(" 07:00")  # no CET or CEST: the zone was said once, above
