"""The settings of the plain tables ([daemon], [model], [voice], ...) and their specs; each
platform's table is its own (channels/<name>/platform.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from daemon.core.config.values import (
    _BASE_URL,
    _BOOL,
    _DURATION,
    _PERIOD,
    _STRING,
    _URL,
    _array,
    _at_least,
    _Bad,
    _host_name,
    _like,
    _listen,
    _ollama_duration,
    _one_of,
    _seconds,
    _Spec,
    _speed,
    _valid_zone,
    _value,
)

DEFAULT_HOST = "http://127.0.0.1:11434"
OLLAMA_WEB_SEARCH = "https://ollama.com/api/web_search"


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
class HostSettings:
    """One Ollama server of the pool (`[model] hosts`; daemon/llm/pool.py routes between them).
    `priority`: higher is preferred for new conversations. `models`: the models it may serve
    (empty: any it has)."""

    url: str
    priority: int = 0
    models: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelSettings:
    # The first host of the pool: set from `hosts` when they are given (for the messages and
    # commands that name one server).
    host: str = DEFAULT_HOST
    # Several Ollama servers, each conversation pinned to one (daemon/llm/pool.py); empty: the
    # one `host`.
    hosts: tuple[HostSettings, ...] = ()
    name: str = "qwen3:4b"
    window: int = 8192  # num_ctx, before capping at the model's context_length
    response_reserve: int = 1024
    keep_alive: str = "30m"  # passed to Ollama unchanged
    concurrency: int = 1
    timeout: float = 300.0  # seconds of silence before a request counts as timed out
    # Seconds of silence in a model's answer after which the chat is told the model is silent
    # (the request goes on until `timeout`).
    stall: float = 30.0
    retry_attempts: int = 5  # tries while Ollama is unreachable, then the turn is parked
    retry_backoff: float = 2.0  # seconds before the first retry, doubled each time
    max_calls: int = 8  # model calls one turn may make (tool rounds, continuations)
    think: bool = False  # let a thinking model think on chat turns (never on background calls)
    # Probe a model without a card quietly on its first use (daemon/models/book.py).
    probe_new: bool = True

    def __post_init__(self) -> None:
        if self.hosts:
            object.__setattr__(self, "host", self.hosts[0].url)

    @property
    def pool(self) -> tuple[HostSettings, ...]:
        """The Ollama servers roost sends to: `hosts`, else `host` alone (a pool of one)."""
        return self.hosts or (HostSettings(self.host),)


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
class SpeechSettings:
    """Voice replies synthesised from the reply's text (daemon/voice/speaking.py); off unless a
    backend is named."""

    backend: str = "off"  # "http" (an OpenAI-compatible server) or "espeak-ng" (a subprocess)
    url: str = "http://127.0.0.1:8000/v1/audio/speech"  # the http backend's endpoint
    model: str = "tts-1"  # the server's model id (speaches: "speaches-ai/Kokoro-82M-v1.0-ONNX")
    voice: str | None = None  # the server's voice ("alloy"), or espeak-ng's ("en-us")
    speed: float = 1.0  # 0.5 to 2.0, 1 is the engine's normal rate
    max_duration: float = 60.0  # seconds of speech at most; the rest of the reply is written
    timeout: float = 60.0  # seconds one synthesis may take
    queue_with_model: bool = True  # wait for a model slot, as a model call does (one GPU)
    key: str | None = field(default=None, repr=False)  # ROOST_SPEECH_KEY, for the http backend


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
class ConsoleSettings:
    enabled: bool = True  # the web console under /console/ on daemon.listen
    url: str | None = None  # how a browser reaches roost (a proxy's https address), for links


_HOST_KEYS = ("url", "priority", "models")
_MODEL_NAMES = _array(_STRING)


def _host_entry(value: Any) -> HostSettings:
    """One item of `model.hosts`: a URL, or a table with `url`, `priority` and `models`."""
    if isinstance(value, str):
        return HostSettings(_BASE_URL(value))
    table = _value(dict, "a URL string or a table with url, priority and models")(value)
    for key in table:
        if key not in _HOST_KEYS:
            raise _Bad("unknown key", f".{key}")
    if "url" not in table:
        raise _Bad("a host table needs its url", ".url")
    converters: dict[str, Callable[[Any], Any]] = {
        "url": _BASE_URL, "priority": _value(int, "an integer"), "models": _MODEL_NAMES}
    values = {}
    for key, item in table.items():
        try:
            values[key] = converters[key](item)
        except _Bad as bad:
            raise _Bad(str(bad), f".{key}{bad.where}") from None
    return HostSettings(**values)


def _hosts(value: Any) -> tuple[HostSettings, ...]:
    """`model.hosts`: URLs or `[[model.hosts]]` tables, each URL once."""
    hosts: list[HostSettings] = []
    for i, item in enumerate(_value(list, "an array of URLs or [[model.hosts]] tables")(value)):
        try:
            host = _host_entry(item)
        except _Bad as bad:
            raise _Bad(str(bad), f"[{i}]{bad.where}") from None
        same = [j for j, h in enumerate(hosts) if h.url.lower() == host.url.lower()]
        if same:
            raise _Bad(f"{host.url} is listed twice (also model.hosts[{same[0]}])", f"[{i}]")
        hosts.append(host)
    return tuple(hosts)


def model_settings(values: Mapping[str, Any],
                   fail: Callable[[str, str], Exception]) -> ModelSettings:
    """`[model]` read by its spec into settings: `host` and a non-empty `hosts` both set is an
    error (which one would the pool start from?)."""
    if "host" in values and values.get("hosts"):
        raise fail("model.hosts", "set model.host or model.hosts, not both (a pool of one is "
                   "hosts = [URL])")
    return ModelSettings(**values)


# What each table may hold; [[automations]] and [variables] are read separately.
_SPECS: Mapping[str, _Spec] = {
    "daemon": {
        "state_dir": _STRING, "listen": _value(str, "a string 'host:port'", then=_listen),
        "timezone": _value(str, "an IANA time zone name", _valid_zone,
                           "must be an IANA time zone name such as 'Europe/Berlin'"),
        "idle_rotation": _PERIOD, "shutdown_grace": _DURATION},
    "console": {"enabled": _BOOL, "url": _URL},
    "model": {
        "host": _BASE_URL, "hosts": _hosts, "name": _STRING, "window": _at_least(512),
        "response_reserve": _at_least(1), "concurrency": _at_least(1),
        "keep_alive": _value(str, "a duration string such as '30m'", _ollama_duration,
                             "must be '-1', '0' or a duration in ms, s, m or h (Ollama has no d)"),
        "timeout": _PERIOD, "stall": _PERIOD, "retry_attempts": _at_least(1),
        "retry_backoff": _DURATION, "max_calls": _at_least(1), "think": _BOOL,
        "probe_new": _BOOL},
    "access": {"unknown_senders": _one_of("pair", "ignore"), "rate_limit": _at_least(1)},
    "attachments": {
        "image_max_side": _at_least(64), "image_max_mb": _at_least(1),
        "file_max_mb": _at_least(1)},
    "voice": {
        "backend": _one_of("off", "http", "faster-whisper"), "url": _URL, "model": _STRING,
        "language": _like("[a-z]{2,3}", "a language code such as 'en' or 'de'"),
        "device": _one_of("auto", "cpu", "cuda"), "compute_type": _STRING,
        "max_duration": _PERIOD, "timeout": _PERIOD, "queue_with_model": _BOOL},
    "speech": {
        "backend": _one_of("off", "http", "espeak-ng"), "url": _URL, "model": _STRING,
        # Given to espeak-ng as `-v <voice>`: a name, never something read as an option.
        "voice": _like("[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}",
                       "a voice name such as 'alloy' or 'en-us'"),
        "speed": _speed,
        "max_duration": _value(str, "a duration string such as '60s'",
                               lambda v: 1 <= _seconds(v) <= 600, "must be 1s to 10m",
                               _seconds),
        "timeout": _PERIOD, "queue_with_model": _BOOL},
    "web": {
        "searxng_url": _BASE_URL, "ollama_search_url": _URL, "allow_private": _BOOL,
        "allow_hosts": _array(_value(str, "a host name or address", _host_name,
                                     "must be a bare host name or address (no scheme or port)",
                                     lambda v: v.strip("[]").lower())),
        "timeout": _PERIOD, "max_mb": _at_least(1)},
}
