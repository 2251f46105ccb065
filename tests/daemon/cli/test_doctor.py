"""`roost doctor` as its owner runs it: one line per check, a fix for each failure, exit 1."""

from __future__ import annotations

import asyncio
import io
import json
import os
import socket
import sys
from pathlib import Path

import pytest

from daemon.cli import doctor as doctor_module
from daemon.core.config import Settings, load_settings
from daemon.core.errors import ConfigError
from daemon.store import Store
from tests.conftest import SettingsFactory
from tests.fakes.graph import API_VERSION, PHONE_NUMBER_ID, WABA_ID, FakeGraph, Template
from tests.fakes.ollama import FakeOllama
from tests.fakes.telegram import FakeTelegram
from tests.fakes.transcription import FakeTranscriber

SECRET = "s3cret_-X"
HOOK_URL = "https://bot.example.org/webhooks/telegram"


async def doctor(config: Path, *args: str, **env: str) -> tuple[int, str]:
    """`roost doctor [--json] --config <config>` with `env` for ROOST_*, as `roost` runs it
    once the config is read (daemon/cli/main.py), in this process: a process per check cost a
    second of imports each. The command itself, exit status and all, is run as a process in
    the tests of the config error below and in tests/daemon/cli/test_cli.py."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ROOST_")}
    as_json = "--json" in args
    try:
        settings = load_settings(config, {**clean, **env}, require_secrets=False)
    except ConfigError as exc:
        report = doctor_module.config_error_report(exc) if as_json else f"config error: {exc}"
        return ConfigError.exit_status, report
    out = io.StringIO()
    status = await doctor_module.run_doctor(settings, as_json=as_json, out=out)
    return status, out.getvalue()


def write_config(tmp_path: Path, ollama: str, telegram: FakeTelegram | None = None,
                 mode: str = "webhook") -> Path:
    config = tmp_path / "roost.toml"
    text = f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n[model]\nhost = "{ollama}"\n'
    if telegram is not None:
        text += (f'[telegram]\nenabled = true\nmode = "{mode}"\nwebhook_url = "{HOOK_URL}"\n'
                 f'api_base = "{telegram.api_base}"\nfile_base = "{telegram.file_base}"\n')
    config.write_text(text)
    return config


def failed(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("FAIL")]


async def registered(fake: FakeTelegram) -> None:
    fake.webhook = {"url": HOOK_URL, "secret_token": SECRET}


async def test_all_well_is_exit_0_and_json_lists_every_check(
    tmp_path: Path, fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    await registered(fake_telegram)
    config = write_config(tmp_path, fake_ollama.url, fake_telegram)
    status, out = await doctor(config, ROOST_TELEGRAM_TOKEN=fake_telegram.token,
                               ROOST_TELEGRAM_SECRET=SECRET)
    assert status == 0, out
    assert failed(out) == []
    assert all(line.startswith(("ok  ", "FAIL")) for line in out.splitlines())
    assert "context length 32768" in out and "@roost_test_bot" in out
    status, out = await doctor(config, "--json", ROOST_TELEGRAM_TOKEN=fake_telegram.token,
                               ROOST_TELEGRAM_SECRET=SECRET)
    report = json.loads(out)
    assert status == 0 and report["ok"] is True
    names = {c["name"] for c in report["checks"]}
    assert {"config", "state directory", "state directory privacy", "store files", "ollama",
            "model", "model tools", "model vision", "model thinking", "loaded runner",
            "telegram getMe", "telegram webhook", "telegram pending updates"} <= names


async def test_a_refused_token_fails(
    tmp_path: Path, fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    config = write_config(tmp_path, fake_ollama.url, fake_telegram)
    status, out = await doctor(config, ROOST_TELEGRAM_TOKEN="999:WRONG",
                               ROOST_TELEGRAM_SECRET=SECRET)
    assert status == 1
    assert failed(out) == ["FAIL telegram getMe: Telegram refused the bot token -> fix: check "
                           "ROOST_TELEGRAM_TOKEN with @BotFather"]
    assert "999:WRONG" not in out


async def test_a_malformed_token_fails_without_asking_telegram(
    tmp_path: Path, fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    await registered(fake_telegram)
    config = write_config(tmp_path, fake_ollama.url, fake_telegram)
    quoted = f'"{fake_telegram.token}"'
    status, out = await doctor(config, ROOST_TELEGRAM_TOKEN=quoted, ROOST_TELEGRAM_SECRET=SECRET)
    assert status == 1
    assert "FAIL config telegram.enabled: ROOST_TELEGRAM_TOKEN does not look like a bot token" \
        in out, out
    assert fake_telegram.token not in out and fake_telegram.calls == []


async def test_a_missing_webhook_secret_fails(
    tmp_path: Path, fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    await registered(fake_telegram)
    config = write_config(tmp_path, fake_ollama.url, fake_telegram)
    status, out = await doctor(config, ROOST_TELEGRAM_TOKEN=fake_telegram.token)
    assert status == 1
    line, channels = failed(out)
    assert line.startswith("FAIL config telegram.secret: webhook mode needs a secret")
    assert channels.startswith("FAIL channels: telegram (cannot start until")


async def test_a_wrong_webhook_url_and_a_delivery_error_fail(
    tmp_path: Path, fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    fake_telegram.webhook = {"url": "https://old.example.org/hook"}
    fake_telegram.webhook_error = "Connection timed out"
    config = write_config(tmp_path, fake_ollama.url, fake_telegram)
    status, out = await doctor(config, ROOST_TELEGRAM_TOKEN=fake_telegram.token,
                               ROOST_TELEGRAM_SECRET=SECRET)
    assert status == 1
    lines = failed(out)
    assert lines[0].startswith("FAIL telegram webhook: Telegram has https://old.example.org/hook,"
                               f" the config says {HOOK_URL}")
    assert lines[1].startswith("FAIL telegram last error: Connection timed out -> fix:")
    assert len(lines) == 2


async def test_ollama_down_fails_with_how_to_start_it(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9")
    status, out = await doctor(config)
    assert status == 1
    [line] = failed(out)
    assert line.startswith("FAIL ollama: not reachable at http://127.0.0.1:9")
    assert "ollama serve" in line


async def test_a_runner_loaded_with_another_num_ctx_fails(
    tmp_path: Path, fake_ollama: FakeOllama
) -> None:
    fake_ollama.loaded["qwen3:4b"] = 2048  # someone else's client loaded it smaller
    config = write_config(tmp_path, fake_ollama.url)
    status, out = await doctor(config)
    assert status == 1
    [line] = failed(out)
    assert line.startswith("FAIL loaded runner: qwen3:4b is loaded with num_ctx 2048, roost asks "
                           "for 8192")


async def test_a_state_directory_readable_by_others_fails(
    tmp_path: Path, fake_ollama: FakeOllama
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o755)
    status, out = await doctor(write_config(tmp_path, fake_ollama.url))
    assert status == 1
    [line] = failed(out)
    assert "readable by others (mode 0755)" in line and f"chmod 700 {state}" in line


@pytest.mark.parametrize(("toml", "env"), [
    ('[telegram]\nenabled = true\nmode = "polling"\n', {}),  # no token
    ('[telegram]\nenabled = true\nwebhook_url = "https://x.example/h"\n',
     {"ROOST_TELEGRAM_TOKEN": "1:a"}),  # webhook without a secret
    ('[telegram]\nenabled = true\nmode = "polling"\n',
     {"ROOST_TELEGRAM_TOKEN": "1:a", "ROOST_TELEGRAM_SECRET": "has spaces"}),
    ('[whatsapp]\nenabled = true\nphone_number_id = "1"\n', {}),
    ('[telegram]\nenabled = true\nmode = "webhook"\n', {"ROOST_TELEGRAM_TOKEN": "1:a"}),  # no url
    ('[model]\nwindw = 1\n', {}),
])
async def test_doctor_fails_on_every_config_run_refuses(
    tmp_path: Path, toml: str, env: dict[str, str]
) -> None:
    # The port it would listen on is taken: the config error is still what `roost run` says
    # (before, a port it could not take came first: as a plain user, port 9 said "Permission
    # denied" and exit 71, where root took the port and went on to the config error).
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "roost.toml"
        config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
                          f'listen = "127.0.0.1:{port}"\n' + toml)
        clean = {k: v for k, v in os.environ.items() if not k.startswith("ROOST_")}
        run = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "daemon", "run", "--config", str(config),
            env={**clean, **env}, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(run.communicate(), 60)
    assert run.returncode == 78, err.decode()
    assert "config error" in err.decode() and "cannot listen" not in err.decode()
    status, out = await doctor(config, **env)
    assert status != 0, out


def no_traceback(output: str) -> None:
    assert "Traceback" not in output and 'File "' not in output, output


async def test_a_fresh_webhook_install_before_the_first_start_is_not_a_failure(
    tmp_path: Path, fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    # The README says to run doctor before the first start; roost registers the webhook at start.
    config = write_config(tmp_path, fake_ollama.url, fake_telegram)
    status, out = await doctor(config, ROOST_TELEGRAM_TOKEN=fake_telegram.token,
                               ROOST_TELEGRAM_SECRET=SECRET)
    assert status == 0, out
    assert failed(out) == []
    [line] = [line for line in out.splitlines() if "telegram webhook" in line]
    assert "roost run" in line and HOOK_URL in line


async def test_a_trailing_slash_in_api_base_is_named_with_its_fix_as_run_does(
    tmp_path: Path, fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    await registered(fake_telegram)
    config = write_config(tmp_path, fake_ollama.url, fake_telegram)
    config.write_text(config.read_text().replace(f'api_base = "{fake_telegram.api_base}"',
                                                 f'api_base = "{fake_telegram.api_base}/"'))
    status, out = await doctor(config, ROOST_TELEGRAM_TOKEN=fake_telegram.token,
                               ROOST_TELEGRAM_SECRET=SECRET)
    no_traceback(out)
    assert status == 1
    [line] = failed(out)
    # As `roost run` says it: the address, not the token; and the fix removes the slash.
    assert line.startswith("FAIL telegram getMe:") and "404 Not Found" in line, line
    assert f'telegram.api_base = "{fake_telegram.api_base}"' in line
    assert "@BotFather" not in line and fake_telegram.token not in line
    config.write_text(config.read_text().replace(f'api_base = "{fake_telegram.api_base}/"',
                                                 f'api_base = "{fake_telegram.api_base}"'))
    status, out = await doctor(config, ROOST_TELEGRAM_TOKEN=fake_telegram.token,
                               ROOST_TELEGRAM_SECRET=SECRET)
    assert status == 0, out  # the fix it named fixes it


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_file_base_nothing_answers_at_fails_since_no_photo_could_be_read(
    tmp_path: Path, fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    await registered(fake_telegram)
    config = write_config(tmp_path, fake_ollama.url, fake_telegram)
    nowhere = f"http://127.0.0.1:{closed_port()}/file/bot"
    config.write_text(config.read_text().replace(f'file_base = "{fake_telegram.file_base}"',
                                                 f'file_base = "{nowhere}"'))
    status, out = await doctor(config, ROOST_TELEGRAM_TOKEN=fake_telegram.token,
                               ROOST_TELEGRAM_SECRET=SECRET)
    no_traceback(out)
    assert status == 1
    [line] = failed(out)
    assert line.startswith("FAIL telegram files:") and nowhere in line, line
    assert "photo" in line and "telegram.file_base" in line and fake_telegram.token not in line
    # Without file_base, it follows api_base to the fake: all well.
    config.write_text(config.read_text().replace(f'file_base = "{nowhere}"\n', ""))
    status, out = await doctor(config, ROOST_TELEGRAM_TOKEN=fake_telegram.token,
                               ROOST_TELEGRAM_SECRET=SECRET)
    assert status == 0, out
    assert f"ok   telegram files: {fake_telegram.file_base}" in out


async def test_an_api_base_that_answers_404_blames_the_address_not_the_token(
    tmp_path: Path, fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    config = write_config(tmp_path, fake_ollama.url, fake_telegram)
    config.write_text(config.read_text().replace(f'api_base = "{fake_telegram.api_base}"',
                                                 f'api_base = "{fake_telegram.url}/nowhere/bot"'))
    status, out = await doctor(config, ROOST_TELEGRAM_TOKEN=fake_telegram.token,
                               ROOST_TELEGRAM_SECRET=SECRET)
    no_traceback(out)
    assert status == 1
    [line] = failed(out)
    assert line.startswith("FAIL telegram getMe:") and "telegram.api_base" in line, line
    assert "@BotFather" not in line


async def test_ollama_answering_503_is_not_told_to_start_it(
    tmp_path: Path, fake_ollama: FakeOllama
) -> None:
    fake_ollama.gateway_status = 503  # a proxy in front of Ollama whose upstream is down
    status, out = await doctor(write_config(tmp_path, fake_ollama.url))
    no_traceback(out)
    assert status == 1
    [line] = failed(out)
    assert line.startswith("FAIL ollama:") and "503" in line, line
    assert "ollama serve" not in line
    assert "busy" in line and "proxy" in line


async def test_a_model_not_pulled_lists_the_pulled_ones(
    tmp_path: Path, fake_ollama: FakeOllama
) -> None:
    config = write_config(tmp_path, fake_ollama.url)
    config.write_text(config.read_text() + 'name = "llama9:70b"\n')
    status, out = await doctor(config)
    assert status == 1
    [line] = failed(out)
    assert line.startswith("FAIL model: llama9:70b is not pulled"), line
    assert "qwen3:4b" in line and "ollama pull llama9:70b" in line


async def test_json_with_a_config_error_is_json_and_exit_78(
    tmp_path: Path, fake_ollama: FakeOllama
) -> None:
    config = write_config(tmp_path, fake_ollama.url)
    config.write_text(config.read_text() + "windw = 1\n")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "doctor", "--json", "--config", str(config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 78
    report = json.loads(out)
    assert report["ok"] is False
    [check] = report["checks"]
    assert check["ok"] is False and "model.windw" in check["detail"] and check["fix"]


async def test_a_missing_token_does_not_also_say_the_channel_is_ok(
    tmp_path: Path, fake_ollama: FakeOllama
) -> None:
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n[model]\nhost = '
                      f'"{fake_ollama.url}"\n[telegram]\nenabled = true\nmode = "polling"\n')
    status, out = await doctor(config)
    assert status == 1
    token, channels = failed(out)
    assert "ROOST_TELEGRAM_TOKEN" in token
    # No "ok" line says a channel cannot start.
    assert channels.startswith("FAIL channels:") and "cannot start" in channels, channels


async def test_a_check_that_breaks_is_one_fail_line_not_a_traceback(
    make_settings: SettingsFactory, fake_ollama: FakeOllama, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(settings: Settings) -> list[doctor_module.Check]:
        raise KeyError("schedule")  # a bug in a check, standing for any

    monkeypatch.setattr(doctor_module, "_automation_checks", broken)
    out = io.StringIO()
    status = await doctor_module.run_doctor(make_settings(model={"host": fake_ollama.url}),
                                            out=out)
    no_traceback(out.getvalue())
    assert status == 1
    [line] = failed(out.getvalue())
    assert line.startswith("FAIL automations: the check itself failed: KeyError") and "-v" in line
    assert "ok   ollama: reachable" in out.getvalue()  # the other checks still ran


async def test_no_webhook_after_roost_has_run_still_fails(
    tmp_path: Path, fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    (tmp_path / "state").mkdir(mode=0o700)
    Store.open(tmp_path / "state").close()  # roost has run here: it would have registered it
    config = write_config(tmp_path, fake_ollama.url, fake_telegram)
    status, out = await doctor(config, ROOST_TELEGRAM_TOKEN=fake_telegram.token,
                               ROOST_TELEGRAM_SECRET=SECRET)
    assert status == 1
    lines = failed(out)
    assert len(lines) == 1, out
    [line] = lines
    assert line.startswith(f"FAIL telegram webhook: Telegram has no webhook, the config says "
                           f"{HOOK_URL} -> fix: start `roost run`"), line


async def test_the_voice_backend_is_checked_with_a_test_recording_and_a_fix_when_it_fails(
        tmp_path: Path, fake_ollama: FakeOllama) -> None:
    async with FakeTranscriber(key="sk-voice") as whisper:
        config = write_config(tmp_path, fake_ollama.url)
        config.write_text(config.read_text()
                          + f'[voice]\nbackend = "http"\nurl = "{whisper.url}"\n')
        status, out = await doctor(config, ROOST_VOICE_KEY="sk-voice")
        assert status == 0, out
        assert f"ok   voice (http): {whisper.url} transcribed a test recording" in out
        status, out = await doctor(config)  # no key
        (line,) = failed(out)
        assert line.startswith("FAIL voice (http): the transcription server at")
        assert "answered 401" in line and "-> fix: set ROOST_VOICE_KEY" in line
    status, out = await doctor(config, ROOST_VOICE_KEY="sk-voice")  # the server is gone
    (line,) = failed(out)
    assert "is not answering -> fix: start the transcription server" in line
    assert "sk-voice" not in out


async def test_faster_whisper_that_cannot_load_is_a_doctor_failure_with_the_fix(
        tmp_path: Path, fake_ollama: FakeOllama) -> None:
    config = write_config(tmp_path, fake_ollama.url)
    config.write_text(config.read_text() + '[voice]\nbackend = "faster-whisper"\n'
                      f'model = "{tmp_path / "no-such-model"}"\ndevice = "cpu"\n')
    status, out = await doctor(config)
    assert status == 1
    (line,) = failed(out)
    assert line.startswith("FAIL voice (faster-whisper): ")
    assert ("faster-whisper is not installed -> fix: install the extra: pip install "
            "'roost[voice]'" in line) or "could not load the model" in line, line


@pytest.mark.parametrize(("template", "problem"), [
    (None, "no such template in en_US"),
    (Template("report_ready", status="PENDING"), "status PENDING"),
    (Template("report_ready", body="Ready: {{1}}"), "its body has 1 parameters; roost fills 0"),
    (Template("report_ready"), ""),
])
async def test_the_whatsapp_template_is_checked_approved_with_its_parameters(
        tmp_path: Path, fake_ollama: FakeOllama, template: Template | None,
        problem: str) -> None:
    async with FakeGraph() as graph:
        graph.templates.extend([template] if template else [])
        config = write_config(tmp_path, fake_ollama.url)
        config.write_text(config.read_text() + (
            f'[whatsapp]\nenabled = true\nphone_number_id = "{PHONE_NUMBER_ID}"\n'
            f'api_base = "{graph.url}"\napi_version = "{API_VERSION}"\n'
            f'template = "report_ready"\nbusiness_account_id = "{WABA_ID}"\n'))
        status, out = await doctor(config, ROOST_WHATSAPP_TOKEN=graph.token,
                                   ROOST_WHATSAPP_APP_SECRET="x", ROOST_WHATSAPP_VERIFY_TOKEN="y")
    line = next(line for line in out.splitlines() if "whatsapp template report_ready" in line)
    if problem:
        assert line.startswith("FAIL") and problem in line and status == 1
    else:
        assert line.startswith("ok") and "approved, en_US" in line
