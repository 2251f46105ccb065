"""`roost init` as a new owner runs it: against the fake Ollama and the fake Bot API, typed
answers on stdin or flags alone, and each way it can go wrong."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import signal
import socket
import stat
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from daemon.cli.init import run_init
from daemon.cli.main import build_parser
from daemon.core.config import load_settings
from daemon.intake.pairing import PairingBook
from tests.fakes.graph import PHONE_NUMBER_ID, FakeGraph
from tests.fakes.ollama import FakeModel, FakeOllama
from tests.fakes.telegram import FakeTelegram

OWNER = 4242424


def start_update(user: int = OWNER, text: str = "/start",
                 chat_type: str = "private") -> dict[str, Any]:
    chat: dict[str, Any] = {"id": user, "type": chat_type, "first_name": "Ann"}
    if chat_type != "private":
        chat = {"id": -100, "type": chat_type, "title": "A group"}
    return {"message": {"message_id": 1, "date": int(time.time()), "chat": chat,
                        "from": {"id": user, "is_bot": False, "first_name": "Ann"},
                        "text": text}}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """A user's environment with its own home, config and state folders under tmp_path."""
    return {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "home/.config"),
            "STATE_DIRECTORY": str(tmp_path / "state"), "PATH": os.environ.get("PATH", "")}


def config_of(home: dict[str, str]) -> Path:
    return Path(home["XDG_CONFIG_HOME"]) / "roost" / "roost.toml"


def credentials_of(home: dict[str, str]) -> Path:
    return Path(home["XDG_CONFIG_HOME"]) / "roost" / "credentials"


async def init_process(home: dict[str, str], *args: str, **env: str) -> tuple[int, str, str]:
    # Every place named: the suite may run as root, where the defaults are /etc and /var/lib.
    places = ["--config", str(config_of(home)), "--credentials-dir", str(credentials_of(home)),
              "--state-dir", home["STATE_DIRECTORY"]]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "init", *places, *args, env={**home, **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL)
    out, err = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def flags(ollama: FakeOllama, telegram: FakeTelegram, *more: str) -> list[str]:
    return ["--non-interactive", "--ollama-url", ollama.url, "--telegram-api-base",
            telegram.api_base, "--no-service", "--pair-timeout", "30", *more]


async def test_non_interactive_writes_a_private_config_and_secrets_and_pairs_the_owner(
    home: dict[str, str], fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    fake_telegram.queue_update(start_update())
    status, out, err = await init_process(home, *flags(fake_ollama, fake_telegram),
                                          ROOST_TELEGRAM_TOKEN=fake_telegram.token)
    assert status == 0, err
    assert "@roost_test_bot" in out and "send /start to @roost_test_bot" in out.replace(
        "Now send", "send")
    config, credentials = config_of(home), credentials_of(home)
    assert mode(config) == 0o600 and mode(credentials) == 0o700
    assert mode(credentials / "ROOST_TELEGRAM_TOKEN") == 0o600
    assert (credentials / "ROOST_TELEGRAM_TOKEN").read_text() == fake_telegram.token
    assert fake_telegram.token not in config.read_text()  # secrets never in the config
    # What `roost run` would read, with the credentials the unit loads:
    settings = load_settings(config, env={**home, "CREDENTIALS_DIRECTORY": str(credentials)})
    telegram = settings.platforms["telegram"]
    assert telegram.enabled and telegram.mode == "polling"
    assert telegram.token == fake_telegram.token
    assert settings.model.host == fake_ollama.url and settings.model.name == "qwen3:4b"
    book = PairingBook(Path(home["STATE_DIRECTORY"]))
    assert book.is_approved("telegram", str(OWNER))
    assert [m["chat_id"] for m in fake_telegram.sent_messages] == [OWNER]
    assert f"roost run --config {config}" in out
    # The /start init read is confirmed, so the daemon does not see it again.
    assert fake_telegram._updates == []


async def test_the_command_init_prints_pastes_and_finds_the_token_without_more(
    home: dict[str, str], fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    # A fresh shell after the Quick start: the venv is not on PATH, nothing else is set.
    home = {**home, "PATH": "/usr/bin:/bin"}
    status, out, err = await init_process(home, *flags(fake_ollama, fake_telegram),
                                          "--pair-timeout", "0",
                                          ROOST_TELEGRAM_TOKEN=fake_telegram.token)
    assert status == 0, err
    lines = out.splitlines()
    printed = lines[lines.index("Run it in the foreground now (Ctrl-C stops it):") + 1].split()
    assert printed[1:] == ["run", "--config", str(config_of(home))], printed
    assert shutil.which(printed[0], path=home["PATH"]), f"{printed[0]} cannot be run"
    # The same command with doctor instead of run: the token init wrote is found.
    process = await asyncio.create_subprocess_exec(
        shutil.which(printed[0], path=home["PATH"]) or "", "doctor", *printed[2:], env=home,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    report = (await asyncio.wait_for(process.communicate(), 90))[0].decode()
    assert "ok   telegram getMe: bot @roost_test_bot" in report, report
    assert process.returncode == 0, report


async def interactive(answers: str, home: dict[str, str], *argv: str,
                      calls: list[Sequence[str]] | None = None) -> tuple[int, str]:
    args = build_parser().parse_args(["init", *argv])
    out = io.StringIO()

    def systemctl(command: Sequence[str]) -> int:
        if calls is not None:
            calls.append(list(command))
        return 0

    status = await run_init(args, stdin=io.StringIO(answers), stdout=out, env=home,
                            systemctl=systemctl, root=False)
    return status, out.getvalue()


async def test_interactive_lists_models_asks_again_for_a_refused_token_and_installs_the_unit(
    home: dict[str, str], fake_telegram: FakeTelegram
) -> None:
    models = [FakeModel("llama3.2:3b", 131072, ("completion", "tools")),
              FakeModel("gemma3:4b", 8192, ("completion", "vision"))]
    calls: list[Sequence[str]] = []
    async with FakeOllama(models=models) as ollama:
        fake_telegram.queue_update(start_update())
        # Set up Telegram? yes (the default); WhatsApp? Matrix? no; the service: yes.
        answers = "\n".join([ollama.url, "2", "", "123456:WRONG", fake_telegram.token,
                             "", "n", "n", "y"]) + "\n"
        status, out = await interactive(answers, home, "--telegram-api-base",
                                        fake_telegram.api_base, "--pair-timeout", "30",
                                        calls=calls)
    assert status == 0, out
    assert "llama3.2:3b" in out and "context 131072" in out and "completion, tools" in out
    assert "gemma3:4b" in out and "context 8192" in out and "vision" in out
    assert "Telegram refused that token" in out and "@roost_test_bot" in out
    settings = load_settings(config_of(home), env={
        **home, "CREDENTIALS_DIRECTORY": str(credentials_of(home))})
    assert settings.model.name == "gemma3:4b"
    assert settings.platforms["telegram"].mode == "polling"
    unit = Path(home["XDG_CONFIG_HOME"]) / "systemd" / "user" / "roost.service"
    text = unit.read_text()
    token_file = credentials_of(home) / "ROOST_TELEGRAM_TOKEN"
    assert f"\nLoadCredential=ROOST_TELEGRAM_TOKEN:{token_file}\n" in text
    assert "\n#LoadCredential=ROOST_TELEGRAM_SECRET:" in text  # not written, not loaded
    assert f"run --config {config_of(home)}" in text
    assert calls == [["systemctl", "--user", "daemon-reload"],
                     ["systemctl", "--user", "enable", "--now", "roost"]]
    assert "loginctl enable-linger" in out
    assert PairingBook(Path(home["STATE_DIRECTORY"])).is_approved("telegram", str(OWNER))


async def test_a_webhook_url_gets_webhook_mode_and_a_secret_and_whatsapp_its_checked_secrets(
    home: dict[str, str], fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    async with FakeGraph() as graph:
        answers = "\n".join(["", "", fake_telegram.token, "http://plain.example",
                             "https://bot.example.org/webhooks/telegram", "y", PHONE_NUMBER_ID,
                             "expired-token", "app-secret", "", "+972 54-440-1243",
                             graph.token, "n"]) + "\n"
        status, out = await interactive(answers, home, "--ollama-url", fake_ollama.url,
                                        "--telegram-api-base", fake_telegram.api_base,
                                        "--whatsapp-api-base", graph.url,
                                        "--pair-timeout", "0", "--no-service")
    assert status == 0, out
    assert "https:// addresses only" in out
    assert "The Graph API refused that token" in out and "WhatsApp: number 15550953877" in out
    credentials = credentials_of(home)
    settings = load_settings(config_of(home), env={**home,
                                                   "CREDENTIALS_DIRECTORY": str(credentials)})
    telegram, whatsapp = settings.platforms["telegram"], settings.platforms["whatsapp"]
    assert telegram.mode == "webhook"
    assert telegram.webhook_url == "https://bot.example.org/webhooks/telegram"
    assert len(telegram.secret or "") == 64
    assert whatsapp.enabled and whatsapp.phone_number_id == PHONE_NUMBER_ID
    assert whatsapp.api_base == graph.url
    assert whatsapp.token == graph.token  # the one the Graph API took
    # The owner's own number is let in: no pairing code from their own bot.
    assert whatsapp.allow == ("972544401243",)
    assert (credentials / "ROOST_WHATSAPP_APP_SECRET").read_text() == "app-secret"
    assert len((credentials / "ROOST_WHATSAPP_VERIFY_TOKEN").read_text()) == 32  # made up
    assert all(mode(f) == 0o600 for f in credentials.iterdir())
    assert not (Path(home["XDG_CONFIG_HOME"]) / "systemd").exists()  # --no-service


async def test_a_refused_token_is_exit_78_and_writes_nothing(
    home: dict[str, str], fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    status, _, err = await init_process(home, *flags(fake_ollama, fake_telegram),
                                        ROOST_TELEGRAM_TOKEN="123456:WRONG")
    assert status == 78 and "Telegram refused the bot token" in err
    assert "Traceback" not in err
    assert not config_of(home).exists() and not credentials_of(home).exists()


async def test_a_malformed_token_is_refused_before_any_call_to_telegram(
    home: dict[str, str], fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    pasted = f"'{fake_telegram.token} '"  # copied with quotes around it
    status, _, err = await init_process(home, *flags(fake_ollama, fake_telegram),
                                        ROOST_TELEGRAM_TOKEN=pasted)
    assert status == 78 and "does not look like a bot token" in err, err
    assert fake_telegram.token not in err
    assert fake_telegram.calls == []  # nothing went to the network
    assert not config_of(home).exists()
    # Typed at the question: asked again at once, and the good one goes on.
    fake_telegram.queue_update(start_update())
    answers = "\n".join(["1", "", "bot" + fake_telegram.token, fake_telegram.token, "", "n",
                         "n"]) + "\n"
    status, out = await interactive(answers, home, "--ollama-url", fake_ollama.url,
                                    "--telegram-api-base", fake_telegram.api_base,
                                    "--pair-timeout", "30", "--no-service")
    assert status == 0, out
    assert "does not look like a bot token" in out
    assert len(fake_telegram.calls_to("getMe")) == 1


async def test_an_unreachable_bot_api_ends_init_with_a_plain_line(
    home: dict[str, str], fake_ollama: FakeOllama
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{probe.getsockname()[1]}/bot"
    status, _, err = await init_process(
        home, "--non-interactive", "--ollama-url", fake_ollama.url, "--telegram-api-base",
        nowhere, "--no-service", ROOST_TELEGRAM_TOKEN="123456:TEST-TOKEN")
    assert status == 69
    assert f"cannot reach the Bot API at {nowhere}" in err and "--telegram-api-base" in err
    assert "httpx" not in err and "Error" not in err, err


async def test_no_token_at_all_is_named(
    home: dict[str, str], fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    status, _, err = await init_process(home, *flags(fake_ollama, fake_telegram))
    assert status == 78 and "ROOST_TELEGRAM_TOKEN" in err and "--token-file" in err


async def test_ollama_unreachable_is_exit_69_naming_the_address(
    home: dict[str, str], fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    url = fake_ollama.url
    await fake_ollama.stop()
    status, _, err = await init_process(home, *flags(fake_ollama, fake_telegram),
                                        ROOST_TELEGRAM_TOKEN=fake_telegram.token)
    assert status == 69 and f"cannot reach Ollama at {url}" in err and "--ollama-url" in err
    assert "Traceback" not in err and not config_of(home).exists()
    assert fake_telegram.calls == []


async def test_interactive_asks_again_for_ollama_s_address(
    home: dict[str, str], fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    answers = "\n".join(["http://127.0.0.1:9", fake_ollama.url, "", "", fake_telegram.token,
                         "", "n", "n"]) + "\n"
    status, out = await interactive(answers, home, "--telegram-api-base",
                                    fake_telegram.api_base, "--pair-timeout", "0",
                                    "--no-service")
    assert status == 0, out
    assert "cannot reach Ollama at http://127.0.0.1:9" in out
    assert load_settings(config_of(home), env=home,
                         require_secrets=False).model.host == fake_ollama.url


async def test_a_model_not_pulled_lists_the_pulled_ones(
    home: dict[str, str], fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    status, _, err = await init_process(home, *flags(fake_ollama, fake_telegram),
                                        "--model", "llama9:70b",
                                        ROOST_TELEGRAM_TOKEN=fake_telegram.token)
    assert status == 78 and "'llama9:70b' is not pulled (pulled: qwen3:4b)" in err


async def test_an_existing_config_is_left_alone_without_force(
    home: dict[str, str], fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    config = config_of(home)
    config.parent.mkdir(parents=True)
    config.write_text('[model]\nname = "mine"\n')
    status, _, err = await init_process(home, *flags(fake_ollama, fake_telegram),
                                        ROOST_TELEGRAM_TOKEN=fake_telegram.token)
    assert status == 73 and str(config) in err and "--force" in err
    assert config.read_text() == '[model]\nname = "mine"\n'
    status, _, err = await init_process(home, *flags(fake_ollama, fake_telegram, "--force",
                                                     "--pair-timeout", "0"),
                                        ROOST_TELEGRAM_TOKEN=fake_telegram.token)
    assert status == 0, err
    assert 'name = "qwen3:4b"' in config.read_text()


async def test_nobody_sending_start_in_time_is_exit_1_with_the_config_kept(
    home: dict[str, str], fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    fake_telegram.queue_update(start_update(chat_type="group"))  # not the owner's private chat
    fake_telegram.queue_update(start_update(text="hello"))
    status, out, _ = await init_process(home, *flags(fake_ollama, fake_telegram,
                                                     "--pair-timeout", "1"),
                                        ROOST_TELEGRAM_TOKEN=fake_telegram.token)
    assert status == 1 and "nobody sent /start within 1 s" in out
    assert "roost pairing approve CODE" in out
    assert config_of(home).exists()
    assert not (Path(home["STATE_DIRECTORY"]) / "pairing.json").exists()


async def test_end_of_input_stops_cleanly(home: dict[str, str], fake_ollama: FakeOllama) -> None:
    status, _ = await interactive("", home, "--ollama-url", fake_ollama.url)
    assert status == 1 and not config_of(home).exists()


def test_pairing_admit_replaces_a_waiting_code(tmp_path: Path) -> None:
    book = PairingBook(tmp_path)
    request = book.request("telegram", "7", "telegram:7", "Ann", now=100.0)
    assert request is not None
    book.admit("telegram", "7", "Ann", now=101.0)
    assert book.pending(now=102.0) == [] and book.is_approved("telegram", "7")
    assert json.loads((tmp_path / "pairing.json").read_text())["approved"][0]["sender"] == "7"


async def test_an_api_base_that_answers_404_is_named_not_the_token(
    home: dict[str, str], fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    wrong = fake_telegram.api_base.replace("/bot", "/nowhere/bot")
    status, _, err = await init_process(home, "--non-interactive", "--ollama-url",
                                        fake_ollama.url, "--telegram-api-base", wrong,
                                        ROOST_TELEGRAM_TOKEN=fake_telegram.token)
    assert status == 78 and "answered 404" in err and "--telegram-api-base" in err
    assert fake_telegram.token not in err


async def test_as_root_with_a_config_of_its_own_the_pairing_goes_to_that_config_s_state(
    home: dict[str, str], fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    fake_telegram.queue_update(start_update())
    args = build_parser().parse_args([
        "init", "--non-interactive", "--config", str(config_of(home)), "--credentials-dir",
        str(credentials_of(home)), "--ollama-url", fake_ollama.url, "--telegram-api-base",
        fake_telegram.api_base, "--pair-timeout", "30"])
    out = io.StringIO()
    status = await run_init(args, stdout=out, env={**home, "ROOST_TELEGRAM_TOKEN":
                                                   fake_telegram.token}, root=True)
    assert status == 0, out.getvalue()
    assert PairingBook(Path(home["STATE_DIRECTORY"])).is_approved("telegram", str(OWNER))
    # Root gets the system unit's commands to run, never a systemctl call of init's own.
    assert "sudo systemctl daemon-reload && sudo systemctl enable --now roost" in out.getvalue()
    assert "LoadCredential=ROOST_TELEGRAM_TOKEN:" in out.getvalue()


async def test_a_webhook_url_roost_would_refuse_leaves_no_config(
    home: dict[str, str], fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    status, _, err = await init_process(home, *flags(fake_ollama, fake_telegram, "--webhook-url",
                                                     "ftp://bot.example.org/hook"),
                                        ROOST_TELEGRAM_TOKEN=fake_telegram.token)
    assert status == 78 and "telegram.webhook_url" in err and "Traceback" not in err
    assert not config_of(home).exists()
    assert not any(p.name.startswith(".roost.toml") for p in config_of(home).parent.iterdir())


async def test_a_registered_webhook_is_named_instead_of_waiting_for_start(
    home: dict[str, str], fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    fake_telegram.webhook = {"url": "https://bot.example.org/webhooks/telegram"}
    status, out, err = await init_process(home, *flags(fake_ollama, fake_telegram),
                                          ROOST_TELEGRAM_TOKEN=fake_telegram.token)
    assert status == 1 and "A webhook is registered" in out and "Traceback" not in err
    assert config_of(home).exists()


async def test_an_ollama_without_models_names_the_pull(
    home: dict[str, str], fake_telegram: FakeTelegram
) -> None:
    async with FakeOllama(models=[]) as empty:
        status, _, err = await init_process(home, *flags(empty, fake_telegram),
                                            ROOST_TELEGRAM_TOKEN=fake_telegram.token)
    assert status == 78 and "no model pulled" in err and "ollama pull" in err
    assert not config_of(home).exists()


async def test_whatsapp_without_its_secrets_or_with_a_refused_token_writes_nothing(
    home: dict[str, str], fake_ollama: FakeOllama, fake_telegram: FakeTelegram
) -> None:
    async with FakeGraph() as graph:
        whatsapp = ["--whatsapp-phone-number-id", PHONE_NUMBER_ID, "--whatsapp-api-base",
                    graph.url]
        status, _, err = await init_process(
            home, *flags(fake_ollama, fake_telegram, *whatsapp),
            ROOST_TELEGRAM_TOKEN=fake_telegram.token, ROOST_WHATSAPP_TOKEN=graph.token)
        assert status == 78
        assert "ROOST_WHATSAPP_APP_SECRET, ROOST_WHATSAPP_VERIFY_TOKEN" in err
        secrets = {"ROOST_WHATSAPP_APP_SECRET": "app-secret",
                   "ROOST_WHATSAPP_VERIFY_TOKEN": "verify"}
        status, _, err = await init_process(
            home, *flags(fake_ollama, fake_telegram, *whatsapp),
            ROOST_TELEGRAM_TOKEN=fake_telegram.token, ROOST_WHATSAPP_TOKEN="expired", **secrets)
        assert status == 78 and "refused the WhatsApp token" in err and "expired" not in err
        assert not config_of(home).exists()
        status, out, err = await init_process(
            home, *flags(fake_ollama, fake_telegram, *whatsapp, "--pair-timeout", "0",
                         "--whatsapp-owner", "972544401243"),
            ROOST_TELEGRAM_TOKEN=fake_telegram.token, ROOST_WHATSAPP_TOKEN=graph.token,
            **secrets)
    assert status == 0, err
    assert "WhatsApp: number 15550953877 (roost test)" in out
    settings = load_settings(config_of(home), env={
        **home, "CREDENTIALS_DIRECTORY": str(credentials_of(home))})
    whatsapp = settings.platforms["whatsapp"]
    assert whatsapp.enabled and whatsapp.app_secret == "app-secret"
    assert whatsapp.allow == ("972544401243",)


async def test_ctrl_c_at_a_question_stops_init_at_once_with_130(
    home: dict[str, str], tmp_path: Path
) -> None:
    places = ["--config", str(config_of(home)), "--credentials-dir", str(credentials_of(home)),
              "--state-dir", home["STATE_DIRECTORY"]]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "init", *places, env=home,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    try:
        asked = b""
        async with asyncio.timeout(30):
            while b"Ollama's address" not in asked:
                asked += await process.stdout.read(1)
        process.send_signal(signal.SIGINT)  # what Ctrl-C at the terminal sends
        # Nothing more is typed: init must not wait for a line to take as the answer.
        status = await asyncio.wait_for(process.wait(), 15)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert status == 130
    err = (await process.stderr.read()).decode()
    assert "Traceback" not in err
    assert not config_of(home).exists()
