"""How `roost init` sets a platform up without knowing it: the questions go through an
`Asker`, the answers come back as a `SetUp`.

Each platform declares its `roost init` flags as data on its light description
(`Platform.init_flags`: the `roost` parser is built at every start, before any platform library
is imported) and its questions and checks in its runtime (`Runtime.setup`, loaded only for a
platform being set up). init hands each chosen platform a `SetupRequest` (the asker, the values
of its own flags, the environment) and gets back a `SetUp`: the keys of its config table, its
secrets, and, when the owner must claim the bot by writing to it, a pairing step that init runs
once the config is written. Whatever a platform opened to check its answers (a bot session) is
closed by its `close`, whichever way init ends.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from daemon.core.errors import ConfigError, RoostError

EX_UNAVAILABLE = 69  # sysexits.h: a service init must reach cannot be reached
EX_CONFIG = ConfigError.exit_status  # an answer the service or roost refuses
TRIES = 3  # an interactive question asked again at most this often

# What a config table's key may be set to in the TOML init writes.
Value = str | bool | int | float | tuple[str, ...]


class SetupStop(RoostError):
    """A step of init that cannot go on; `status` is the exit status `roost init` ends with."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class Asker(Protocol):
    """The questions of `roost init`: on a terminal, or none (`--non-interactive`, where every
    answer comes from a flag or the environment)."""

    @property
    def interactive(self) -> bool: ...

    def say(self, text: str = "") -> None: ...

    def ask(self, question: str, default: str = "", *, hidden: bool = False) -> str:
        """The answer typed (`hidden`: not echoed, for a secret), else `default`."""
        ...

    def confirm(self, question: str, default: bool) -> bool: ...


@dataclass(frozen=True)
class InitFlag:
    """One flag a platform adds to `roost init`. `selects`: given, it asks for the platform
    (with `--non-interactive`, only the platforms asked for are set up); so does `env` set."""

    name: str  # "--token-file"
    help: str
    metavar: str = "VALUE"
    default: str | None = None
    path: bool = False  # the value is a file's path
    selects: bool = True
    env: str | None = None  # an environment variable that stands for the flag

    @property
    def dest(self) -> str:
        """The flag's attribute on the parsed arguments: `--token-file` -> `token_file`."""
        return self.name.removeprefix("--").replace("-", "_")


def given(flags: tuple[InitFlag, ...], values: Mapping[str, Any]) -> list[str]:
    """The names of the flags given a value of their own."""
    return [flag.name for flag in flags if values.get(flag.dest) not in (None, "", flag.default)]


def selected(flags: tuple[InitFlag, ...], values: Mapping[str, Any],
             env: Mapping[str, str]) -> bool:
    """Whether these flags' values (or the environment) ask for their platform."""
    named = given(flags, values)
    return any((flag.selects and flag.name in named)
               or (flag.env is not None and bool(env.get(flag.env, "").strip()))
               for flag in flags)


def how_to_select(flags: tuple[InitFlag, ...]) -> str:
    """The flags and variables that ask for a platform, as an error message lists them."""
    names = [f.name for f in flags if f.selects] + [f"${f.env}" for f in flags if f.env]
    return " or ".join(dict.fromkeys(names))


Admit = Callable[[str, str], None]  # (sender id, name): approve them in the pairing book


async def _nothing() -> None:
    return None


@dataclass(frozen=True)
class SetUp:
    """What a platform's setup gives back: its config table's keys (besides `enabled`), its
    secrets (environment variable -> value, written as credential files), and optionally the
    pairing step `pair(admit, timeout)`, True once the owner is approved (False: nobody in
    time); `close` releases what the setup opened."""

    table: Mapping[str, Value]
    secrets: Mapping[str, str]
    pair: Callable[[Admit, float], Awaitable[bool]] | None = None
    close: Callable[[], Awaitable[None]] = field(default=_nothing)


@dataclass(frozen=True)
class SetupRequest:
    """What a platform's setup is handed: the questions, its own flags' values (by `dest`),
    and the environment (secrets given for `--non-interactive`)."""

    asker: Asker
    options: Mapping[str, Any]
    env: Mapping[str, str]


Setup = Callable[[SetupRequest], Awaitable[SetUp]]


def toml_value(value: Value) -> str:
    """A value as TOML writes it (init's config is only ever these few kinds)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
