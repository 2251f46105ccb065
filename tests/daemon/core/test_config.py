"""Config loading: defaults, the DESIGN.md example, lookup order, secrets and error messages."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from channels.telegram.parse import chat_key
from channels.telegram.platform import TelegramSettings
from channels.whatsapp.platform import WhatsAppSettings
from daemon.core.config import (
    DEFAULT_HOST,
    SYSTEM_CONFIG,
    AccessSettings,
    AutomationSettings,
    DaemonSettings,
    ModelSettings,
    Settings,
    find_config_path,
    load_settings,
    parse_duration,
    read_secret,
)
from daemon.core.errors import ConfigError
from daemon.core.platforms import installed

DESIGN_EXAMPLE = """\
[daemon]
state_dir = "/var/lib/roost"     # default: $STATE_DIRECTORY, else ~/.local/state/roost
listen = "127.0.0.1:8780"
timezone = "Europe/Berlin"       # IANA name; default: the system's
idle_rotation = "3h"

[model]
host = "http://127.0.0.1:11434"
name = "qwen3:4b"
window = 8192                    # num_ctx; capped at the model's context_length
response_reserve = 1024
keep_alive = "30m"
concurrency = 1                  # requests in flight to Ollama at once

[telegram]                       # token: ROOST_TELEGRAM_TOKEN, secret: ROOST_TELEGRAM_SECRET
enabled = true
mode = "webhook"                 # or "polling"
webhook_url = "https://bot.example.org/webhooks/telegram"
api_base = "https://api.telegram.org/bot"
file_base = "https://api.telegram.org/file/bot"
allow = [1111111]                # user ids

[whatsapp]                       # ROOST_WHATSAPP_TOKEN, ROOST_WHATSAPP_APP_SECRET, ROOST_WHATSAPP_VERIFY_TOKEN
enabled = true
phone_number_id = "277321005464405"
api_base = "https://graph.facebook.com"
api_version = "v23.0"
allow = ["972544401243"]         # wa_ids

[access]
unknown_senders = "pair"         # or "ignore"

[[automations]]
name = "morning-brief"
schedule = "0 7 * * *"           # crontab syntax (0 and 7 are Sunday), in daemon.timezone
prompt = "Summarise what I asked you to keep an eye on."
deliver = ["telegram:1111111"]
"""  # noqa: E501 (copied verbatim from DESIGN.md)

SECRETS = {
    "ROOST_TELEGRAM_TOKEN": "123:abc",
    "ROOST_TELEGRAM_SECRET": "webhook-secret",
    "ROOST_WHATSAPP_TOKEN": "wa-token",
    "ROOST_WHATSAPP_APP_SECRET": "wa-app-secret",
    "ROOST_WHATSAPP_VERIFY_TOKEN": "wa-verify",
    "ROOST_MATRIX_PASSWORD": "mx-password",
}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """An environment of our own, so the tests never see the developer's."""
    return {"HOME": str(tmp_path / "home"), "TZ": "UTC"}


def write(tmp_path: Path, text: str, name: str = "roost.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_no_file_means_console_only_defaults(
    tmp_path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = load_settings(env=env)
    assert settings.source is None
    assert settings.model == ModelSettings()
    assert settings.model.host == DEFAULT_HOST
    assert not settings.platforms["telegram"].enabled and not settings.platforms["whatsapp"].enabled
    assert settings.automations == () and dict(settings.variables) == {}
    assert settings.daemon.state_dir == tmp_path / "home/.local/state/roost"
    assert (settings.daemon.listen_host, settings.daemon.listen_port) == ("127.0.0.1", 8780)
    assert settings.daemon.idle_rotation == 3 * 3600
    assert settings.daemon.shutdown_grace == 20
    assert settings == Settings.defaults(env)


def test_the_design_example_parses(tmp_path: Path) -> None:
    path = write(tmp_path, DESIGN_EXAMPLE)
    settings = load_settings(path, env=SECRETS)
    assert settings.source == path
    assert settings.daemon == DaemonSettings(
        state_dir=Path("/var/lib/roost"), listen_host="127.0.0.1", listen_port=8780,
        timezone="Europe/Berlin", idle_rotation=10800.0, shutdown_grace=20.0,
    )
    assert settings.daemon.tz.key == "Europe/Berlin"
    assert settings.model == ModelSettings()
    assert settings.platforms["telegram"] == TelegramSettings(
        enabled=True, mode="webhook", webhook_url="https://bot.example.org/webhooks/telegram",
        allow=(1111111,), token="123:abc", secret="webhook-secret",
    )
    assert settings.platforms["whatsapp"] == WhatsAppSettings(
        enabled=True, phone_number_id="277321005464405", allow=("972544401243",),
        token="wa-token", app_secret="wa-app-secret", verify_token="wa-verify",
    )
    assert settings.access.unknown_senders == "pair"
    assert settings.automations == (
        AutomationSettings(
            name="morning-brief", schedule="0 7 * * *",
            prompt="Summarise what I asked you to keep an eye on.", deliver=("telegram:1111111",),
        ),
    )


def test_settings_are_frozen_and_secrets_stay_out_of_repr(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, DESIGN_EXAMPLE), env=SECRETS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.model.window = 4096  # type: ignore[misc]
    assert all(secret not in repr(settings) for secret in SECRETS.values())


def test_the_readme_reference_is_true(tmp_path: Path) -> None:
    root = Path(__file__).parents[3]
    readme = (root / "README.md").read_text(encoding="utf-8")
    section = readme.partition("<!-- config-reference:start -->")[2]
    section = section.partition("<!-- config-reference:end -->")[0]
    page = (root / "docs" / "config-example.md").read_text(encoding="utf-8")
    example = re.findall(r"```toml\n(.*?)```", page, re.S)[-1]
    settings = load_settings(write(tmp_path, example), env=SECRETS)
    assert all(own.enabled for own in settings.platforms.values())  # every platform shown
    renamed = {"listen_host": "listen", "listen_port": "listen"}
    for cls in (DaemonSettings, ModelSettings, AccessSettings, AutomationSettings,
                *(platform.settings for platform in installed().values())):
        for field in dataclasses.fields(cls):
            if field.repr:  # the secrets are documented by their variable names instead
                assert f"`{renamed.get(field.name, field.name)}`" in section, field.name
    assert all(f"`{name}`" in section for name in SECRETS)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("3h", 10800), ("90s", 90), ("30m", 1800), ("1h30m", 5400), ("1d", 86400),
     ("500ms", 0.5), ("1.5h", 5400)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "3", "3 h", "h", "-5m", "3x", "1h 30m", "3H"])
def test_bad_durations_name_the_key(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_duration(text, key="daemon.idle_rotation", source="/etc/roost/roost.toml")
    assert caught.value.key == "daemon.idle_rotation"
    assert str(caught.value).startswith("daemon.idle_rotation in /etc/roost/roost.toml: ")


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ("[model]\nwindw = 4096", "model.windw", "unknown key"),
        ("[modle]\nwindow = 4096", "modle", "unknown table"),
        ("verbose = true", "verbose", "unknown key"),
        ("[model]\nwindow = \"8192\"", "model.window", "expected an integer, got string"),
        ("[model]\nwindow = true", "model.window", "expected an integer, got boolean"),
        ("[model]\nwindow = 256", "model.window", "at least 512"),
        ("[model]\nresponse_reserve = 8192", "model.response_reserve", "less than model.window"),
        ("[model]\nhost = \"127.0.0.1:11434\"", "model.host", "http"),
        ("[model]\nkeep_alive = \"1d\"", "model.keep_alive", "-1"),
        ("[model]\nconcurrency = 0", "model.concurrency", "at least 1"),
        ("[model]\nstall = \"5m\"", "model.stall", "shorter than model.timeout (300s)"),
        ("[model]\nstall = \"0s\"", "model.stall", "longer than zero"),
        ("[telegram]\nenabled = \"yes\"", "telegram.enabled", "expected a boolean"),
        ("[telegram]\nmode = \"push\"", "telegram.mode", "webhook or polling"),
        ("[telegram]\nallow = [1, \"2\"]", "telegram.allow[1]", "expected an integer user id"),
        ("[whatsapp]\nallow = [\"+972544401243\"]", "whatsapp.allow[0]", "digits only"),
        ("model = 3", "model", "expected a table"),
        ("[daemon]\nidle_rotation = \"3 hours\"", "daemon.idle_rotation", "duration"),
        ("[daemon]\nidle_rotation = 10800", "daemon.idle_rotation", "expected a duration"),
        ("[daemon]\nidle_rotation = \"0s\"", "daemon.idle_rotation", "longer than zero"),
        ("[daemon]\ntimezone = \"Mars/Olympus\"", "daemon.timezone", "IANA"),
        ("[daemon]\nlisten = \"8780\"", "daemon.listen", "host:port"),
        ("[daemon]\nlisten = \"::1:8780\"", "daemon.listen", "[ipv6]:port"),
        ("[daemon]\nlisten = \"localhost:99999\"", "daemon.listen", "host:port"),
        ("[access]\nunknown_senders = \"allow\"", "access.unknown_senders", "pair or ignore"),
        ("[variables]\ncity = 3", "variables.city", "expected a string"),
        ("automations = 3", "automations", "array of tables"),
        ("[telegram]\ntoken = \"123:abc\"", "telegram.token", "ROOST_TELEGRAM_TOKEN"),
        ("[telegram]\nsecret = \"s\"", "telegram.secret", "ROOST_TELEGRAM_SECRET"),
        ("[whatsapp]\napp_secret = \"s\"", "whatsapp.app_secret", "ROOST_WHATSAPP_APP_SECRET"),
        ("[telegram]\nenabled = true\nmode = \"polling\"", "telegram.enabled",
         "ROOST_TELEGRAM_TOKEN"),
        ("[whatsapp]\nenabled = true\nphone_number_id = \"1\"", "whatsapp.enabled",
         "ROOST_WHATSAPP_TOKEN, ROOST_WHATSAPP_APP_SECRET, ROOST_WHATSAPP_VERIFY_TOKEN"),
        ("[model\nwindow = 1", "config", "not valid TOML"),
    ],
)
def test_errors_name_the_key_and_the_file(
    tmp_path: Path, env: dict[str, str], text: str, key: str, problem: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env=env)
    assert caught.value.key == key
    assert caught.value.source == str(path)
    assert str(caught.value).startswith(f"{key} in {path}: ")
    assert problem in caught.value.problem
    assert caught.value.exit_status == 78


def test_a_secret_in_the_file_is_refused_and_not_repeated(tmp_path: Path) -> None:
    path = write(tmp_path, '[whatsapp]\ntoken = "EAAG-very-secret"\n')
    with pytest.raises(ConfigError, match="CREDENTIALS_DIRECTORY") as caught:
        load_settings(path, env={})
    assert "EAAG-very-secret" not in str(caught.value)


def test_webhook_mode_needs_a_webhook_url(tmp_path: Path) -> None:
    path = write(tmp_path, '[telegram]\nenabled = true\nmode = "webhook"\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env=SECRETS)
    assert caught.value.key == "telegram.webhook_url"
    assert 'mode = "polling"' in caught.value.problem  # the way out without a public address
    polling = write(tmp_path, '[telegram]\nenabled = true\nmode = "polling"\n', "polling.toml")
    assert load_settings(polling, env=SECRETS).platforms["telegram"].mode == "polling"


def test_without_mode_telegram_polls_unless_a_webhook_url_is_given(tmp_path: Path) -> None:
    # As the five-minute guide and roost init set it up: no public address needed.
    path = write(tmp_path, "[telegram]\nenabled = true\n")
    assert load_settings(path, env=SECRETS).platforms["telegram"].mode == "polling"
    hook = write(tmp_path, '[telegram]\nenabled = true\nwebhook_url = "https://b.example/w"\n',
                 "hook.toml")
    assert load_settings(hook, env=SECRETS).platforms["telegram"].mode == "webhook"


def test_whatsapp_needs_a_phone_number_id(tmp_path: Path) -> None:
    path = write(tmp_path, "[whatsapp]\nenabled = true\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env=SECRETS)
    assert caught.value.key == "whatsapp.phone_number_id"


def automation(**fields: str) -> str:
    values = {"name": '"brief"', "schedule": '"0 7 * * *"', "prompt": '"Hi"',
              "deliver": '["telegram:1"]'} | fields
    return "[[automations]]\n" + "".join(f"{k} = {v}\n" for k, v in values.items() if v)


@pytest.mark.parametrize(
    "schedule",
    ["0 7 * * *", "*/15 * * * *", "0 9-17/2 * * 1-5", "30 6 1,15 * 0", "0 0 * * 7",
     "0 8 * jan-mar mon-fri", "5 4 * * SUN", "0 0 31 12 *"],
)
def test_good_crontabs(tmp_path: Path, env: dict[str, str], schedule: str) -> None:
    path = write(tmp_path, automation(schedule=f'"{schedule}"'))
    assert load_settings(path, env=env).automations[0].schedule == schedule


@pytest.mark.parametrize(
    "schedule",
    ["0 7 * *", "0 7 * * * *", "60 * * * *", "0 24 * * *", "0 0 0 * *", "0 0 * 13 *",
     "0 0 * * 8", "*/0 * * * *", "5/15 * * * *", "10-5 * * * *", "@daily", "0 7 ? * *",
     "0 7 * * mon-", "0 7 L * *"],
)
def test_bad_crontabs_name_the_key(tmp_path: Path, env: dict[str, str], schedule: str) -> None:
    path = write(tmp_path, automation(schedule=f'"{schedule}"'))
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env=env)
    assert caught.value.key == "automations[0].schedule"
    assert caught.value.source == str(path)


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"deliver": '["signal:123"]'}, "automations[0].deliver[0]"),
        ({"deliver": '["telegram:1", "whatsapp:+972"]'}, "automations[0].deliver[1]"),
        ({"deliver": '["console:remote"]'}, "automations[0].deliver[0]"),
        ({"deliver": '["telegram:-1001234:"]'}, "automations[0].deliver[0]"),
        ({"deliver": '["telegram:-1001234:0"]'}, "automations[0].deliver[0]"),
        ({"deliver": '["telegram:-1001234:7:8"]'}, "automations[0].deliver[0]"),
        ({"deliver": "[]"}, "automations[0].deliver"),
        ({"prompt": ""}, "automations[0].prompt"),
        ({"name": '"Morning Brief"'}, "automations[0].name"),
        ({"when": '"daily"'}, "automations[0].when"),
    ],
)
def test_bad_automations_name_the_key(
    tmp_path: Path, env: dict[str, str], fields: dict[str, str], key: str
) -> None:
    path = write(tmp_path, automation(**fields))
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env=env)
    assert caught.value.key == key


def test_deliver_targets_and_duplicate_names(tmp_path: Path, env: dict[str, str]) -> None:
    targets = '["telegram:-1001234", "telegram:-1001234:42", "whatsapp:972544401243", ' \
              '"console:local"]'
    path = write(tmp_path, automation(deliver=targets) + automation(name='"other"'))
    first, _ = load_settings(path, env=env).automations
    # A forum topic's chat key, as the Telegram channel keys (and answers) that topic.
    assert first.deliver == ("telegram:-1001234", "telegram:-1001234:42",
                             "whatsapp:972544401243", "console:local")
    assert chat_key(-1001234, 42) in first.deliver
    path = write(tmp_path, automation() + automation())
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env=env)
    assert caught.value.key == "automations[1].name"


def test_variables_are_a_read_only_mapping(tmp_path: Path, env: dict[str, str]) -> None:
    path = write(tmp_path, '[variables]\ncity = "Haifa"\n')
    variables = load_settings(path, env=env).variables
    assert dict(variables) == {"city": "Haifa"}
    with pytest.raises(TypeError):
        variables["city"] = "Berlin"  # type: ignore[index]


@pytest.mark.parametrize(
    ("listen", "host", "port"),
    [("127.0.0.1:8780", "127.0.0.1", 8780), ("[::1]:9000", "::1", 9000),
     ("0.0.0.0:80", "0.0.0.0", 80), ("localhost:8780", "localhost", 8780)],
)
def test_listen(tmp_path: Path, env: dict[str, str], listen: str, host: str, port: int) -> None:
    daemon = load_settings(write(tmp_path, f'[daemon]\nlisten = "{listen}"\n'), env=env).daemon
    assert (daemon.listen_host, daemon.listen_port) == (host, port)


def test_keep_alive_accepts_what_ollama_accepts(tmp_path: Path, env: dict[str, str]) -> None:
    for value in ("-1", "0", "5m", "1h30m", "24h"):
        path = write(tmp_path, f'[model]\nkeep_alive = "{value}"\n')
        assert load_settings(path, env=env).model.keep_alive == value


# --- lookup order -------------------------------------------------------------------------------


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A config file in each place roost looks, with HOME and the working directory in tmp_path."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    (home / ".config/roost").mkdir(parents=True)
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HOME", str(home))  # find_config_path falls back to Path.home()
    return {
        "explicit": write(tmp_path, "", "explicit.toml"),
        "env": write(tmp_path, "", "from-env.toml"),
        "cwd": write(cwd, ""),
        "user": write(home / ".config/roost", ""),
    }


def test_lookup_order(places: dict[str, Path]) -> None:
    env = {"ROOST_CONFIG": str(places["env"])}
    assert find_config_path(places["explicit"], env) == places["explicit"]
    assert find_config_path(None, env) == places["env"]
    assert find_config_path(None, {}) == Path.cwd() / "roost.toml"
    places["cwd"].unlink()
    assert find_config_path(None, {}) == places["user"]
    places["user"].unlink()
    # /etc/roost/roost.toml comes last; it is outside tmp_path, so only check it is last.
    assert find_config_path(None, {}) in (None, SYSTEM_CONFIG)


def test_load_settings_follows_roost_config(tmp_path: Path) -> None:
    path = write(tmp_path, '[model]\nname = "llama3.2:3b"\n', "elsewhere.toml")
    settings = load_settings(env={"ROOST_CONFIG": str(path)})
    assert (settings.source, settings.model.name) == (path, "llama3.2:3b")


@pytest.mark.parametrize("via", ["explicit", "env"])
def test_a_named_config_that_is_missing_is_an_error(tmp_path: Path, via: str) -> None:
    missing = tmp_path / "missing.toml"
    with pytest.raises(ConfigError) as caught:
        if via == "explicit":
            find_config_path(missing, {})
        else:
            load_settings(env={"ROOST_CONFIG": str(missing)})
    assert (caught.value.key, caught.value.source) == ("config", str(missing))


def test_an_unreadable_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(tmp_path, env={})  # a directory cannot be read as a file
    assert caught.value.source == str(tmp_path)


# --- secrets and environment --------------------------------------------------------------------


def test_secrets_come_from_the_environment_first(tmp_path: Path) -> None:
    (tmp_path / "ROOST_TELEGRAM_TOKEN").write_text("from-file\n")
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path), "ROOST_TELEGRAM_TOKEN": "from-env"}
    assert read_secret("ROOST_TELEGRAM_TOKEN", env) == "from-env"
    assert read_secret("ROOST_TELEGRAM_TOKEN", env | {"ROOST_TELEGRAM_TOKEN": ""}) == "from-file"
    assert read_secret("ROOST_TELEGRAM_SECRET", env) is None
    assert read_secret("ROOST_TELEGRAM_TOKEN", {}) is None


def test_secrets_from_systemd_credentials(tmp_path: Path) -> None:
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "ROOST_TELEGRAM_TOKEN").write_text("123:from-credential\n")
    path = write(tmp_path, '[telegram]\nenabled = true\nmode = "polling"\n')
    settings = load_settings(path, env={"CREDENTIALS_DIRECTORY": str(credentials)})
    assert settings.platforms["telegram"].token == "123:from-credential"


def test_state_directory_from_systemd(tmp_path: Path, env: dict[str, str]) -> None:
    settings = Settings.defaults(env | {"STATE_DIRECTORY": "/var/lib/roost:/var/lib/other"})
    assert settings.daemon.state_dir == Path("/var/lib/roost")
    path = write(tmp_path, '[daemon]\nstate_dir = "~/roost-state"\n')
    assert load_settings(path, env=env).daemon.state_dir == Path(env["HOME"]) / "roost-state"


def test_relative_state_dir_is_beside_the_file(tmp_path: Path, env: dict[str, str]) -> None:
    path = write(tmp_path, '[daemon]\nstate_dir = "state"\n')
    assert load_settings(path, env=env).daemon.state_dir == tmp_path / "state"


def test_default_timezone_follows_tz(env: dict[str, str]) -> None:
    assert Settings.defaults(env | {"TZ": "Asia/Tokyo"}).daemon.timezone == "Asia/Tokyo"
    zone = Settings.defaults(env | {"TZ": "not/a-zone"}).daemon.tz  # falls back, never fails
    assert zone.key


@pytest.mark.parametrize(("line", "key"), [
    ('streaming = "yes"', "telegram.streaming"),
    ('draft_interval = "10ms"', "telegram.draft_interval"),
    ("draft_interval = 1", "telegram.draft_interval"),
])
def test_bad_streaming_settings_name_the_key(tmp_path: Path, line: str, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, f"[telegram]\n{line}\n"), env=SECRETS)
    assert caught.value.key == key


def test_streaming_settings_are_read(tmp_path: Path) -> None:
    path = write(tmp_path, '[telegram]\nstreaming = "off"\ndraft_interval = "1.5s"\n')
    telegram = load_settings(path, env=SECRETS).platforms["telegram"]
    assert (telegram.streaming, telegram.draft_interval) == ("off", 1.5)


def test_identities_link_a_persons_chats(tmp_path: Path, env: dict[str, str]) -> None:
    settings = load_settings(write(tmp_path, '[identities]\nowner = ["telegram:1111111", '
                                   '"whatsapp:972544401243", "console:local"]\n'), env=env)
    assert dict(settings.identities) == {
        "owner": ("telegram:1111111", "whatsapp:972544401243", "console:local")}
    with pytest.raises(TypeError):
        settings.identities["x"] = ()  # type: ignore[index]
    assert dict(load_settings(env=env).identities) == {}


@pytest.mark.parametrize(("text", "key", "problem"), [
    ('owner = ["telegram:-1001234567890"]', "identities.owner[0]", "a person's chat"),
    ('owner = ["telegram:1111111:5"]', "identities.owner[0]", "a person's chat"),
    ('owner = ["log"]', "identities.owner[0]", "a person's chat"),
    ('owner = "telegram:1111111"', "identities.owner", "expected an array"),
    ("owner = []", "identities.owner", "at least one chat"),
    ('Owner = ["telegram:1"]', "identities.Owner", "lowercase"),
    ('a = ["telegram:1"]\nb = ["whatsapp:2", "telegram:1"]', "identities.b",
     "telegram:1 is already in identity 'a'"),
])
def test_bad_identities_name_the_key(tmp_path: Path, env: dict[str, str], text: str, key: str,
                                     problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, f"[identities]\n{text}\n"), env=env)
    assert caught.value.key == key and problem in caught.value.problem


def test_without_credentials_directory_the_secrets_come_from_inits_folder(
    tmp_path: Path, env: dict[str, str]
) -> None:
    # Where `roost init` puts them: ~/.config/roost/credentials, beside the config it writes.
    folder = Path(env["HOME"]) / ".config" / "roost" / "credentials"
    folder.mkdir(parents=True)
    (folder / "ROOST_TELEGRAM_TOKEN").write_text("123:from-init\n")
    path = write(tmp_path, '[telegram]\nenabled = true\nmode = "polling"\n')
    assert load_settings(path, env=env).platforms["telegram"].token == "123:from-init"
    # systemd's folder, when it is set, is the only one read (the unit says what it loads).
    empty = tmp_path / "systemd-credentials"
    empty.mkdir()
    settings = load_settings(path, env=env | {"CREDENTIALS_DIRECTORY": str(empty)},
                             require_secrets=False)
    assert settings.platforms["telegram"].token is None


def test_a_bot_api_base_of_its_own_moves_the_file_base_too(tmp_path: Path) -> None:
    # A local Bot API server serves files beside its methods, as Telegram does.
    path = write(tmp_path, '[telegram]\napi_base = "http://127.0.0.1:8081/bot"\n')
    assert load_settings(path, env={}).platforms["telegram"].file_base == "http://127.0.0.1:8081/file/bot"
    both = write(tmp_path, '[telegram]\napi_base = "http://127.0.0.1:8081/bot"\n'
                 'file_base = "http://files.example/f/bot"\n', "both.toml")
    assert load_settings(both, env={}).platforms["telegram"].file_base == "http://files.example/f/bot"
    assert Settings.defaults(env={}).platforms["telegram"].file_base == "https://api.telegram.org/file/bot"
