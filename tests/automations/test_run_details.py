"""The small things a user of automations notices: token counts, `list`, `remind`, schedules
that never run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from automations.commands import list_automations
from tests.automations.conftest import DaemonFactory, at, automation
from tests.fakes.ollama import FakeOllama, Reply


def roost(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "daemon", *args], capture_output=True,
                          text=True, timeout=30, env={**os.environ, **env})


async def test_a_run_of_several_model_calls_records_the_prompt_tokens_of_all(
    make_daemon: DaemonFactory, fake_ollama: FakeOllama
) -> None:
    daemon = make_daemon(automation("brief", "0 9 * * *"))
    automations = await daemon.start()
    search = {"function": {"name": "memory_search", "arguments": {"query": "plants"}}}
    fake_ollama.script(Reply(tool_calls=[search]), Reply(tool_calls=[search]), "All quiet.")
    daemon.clock.set(at(2026, 12, 1, 9, 0, 5))
    await automations.fire("brief")
    requests = fake_ollama.chat_requests
    assert len(requests) == 3
    sent = [fake_ollama.count_tokens(r["messages"], r.get("tools")) for r in requests]
    assert sent[0] < sent[1] < sent[2]
    (run,) = automations.state.runs("brief")
    assert run["status"] == "ok" and run["prompt_tokens"] == sum(sent)


async def test_list_shows_the_last_scheduled_outcome_not_a_manual_skip_zone_said_once(
    make_daemon: DaemonFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    daemon = make_daemon(automation("brief", "0 * * * *"))
    automations = await daemon.start()
    daemon.clock.set(at(2026, 12, 1, 10, 0, 1))
    await automations.fire("brief")
    # A manual run meeting a run still going is skipped; the scheduled runs were fine.
    automations.runner._running.add("brief")
    await automations.runner.run(daemon.settings.automations[0], None, deliver=False)
    automations.runner._running.discard("brief")
    capsys.readouterr()
    list_automations(daemon.settings)
    out = capsys.readouterr().out
    # The zone once, at the top; not at every time (10:00 happens once a day in December).
    assert out.startswith(f"Times in {daemon.settings.daemon.tz.key}.\n")
    assert "last: ok Tue 2026-12-01 10:00 (" in out
    assert "manual: skipped Tue 2026-12-01 10:00: the previous run was still going" in out
    assert "CET" not in out


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "roost.toml"
    path.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
                    'timezone = "Europe/Berlin"\n'
                    '[telegram]\nenabled = true\nmode = "polling"\nallow = [1111111]\n')
    return path


def remind(config: Path, when: str, to: str = "telegram:1111111"
           ) -> subprocess.CompletedProcess[str]:
    return roost("automations", "remind", when, "water the plants", "--to", to,
                 "--config", str(config), ROOST_TELEGRAM_TOKEN="123:abc")


def test_remind_far_in_the_future_is_a_clear_error(config: Path) -> None:
    result = remind(config, "in 99999999d")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "too far in the future" in result.stderr


def test_remind_in_the_past_says_so(config: Path) -> None:
    result = remind(config, "in -5m")
    assert result.returncode == 2 and "in the past" in result.stderr


def test_remind_refuses_a_chat_roost_does_not_serve(config: Path) -> None:
    stranger = remind(config, "in 2h", "telegram:2222222")
    assert stranger.returncode == 2
    assert "telegram:2222222" in stranger.stderr and "telegram.allow" in stranger.stderr
    whatsapp = remind(config, "in 2h", "whatsapp:972544401243")
    assert whatsapp.returncode == 2 and "WhatsApp is not enabled" in whatsapp.stderr
    allowed = remind(config, "in 2h")
    assert allowed.returncode == 0, allowed.stderr
    assert "(Europe/Berlin) to telegram:1111111" in allowed.stdout
    # A person of `[people]` is served without the allow list.
    config.write_text(config.read_text() + '[people.omar]\nchats = ["telegram:2222222"]\n')
    listed = remind(config, "in 2h", "telegram:2222222")
    assert listed.returncode == 0, listed.stderr


def test_a_schedule_that_never_runs_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "roost.toml"
    path.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n[[automations]]\nname = "never"\n'
                    'schedule = "0 0 30 2 *"\nprompt = "Hi"\ndeliver = ["log"]\n')
    result = roost("automations", "list", "--config", str(path))
    assert result.returncode == 78
    assert "automations[0].schedule" in result.stderr and "never runs" in result.stderr
    # 29 February comes every four years; the 30th with a weekday runs on that weekday.
    for schedule in ("0 0 29 2 *", "0 0 30 2 1"):
        path.write_text(path.read_text().replace('"0 0 30 2 *"', f'"{schedule}"')
                        .replace('"0 0 29 2 *"', f'"{schedule}"'))
        assert roost("automations", "list", "--config", str(path)).returncode == 0


def test_remind_takes_the_rest_of_the_line_unquoted(config: Path) -> None:
    for words in (["in", "20m", "call", "the", "plumber"], ["in 20m", "call the plumber"],
                  ["tomorrow", "09:00", "call", "the", "plumber"]):
        added = roost("automations", "remind", *words, "--to", "telegram:1111111",
                      "--config", str(config), ROOST_TELEGRAM_TOKEN="123:abc")
        assert added.returncode == 0, (words, added.stderr)
    unread = roost("automations", "remind", "at", "noon", "call", "--to", "telegram:1111111",
                   "--config", str(config), ROOST_TELEGRAM_TOKEN="123:abc")
    assert unread.returncode == 2 and "cannot read 'at'" in unread.stderr
    listed = roost("automations", "list", "--config", str(config),
                   ROOST_TELEGRAM_TOKEN="123:abc").stdout
    assert listed.count("-> telegram:1111111: call the plumber\n") == 3, listed
