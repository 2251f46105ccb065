"""`[model] hosts`: a pool of Ollama servers, as URLs or `[[model.hosts]]` tables; `host` alone
is a pool of one, and the two together are an error naming the keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.core.config import DEFAULT_HOST, load_settings
from daemon.core.config.sections import HostSettings
from daemon.core.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "roost.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_host_alone_is_a_pool_of_one(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, '[model]\nhost = "http://box:11434/"\n'), env={})
    assert settings.model.pool == (HostSettings("http://box:11434"),)
    assert load_settings(None, env={"HOME": str(tmp_path)}).model.pool == (
        HostSettings(DEFAULT_HOST),)


def test_hosts_as_urls_and_as_tables(tmp_path: Path) -> None:
    urls = load_settings(write(tmp_path, (
        '[model]\nhosts = ["http://evening-pc:11434", "http://small-box:11434/"]\n')), env={})
    assert urls.model.pool == (HostSettings("http://evening-pc:11434"),
                               HostSettings("http://small-box:11434"))
    assert urls.model.host == "http://evening-pc:11434"  # the first: what messages name

    tables = load_settings(write(tmp_path, """\
[model]
name = "qwen3:4b"

[[model.hosts]]
url = "http://small-box:11434"

[[model.hosts]]
url = "http://evening-pc:11434"
priority = 10
models = ["qwen3:14b", "qwen3:4b"]
"""), env={})
    assert tables.model.pool == (
        HostSettings("http://small-box:11434"),
        HostSettings("http://evening-pc:11434", priority=10, models=("qwen3:14b", "qwen3:4b")))
    assert tables.model.host == "http://small-box:11434"


def test_an_empty_hosts_leaves_host(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, (
        '[model]\nhost = "http://box:11434"\nhosts = []\n')), env={})
    assert settings.model.pool == (HostSettings("http://box:11434"),)


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ('host = "http://a:11434"\nhosts = ["http://b:11434"]', "model.hosts",
         "set model.host or model.hosts, not both"),
        ('hosts = ["http://a:11434", "http://A:11434/"]', "model.hosts[1]",
         "listed twice (also model.hosts[0])"),
        ('hosts = "http://a:11434"', "model.hosts", "expected an array"),
        ('hosts = ["a:11434"]', "model.hosts[0]", "http:// or https://"),
        ('hosts = [3]', "model.hosts[0]", "expected a URL string or a table"),
        ('hosts = [{priority = 1}]', "model.hosts[0].url", "needs its url"),
        ('hosts = [{url = "http://a:11434", weight = 2}]', "model.hosts[0].weight",
         "unknown key"),
        ('hosts = [{url = "http://a:11434", priority = "high"}]', "model.hosts[0].priority",
         "expected an integer"),
        ('hosts = [{url = "http://a:11434", models = ["qwen3:4b", ""]}]',
         "model.hosts[0].models[1]", "must not be empty"),
        ('[[model.hosts]]\nurl = "http://a:11434"\n[[model.hosts]]\nurl = "ftp://b"',
         "model.hosts[1].url", "http:// or https://"),
    ],
)
def test_errors_name_the_key_and_the_file(tmp_path: Path, text: str, key: str,
                                          problem: str) -> None:
    path = write(tmp_path, f"[model]\n{text}\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env={})
    assert caught.value.key == key
    assert str(caught.value).startswith(f"{key} in {path}: ")
    assert problem in caught.value.problem
