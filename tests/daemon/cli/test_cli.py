"""The `roost` command as a user runs it: exit statuses, help, conversations, `python -m daemon`."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from daemon.cli.main import build_parser
from daemon.core.conversations import SummaryState
from daemon.store import Store

README = Path(__file__).resolve().parents[3] / "README.md"
ROOST = Path(sys.executable).parent / "roost"


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "daemon", *args], capture_output=True,
                          text=True, timeout=30, cwd=cwd)


@pytest.mark.parametrize(
    ("command", "toml", "key"),
    [
        ("run", "[model]\nwindw = 8192\n", "model.windw"),
        ("chat", "[model]\nwindow = \"big\"\n", "model.window"),
        ("doctor", "[daemon]\nidle_rotation = \"3 hours\"\n", "daemon.idle_rotation"),
        ("run", "[daemon]\ntimezone = \"Mars/Olympus\"\n", "daemon.timezone"),
        ("chat", "[nonsense]\nx = 1\n", "nonsense"),
    ],
)
def test_config_errors_name_the_key_and_file_and_exit_78(
    tmp_path: Path, toml: str, key: str, command: str
) -> None:
    config = tmp_path / "roost.toml"
    config.write_text(toml)
    result = run(command, "--config", str(config))
    assert result.returncode == 78
    assert key in result.stderr and str(config) in result.stderr
    assert result.stderr.count("\n") == 1  # one line, no traceback


def test_the_roost_script_and_python_m_daemon_agree() -> None:
    if not ROOST.exists():
        pytest.skip("the roost console script is not installed next to this interpreter")
    script = subprocess.run([str(ROOST), "--help"], capture_output=True, text=True, timeout=30)
    module = run("--help")
    assert script.returncode == module.returncode == 0
    assert script.stdout == module.stdout


def test_every_command_is_documented_in_the_readme() -> None:
    readme = README.read_text("utf-8")
    documented = set(re.findall(r"^\| `roost (\w+)", readme, re.MULTILINE))
    parser = build_parser()
    actions = [a for a in parser._subparsers._group_actions]  # type: ignore[union-attr]
    commands = {name for action in actions for name in action.choices}  # type: ignore[union-attr]
    assert documented == commands


def test_conversations_list_show_export(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with Store.open(state) as store:
        conversation = store.create_conversation("console:local", time.time())
        store.append_message(conversation.id, "user", "Grüße, ünïcödé ✓", created=time.time())
        store.append_message(conversation.id, "assistant", "line one\nline two",
                             created=time.time())
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{state}"\n')
    listed = run("conversations", "list", "--config", str(config))
    assert listed.returncode == 0
    assert conversation.id in listed.stdout and "2 messages" in listed.stdout
    shown = run("conversations", "show", conversation.id[:12], "--config", str(config))
    assert "Grüße, ünïcödé ✓" in shown.stdout and "line one\nline two" in shown.stdout
    exported = run("conversations", "export", conversation.id, "--config", str(config))
    doc = json.loads(exported.stdout)
    assert [m["content"] for m in doc["messages"]] == ["Grüße, ünïcödé ✓", "line one\nline two"]
    missing = run("conversations", "show", "ZZZZ", "--config", str(config))
    assert missing.returncode == 1 and "no conversation matches" in missing.stderr


def test_export_carries_the_summary_the_store_holds(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with Store.open(state) as store:
        conversation = store.create_conversation("telegram:1111111", time.time())
        store.append_message(conversation.id, "user", "remember the plan", created=time.time())
        store.save_summary(conversation.id, SummaryState(
            summary="The user is planning a trip to Lisbon.", user_notes="- vegetarian",
            through_seq=1, fold_count=8, folded_at=time.time()))
        store.save_conversation(conversation.archived("idle"))
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{state}"\n')
    exported = run("conversations", "export", conversation.id, "--config", str(config))
    assert exported.returncode == 0, exported.stderr
    summary = json.loads(exported.stdout)["summary"]
    assert summary["fold_count"] == 8
    assert summary["summary"] == "The user is planning a trip to Lisbon."
    assert summary["user_notes"] == "- vegetarian"


def test_a_second_daemon_on_the_same_state_directory_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{state}"\nlisten = "127.0.0.1:0"\n'
                      '[model]\nhost = "http://127.0.0.1:9"\n')
    with Store.open(state):
        result = run("run", "--config", str(config))
    assert result.returncode == 73
    assert "another roost process is using" in result.stderr


def test_a_port_in_use_is_refused_with_the_setting_that_moves_it(tmp_path: Path) -> None:
    config = tmp_path / "roost.toml"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
                          f'listen = "127.0.0.1:{port}"\n[model]\nhost = "http://127.0.0.1:9"\n')
        result = run("run", "--config", str(config))
    assert result.returncode == 71  # EX_OSERR
    assert f"127.0.0.1:{port}" in result.stderr and "daemon.listen" in result.stderr
    assert str(config) in result.stderr  # where to change it


def test_doctor_reports_an_unreachable_ollama(tmp_path: Path) -> None:
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n[model]\nhost = "http://127.0.0.1:9"\n')
    result = run("doctor", "--config", str(config))
    assert result.returncode == 1
    assert "ollama serve" in result.stdout and "(writable)" in result.stdout


def _config_with_state(tmp_path: Path, extra: str = "") -> tuple[Path, Path]:
    state = tmp_path / "state"
    config = tmp_path / "elsewhere.toml"
    config.write_text(f'[daemon]\nstate_dir = "{state}"\n[model]\nhost = "http://127.0.0.1:9"\n'
                      + extra)
    return config, state


@pytest.mark.parametrize("where", ["before", "between", "after"])
def test_config_is_honoured_wherever_it_stands(tmp_path: Path, where: str) -> None:
    config, state = _config_with_state(tmp_path)
    with Store.open(state) as store:
        conversation = store.create_conversation("console:local", time.time())
    option = ["--config", str(config)]
    args = {"before": [*option, "conversations", "list"],
            "between": ["conversations", *option, "list"],
            "after": ["conversations", "list", *option]}[where]
    # Run from a folder whose own roost.toml points elsewhere: X must win everywhere.
    decoy = tmp_path / "cwd"
    decoy.mkdir()
    (decoy / "roost.toml").write_text(f'[daemon]\nstate_dir = "{tmp_path / "decoy"}"\n')
    listed = run(*args, cwd=decoy)
    assert listed.returncode == 0, listed.stderr
    assert conversation.id in listed.stdout


def test_config_before_doctor_is_read(tmp_path: Path) -> None:
    config, state = _config_with_state(tmp_path)
    result = run("--config", str(config), "doctor")
    assert result.returncode == 1  # Ollama at port 9 is down, so doctor finds a problem
    assert str(config) in result.stdout and str(state) in result.stdout


def test_a_fresh_install_lists_no_conversations(tmp_path: Path) -> None:
    config, state = _config_with_state(tmp_path)
    listed = run("conversations", "list", "--config", str(config))
    assert (listed.returncode, listed.stdout, listed.stderr) == (0, "", "")
    state.mkdir()  # e.g. made by doctor or by systemd's StateDirectory=, still without state
    assert run("conversations", "list", "--config", str(config)).returncode == 0
    shown = run("conversations", "show", "01ABC", "--config", str(config))
    assert shown.returncode == 1 and "no conversation matches" in shown.stderr


TELEGRAM_WITHOUT_TOKEN = ('[telegram]\nenabled = true\nmode = "polling"\n'
                          'api_base = "http://127.0.0.1:9/bot"\n')


def test_read_only_commands_need_no_channel_secrets(tmp_path: Path) -> None:
    config, _ = _config_with_state(tmp_path, TELEGRAM_WITHOUT_TOKEN)
    listed = run("conversations", "list", "--config", str(config))
    assert listed.returncode == 0, listed.stderr
    doctor = run("doctor", "--config", str(config))
    assert doctor.returncode == 1  # a failed check, not a config error
    assert "ROOST_TELEGRAM_TOKEN" in doctor.stdout
    chat = subprocess.run([sys.executable, "-m", "daemon", "chat", "--config", str(config)],
                          input="", capture_output=True, text=True, timeout=30)
    assert chat.returncode == 0  # past the config: it warns of the unreachable Ollama
    assert "cannot reach Ollama" in chat.stderr
    refused = run("run", "--config", str(config))
    assert refused.returncode == 78 and "ROOST_TELEGRAM_TOKEN" in refused.stderr


def test_usage_errors_exit_2_and_every_exit_status_is_in_the_readme(tmp_path: Path) -> None:
    assert run().returncode == 2
    assert run("nonsense").returncode == 2
    assert run("conversations").returncode == 2
    readme = README.read_text("utf-8")
    listed = re.search(r"^Exit statuses:(.*?)\n\n", readme, re.MULTILINE | re.DOTALL)
    assert listed is not None
    statuses = {int(n) for n in re.findall(r"\b(\d+) ", listed.group(1))}
    assert statuses == {0, 1, 2, 69, 71, 73, 78, 141}


def test_show_a_chat_shows_its_active_conversation_and_lists_have_a_header(
    tmp_path: Path
) -> None:
    state = tmp_path / "state"
    with Store.open(state) as store:
        old = store.create_conversation("telegram:1111111", time.time() - 7200)
        store.append_message(old.id, "user", "the old talk", created=time.time() - 7200)
        store.save_conversation(old.archived("idle"))
        new = store.create_conversation("telegram:1111111", time.time())
        store.append_message(new.id, "user", "the talk of now", created=time.time())
        other = store.create_conversation("telegram:2222222", time.time())
        store.append_message(other.id, "user", "someone else", created=time.time())
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{state}"\n')
    shown = run("conversations", "show", "telegram:1111111", "--config", str(config))
    assert shown.returncode == 0, shown.stderr
    assert "the talk of now" in shown.stdout
    assert "the old talk" not in shown.stdout and "someone else" not in shown.stdout
    exported = run("conversations", "export", "telegram:2222222", "--config", str(config))
    assert json.loads(exported.stdout)["id"] == other.id
    missing = run("conversations", "show", "telegram:3333333", "--config", str(config))
    assert missing.returncode == 1 and "no conversation matches" in missing.stderr
    header, *rows = run("conversations", "list", "--config", str(config)).stdout.splitlines()
    assert header.split()[:6] == ["ID", "CHAT", "STATUS", "MESSAGES", "LAST", "ACTIVE"]
    assert re.fullmatch(r"\(\S+\)", header.split()[6])  # the zone of the times, said once
    assert len(rows) == 3 and all(row.index("telegram:") == header.index("CHAT")
                                  for row in rows)


@pytest.mark.parametrize("command", ["run", "chat"])
def test_run_and_chat_help_say_what_they_do(command: str) -> None:
    helped = run(command, "--help")
    assert helped.returncode == 0
    description = helped.stdout.split("\n\n")[1]  # after the usage, before the options
    assert not description.startswith("options:") and len(description.split()) > 8
