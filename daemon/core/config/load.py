"""Reading the file: the tables checked against their specs into one frozen `Settings`."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from daemon.core.config.automations import (
    _AUTOMATION,
    AutomationSettings,
    _automations,
    _check_people,
)
from daemon.core.config.credentials import (
    SECRETS,
    SYSTEM_CONFIG,
    _config_home,
    _home,
    credentials_dir,
    read_secret,
)
from daemon.core.config.identities import PersonSettings, _identities, _people
from daemon.core.config.mcp import _MCP, _MCP_SERVER, McpSettings, _mcp
from daemon.core.config.sections import (
    _SPECS,
    AccessSettings,
    AttachmentSettings,
    ConsoleSettings,
    DaemonSettings,
    ModelSettings,
    SpeechSettings,
    VoiceSettings,
    WebSettings,
    model_settings,
)
from daemon.core.config.values import _TEXT, _TOML_TYPES, _Bad, _seconds, _Spec, _valid_zone
from daemon.core.errors import ConfigError
from daemon.core.platforms import installed


@dataclass(frozen=True)
class Settings:
    daemon: DaemonSettings
    model: ModelSettings
    # Each installed platform's settings by its name (channels/<name>/platform.py): read one
    # with the platform's `of`, e.g. TELEGRAM.of(settings.platforms).
    platforms: Mapping[str, Any]
    access: AccessSettings
    attachments: AttachmentSettings
    automations: tuple[AutomationSettings, ...]
    variables: Mapping[str, str]
    source: Path | None  # the file loaded, or None for defaults
    credentials: Path | None = None  # the folder secrets were looked for in (credentials_dir)
    # One person's chats on several channels: name -> chat keys (facts and recall are shared)
    identities: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: MappingProxyType({}))
    # `[people.NAME]`: each person's chats and role (owner, member, guest); they may talk on
    # those chats without pairing. daemon/intake/household.py answers who is who.
    people: Mapping[str, PersonSettings] = field(default_factory=lambda: MappingProxyType({}))
    web: WebSettings = field(default_factory=WebSettings)
    voice: VoiceSettings = field(default_factory=VoiceSettings)
    speech: SpeechSettings = field(default_factory=SpeechSettings)
    mcp: McpSettings = field(default_factory=McpSettings)
    console: ConsoleSettings = field(default_factory=ConsoleSettings)

    @property
    def linked(self) -> Mapping[str, tuple[str, ...]]:
        """Every named person's chats, `[identities]` and `[people]` together (a name and a
        chat are in one of them only): the chats that share facts and recall."""
        return MappingProxyType({**self.identities,
                                 **{name: p.chats for name, p in self.people.items()}})

    @classmethod
    def defaults(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings used when there is no config file: console only, local Ollama."""
        return _build({}, None, os.environ if env is None else env)


def config_keys() -> dict[str, frozenset[str]]:
    """Every key the config file may hold, by table as the README heads it (`[model]`,
    `[[automations]]`): tests/test_readme.py holds the README's key reference to it, both ways.
    [variables] takes any key and is not listed."""
    keys = {f"[{name}]": frozenset(spec) for name, spec in _SPECS.items()}
    keys |= {f"[{name}]": frozenset(p.spec) for name, p in installed().items()}
    keys["[[automations]]"] = frozenset(_AUTOMATION)
    keys["[mcp]"] = frozenset(_MCP)
    keys["[mcp.servers.NAME]"] = frozenset(_MCP_SERVER)
    return keys


# --- loading -----------------------------------------------------------------------------------


def parse_duration(text: str, key: str = "duration", source: str | None = None) -> float:
    """'90s', '30m', '3h', '1d', '1h30m', '500ms' -> seconds; bad text is a ConfigError on key."""
    try:
        return _seconds(text)
    except _Bad as bad:
        raise ConfigError(key, str(bad), source) from None


def find_config_path(explicit: Path | None, env: Mapping[str, str]) -> Path | None:
    """The config file to use: --config, $ROOST_CONFIG, ./roost.toml, the user's, the system's."""
    if named := explicit or env.get("ROOST_CONFIG"):
        if not Path(named).exists():
            raise ConfigError("config", "file not found", str(named))
        return Path(named)
    for candidate in (Path.cwd() / "roost.toml", _config_home(env) / "roost/roost.toml",
                      SYSTEM_CONFIG):
        if candidate.is_file():
            return candidate
    return None


def load_settings(path: Path | None = None, env: Mapping[str, str] | None = None, *,
                  require_secrets: bool = True) -> Settings:
    """Read and validate the config file (found by `find_config_path` when path is None).

    Commands that only read state pass `require_secrets=False`: a missing channel secret then
    does not stop them (`missing_secrets` tells what `roost run` would refuse)."""
    env = os.environ if env is None else env
    path = find_config_path(None, env) if path is None else Path(path)
    settings = _build(_read_document(path), path, env)
    if require_secrets and (missing := missing_secrets(settings)):
        raise missing[0]
    return settings


def missing_secrets(settings: Settings) -> list[ConfigError]:
    """The secrets the enabled channels need and do not have, as the errors `roost run` gives."""
    source = str(settings.source) if settings.source else None
    folder = settings.credentials or "$CREDENTIALS_DIRECTORY"
    missing = []
    for name, platform in installed().items():
        own = platform.of(settings.platforms)
        unset = platform.missing_secrets(own)
        if own.enabled and unset:
            missing.append(ConfigError(f"{name}.enabled", f"needs {', '.join(unset)} in the "
                                       f"environment or as files in {folder} (roost init "
                                       "writes them)", source))
    return missing


def _read_document(path: Path | None) -> Mapping[str, Any]:
    if path is None:
        return {}
    try:
        with path.open("rb") as file:
            document = tomllib.load(file)
    except OSError as error:
        problem = f"cannot read the file: {error.strerror or error}"
        raise ConfigError("config", problem, str(path)) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError("config", f"not valid TOML: {error}", str(path)) from None
    return document


def _check_together(model: ModelSettings, platforms: Mapping[str, Any],
                    fail: Callable[[str, str], ConfigError]) -> None:
    """The settings that are wrong only together with others."""
    for key, broken, problem in (
        ("model.response_reserve", model.response_reserve >= model.window,
         f"must be less than model.window ({model.window})"),
        # A stall as long as the timeout would never be said: the request fails first.
        ("model.stall", model.stall >= model.timeout,
         f"must be shorter than model.timeout ({model.timeout:g}s)"),
    ):
        if broken:
            raise fail(key, problem)
    for name, platform in installed().items():
        own = platform.of(platforms)
        for key, problem in platform.check(own) if own.enabled else ():
            raise fail(f"{name}.{key}", problem)


# The tables read by a module of their own (beside the plain ones of sections and platforms).
_OWN_READERS = ("automations", "variables", "identities", "people", "mcp")


def _known_tables(document: Mapping[str, Any], fail: Callable[[str, str], ConfigError]) -> None:
    """Every top-level name of the file is a table roost reads."""
    for name, value in document.items():
        if name not in (*_SPECS, *installed(), *_OWN_READERS):
            raise fail(name, "unknown table" if isinstance(value, dict) else "unknown key")


def _build(document: Mapping[str, Any], path: Path | None, env: Mapping[str, str]) -> Settings:
    def fail(key: str, problem: str) -> ConfigError:
        return ConfigError(key, problem, str(path) if path else None)

    def read(table: Any, prefix: str, spec: _Spec) -> dict[str, Any]:
        if not isinstance(table, dict):
            raise fail(prefix, f"expected a table, got {_TOML_TYPES.get(type(table), 'date/time')}")
        values: dict[str, Any] = {}
        for key, value in table.items():
            if secret := secret_names.get(prefix, {}).get(key):
                raise fail(f"{prefix}.{key}", f"secrets do not belong in the config file; set "
                           f"{secret} in the environment or $CREDENTIALS_DIRECTORY/{secret}")
            if key not in spec:
                raise fail(f"{prefix}.{key}", "unknown key")
            try:
                values[key] = spec[key](value)
            except _Bad as bad:
                raise fail(f"{prefix}.{key}{bad.where}", str(bad)) from None
        return values

    platforms = installed()
    secret_names = {**SECRETS, **{name: p.secrets for name, p in platforms.items()}}
    _known_tables(document, fail)
    tables = {name: read(document.get(name, {}), name, spec) for name, spec in _SPECS.items()}
    secrets: dict[str, dict[str, Any]] = {
        name: {key: read_secret(var, env, path) for key, var in names.items()}
        for name, names in secret_names.items()}
    daemon = tables["daemon"]
    listen_host, listen_port = daemon.pop("listen", ("127.0.0.1", 8780))
    state_dir = _state_dir(daemon.pop("state_dir", None), path, env)
    daemon["timezone"] = daemon.get("timezone") or _system_timezone(env)
    model = model_settings(tables["model"], fail)
    own: dict[str, Any] = {}
    for name, platform in platforms.items():
        table = read(document.get(name, {}), name, platform.spec)
        if name in document:
            platform.prepare(table)
        own[name] = platform.settings(**table, **secrets[name])
    _check_together(model, own, fail)

    jobs = _automations(document.get("automations", []), read, fail)
    # [variables] takes any key; read() still checks that it is a table of strings.
    raw = document.get("variables", {})
    variables = read(raw, "variables", dict.fromkeys(raw if isinstance(raw, dict) else (), _TEXT))
    mcp = _mcp(document.get("mcp", {}), read, fail, env, path)
    identities = _identities(document.get("identities", {}), fail)
    people = _people(document.get("people", {}), read, fail, identities)
    _check_people(jobs, {*identities, *people}, fail)
    return Settings(
        mcp=mcp, daemon=DaemonSettings(state_dir, listen_host, listen_port, **daemon), model=model,
        platforms=MappingProxyType(own), access=AccessSettings(**tables["access"]),
        attachments=AttachmentSettings(**tables["attachments"]),
        automations=jobs, variables=MappingProxyType(variables), source=path,
        credentials=credentials_dir(env, path),
        identities=identities, people=people,
        web=WebSettings(**tables["web"], **secrets["web"]),
        voice=VoiceSettings(**tables["voice"], **secrets["voice"]),
        speech=SpeechSettings(**tables["speech"], **secrets["speech"]),
        console=ConsoleSettings(**tables["console"]))


def _state_dir(configured: str | None, path: Path | None, env: Mapping[str, str]) -> Path:
    if configured is None:
        # systemd's StateDirectory= may list several, colon-separated; ours is the first.
        if env.get("STATE_DIRECTORY"):
            return Path(env["STATE_DIRECTORY"].split(":")[0])
        return Path(env.get("XDG_STATE_HOME") or _home(env) / ".local/state") / "roost"
    state_dir = Path(configured)
    if state_dir.parts[:1] == ("~",):
        state_dir = _home(env).joinpath(*state_dir.parts[1:])
    # A relative path is taken from the config file's directory, not from wherever we started.
    return state_dir if state_dir.is_absolute() or path is None else path.parent / state_dir


def _system_timezone(env: Mapping[str, str]) -> str:
    """$TZ (libc reads it first too), else the zone /etc/localtime links to, else UTC."""
    try:
        link = os.readlink("/etc/localtime")
    except OSError:
        link = ""
    _, found, zone = link.rpartition("zoneinfo/")
    for name in (env.get("TZ", "").lstrip(":"), zone.removeprefix("posix/") if found else ""):
        if name and _valid_zone(name):
            return name
    return "UTC"
