"""`[people.NAME]` in the config file: each person's chats, role and a guest's daily turns, and
the error a user reads for each way of getting it wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.core.config import PersonSettings, load_settings
from daemon.core.errors import ConfigError

PEOPLE = """\
[people.dana]
chats = ["telegram:1111111", "whatsapp:972544401243", "console:local"]
role = "owner"

[people.omar]
chats = ["telegram:2222222", "matrix:@omar:example.org"]

[people.sam]
chats = ["telegram:3333333"]
role = "guest"

[people.zoe]
chats = ["whatsapp:4915112345678"]
role = "guest"
daily_messages = 5
"""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path / "home"), "TZ": "UTC"}


def test_people_are_read_with_their_roles_and_a_guests_daily_turns(
        tmp_path: Path, env: dict[str, str]) -> None:
    path = tmp_path / "roost.toml"
    path.write_text(PEOPLE, encoding="utf-8")
    settings = load_settings(path, env=env)
    assert dict(settings.people) == {
        "dana": PersonSettings(("telegram:1111111", "whatsapp:972544401243", "console:local"),
                               "owner"),
        "omar": PersonSettings(("telegram:2222222", "matrix:@omar:example.org"), "member"),
        "sam": PersonSettings(("telegram:3333333",), "guest", 30),
        "zoe": PersonSettings(("whatsapp:4915112345678",), "guest", 5),
    }
    with pytest.raises(TypeError):
        settings.people["x"] = PersonSettings(())  # type: ignore[index]
    assert dict(load_settings(env=env).people) == {}


@pytest.mark.parametrize(("text", "key", "problem"), [
    ('[people.sam]\nchats = ["telegram:3"]\nrole = "admin"', "people.sam.role",
     "must be one of owner or member or guest, got 'admin'"),
    ('[people.omar]\nchats = ["telegram:2"]\ndaily_messages = 30', "people.omar.daily_messages",
     "only a guest has a daily limit; omar's role is 'member'"),
    ('[people.omar]\nchats = ["telegram:2"]\nrole = "owner"\ndaily_messages = 30',
     "people.omar.daily_messages", "only a guest has a daily limit"),
    ('[people.sam]\nchats = ["telegram:3"]\nrole = "guest"\ndaily_messages = 0',
     "people.sam.daily_messages", "must be at least 1, got 0"),
    ('[people.sam]\nchats = ["telegram:3"]\nrole = "guest"\ndaily_messages = "30"',
     "people.sam.daily_messages", "expected an integer, got string"),
    ('[people.dana]\nchats = ["telegram:1"]\n[people.omar]\nchats = ["whatsapp:2", "telegram:1"]',
     "people.omar.chats", "telegram:1 is already a chat of [people.dana]: a chat belongs to one "
     "person"),
    ('[identities]\nolive = ["telegram:1"]\n[people.omar]\nchats = ["telegram:1"]',
     "people.omar.chats", "telegram:1 is already a chat of [identities] olive"),
    ('[people.omar]\nchats = ["telegram:-1001234567890"]', "people.omar.chats[0]",
     "must be a person's chat"),
    ('[people.omar]\nchats = ["telegram:2222222:5"]', "people.omar.chats[0]",
     "must be a person's chat"),
    ('[identities]\ndana = ["telegram:1"]\n[people.dana]\nchats = ["whatsapp:2"]', "people.dana",
     "'dana' is also in [identities]: a person is named in one place; move their chats to "
     "[people.dana] and take dana out of [identities]"),
    ('[people.omar]\nchats = ["console:local"]', "people.omar.chats",
     'console:local is the terminal, the owner\'s: only a person with role = "owner" may list it'),
    ('[people.omar]\nrole = "member"', "people.omar.chats",
     "must name at least one of their chats"),
    ('[people.omar]\nchats = []', "people.omar.chats", "must name at least one of their chats"),
    ('[people.omar]\nchats = ["telegram:2"]\ncolour = "blue"', "people.omar.colour", "unknown key"),
    ('[people]\nomar = ["telegram:2"]', "people.omar",
     "expected a table [people.omar] with chats and role, got array"),
    ('[people.Omar]\nchats = ["telegram:2"]', "people.Omar", "lowercase"),
    ('people = "omar"', "people", "expected [people.NAME] tables, got string"),
])
def test_bad_people_name_the_key_and_say_what_is_wrong(
        tmp_path: Path, env: dict[str, str], text: str, key: str, problem: str) -> None:
    path = tmp_path / "roost.toml"
    path.write_text(text + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env=env)
    assert caught.value.key == key and problem in caught.value.problem, str(caught.value)
    assert str(path) in str(caught.value)  # one line naming the key and the file
