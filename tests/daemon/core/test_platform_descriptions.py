"""The core reads each platform from its description (daemon/core/platforms.py): a platform's
table, secrets and chat keys work everywhere a chat key is written, and a platform installed
beside the three (as a fourth would be) is read by the same code, with no change to the core."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from channels.installed import PLATFORMS
from daemon.context.prefix import channel_note
from daemon.core.config import ConfigError, load_settings, missing_secrets
from daemon.core.config.values import _BOOL, _array, _like
from daemon.core.platforms import (
    Platform,
    automation_key,
    automation_name,
    install,
    installed,
    is_person_chat,
    is_platform_chat,
)

MATRIX_SECRET = {"ROOST_MATRIX_PASSWORD": "mx-password", "HOME": "/nonexistent"}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "roost.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_matrix_table_is_read_with_its_secret(tmp_path: Path) -> None:
    path = write(tmp_path, '[matrix]\nenabled = true\nhomeserver = "https://matrix.example.org"\n'
                           'user_id = "@roost:example.org"\nallow = ["@dana:example.org"]\n'
                           'stream_interval = "2s"\n')
    matrix = load_settings(path, env=MATRIX_SECRET).platforms["matrix"]
    assert (matrix.homeserver, matrix.user_id, matrix.allow, matrix.stream_interval) == (
        "https://matrix.example.org", "@roost:example.org", ("@dana:example.org",), 2.0)
    assert matrix.password == "mx-password" and "mx-password" not in repr(matrix)


def test_matrix_without_a_password_or_token_is_refused_by_name(tmp_path: Path) -> None:
    path = write(tmp_path, '[matrix]\nenabled = true\nhomeserver = "https://m.example.org"\n'
                           'user_id = "@roost:example.org"\n')
    with pytest.raises(ConfigError) as refused:
        load_settings(path, env={"HOME": "/nonexistent"})
    assert refused.value.key == "matrix.enabled" and "ROOST_MATRIX_PASSWORD" in str(refused.value)
    settings = load_settings(path, env={"HOME": "/nonexistent"}, require_secrets=False)
    assert [e.key for e in missing_secrets(settings)] == ["matrix.enabled"]
    # A token does instead of the password.
    load_settings(path, env={"ROOST_MATRIX_TOKEN": "syt_x", "HOME": "/nonexistent"})


@pytest.mark.parametrize(("line", "key"), [
    ('password = "hunter2"', "matrix.password"),  # a secret in the file
    ('user_id = "roost"', "matrix.user_id"),  # not a user id
    ('allow = ["dana"]', "matrix.allow[0]"),
    ('homeserver = "matrix.example.org"', "matrix.homeserver"),  # no scheme
])
def test_a_bad_matrix_value_names_its_key(tmp_path: Path, line: str, key: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(write(tmp_path, f"[matrix]\n{line}\n"), env=MATRIX_SECRET)
    assert refused.value.key == key


def test_an_enabled_matrix_needs_its_homeserver_and_user(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(write(tmp_path, "[matrix]\nenabled = true\n"), env=MATRIX_SECRET)
    assert refused.value.key == "matrix.homeserver"


def test_matrix_chats_are_written_where_any_chat_is(tmp_path: Path) -> None:
    path = write(tmp_path, '''
[whatsapp]
fallback = "matrix:@dana:example.org"

[identities]
dana = ["matrix:@dana:example.org", "telegram:1111111"]

[[automations]]
name = "brief"
schedule = "0 7 * * *"
prompt = "Brief me."
deliver = ["matrix:@dana:example.org", "matrix:!kitchen:example.org", "matrix:!v12room"]
''')
    settings = load_settings(path, env=MATRIX_SECRET)
    assert settings.identities["dana"] == ("matrix:@dana:example.org", "telegram:1111111")
    assert settings.automations[0].deliver[2] == "matrix:!v12room"
    assert settings.platforms["whatsapp"].fallback == "matrix:@dana:example.org"


def test_a_group_cannot_be_an_identity_s_chat(tmp_path: Path) -> None:
    path = write(tmp_path, '[identities]\ndana = ["matrix:!kitchen:example.org"]\n')
    with pytest.raises(ConfigError) as refused:
        load_settings(path, env=MATRIX_SECRET)
    assert refused.value.key == "identities.dana[0]"
    assert "'matrix:@<user>:<server>'" in refused.value.problem


def test_chat_keys_by_their_platform_s_grammar() -> None:
    assert is_person_chat("matrix:@dana:example.org") and is_person_chat("telegram:1111111")
    assert is_person_chat("whatsapp:972544401243") and is_person_chat("console:local")
    assert not is_person_chat("matrix:!kitchen:example.org")
    assert not is_person_chat("telegram:-1001234") and not is_person_chat("automation:brief")
    assert is_platform_chat("matrix:!kitchen:example.org")
    assert not is_platform_chat("signal:+4915112345678")  # no such platform installed
    assert automation_name(automation_key("brief")) == "brief"
    assert automation_name("telegram:1") is None


@dataclasses.dataclass(frozen=True)
class PigeonSettings:
    enabled: bool = False
    allow: tuple[str, ...] = ()
    key: str | None = dataclasses.field(default=None, repr=False)


PIGEON: Platform[PigeonSettings] = Platform(
    name="pigeon", title="Pigeon post", settings=PigeonSettings,
    spec={"enabled": _BOOL, "allow": _array(_like("[a-z]+", "a loft name"))},
    secrets={"key": "ROOST_PIGEON_KEY"}, required_secrets=("key",),
    person="[a-z]+", group="#[a-z]+", forms="'pigeon:<loft>', 'pigeon:#<flock>'",
    person_forms="'pigeon:<loft>'", note="The user reads you on a slip of paper.",
    runtime="channels.pigeon.channel", allowed=lambda s, sender: sender in s.allow)


@pytest.fixture
def with_pigeons() -> Iterator[None]:
    install([*PLATFORMS, PIGEON])
    try:
        yield
    finally:
        install(PLATFORMS)


def test_a_fourth_platform_is_read_by_the_same_core(with_pigeons: None, tmp_path: Path) -> None:
    """What adding a platform asks of the core: nothing but its description."""
    assert "pigeon" in installed()
    path = write(tmp_path, '[pigeon]\nenabled = true\nallow = ["attic"]\n'
                           '[identities]\nme = ["pigeon:attic", "console:local"]\n'
                           '[[automations]]\nname = "n"\nschedule = "every 1h"\nprompt = "p"\n'
                           'deliver = ["pigeon:#roof"]\n')
    with pytest.raises(ConfigError) as refused:
        load_settings(path, env={"HOME": "/nonexistent"})
    assert refused.value.key == "pigeon.enabled" and "ROOST_PIGEON_KEY" in refused.value.problem
    settings = load_settings(path, env={"ROOST_PIGEON_KEY": "k", "HOME": "/nonexistent"})
    assert settings.platforms["pigeon"] == PigeonSettings(enabled=True, allow=("attic",), key="k")
    assert is_person_chat("pigeon:attic") and not is_person_chat("pigeon:#roof")
    assert "slip of paper" in channel_note("pigeon")
