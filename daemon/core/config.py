"""TOML file + environment secrets -> typed, validated, frozen settings.

The file is read once, here; every other module gets a `Settings` passed down. Each table is
checked against a small spec (key -> converter), so an unknown key, a wrong type or a bad value
becomes a `ConfigError` that names the dotted key and the file. Secrets never come from the file:
they are read from the environment or from systemd credentials (`$CREDENTIALS_DIRECTORY/<NAME>`),
else from the folder `roost init` writes them to (`credentials_dir`).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from daemon.core import crontab
from daemon.core.errors import ConfigError, RoostError

DEFAULT_HOST = "http://127.0.0.1:11434"
SYSTEM_CONFIG = Path("/etc/roost/roost.toml")
SYSTEM_CREDENTIALS = Path("/etc/roost/credentials")

# Environment variable (and credential file) name of each secret, per table.
SECRETS: Mapping[str, Mapping[str, str]] = {
    "telegram": {"token": "ROOST_TELEGRAM_TOKEN", "secret": "ROOST_TELEGRAM_SECRET"},
    "whatsapp": {"token": "ROOST_WHATSAPP_TOKEN", "app_secret": "ROOST_WHATSAPP_APP_SECRET",
                 "verify_token": "ROOST_WHATSAPP_VERIFY_TOKEN"},
    "voice": {"key": "ROOST_VOICE_KEY"},
    "web": {"ollama_api_key": "ROOST_OLLAMA_API_KEY"}}
OLLAMA_WEB_SEARCH = "https://ollama.com/api/web_search"
# What @BotFather gives: the bot's id, a colon, then letters, digits, '-' and '_'.
BOT_TOKEN = re.compile(r"[0-9]+:[A-Za-z0-9_-]+")
MALFORMED_TOKEN = ("does not look like a bot token (digits, a colon, then letters, digits, - "
                   "and _, with no quotes or spaces): copy it again from @BotFather")


@dataclass(frozen=True)
class DaemonSettings:
    state_dir: Path  # TinyDB files, attachments, corpus/, debug/
    listen_host: str = "127.0.0.1"
    listen_port: int = 8780
    timezone: str = "UTC"
    idle_rotation: float = 3 * 3600.0  # seconds idle before a chat starts a new conversation
    shutdown_grace: float = 20.0  # seconds the whole stop may take on SIGTERM (most for turns)

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)


@dataclass(frozen=True)
class ModelSettings:
    host: str = DEFAULT_HOST
    name: str = "qwen3:4b"
    window: int = 8192  # num_ctx, before capping at the model's context_length
    response_reserve: int = 1024
    keep_alive: str = "30m"  # passed to Ollama unchanged
    concurrency: int = 1
    timeout: float = 300.0  # seconds of silence before a request counts as timed out
    retry_attempts: int = 5  # tries while Ollama is unreachable, then the turn is parked
    retry_backoff: float = 2.0  # seconds before the first retry, doubled each time
    max_calls: int = 8  # model calls one turn may make (tool rounds, continuations)
    think: bool = False  # let a thinking model think on chat turns (never on background calls)


@dataclass(frozen=True)
class TelegramSettings:
    enabled: bool = False
    mode: str = "webhook"  # or "polling"; a file without mode: webhook only with a webhook_url
    webhook_url: str | None = None
    api_base: str = "https://api.telegram.org/bot"
    file_base: str = "https://api.telegram.org/file/bot"
    allow: tuple[int, ...] = ()  # user ids
    streaming: str = "draft"  # or "off": replies shown as they are written (sendMessageDraft)
    draft_interval: float = 0.7  # seconds between two draft updates of one chat
    token: str | None = field(default=None, repr=False)
    secret: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class WhatsAppSettings:
    enabled: bool = False
    phone_number_id: str | None = None
    api_base: str = "https://graph.facebook.com"
    api_version: str = "v23.0"
    allow: tuple[str, ...] = ()  # wa_ids, digits only
    fallback: str | None = None  # a chat key for replies WhatsApp refuses after 24 hours
    # An approved template sent when a reply is held by the 24-hour rule ("reply to see it")
    template: str | None = None
    template_language: str = "en_US"
    template_parameter: bool = False  # its one body parameter: the held reply's first words
    template_interval: float = 24 * 3600.0  # at most one template per chat this often
    business_account_id: str | None = None  # the WABA, for doctor's check of the template
    token: str | None = field(default=None, repr=False)
    app_secret: str | None = field(default=None, repr=False)
    verify_token: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class AccessSettings:
    unknown_senders: str = "pair"  # or "ignore"
    rate_limit: int = 20  # messages a minute per sender; more wait and are answered later


@dataclass(frozen=True)
class AttachmentSettings:
    image_max_side: int = 1024  # pixels of the longer side after downscaling
    image_max_mb: int = 20  # an image larger than this is refused with a clear message
    file_max_mb: int = 50  # likewise for documents, voice notes and other files


@dataclass(frozen=True)
class VoiceSettings:
    """Transcription of voice notes and audio (daemon/voice/); off unless a backend is named."""

    backend: str = "off"  # "http" (an OpenAI-compatible server) or "faster-whisper" (in-process)
    url: str = "http://127.0.0.1:8000/v1/audio/transcriptions"  # the http backend's endpoint
    model: str = "small"  # the server's model id, or faster-whisper's size name or directory
    language: str | None = None  # e.g. "de"; None lets the model detect it
    device: str = "auto"  # faster-whisper: "auto", "cpu" or "cuda"
    compute_type: str = "default"  # faster-whisper: "int8", "float16", ...
    max_duration: float = 600.0  # seconds; a longer recording is not transcribed
    timeout: float = 120.0  # seconds one transcription may take
    queue_with_model: bool = True  # wait for a model slot, as a model call does (one GPU)
    key: str | None = field(default=None, repr=False)  # ROOST_VOICE_KEY, for the http backend


@dataclass(frozen=True)
class WebSettings:
    searxng_url: str | None = None  # a SearXNG instance for web_search (JSON format enabled)
    ollama_search_url: str = OLLAMA_WEB_SEARCH  # used when ROOST_OLLAMA_API_KEY is set
    allow_private: bool = False  # let web_fetch reach loopback, LAN and link-local addresses
    allow_hosts: tuple[str, ...] = ()  # host names or addresses web_fetch may reach anyway
    timeout: float = 20.0  # seconds for one fetch, redirects included
    max_mb: int = 5  # a page larger than this is refused, not cut
    ollama_api_key: str | None = field(default=None, repr=False)

    @property
    def search_backend(self) -> str | None:
        """"searxng", "ollama" or None (then there is no web_search tool)."""
        if self.searxng_url:
            return "searxng"
        return "ollama" if self.ollama_api_key else None


@dataclass(frozen=True)
class AutomationSettings:
    name: str
    schedule: str  # crontab, 5 fields, unconverted: 0 and 7 are Sunday; or "every <duration>"
    prompt: str
    deliver: tuple[str, ...]  # "telegram:<chat id>", "whatsapp:<wa_id>", "console:local", "log"
    model: str | None = None  # None: the chat model (another one means a reload on one GPU)
    enabled: bool = True
    quiet: str | None = None  # a reply that is exactly this token is not delivered
    grace: float = 300.0  # APScheduler's misfire_grace_time; also how long a run retries
    timeout: float = 600.0  # a run still going after this long is stopped and recorded


@dataclass(frozen=True)
class McpServerSettings:
    """One `[mcp.servers.NAME]`: a stdio server (`command`) or a streamable HTTP one (`url`)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)  # ${NAME}s resolved
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # likewise
    description: str | None = None  # the index line; else the server's own, cut to one line
    approve: str = "ask"  # "never" | "ask" | "always", for every tool of the server
    approve_tools: Mapping[str, str] = field(default_factory=dict)  # per tool, over `approve`
    timeout: float = 60.0  # seconds one call may take
    enabled: bool = True
    missing: tuple[str, ...] = ()  # ${NAME}s with no value: the server cannot start


@dataclass(frozen=True)
class McpSettings:
    servers: tuple[McpServerSettings, ...] = ()
    approve_timeout: float = 600.0  # no answer within this counts as Deny
    start_timeout: float = 30.0  # a server not listing its tools by then failed this start
    result_max_chars: int = 20_000  # what is kept of one result; the model sees less of it


@dataclass(frozen=True)
class ConsoleSettings:
    enabled: bool = True  # the web console under /console/ on daemon.listen
    url: str | None = None  # how a browser reaches roost (a proxy's https address), for links


@dataclass(frozen=True)
class Settings:
    daemon: DaemonSettings
    model: ModelSettings
    telegram: TelegramSettings
    whatsapp: WhatsAppSettings
    access: AccessSettings
    attachments: AttachmentSettings
    automations: tuple[AutomationSettings, ...]
    variables: Mapping[str, str]
    source: Path | None  # the file loaded, or None for defaults
    credentials: Path | None = None  # the folder secrets were looked for in (credentials_dir)
    # One person's chats on several channels: name -> chat keys (facts and recall are shared)
    identities: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: MappingProxyType({}))
    web: WebSettings = WebSettings()
    voice: VoiceSettings = field(default_factory=VoiceSettings)
    mcp: McpSettings = field(default_factory=McpSettings)
    console: ConsoleSettings = ConsoleSettings()

    @classmethod
    def defaults(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings used when there is no config file: console only, local Ollama."""
        return _build({}, None, os.environ if env is None else env)


# --- converters: each takes a TOML value and returns the setting, or raises _Bad ---------------


class _Bad(RoostError, ValueError):
    """A value is wrong; `where` is appended to the key (e.g. "[2]" for an array item)."""

    def __init__(self, problem: str, where: str = "") -> None:
        super().__init__(problem)
        self.where = where


Convert = Callable[[Any], Any]
_Spec = Mapping[str, Convert]
_TOML_TYPES = {bool: "boolean", int: "integer", float: "float", str: "string", list: "array",
               dict: "table"}  # anything else tomllib returns is a date or time


def _value(kind: type, what: str, ok: Callable[[Any], object] | None = None, rule: str = "",
           then: Convert | None = None) -> Convert:
    """A converter: check the TOML type, then `ok(value)` (else "rule, got value"), then `then`."""

    def convert(value: Any) -> Any:
        if type(value) is not kind:  # not isinstance(): a TOML boolean must not pass as an integer
            raise _Bad(f"expected {what}, got {_TOML_TYPES.get(type(value), 'date/time')}")
        if ok is not None and not ok(value):
            raise _Bad(f"{rule}, got {value!r}")
        return value if then is None else then(value)

    return convert


def _array(item: Convert) -> Convert:
    def convert(value: Any) -> tuple[Any, ...]:
        out = []
        for i, element in enumerate(_value(list, "an array")(value)):
            try:
                out.append(item(element))
            except _Bad as bad:
                raise _Bad(str(bad), f"[{i}]") from None
        return tuple(out)

    return convert


def _at_least(low: int) -> Convert:
    return _value(int, "an integer", lambda v: v >= low, f"must be at least {low}")


def _one_of(*options: str) -> Convert:
    return _value(str, "a string", options.__contains__, f"must be one of {' or '.join(options)}")


def _like(pattern: str, rule: str) -> Convert:
    return _value(str, "a string", re.compile(pattern).fullmatch, f"must be {rule}")


_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile("([0-9]+(?:[.][0-9]+)?)(ms|s|m|h|d)")


def _seconds(text: str) -> float:
    if not re.fullmatch(f"(?:{_PART.pattern})+", text):
        raise _Bad(f"expected a duration like '90s', '30m', '3h', '1d' or '1h30m', got {text!r}")
    return sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(text))


def _file_base(api_base: str) -> str:
    """Where files are downloaded beside a Bot API base, as Telegram and a local Bot API server
    lay them out: https://api.telegram.org/bot -> https://api.telegram.org/file/bot."""
    parts = urlsplit(api_base)
    head, _, last = parts.path.rpartition("/")
    if not last:  # no path to go by (doctor names the address's problem)
        return api_base.rstrip("/") + "/file/bot"
    return parts._replace(path=f"{head}/file/{last}").geturl()


def _is_url(text: str) -> bool:
    parts = urlsplit(text)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _host_name(text: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9.-]+|\[?[0-9A-Fa-f:.]+\]?", text) is not None


def _valid_zone(name: str) -> bool:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return False
    return True


def _listen(text: str) -> tuple[str, int]:
    match = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:([0-9]+)|([^:\[\]\s]+):([0-9]+)", text)
    if not match or int(match[2] or match[4]) > 65535:
        raise _Bad(f"expected 'host:port' or '[ipv6]:port', got {text!r}")
    return match[1] or match[3], int(match[2] or match[4])


def _schedule(text: str) -> str:
    if text.startswith("every "):
        every = text.removeprefix("every ").strip()
        if _seconds(every) < 60 or _seconds(every) % 60:
            raise _Bad(f"'every' takes whole minutes, at least '1m', got {every!r}")
        return text
    try:
        return crontab.check(text)
    except ValueError as exc:
        raise _Bad(str(exc)) from None


def _ollama_duration(text: str) -> bool:
    # Passed to Ollama as is, which parses it with Go's time.ParseDuration: no days there.
    return text in ("-1", "0") or ("d" not in text and _seconds(text) >= 0)


_TEXT = _value(str, "a string")
_STRING = _value(str, "a string", str.strip, "must not be empty")
_BOOL = _value(bool, "a boolean (true or false)")
_URL = _value(str, "a URL string", _is_url, "must be an http:// or https:// URL")
_BASE_URL = _value(str, "a URL string", _is_url, "must be an http:// or https:// URL",
                   lambda v: v.rstrip("/"))  # a bare host: paths are joined onto it
_DURATION = _value(str, "a duration string such as '20s'", then=_seconds)
_PERIOD = _value(str, "a duration string such as '3h'", lambda v: _seconds(v) > 0,
                 "must be longer than zero", _seconds)
_DIGITS = _like("[0-9]+", "digits only (no '+' or spaces)")

# What each table may hold; [[automations]] and [variables] are read separately.
_SPECS: Mapping[str, _Spec] = {
    "daemon": {
        "state_dir": _STRING, "listen": _value(str, "a string 'host:port'", then=_listen),
        "timezone": _value(str, "an IANA time zone name", _valid_zone,
                           "must be an IANA time zone name such as 'Europe/Berlin'"),
        "idle_rotation": _PERIOD, "shutdown_grace": _DURATION},
    "console": {"enabled": _BOOL, "url": _URL},
    "model": {
        "host": _BASE_URL, "name": _STRING, "window": _at_least(512),
        "response_reserve": _at_least(1), "concurrency": _at_least(1),
        "keep_alive": _value(str, "a duration string such as '30m'", _ollama_duration,
                             "must be '-1', '0' or a duration in ms, s, m or h (Ollama has no d)"),
        "timeout": _PERIOD, "retry_attempts": _at_least(1), "retry_backoff": _DURATION,
        "max_calls": _at_least(1), "think": _BOOL},
    "telegram": {
        "enabled": _BOOL, "mode": _one_of("webhook", "polling"), "webhook_url": _URL,
        "api_base": _URL, "file_base": _URL, "allow": _array(_value(int, "an integer user id")),
        "streaming": _one_of("draft", "off"),
        "draft_interval": _value(str, "a duration string such as '700ms'",
                                 lambda v: 0.1 <= _seconds(v) <= 60, "must be 100ms to 60s",
                                 _seconds)},
    "whatsapp": {
        "enabled": _BOOL, "phone_number_id": _DIGITS, "api_base": _BASE_URL,
        "api_version": _like("v[0-9]+[.][0-9]+", "like 'v23.0'"), "allow": _array(_DIGITS),
        "fallback": _like("telegram:-?[0-9]+(:[0-9]+)?", "'telegram:<chat id>'"),
        "template": _like("[a-z0-9_]{1,512}", "a template's name: lowercase letters, digits, _"),
        "template_language": _like("[a-z]{2,3}(_[A-Z]{2})?", "a language code such as 'en_US'"),
        "template_parameter": _BOOL, "template_interval": _PERIOD,
        "business_account_id": _DIGITS},
    "access": {"unknown_senders": _one_of("pair", "ignore"), "rate_limit": _at_least(1)},
    "attachments": {
        "image_max_side": _at_least(64), "image_max_mb": _at_least(1),
        "file_max_mb": _at_least(1)},
    "voice": {
        "backend": _one_of("off", "http", "faster-whisper"), "url": _URL, "model": _STRING,
        "language": _like("[a-z]{2,3}", "a language code such as 'en' or 'de'"),
        "device": _one_of("auto", "cpu", "cuda"), "compute_type": _STRING,
        "max_duration": _PERIOD, "timeout": _PERIOD, "queue_with_model": _BOOL},
    "web": {
        "searxng_url": _BASE_URL, "ollama_search_url": _URL, "allow_private": _BOOL,
        "allow_hosts": _array(_value(str, "a host name or address", _host_name,
                                     "must be a bare host name or address (no scheme or port)",
                                     lambda v: v.strip("[]").lower())),
        "timeout": _PERIOD, "max_mb": _at_least(1)},
}
_AUTOMATION: _Spec = {
    "name": _like("[a-z0-9_-]+", "lowercase letters, digits, '-' and '_'"),
    "schedule": _value(str, "a crontab string such as '0 7 * * *' or 'every 1h'",
                       then=_schedule),
    "prompt": _STRING,
    # A forum topic is its own chat: `telegram:<chat>:<topic>`, as channels/telegram/parse.py
    # keys it (topic ids start at 1; the General topic has none).
    "deliver": _array(_like("telegram:-?[0-9]+(:[1-9][0-9]*)?|whatsapp:[0-9]+|console:local|log",
                            "a known target ('telegram:<chat id>', 'telegram:<chat id>:<topic>', "
                            "'whatsapp:<wa_id>', 'console:local' or 'log')")),
    "model": _STRING, "enabled": _BOOL, "quiet": _STRING,
    "grace": _value(str, "a duration string such as '5m'", lambda v: _seconds(v) >= 1,
                    "must be at least 1s", _seconds),
    "timeout": _value(str, "a duration string such as '10m'", lambda v: _seconds(v) >= 1,
                      "must be at least 1s", _seconds)}
_AUTOMATION_REQUIRED = ("name", "schedule", "prompt", "deliver")
_APPROVE = _one_of("never", "ask", "always")
_MCP: _Spec = {"approve_timeout": _PERIOD, "start_timeout": _PERIOD,
               "result_max_chars": _at_least(1000)}
_MCP_SERVER: _Spec = {
    "command": _STRING, "args": _array(_TEXT), "env": _value(dict, "a table of strings"),
    "cwd": _STRING, "url": _URL, "headers": _value(dict, "a table of strings"),
    "description": _STRING, "approve": _APPROVE,
    "approve_tools": _value(dict, "a table of tool name = 'never', 'ask' or 'always'"),
    "timeout": _PERIOD, "enabled": _BOOL}
_SERVER_NAME = re.compile("[a-z0-9][a-z0-9_-]{0,29}")
# The capabilities roost registers itself (daemon/tools, automations/reminders.py): a server's
# name is its capability's, so it cannot be one of these (a test holds the list to the code).
BUILTIN_CAPABILITIES = frozenset({"memory", "time", "tools", "files", "facts", "web",
                                  "documents", "reminders"})
# A value the file gives literally under one of these names is a secret in the file.
_SECRETISH = re.compile("(?i)token|secret|password|passwd|api_?key|authorization|cookie")
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def config_keys() -> dict[str, frozenset[str]]:
    """Every key the config file may hold, by table as the README heads it (`[model]`,
    `[[automations]]`): tests/test_readme.py holds the README's key reference to it, both ways.
    [variables] takes any key and is not listed."""
    keys = {f"[{name}]": frozenset(spec) for name, spec in _SPECS.items()}
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
    telegram, whatsapp = settings.telegram, settings.whatsapp
    unset = [var for key, var in SECRETS["whatsapp"].items() if not getattr(whatsapp, key)]
    folder = settings.credentials or "$CREDENTIALS_DIRECTORY"
    return [ConfigError(key, problem, source) for key, broken, problem in (
        ("telegram.enabled", telegram.enabled and not telegram.token, "needs the bot token: set "
         f"ROOST_TELEGRAM_TOKEN, or put it in {folder}/ROOST_TELEGRAM_TOKEN (roost init does)"),
        ("whatsapp.enabled", whatsapp.enabled and unset,
         f"needs {', '.join(unset)} in the environment or as files in {folder}"),
    ) if broken]


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


def credentials_dir(env: Mapping[str, str], config: Path | None = None) -> Path:
    """Where secrets are files: systemd's $CREDENTIALS_DIRECTORY when it is set, else the folder
    `roost init` writes them to, so a plain `roost run` right after init finds them:
    /etc/roost/credentials for the system config, ~/.config/roost/credentials otherwise."""
    if env.get("CREDENTIALS_DIRECTORY"):
        return Path(env["CREDENTIALS_DIRECTORY"])
    if config is not None and config.absolute() == SYSTEM_CONFIG:
        return SYSTEM_CREDENTIALS
    return _config_home(env) / "roost" / "credentials"


def read_secret(name: str, env: Mapping[str, str], config: Path | None = None) -> str | None:
    """A secret from the environment, else from its file in `credentials_dir`."""
    if value := env.get(name, "").strip():
        return value
    path = credentials_dir(env, config) / name
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(name, f"cannot read the credential: {error}", str(path)) from None


def _build(document: Mapping[str, Any], path: Path | None, env: Mapping[str, str]) -> Settings:
    def fail(key: str, problem: str) -> ConfigError:
        return ConfigError(key, problem, str(path) if path else None)

    def read(table: Any, prefix: str, spec: _Spec) -> dict[str, Any]:
        if not isinstance(table, dict):
            raise fail(prefix, f"expected a table, got {_TOML_TYPES.get(type(table), 'date/time')}")
        values: dict[str, Any] = {}
        for key, value in table.items():
            if secret := SECRETS.get(prefix, {}).get(key):
                raise fail(f"{prefix}.{key}", f"secrets do not belong in the config file; set "
                           f"{secret} in the environment or $CREDENTIALS_DIRECTORY/{secret}")
            if key not in spec:
                raise fail(f"{prefix}.{key}", "unknown key")
            try:
                values[key] = spec[key](value)
            except _Bad as bad:
                raise fail(f"{prefix}.{key}{bad.where}", str(bad)) from None
        return values

    for name, value in document.items():
        if name not in (*_SPECS, "automations", "variables", "identities", "mcp"):
            raise fail(name, "unknown table" if isinstance(value, dict) else "unknown key")
    tables = {name: read(document.get(name, {}), name, spec) for name, spec in _SPECS.items()}
    secrets: dict[str, dict[str, Any]] = {
        name: {key: read_secret(var, env, path) for key, var in names.items()}
        for name, names in SECRETS.items()}
    daemon = tables["daemon"]
    listen_host, listen_port = daemon.pop("listen", ("127.0.0.1", 8780))
    state_dir = _state_dir(daemon.pop("state_dir", None), path, env)
    daemon["timezone"] = daemon.get("timezone") or _system_timezone(env)
    model = ModelSettings(**tables["model"])
    if "telegram" in document:  # no mode: a webhook_url says webhook, else polling (no address)
        tables["telegram"].setdefault(
            "mode", "webhook" if tables["telegram"].get("webhook_url") else "polling")
        if "api_base" in tables["telegram"] and "file_base" not in tables["telegram"]:
            tables["telegram"]["file_base"] = _file_base(tables["telegram"]["api_base"])
    telegram = TelegramSettings(**tables["telegram"], **secrets["telegram"])
    whatsapp = WhatsAppSettings(**tables["whatsapp"], **secrets["whatsapp"])
    for key, broken, problem in (
        ("model.response_reserve", model.response_reserve >= model.window,
         f"must be less than model.window ({model.window})"),
        ("telegram.webhook_url", telegram.enabled and telegram.mode == "webhook"
         and not telegram.webhook_url, "is required when telegram.mode is 'webhook' (the "
         "public HTTPS URL of /webhooks/telegram); without a public address, set "
         'mode = "polling"'),
        ("whatsapp.phone_number_id", whatsapp.enabled and not whatsapp.phone_number_id,
         "is required when WhatsApp is enabled"),
    ):
        if broken:
            raise fail(key, problem)

    raw_jobs = document.get("automations", [])
    if not isinstance(raw_jobs, list):
        raise fail("automations", "expected an array of tables ([[automations]])")
    jobs: list[AutomationSettings] = []
    for i, table in enumerate(raw_jobs):
        # Every error about an automation names it, so the user knows which table to fix.
        label = table.get("name") if isinstance(table, dict) else None
        try:
            job = read(table, f"automations[{i}]", _AUTOMATION)
            if missing := [key for key in _AUTOMATION_REQUIRED if not job.get(key)]:
                raise fail(f"automations[{i}].{missing[0]}", "is required and must not be empty")
            if job["name"] in {other.name for other in jobs}:
                raise fail(f"automations[{i}].name", "is used by another automation")
        except ConfigError as error:
            if not isinstance(label, str):
                raise
            raise ConfigError(error.key, f"automation {label!r}: {error.problem}",
                              error.source) from None
        jobs.append(AutomationSettings(**job))
    # [variables] takes any key; read() still checks that it is a table of strings.
    raw = document.get("variables", {})
    variables = read(raw, "variables", dict.fromkeys(raw if isinstance(raw, dict) else (), _TEXT))
    mcp = _mcp(document.get("mcp", {}), read, fail, env, path)
    return Settings(
        mcp=mcp, daemon=DaemonSettings(state_dir, listen_host, listen_port, **daemon), model=model,
        telegram=telegram, whatsapp=whatsapp, access=AccessSettings(**tables["access"]),
        attachments=AttachmentSettings(**tables["attachments"]),
        automations=tuple(jobs), variables=MappingProxyType(variables), source=path,
        credentials=credentials_dir(env, path),
        identities=_identities(document.get("identities", {}), fail),
        web=WebSettings(**tables["web"], **secrets["web"]),
        voice=VoiceSettings(**tables["voice"], **secrets["voice"]),
        console=ConsoleSettings(**tables["console"]))


# A person's own chat: a Telegram private chat (its id is the user's, positive), a WhatsApp
# wa_id or the terminal. Groups and forum topics are nobody's, so they cannot be linked.
_PERSON_CHAT = _like("telegram:[1-9][0-9]*|whatsapp:[0-9]+|console:local",
                     "a person's chat ('telegram:<user id>', 'whatsapp:<wa_id>' or "
                     "'console:local')")
_IDENTITY_NAME = re.compile("[a-z0-9][a-z0-9_-]{0,39}")


def _identities(raw: Any, fail: Callable[[str, str], ConfigError]
                ) -> Mapping[str, tuple[str, ...]]:
    """`[identities]`: name = [chat keys]; a chat belongs to one identity at most."""
    if not isinstance(raw, dict):
        raise fail("identities", "expected a table, got "
                   f"{_TOML_TYPES.get(type(raw), 'date/time')}")
    identities: dict[str, tuple[str, ...]] = {}
    owner: dict[str, str] = {}
    for name, chats in raw.items():
        if not _IDENTITY_NAME.fullmatch(name):
            raise fail(f"identities.{name}", "the name must be lowercase letters, digits, '-' "
                       "and '_' (at most 40)")
        try:
            keys = _array(_PERSON_CHAT)(chats)
        except _Bad as bad:
            raise fail(f"identities.{name}{bad.where}", str(bad)) from None
        if not keys:
            raise fail(f"identities.{name}", "must name at least one chat")
        for key in keys:
            if key in owner:
                raise fail(f"identities.{name}", f"{key} is already in identity {owner[key]!r}")
            owner[key] = name
        identities[name] = tuple(dict.fromkeys(keys))
    return MappingProxyType(identities)


def _mcp(table: Any, read: Callable[[Any, str, _Spec], dict[str, Any]],
         fail: Callable[[str, str], ConfigError], env: Mapping[str, str],
         path: Path | None) -> McpSettings:
    """`[mcp]` and its `[mcp.servers.NAME]` tables. Values of `env` and `headers` may name
    secrets as `${NAME}` (from the environment or $CREDENTIALS_DIRECTORY/NAME); one that is
    not set leaves the server unable to start (doctor says so), not the daemon."""
    servers_table = table.get("servers", {}) if isinstance(table, dict) else {}
    top = read({k: v for k, v in table.items() if k != "servers"}
               if isinstance(table, dict) else table, "mcp", _MCP)
    if not isinstance(servers_table, dict):
        raise fail("mcp.servers", "expected a table of [mcp.servers.NAME] tables")
    servers = []
    for name, raw in servers_table.items():
        where = f"mcp.servers.{name}"
        if not _SERVER_NAME.fullmatch(name):
            raise fail(where, "the name must be lowercase letters, digits, '-' and '_' "
                       "(at most 30), starting with a letter or digit")
        if name in BUILTIN_CAPABILITIES:
            raise fail(where, f"{name!r} is the name of one of roost's own capabilities; give "
                       f"the server another name, such as "
                       f"[mcp.servers.{_free_name(name, servers_table)}]")
        values = read(raw, where, _MCP_SERVER)
        if ("command" in values) == ("url" in values):
            raise fail(where, "needs either command (a stdio server) or url (streamable HTTP)")
        missing: list[str] = []
        for key in ("env", "headers"):
            resolved = {}
            for item, value in values.get(key, {}).items():
                if not isinstance(value, str):
                    raise fail(f"{where}.{key}.{item}", "expected a string")
                if _SECRETISH.search(item) and not _REFERENCE.search(value):
                    raise fail(f"{where}.{key}.{item}", "secrets do not belong in the config "
                               "file; write \"${NAME}\" and set NAME in the environment or "
                               "$CREDENTIALS_DIRECTORY/NAME")
                missing += [n for n in _REFERENCE.findall(value)
                            if not read_secret(n, env, path)]
                resolved[item] = _REFERENCE.sub(
                    lambda m: read_secret(m.group(1), env, path) or "", value)
            values[key] = MappingProxyType(resolved)
        for tool, policy in values.get("approve_tools", {}).items():
            try:
                _APPROVE(policy)
            except _Bad as bad:
                raise fail(f"{where}.approve_tools.{tool}", str(bad)) from None
        values["approve_tools"] = MappingProxyType(dict(values.get("approve_tools", {})))
        servers.append(McpServerSettings(name=name, missing=tuple(missing), **values))
    return McpSettings(servers=tuple(servers), **top)


def _free_name(name: str, taken: Mapping[str, object]) -> str:
    """A server name like `name` that is neither a built-in's nor another server's."""
    candidates = [f"{name}-mcp", f"{name}-server", *(f"{name}-{n}" for n in range(2, 100))]
    return next(c for c in candidates if c not in taken and c not in BUILTIN_CAPABILITIES)


def _home(env: Mapping[str, str]) -> Path:
    return Path(env["HOME"]) if env.get("HOME") else Path.home()


def _config_home(env: Mapping[str, str]) -> Path:
    return Path(env.get("XDG_CONFIG_HOME") or _home(env) / ".config")


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
