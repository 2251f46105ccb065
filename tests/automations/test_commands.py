"""`roost automations list` and `remind` as a user runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def roost(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "daemon", *args], capture_output=True,
                          text=True, timeout=30)


def test_list_shows_next_run_and_remind_adds_a_pending_reminder(tmp_path: Path) -> None:
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\ntimezone = "UTC"\n'
                      '[[automations]]\nname = "weekly"\nschedule = "0 9 * * 0"\n'
                      'prompt = "Hi"\ndeliver = ["telegram:1"]\n')
    listed = roost("automations", "list", "--config", str(config))
    assert listed.returncode == 0, listed.stderr
    assert "weekly" in listed.stdout and "next: Sun" in listed.stdout
    assert "never run" in listed.stdout
    added = roost("automations", "remind", "in 2h", "water the plants", "--to",
                  "telegram:1", "--config", str(config))
    assert added.returncode == 0, added.stderr
    listed = roost("automations", "list", "--config", str(config))
    assert "water the plants" in listed.stdout and "-> telegram:1" in listed.stdout
    bad = roost("automations", "remind", "someday", "x", "--to", "telegram:1",
                "--config", str(config))
    assert bad.returncode == 2 and "tomorrow 09:00" in bad.stderr
    unknown = roost("automations", "run", "daily", "--config", str(config))
    assert unknown.returncode == 1 and "no automation named 'daily'" in unknown.stderr
