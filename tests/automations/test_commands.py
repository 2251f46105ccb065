"""`roost automations list` and `remind` as a user runs them."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from pathlib import Path

from tests.automations.conftest import DaemonFactory, automation
from tests.daemon.cli.test_doctor import doctor
from tests.fakes.ollama import FakeOllama, Reply


def roost(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "daemon", *args], capture_output=True,
                          text=True, timeout=30)


def test_list_shows_next_run_and_remind_adds_a_pending_reminder(tmp_path: Path) -> None:
    config = tmp_path / "roost.toml"
    # Reminders go only to chats roost serves (issue 18): Telegram on, user 1 allowed.
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\ntimezone = "UTC"\n'
                      '[telegram]\nenabled = true\nmode = "polling"\nallow = [1]\n'
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
    topic = roost("automations", "remind", "in 3h", "stand-up notes", "--to",
                  "telegram:-1001234:42", "--config", str(config))  # a forum topic
    assert topic.returncode == 0, topic.stderr
    assert "-> telegram:-1001234:42" in roost("automations", "list", "--config",
                                               str(config)).stdout
    unknown = roost("automations", "run", "daily", "--config", str(config))
    assert unknown.returncode == 1 and "no automation named 'daily'" in unknown.stderr


async def test_run_while_the_daemon_runs_is_run_by_the_daemon_and_printed(
    tmp_path: Path, make_daemon: DaemonFactory, fake_ollama: FakeOllama
) -> None:
    daemon = make_daemon(automation("brief", "0 7 * * *"))
    automations = await daemon.start()
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{daemon.settings.daemon.state_dir}"\n'
                      f'[model]\nhost = "{fake_ollama.url}"\n'
                      '[[automations]]\nname = "brief"\nschedule = "0 7 * * *"\n'
                      'prompt = "Anything new on the things I follow?"\n'
                      'deliver = ["console:local"]\n')
    command = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "automations", "run", "brief", "--config", str(config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(30):
        while command.returncode is None:
            await automations.scan()  # what the daemon's scan job does every few seconds
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.2):
                    await command.wait()
    out, err = await command.communicate()
    assert command.returncode == 0, err
    assert out.decode().strip() == "echo: Anything new on the things I follow?"
    assert daemon.replies() == []  # printed, not delivered
    (run,) = automations.state.runs("brief")
    assert run["manual"] and run["status"] == "ok"


async def test_run_while_the_daemon_runs_after_earlier_runs_is_printed_once_it_is_done(
    tmp_path: Path, make_daemon: DaemonFactory, fake_ollama: FakeOllama
) -> None:
    """Once automations.json exists, the command's first look at it must not be its last: the
    daemon's run (here a model that takes seconds) is recorded while the command waits."""
    daemon = make_daemon(automation("brief", "0 7 * * *"))
    automations = await daemon.start()
    await automations.runner.run(daemon.settings.automations[0], None, deliver=False)
    assert (daemon.settings.daemon.state_dir / "automations.json").exists()
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{daemon.settings.daemon.state_dir}"\n'
                      f'[model]\nhost = "{fake_ollama.url}"\n'
                      '[[automations]]\nname = "brief"\nschedule = "0 7 * * *"\n'
                      'prompt = "Anything new on the things I follow?"\n'
                      'deliver = ["console:local"]\ntimeout = "1m"\n')
    fake_ollama.script(Reply(content="Two new things.", delay=2.0))
    command = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "automations", "run", "brief", "--config", str(config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:  # well under the command's own deadline (1 min + the scan interval + 30 s)
        async with asyncio.timeout(45):
            while command.returncode is None:
                await automations.scan()  # what the daemon's scan job does every few seconds
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.2):
                        await command.wait()
    finally:
        if command.returncode is None:
            command.kill()
    out, err = await command.communicate()
    assert command.returncode == 0, err
    assert out.decode().strip() == "Two new things."
    assert [r["status"] for r in automations.state.runs("brief")] == ["ok", "ok"]


async def test_doctor_warns_about_an_automation_on_a_second_model(
    tmp_path: Path, fake_ollama: FakeOllama
) -> None:
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
                      f'[model]\nhost = "{fake_ollama.url}"\n'
                      '[[automations]]\nname = "big"\nschedule = "every 1h"\nprompt = "Hi"\n'
                      'deliver = ["log"]\nmodel = "llama3.1:70b"\n'
                      '[[automations]]\nname = "off"\nschedule = "0 9 * * 0"\nprompt = "Hi"\n'
                      'deliver = ["log"]\nenabled = false\n')
    report = (await doctor(config))[1]
    assert "ok   automation big: next run " in report
    assert "ok   automation big model: uses llama3.1:70b, not " in report
    assert "ok   automation off: disabled" in report
    listed = roost("automations", "list", "--config", str(config))
    assert "next: disabled" in listed.stdout


async def test_run_through_a_daemon_that_goes_away_exits_saying_what_happens(
    tmp_path: Path, make_daemon: DaemonFactory, fake_ollama: FakeOllama
) -> None:
    """The daemon takes the request, starts the run and dies: the command used to wait for the
    timeout plus 40 s (10 min 40 s by default); it notices the daemon is gone within seconds."""
    daemon = make_daemon(automation("brief", "0 7 * * *"))
    automations = await daemon.start()
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{daemon.settings.daemon.state_dir}"\n'
                      f'[model]\nhost = "{fake_ollama.url}"\n'
                      '[[automations]]\nname = "brief"\nschedule = "0 7 * * *"\n'
                      'prompt = "Anything new?"\ndeliver = ["console:local"]\n')
    fake_ollama.script(Reply(content="Too late.", delay=30.0))
    command = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "automations", "run", "brief", "--config", str(config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(20):  # the run is taken and recorded as running
            while not any(r["status"] == "running" for r in automations.state.runs("brief")):
                await automations.scan()
                await asyncio.sleep(0.2)
        await daemon.stop()  # its lock on the state directory goes, as when it is killed
        async with asyncio.timeout(20):
            await command.wait()
    finally:
        if command.returncode is None:
            command.kill()
    _, err = await command.communicate()
    assert command.returncode == 1
    assert "roost stopped during the run of brief" in err.decode()
    assert "roost automations run brief" in err.decode()  # what to do about it
